"""Reading segment objects through the cache: a corrupt object is refused (its frames' indexes
too, which no CRC covers), and its bad bytes are not kept (tests/offload/test_faults.py found
a restored object still refused, and a damaged index delivered)."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from messaging.frames import decode
from messaging.objects import FileStore, ObjectCorruptError
from messaging.tiered.cache import ObjectCache
from messaging.tiered.manifest import SegmentObject
from messaging.tiered.metrics import StoreMetrics
from messaging.tiered.objects import SegmentObjectReader
from tests.conftest import frames

TOPIC = 7


async def object_and_reader(tmp_path: Path, data: bytes,
                            ) -> tuple[SegmentObject, SegmentObjectReader, Path, ObjectCache]:
    root = tmp_path / "store"
    root.mkdir()
    store = FileStore(root)
    obj = SegmentObject(1, 20, len(data), 20, hashlib.sha256(data).hexdigest())
    name = obj.name(TOPIC).name
    await store.put_if_absent(name, data)
    cache = ObjectCache(store, asyncio.get_running_loop(), 1 << 20,
                        StoreMetrics(CollectorRegistry()), chunk=256)
    return obj, SegmentObjectReader(cache, TOPIC), root.joinpath(*name.split("/")), cache


async def test_a_corrupt_object_is_read_again_once_put_right(tmp_path: Path) -> None:
    data = frames(TOPIC, range(1, 21))
    obj, reader, path, cache = await object_and_reader(tmp_path, data)
    damaged = bytearray(data)
    damaged[len(data) // 2 + 12] ^= 0xFF  # inside the 11th frame's data
    await asyncio.to_thread(path.write_bytes, bytes(damaged))

    def read_whole() -> bytes:
        _start, found = reader.frames(obj, 0, 0, len(data))
        return found.data

    with pytest.raises(ObjectCorruptError, match="checksum"):
        await asyncio.to_thread(read_whole)
    assert cache.size < len(data)  # the damaged chunks are not kept
    await asyncio.to_thread(path.write_bytes, data)
    got = await asyncio.to_thread(read_whole)
    messages, _used = decode(got)
    assert [m.index for m in messages] == list(range(1, 21))


@pytest.mark.parametrize("frame", [0, 1, 19])
@pytest.mark.parametrize("byte", [0, 7])
async def test_a_damaged_index_is_never_delivered(tmp_path: Path, frame: int,
                                                  byte: int) -> None:
    """An index byte flipped (outside the CRC), in the first, a middle or the last frame:
    above the object's last index or out of order, it is refused, from the object's start
    as from a later frame."""
    data = frames(TOPIC, range(1, 21))
    obj, reader, path, _cache = await object_and_reader(tmp_path, data)
    at = len(frames(TOPIC, range(1, frame + 1))) if frame else 0
    damaged = bytearray(data)
    damaged[at + byte] ^= 0x80
    await asyncio.to_thread(path.write_bytes, bytes(damaged))
    with pytest.raises(ObjectCorruptError, match=r"index \d+ does not follow|index above"):
        await asyncio.to_thread(reader.frames, obj, 0, 0, len(data))
