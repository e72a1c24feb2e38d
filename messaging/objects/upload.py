"""The steps every store's :meth:`~messaging.objects.store.ObjectStore.put_if_absent` shares.

A store only knows how to create an object if absent (S3: ``PUT`` with ``If-None-Match: *``;
a directory: link a fsynced temporary file without replacing). Around that, the same steps for
all: know the size and SHA-256 of what is uploaded (off the loop), create, then verify by
reading back (:mod:`messaging.objects.verify`). Whether the object was there before decides
what a mismatch means: another object holding the name (a conflict, left alone) or a bad copy
this upload made (corrupt: deleted, so a retry can put it right).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from messaging.objects.checksum import Digest, digest_of
from messaging.objects.errors import ObjectConflictError, ObjectCorruptError, ObjectStoreError
from messaging.objects.store import ObjectStore, Source, StoredObject
from messaging.objects.verify import verify_object


async def expected_digest(source: Source, sha256: str | None) -> Digest:
    """The digest ``source`` must have in the store: computed, or ``sha256`` (which the
    caller computed already) with the size of ``source``."""
    if sha256 is None:
        return await digest_of(source)
    if isinstance(source, Path):
        return Digest((await asyncio.to_thread(os.stat, source)).st_size, sha256)
    return Digest(len(source), sha256)


async def put_verified(store: ObjectStore, name: str, source: Source, sha256: str | None,
                       create: Callable[[], Awaitable[bool]]) -> StoredObject:
    """Run ``create`` (True: it made the object; False: one was there already), then verify
    the object against ``source``. See :meth:`ObjectStore.put_if_absent`."""
    expected = await expected_digest(source, sha256)
    created = await create()
    try:
        await verify_object(store, name, expected)
    except ObjectCorruptError as err:
        if not created:
            raise ObjectConflictError(store.url, name, err.detail) from err
        with contextlib.suppress(ObjectStoreError):
            await store.delete(name)
        raise
    return StoredObject(name, expected.size, expected.sha256, created)
