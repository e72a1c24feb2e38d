"""What an S3 store is built from: endpoint and TLS, credentials and region, time limits.

Credentials and region come the standard AWS way, in the standard order:

1. given explicitly (:class:`S3Settings`; tests and embedding programs);
2. the environment: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
   ``AWS_REGION``/``AWS_DEFAULT_REGION``, and web identity (``AWS_WEB_IDENTITY_TOKEN_FILE``,
   ``AWS_ROLE_ARN``) or container credentials (``AWS_CONTAINER_CREDENTIALS_*``): obstore reads
   these itself;
3. the shared files, which obstore does not read: the profile ``AWS_PROFILE`` (else
   ``default``) of ``AWS_SHARED_CREDENTIALS_FILE`` (``~/.aws/credentials``) and
   ``AWS_CONFIG_FILE`` (``~/.aws/config``): its static keys (``aws_access_key_id``,
   ``aws_secret_access_key``, ``aws_session_token``), ``region`` and ``ca_bundle``. A profile
   of another kind (SSO, ``role_arn``, ``credential_process``) is refused with how to export
   its credentials to the environment instead; this is the only part read by hand;
4. the EC2 instance metadata service (obstore).

The endpoint is ``--s3-endpoint`` (else ``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``), for
S3-compatible stores; without one, AWS's regional endpoint. Plain HTTP is allowed only when
the endpoint URL says ``http://`` (a store on loopback in tests); otherwise TLS with the
certificate verified, against the system roots plus ``AWS_CA_BUNDLE`` (or the profile's
``ca_bundle``) when given. Requests are retried by obstore (5xx, connection errors, timeouts
of safe requests) with exponential backoff and jitter, within :class:`S3Settings`' bounds.
"""

from __future__ import annotations

import configparser
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from messaging.errors import ConfigError

if TYPE_CHECKING:
    from obstore.store import ClientConfig, RetryConfig, S3Config

#: Environment variables that make obstore find credentials by itself (step 2 above).
CREDENTIAL_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_WEB_IDENTITY_TOKEN_FILE",
                        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                        "AWS_CONTAINER_CREDENTIALS_FULL_URI")
ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT")
REGION_VARIABLES = ("AWS_REGION", "AWS_DEFAULT_REGION")
_STATIC_KEYS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")
_OTHER_KINDS = ("role_arn", "credential_process", "sso_session", "sso_start_url",
                "web_identity_token_file")


@dataclass(frozen=True, slots=True)
class S3Settings:
    """How to reach an S3 store. Times in seconds.

    ``max_retries`` and ``retry_timeout`` bound obstore's retries of one request (backoff
    with jitter from ``init_backoff`` up to ``max_backoff``); ``request_timeout`` bounds each
    try from connecting to the last byte.
    """

    endpoint: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    connect_timeout: float = 5.0
    request_timeout: float = 30.0
    max_retries: int = 3
    retry_timeout: float = 30.0
    init_backoff: float = 0.1
    max_backoff: float = 5.0


@dataclass(frozen=True, slots=True)
class ObstoreOptions:
    """The keyword arguments of obstore's ``S3Store`` for one store."""

    config: S3Config
    client_options: ClientConfig
    retry_config: RetryConfig


