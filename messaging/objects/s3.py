"""``s3://BUCKET/PREFIX``: an object store in an S3 bucket (AWS or S3-compatible), via obstore.

obstore (the Python face of the Rust ``object_store`` crate) does everything S3-specific:
request signing, credentials from the environment, instance metadata and web identity,
retries of failed requests with exponential backoff and jitter, the conditional
``PUT`` with ``If-None-Match: *`` (``mode="create"``), ranged ``GET``s and paged listings; its
requests run on its own threads, never on the event loop. This module adds only the contract
of :class:`~messaging.objects.store.ObjectStore`: verified uploads, exact ranges, and
failures sorted into our kinds (:mod:`messaging.objects.s3_errors`). Settings:
:mod:`messaging.objects.s3_config`.

A conditional ``PUT`` is a single request (obstore uses multipart uploads only for
unconditional ones); S3 takes up to 5 GiB that way, far above a segment.

obstore is the optional extra ``s3``: without it, importing this module raises a
:class:`~messaging.errors.ConfigError` that says how to install it (``make s3``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from messaging.errors import ConfigError

try:
    import obstore
    from obstore.exceptions import AlreadyExistsError, BaseError, PreconditionError
    from obstore.store import S3Store as ObstoreS3Store
except ImportError as _missing:  # pragma: no cover (the dev install has it)
    # Not "pip install 'messaging[s3]'": a pip of another environment takes that for an
    # unrelated package of the same name on PyPI. This interpreter's own pip cannot miss.
    raise ConfigError("s3:// object stores need obstore, which the core install leaves out: "
                      "make s3 adds it to a checkout's .venv; elsewhere run "
                      f"{sys.executable} -m pip install 'obstore>=0.12'") from _missing

from messaging.objects.checksum import THREAD_AT
from messaging.objects.errors import (
    ObjectConflictError,
    ObjectCorruptError,
    ObjectNotFoundError,
    ObjectStoreError,
)
from messaging.objects.s3_config import S3Settings, obstore_options
from messaging.objects.s3_errors import store_error
from messaging.objects.store import ObjectInfo, Source, StoredObject, check_name, check_range
from messaging.objects.upload import put_verified

#: Objects asked for per page of a listing (S3's maximum).
LIST_PAGE = 1000
#: What obstore raises: its own errors, and builtins (FileNotFoundError for a 404).
_OBSTORE_ERRORS = (BaseError, OSError, ValueError)


class S3Store:
    """An object store under ``prefix`` in the S3 bucket ``bucket``.

    Building one reads the shared AWS files (see :mod:`messaging.objects.s3_config`): do it
    at start-up, not on a running event loop.
    """

    def __init__(self, bucket: str, prefix: str = "", settings: S3Settings | None = None,
                 environ: Mapping[str, str] = os.environ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.settings = settings or S3Settings()
        options = obstore_options(self.settings, environ)
        self.endpoint = options.config.get("endpoint")
        try:
            self._store = ObstoreS3Store(
                bucket, prefix=self.prefix or None, config=options.config,
                client_options=options.client_options, retry_config=options.retry_config)
        except _OBSTORE_ERRORS as err:
            raise ConfigError(f"cannot use the S3 store {self.url}: "
                              f"{str(err).splitlines()[0]}") from err

    @property
    def url(self) -> str:
        """``s3://bucket/prefix``."""
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def __repr__(self) -> str:
        at = f" at {self.endpoint}" if self.endpoint else ""
        return f"S3Store({self.url}{at})"

    async def put_if_absent(self, name: str, source: Source, *,
                            sha256: str | None = None) -> StoredObject:
        """See :meth:`messaging.objects.store.ObjectStore.put_if_absent`."""
        check_name(name)

        async def create() -> bool:
            # A conditional PUT sends the whole body at once: read a file in a thread here,
            # rather than let obstore read it wherever it reads it.
            data = source
            if isinstance(data, Path):
                data = await asyncio.to_thread(data.read_bytes)
            try:
                await obstore.put_async(self._store, name, data, mode="create")
            except (AlreadyExistsError, PreconditionError):
                return False
            except _OBSTORE_ERRORS as err:
                raise await self._error(err, name) from err
            return True

        return await put_verified(self, name, source, sha256, create)

    async def put_new(self, name: str, data: bytes) -> bool:
        """See :meth:`messaging.objects.store.ObjectStore.put_new`: the PUT's ETag must be
        the MD5 of ``data``; a store that answers another kind of ETag (encryption, a
        multipart upload) has the object read back instead."""
        check_name(name)
        # The MD5 in a thread while the bytes are on their way (a small one here).
        hashing = asyncio.ensure_future(asyncio.to_thread(_md5, data)) \
            if len(data) >= THREAD_AT else None
        try:
            try:
                result = await obstore.put_async(self._store, name, data, mode="create")
            finally:
                md5 = await hashing if hashing is not None else _md5(data)
        except (AlreadyExistsError, PreconditionError):
            if await self._holds(name, data):
                return False
            raise ObjectConflictError(self.url, name, "another object holds the name") \
                from None
        except _OBSTORE_ERRORS as err:
            raise await self._error(err, name) from err
        if str(result.get("e_tag") or "").strip('"') == md5 or await self._holds(name, data):
            return True
        with contextlib.suppress(ObjectStoreError):
            await self.delete(name)
        raise ObjectCorruptError(self.url, name, "the bytes read back after the upload are "
                                 "not those sent")

    async def _holds(self, name: str, data: bytes) -> bool:
        """Whether the object ``name`` holds exactly ``data`` (read back)."""
        if await self.size(name) != len(data):
            return False
        return await self.get_range(name, 0, len(data)) == data

    async def get_range(self, name: str, start: int, end: int) -> bytes:
        """See :meth:`messaging.objects.store.ObjectStore.get_range`."""
        check_name(name)
        check_range(name, start, end)
        if start == end:
            return b""
        try:
            data = await obstore.get_range_async(self._store, name, start=start, end=end)
        except _OBSTORE_ERRORS as err:
            raise await self._error(err, name) from err
        if len(data) != end - start:  # S3 answers a range past the end with what there is
            raise ObjectCorruptError(self.url, name, f"{start + len(data)} bytes long, a "
                                     f"read of bytes [{start}, {end}) was asked for")
        return bytes(data)

    async def size(self, name: str) -> int:
        """See :meth:`messaging.objects.store.ObjectStore.size`."""
        check_name(name)
        try:
            meta = await obstore.head_async(self._store, name)
        except _OBSTORE_ERRORS as err:
            raise await self._error(err, name) from err
        return int(meta["size"])

    async def list(self, prefix: str = "") -> Sequence[ObjectInfo]:
        """See :meth:`messaging.objects.store.ObjectStore.list`."""
        check_name(prefix, prefix=True)
        found: dict[str, ObjectInfo] = {}
        try:
            async for page in obstore.list(self._store, prefix or None, chunk_size=LIST_PAGE):
                for meta in page:
                    found[meta["path"]] = ObjectInfo(meta["path"], int(meta["size"]))
        except _OBSTORE_ERRORS as err:
            raise await self._error(err, "") from err
        return sorted(found.values(), key=lambda info: info.name)

    async def delete(self, name: str) -> None:
        """See :meth:`messaging.objects.store.ObjectStore.delete`."""
        check_name(name)
        try:
            await obstore.delete_async(self._store, name)
        except _OBSTORE_ERRORS as err:
            error = await self._error(err, name)
            if not isinstance(error, ObjectNotFoundError):
                raise error from err

    async def _error(self, err: Exception, name: str) -> ObjectStoreError:
        """Our kind of ``err``. A 404 without a body (a HEAD's) cannot say whether the object
        or the whole bucket is missing: one listing of nothing tells."""
        error = store_error(err, self.url, name)
        if isinstance(error, ObjectNotFoundError) and "(NoSuchKey)" not in error.detail:
            try:
                await obstore.list_with_delimiter_async(self._store, name)
            except _OBSTORE_ERRORS as probe_err:
                return store_error(probe_err, self.url, name)
        return error


def _md5(data: bytes) -> str:
    """The MD5 (hex) an S3 store answers as the ETag of a single-part PUT of ``data``: not a
    name or a promise of ours, only what the store says it received."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()
