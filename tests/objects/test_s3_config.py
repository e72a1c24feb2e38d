"""What an S3 store is built from: endpoint and TLS, credentials and region in the standard
AWS order, time limits. No server: these check the options handed to obstore."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from messaging.errors import ConfigError
from messaging.objects import S3Settings
from messaging.objects.s3_config import obstore_options, resolve_endpoint


def files(tmp_path: Path, credentials: str = "", config: str = "",
          **variables: str) -> dict[str, str]:
    """An environment whose shared AWS files hold ``credentials`` and ``config``."""
    (tmp_path / "credentials").write_text(credentials)
    (tmp_path / "config").write_text(config)
    return {"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "credentials"),
            "AWS_CONFIG_FILE": str(tmp_path / "config"), **variables}


def test_plain_http_only_when_the_endpoint_says_so(tmp_path: Path) -> None:
    environ = files(tmp_path)
    loopback = obstore_options(S3Settings(endpoint="http://127.0.0.1:8333/"), environ)
    assert loopback.config["endpoint"] == "http://127.0.0.1:8333"
    assert loopback.client_options["allow_http"] is True
    tls = obstore_options(S3Settings(endpoint="https://s3.example.test"), environ)
    assert tls.client_options["allow_http"] is False
    assert tls.client_options["allow_invalid_certificates"] is False
    aws = obstore_options(S3Settings(), {**environ, "AWS_ALLOW_HTTP": "true",
                                         "AWS_ALLOW_INVALID_CERTIFICATES": "true"})
    assert "endpoint" not in aws.config
    assert aws.client_options["allow_http"] is False
    assert aws.client_options["allow_invalid_certificates"] is False


def test_the_endpoint_may_come_from_the_environment(tmp_path: Path) -> None:
    environ = files(tmp_path, AWS_ENDPOINT_URL="http://127.0.0.1:9000")
    options = obstore_options(S3Settings(), environ)
    assert options.config["endpoint"] == "http://127.0.0.1:9000"
    assert options.client_options["allow_http"] is True
    assert resolve_endpoint("https://a.test", environ) == "https://a.test"  # the option wins


@pytest.mark.parametrize("endpoint", ["127.0.0.1:8333", "ftp://host", "http://", "https://:9",
                                      "http://h:notaport", "http://u:p@h", "http://h/?x=1"])
def test_bad_endpoints_are_refused(endpoint: str) -> None:
    with pytest.raises(ConfigError, match="--s3-endpoint"):
        resolve_endpoint(endpoint, {})


def test_explicit_credentials_come_first(tmp_path: Path) -> None:
    environ = files(tmp_path, "[default]\naws_access_key_id = file\naws_secret_access_key = f\n",
                    AWS_ACCESS_KEY_ID="env")
    options = obstore_options(S3Settings(access_key_id="given", secret_access_key="s",
                                         session_token="t"), environ)
    assert (options.config["access_key_id"], options.config["secret_access_key"],
            options.config["session_token"]) == ("given", "s", "t")
    shown = repr(S3Settings(secret_access_key="hunter2", session_token="token-42"))
    assert "hunter2" not in shown and "token-42" not in shown


@pytest.mark.parametrize("variable", ["AWS_ACCESS_KEY_ID", "AWS_WEB_IDENTITY_TOKEN_FILE",
                                      "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"])
def test_environment_credentials_are_left_to_obstore(tmp_path: Path, variable: str) -> None:
    environ = files(tmp_path, "[default]\naws_access_key_id = file\naws_secret_access_key = f\n",
                    **{variable: "x"})
    assert "access_key_id" not in obstore_options(S3Settings(), environ).config


def test_static_keys_of_the_profile_in_force(tmp_path: Path) -> None:
    credentials = ("[default]\naws_access_key_id = d\naws_secret_access_key = ds\n"
                   "[broker]\naws_access_key_id = b\naws_secret_access_key = bs\n"
                   "aws_session_token = bt\n")
    config = "[default]\nregion = eu-west-1\n[profile broker]\nregion = ap-south-1\n"
    default = obstore_options(S3Settings(), files(tmp_path, credentials, config))
    assert (default.config["access_key_id"], default.config["region"]) == ("d", "eu-west-1")
    assert "session_token" not in default.config
    broker = obstore_options(S3Settings(), files(tmp_path, credentials, config,
                                                 AWS_PROFILE="broker"))
    assert (broker.config["access_key_id"], broker.config["secret_access_key"],
            broker.config["session_token"], broker.config["region"]) == (
        "b", "bs", "bt", "ap-south-1")


def test_keys_may_sit_in_the_config_file(tmp_path: Path) -> None:
    config = "[profile p]\naws_access_key_id = c\naws_secret_access_key = cs\n"
    options = obstore_options(S3Settings(), files(tmp_path, "", config, AWS_PROFILE="p"))
    assert options.config["access_key_id"] == "c"


def test_region_order(tmp_path: Path) -> None:
    environ = files(tmp_path, "", "[default]\nregion = from-file\n")
    assert obstore_options(S3Settings(), environ).config["region"] == "from-file"
    environ["AWS_DEFAULT_REGION"] = "from-default"
    assert obstore_options(S3Settings(), environ).config["region"] == "from-default"
    environ["AWS_REGION"] = "from-env"
    assert obstore_options(S3Settings(), environ).config["region"] == "from-env"
    assert obstore_options(S3Settings(region="given"), environ).config["region"] == "given"


def test_no_files_no_credentials(tmp_path: Path) -> None:
    environ = {"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
               "AWS_CONFIG_FILE": str(tmp_path / "none2")}
    options = obstore_options(S3Settings(), environ)
    assert "access_key_id" not in options.config and "region" not in options.config


def test_a_missing_named_profile_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="AWS profile 'nope'"):
        obstore_options(S3Settings(), files(tmp_path, AWS_PROFILE="nope"))


def test_profiles_of_other_kinds_say_how_to_export_credentials(tmp_path: Path) -> None:
    config = "[profile sso]\nsso_session = corp\nregion = eu-west-1\n"
    with pytest.raises(ConfigError, match="aws configure export-credentials --profile sso"):
        obstore_options(S3Settings(), files(tmp_path, "", config, AWS_PROFILE="sso"))


def test_half_a_key_pair_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="only one of"):
        obstore_options(S3Settings(), files(tmp_path, "[default]\naws_access_key_id = a\n"))


def test_an_unreadable_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the AWS file"):
        obstore_options(S3Settings(), files(tmp_path, "not an ini file"))


def test_a_ca_bundle_is_added_to_the_trusted_roots(tmp_path: Path) -> None:
    bundle = tmp_path / "ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n...\n-----END CERTIFICATE-----\n")
    options = obstore_options(S3Settings(), files(tmp_path, AWS_CA_BUNDLE=str(bundle)))
    assert options.client_options["root_certificate"] == bundle.read_text()
    with pytest.raises(ConfigError, match="CA bundle"):
        obstore_options(S3Settings(), files(tmp_path, AWS_CA_BUNDLE=str(tmp_path / "none")))


def test_time_limits_and_retries() -> None:
    settings = S3Settings(connect_timeout=1.5, request_timeout=7, max_retries=2,
                          retry_timeout=9, init_backoff=0.2, max_backoff=3)
    options = obstore_options(settings, {"AWS_CONFIG_FILE": "/nonexistent/a",
                                         "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/b"})
    assert options.client_options["connect_timeout"] == timedelta(seconds=1.5)
    assert options.client_options["timeout"] == timedelta(seconds=7)
    assert options.retry_config["max_retries"] == 2
    assert options.retry_config["retry_timeout"] == timedelta(seconds=9)
    assert options.retry_config["backoff"] == {"init_backoff": timedelta(seconds=0.2),
                                               "max_backoff": timedelta(seconds=3), "base": 2}
