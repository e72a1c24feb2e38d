"""``--object-store URL`` (and ``--s3-endpoint URL``) to the store they name.

``s3://BUCKET/PREFIX`` is an :class:`~messaging.objects.s3.S3Store` (imported only then: obstore
is an optional extra), ``file:///PATH`` a :class:`~messaging.objects.file.FileStore`. Anything
else is a :class:`~messaging.errors.ConfigError` that says what is expected.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import unquote, urlsplit

from messaging.errors import ConfigError, MessagingError
from messaging.objects.file import FileStore
from messaging.objects.s3_config import S3Settings
from messaging.objects.store import ObjectStore, check_name

#: S3's rule for bucket names (3 to 63 lowercase letters, digits, dots and hyphens).
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
EXPECTED = "expected s3://BUCKET/PREFIX or file:///PATH"


def parse_store_url(url: str, endpoint: str | None = None, *,
                    settings: S3Settings | None = None,
                    environ: Mapping[str, str] = os.environ) -> ObjectStore:
    """The object store at ``url``. ``endpoint`` (``--s3-endpoint``) and ``settings`` apply
    to ``s3://`` only. An S3 store reads the shared AWS files as it is made: call this at
    start-up, not on a running event loop."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as err:
        raise ConfigError(f"object store {url!r}: {EXPECTED} ({err})") from err
    if parts.query or parts.fragment or parts.username or parts.password or port is not None:
        raise ConfigError(f"object store {url!r}: {EXPECTED}, with no port, user, query or "
                          "fragment")
    if parts.scheme == "file":
        if endpoint is not None:
            raise ConfigError(f"--s3-endpoint applies to s3:// object stores, not {url!r}")
        return FileStore(_file_path(url, parts.netloc, unquote(parts.path)))
    if parts.scheme == "s3":
        bucket = parts.netloc
        if not _BUCKET.fullmatch(bucket) or ".." in bucket:
            raise ConfigError(f"object store {url!r}: {bucket!r} is not an S3 bucket name "
                              "(3 to 63 lowercase letters, digits, dots and hyphens)")
        prefix = parts.path.strip("/")
        try:
            check_name(prefix, prefix=True)
        except MessagingError as err:
            raise ConfigError(f"object store {url!r}: the prefix {prefix!r} is not usable: "
                              f"{err}") from err
        if endpoint is not None:
            settings = dataclasses.replace(settings or S3Settings(), endpoint=endpoint)
        from messaging.objects.s3 import S3Store  # only now: obstore is an optional extra

        return S3Store(bucket, prefix, settings, environ)
    raise ConfigError(f"object store {url!r}: {EXPECTED}")


def _file_path(url: str, host: str, path: str) -> Path:
    if host not in ("", "localhost"):
        raise ConfigError(f"object store {url!r}: a file:// URL names a local directory: "
                          "file:///PATH (three slashes), no host")
    if not path.startswith("/") or path == "/":
        raise ConfigError(f"object store {url!r}: expected file:///PATH, an absolute path "
                          "below /")
    return Path(os.path.normpath(path))
