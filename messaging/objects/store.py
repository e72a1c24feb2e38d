"""The object store contract: what the rest of the broker may ask of any store.

:class:`ObjectStore` lists the few operations segments need: an idempotent, verified upload
(:meth:`~ObjectStore.put_if_absent`), ranged reads, the size of one object, a listing with
sizes, and deletion. Implementations: :class:`messaging.objects.file.FileStore`
(``file:///PATH``) and :class:`messaging.objects.s3.S3Store` (``s3://BUCKET/PREFIX``), made by
:func:`messaging.objects.url.parse_store_url`. Every failure is one of the kinds in
:mod:`messaging.objects.errors`.

Names are relative to the store's own prefix (the bucket's prefix, the directory): ``/``
separated segments of letters, digits and ``._=+-``, none empty or starting with a dot, so a
name means the same in every store and can never leave a ``file://`` directory.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from messaging.objects.errors import ObjectNameError

#: Longest name accepted (S3 keys are at most 1024 bytes, prefix included).
MAX_NAME_LENGTH = 512
_SEGMENT = re.compile(r"[A-Za-z0-9_=+-][A-Za-z0-9._=+-]*")

#: What :meth:`ObjectStore.put_if_absent` uploads: bytes, or the path of a file to read.
Source = bytes | Path


@dataclass(frozen=True, slots=True)
class StoredObject:
    """An object verified in a store: it holds exactly ``size`` bytes whose SHA-256 is
    ``sha256`` (hex). ``created``: this upload made it; False when an object of that name
    and those bytes was already there (a retried upload)."""

    name: str
    size: int
    sha256: str
    created: bool


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One object of a listing."""

    name: str
    size: int


class ObjectStore(Protocol):
    """An object store (S3 or a directory) holding closed segments and their time indexes."""

    @property
    def url(self) -> str:
        """Where the store is (``s3://bucket/prefix``, ``file:///path``), for messages."""
        ...

    async def put_if_absent(self, name: str, source: Source, *,
                            sha256: str | None = None) -> StoredObject:
        """Store ``source`` as ``name`` unless an object of that name exists, then verify it.

        Conditional (never replaces an object): when one is there already with the same
        bytes, that counts as success (``created`` False); with other bytes it is left alone
        and :class:`~messaging.objects.errors.ObjectConflictError` is raised. The object
        counts only once read back: its size and SHA-256 must be those of ``source`` (or
        ``sha256``, when the caller has it already), else
        :class:`~messaging.objects.errors.ObjectCorruptError` (and an object this call
        created is deleted again, so that a retry can put it right).
        """
        ...

    async def put_new(self, name: str, data: bytes) -> bool:
        """Store ``data`` as ``name`` unless an object of that name exists, as
        :meth:`put_if_absent` does (True: this call made it), for bytes a caller holds in
        memory and checks itself later (the intake lane's objects, checksummed in their
        pointers): verified by the store's own checksum of what it received where it gives
        one (a single-part S3 PUT's ETag is the MD5 of the bytes it stored), else by reading
        back. An object already there must hold the same bytes
        (:class:`~messaging.objects.errors.ObjectConflictError` otherwise)."""
        ...

    async def get_range(self, name: str, start: int, end: int) -> bytes:
        """Bytes ``start`` up to ``end`` (exclusive) of the object: exactly ``end - start``
        of them (an object shorter than that is corrupt)."""
        ...

    async def size(self, name: str) -> int:
        """The size in bytes of the object (a HEAD request)."""
        ...

    async def list(self, prefix: str = "") -> Sequence[ObjectInfo]:
        """Every object under ``prefix`` (whole segments: ``"7"`` is ``7/...``, not ``70/``;
        "" for all), with its size, sorted by name."""
        ...

    async def delete(self, name: str) -> None:
        """Delete the object; deleting one that is not there is not an error."""
        ...


def check_name(name: str, *, prefix: bool = False) -> str:
    """``name`` if every store can hold an object of that name, else ObjectNameError.
    ``prefix``: a listing prefix, where "" (everything) is allowed too."""
    if prefix and name == "":
        return name
    if len(name) > MAX_NAME_LENGTH:
        raise ObjectNameError(name, f"longer than {MAX_NAME_LENGTH} characters")
    for segment in name.split("/"):
        if not _SEGMENT.fullmatch(segment):
            raise ObjectNameError(
                name, "each /-separated part must be letters, digits and ._=+- and must not "
                "be empty or start with a dot")
    return name


def check_range(name: str, start: int, end: int) -> None:
    """Refuse a range that is not ``0 <= start <= end`` (a bug in the caller)."""
    if not 0 <= start <= end:
        raise ValueError(f"object {name}: invalid byte range [{start}, {end})")