def obstore_options(settings: S3Settings, environ: Mapping[str, str] = os.environ,
                    ) -> ObstoreOptions:
    """obstore's options for ``settings``, the environment and the shared AWS files
    (read here: blocking I/O, for start-up)."""
    config: S3Config = {}
    endpoint = resolve_endpoint(settings.endpoint, environ)
    # Both TLS settings explicit, so that no AWS_ALLOW_* variable obstore would read can
    # loosen them: plain HTTP only for an http:// endpoint, certificates always verified.
    client: ClientConfig = {
        "connect_timeout": timedelta(seconds=settings.connect_timeout),
        "timeout": timedelta(seconds=settings.request_timeout),
        "allow_http": endpoint is not None and endpoint.startswith("http://"),
        "allow_invalid_certificates": False,
    }
    if endpoint is not None:
        config["endpoint"] = endpoint
    profile = shared_profile(environ)
    if settings.access_key_id is not None:
        config["access_key_id"] = settings.access_key_id
        config["secret_access_key"] = settings.secret_access_key or ""
        if settings.session_token is not None:
            config["session_token"] = settings.session_token
    elif not any(environ.get(name) for name in CREDENTIAL_VARIABLES):
        keys = profile_keys(profile, environ)
        if keys:
            config["access_key_id"] = keys["aws_access_key_id"]
            config["secret_access_key"] = keys["aws_secret_access_key"]
            if "aws_session_token" in keys:
                config["session_token"] = keys["aws_session_token"]
    region = settings.region or next(
        (environ[name] for name in REGION_VARIABLES if environ.get(name)), None)
    region = region or profile.get("region")
    if region:
        config["region"] = region
    bundle = environ.get("AWS_CA_BUNDLE") or profile.get("ca_bundle")
    if bundle:
        client["root_certificate"] = _read_ca_bundle(Path(bundle).expanduser())
    retry: RetryConfig = {
        "max_retries": settings.max_retries,
        "retry_timeout": timedelta(seconds=settings.retry_timeout),
        "backoff": {"init_backoff": timedelta(seconds=settings.init_backoff),
                    "max_backoff": timedelta(seconds=settings.max_backoff), "base": 2},
    }
    return ObstoreOptions(config, client, retry)


def resolve_endpoint(endpoint: str | None, environ: Mapping[str, str]) -> str | None:
    """The endpoint URL to use (``endpoint``, else the environment's), checked: ``http://`` or
    ``https://`` and a host, nothing else."""
    source = "--s3-endpoint"
    if endpoint is None:
        for name in ENDPOINT_VARIABLES:
            if environ.get(name):
                endpoint, source = environ[name], name
                break
        else:
            return None
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{source} {endpoint!r}: expected http(s)://HOST[:PORT]")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ConfigError(f"{source} {endpoint!r}: expected http(s)://HOST[:PORT] with no "
                          "query, fragment or user")
    try:
        parts.port  # noqa: B018 (a bad port raises ValueError)
    except ValueError as err:
        raise ConfigError(f"{source} {endpoint!r}: {err}") from err
    return endpoint.rstrip("/")


def shared_profile(environ: Mapping[str, str]) -> dict[str, str]:
    """The settings of the AWS profile in force from the shared files (credentials file over
    config file); {} when neither has it."""
    name = environ.get("AWS_PROFILE") or "default"
    home = Path(environ.get("HOME") or Path.home())
    credentials = Path(environ.get("AWS_SHARED_CREDENTIALS_FILE")
                       or home / ".aws" / "credentials").expanduser()
    config = Path(environ.get("AWS_CONFIG_FILE") or home / ".aws" / "config").expanduser()
    merged: dict[str, str] = {}
    merged.update(_section(config, "default" if name == "default" else f"profile {name}"))
    merged.update(_section(credentials, name))
    if not merged and environ.get("AWS_PROFILE"):
        raise ConfigError(f"AWS profile {name!r} (AWS_PROFILE) is in neither {credentials} "
                          f"nor {config}")
    return merged


def profile_keys(profile: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """The static keys of a profile ({} when it has none and is not of another kind)."""
    keys = {key: profile[key] for key in _STATIC_KEYS if profile.get(key)}
    if keys and not {"aws_access_key_id", "aws_secret_access_key"} <= keys.keys():
        raise ConfigError("the AWS profile has only one of aws_access_key_id and "
                          "aws_secret_access_key")
    if not keys and any(profile.get(key) for key in _OTHER_KINDS):
        name = environ.get("AWS_PROFILE") or "default"
        raise ConfigError(
            f"AWS profile {name!r} gets its credentials through SSO, a role or a process, "
            "but only static keys are read from the shared files: export its credentials "
            f"to the environment first (aws configure export-credentials --profile {name} "
            "--format env)")
    return keys


def _section(path: Path, section: str) -> dict[str, str]:
    parser = configparser.RawConfigParser(default_section="\x00none")
    try:
        with path.open(encoding="utf-8") as f:
            parser.read_file(f)
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, configparser.Error) as err:
        raise ConfigError(f"cannot read the AWS file {path}: {err}") from err
    if not parser.has_section(section):
        return {}
    return {key: value.strip() for key, value in parser.items(section)}


def _read_ca_bundle(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read the CA bundle {path} (AWS_CA_BUNDLE): {err}") from err
