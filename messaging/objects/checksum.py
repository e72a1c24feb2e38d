"""SHA-256 of what goes into an object store, computed off the event loop when it is big.

The SHA-256 of an object's bytes is part of its name (:mod:`messaging.objects.naming`), so
"same name" means "same bytes": an upload retried after a lost answer finds its own object and
counts it as done, and a name reused for other bytes is caught. A cryptographic hash, not a
CRC-32C: a 32-bit checksum cannot make that promise for millions of objects, while every
frame inside keeps its own CRC-32C for reads.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from pathlib import Path

#: Data at least this big is hashed in a thread, so the loop never waits for it.
THREAD_AT = 256 << 10
_FILE_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class Digest:
    """The size and SHA-256 (hex) of some bytes."""

    size: int
    sha256: str


def digest_bytes(data: bytes | memoryview) -> Digest:
    """The digest of ``data`` (on the calling thread)."""
    return Digest(len(data), hashlib.sha256(data).hexdigest())


def digest_file(path: Path) -> Digest:
    """The digest of the file at ``path`` (on the calling thread: blocking I/O)."""
    sha = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while chunk := f.read(_FILE_CHUNK):
            sha.update(chunk)
            size += len(chunk)
    return Digest(size, sha.hexdigest())


async def digest_of(source: bytes | Path) -> Digest:
    """The digest of bytes or of a file, in a thread unless the bytes are small."""
    if isinstance(source, Path):
        return await asyncio.to_thread(digest_file, source)
    if len(source) >= THREAD_AT:
        return await asyncio.to_thread(digest_bytes, source)
    return digest_bytes(source)


async def update(sha: hashlib._Hash, data: bytes) -> None:
    """Feed ``data`` to a running hash, in a thread unless it is small."""
    if len(data) >= THREAD_AT:
        await asyncio.to_thread(sha.update, data)
    else:
        sha.update(data)
