"""Verifying an object after upload: its size, then its bytes read back and hashed.

Why read back instead of trusting the store's ETag: an S3 ETag is the MD5 of the bytes only
for a single-part upload without KMS encryption (a multipart upload's is an MD5 of MD5s with a
``-N`` suffix, and S3-compatible stores vary), and a checksum the uploader stores as metadata
only repeats what the uploader meant to send. Reading the object back through the same ranged
GETs readers use proves what the store will serve; segments are closed and modest in size
(``--max-segment-size``, 10 MiB by default), so the extra read costs little next to keeping
a bad copy as the only one.
"""

from __future__ import annotations

import hashlib

from messaging.objects.checksum import Digest, update
from messaging.objects.errors import ObjectCorruptError
from messaging.objects.store import ObjectStore

#: Bytes read back per ranged GET while verifying.
VERIFY_CHUNK = 8 << 20


async def verify_object(store: ObjectStore, name: str, expected: Digest) -> None:
    """Raise ObjectCorruptError unless the object ``name`` holds exactly the bytes
    ``expected`` describes (size, then SHA-256). Store failures are raised as they are."""
    size = await store.size(name)
    if size != expected.size:
        raise ObjectCorruptError(store.url, name,
                                 f"{size} bytes stored, {expected.size} expected")
    sha = hashlib.sha256()
    for start in range(0, size, VERIFY_CHUNK):
        await update(sha, await store.get_range(name, start, min(size, start + VERIFY_CHUNK)))
    if sha.hexdigest() != expected.sha256:
        raise ObjectCorruptError(
            store.url, name, f"SHA-256 of the stored bytes is {sha.hexdigest()}, "
            f"{expected.sha256} expected")
