"""The chunk cache: bounded, one request per chunk however many readers want it, a slow
store is unreachable for every waiter (503), never a cancelled request (500)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from prometheus_client import CollectorRegistry

from messaging.objects.errors import StoreUnreachableError
from messaging.objects.store import ObjectInfo, Source, StoredObject
from messaging.tiered.cache import ObjectCache
from messaging.tiered.metrics import StoreMetrics

DATA = bytes(range(256)) * 64  # 16 KiB


class FakeStore:
    """An in-memory store that counts ranged GETs and can be slow."""

    url = "mem://fake"

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.gets: list[tuple[str, int, int]] = []

    async def get_range(self, name: str, start: int, end: int) -> bytes:
        self.gets.append((name, start, end))
        await asyncio.sleep(self.delay)
        return DATA[start:end]

    async def put_if_absent(self, name: str, source: Source, *,
                            sha256: str | None = None) -> StoredObject:
        raise NotImplementedError

    async def put_new(self, name: str, data: bytes) -> bool:
        raise NotImplementedError

    async def size(self, name: str) -> int:
        return len(DATA)

    async def list(self, prefix: str = "") -> Sequence[ObjectInfo]:
        return []

    async def delete(self, name: str) -> None:
        return None


def cache_of(store: FakeStore, max_bytes: int, timeout: float = 5.0) -> ObjectCache:
    return ObjectCache(store, asyncio.get_running_loop(), max_bytes,
                       StoreMetrics(CollectorRegistry()), chunk=4096, timeout=timeout)


async def test_reads_span_chunks_and_stay_within_the_bound() -> None:
    store = FakeStore()
    cache = cache_of(store, max_bytes=8192)
    assert await asyncio.to_thread(cache.read, "o", len(DATA), 1000, 9000) == DATA[1000:9000]
    assert len(store.gets) == 3 and cache.size <= 8192
    assert await asyncio.to_thread(cache.read, "o", len(DATA), 8192, 8200) == DATA[8192:8200]
    assert len(store.gets) == 3  # the newest chunk is still cached
    assert await asyncio.to_thread(cache.read, "o", len(DATA), 0, 10) == DATA[:10]
    assert len(store.gets) == 4  # the oldest was dropped to stay within the bound
    assert cache.metrics.cache_hits._value.get() == 1


async def test_concurrent_readers_and_a_prefetch_share_one_request() -> None:
    store = FakeStore(delay=0.2)
    cache = cache_of(store, max_bytes=1 << 20)
    cache.prefetch("o", len(DATA), 4096)
    got = await asyncio.gather(*(asyncio.to_thread(cache.read, "o", len(DATA), 4096, 5000)
                                 for _ in range(4)))
    assert all(g == DATA[4096:5000] for g in got)
    assert store.gets == [("o", 4096, 8192)]


async def test_a_slow_store_is_unreachable_for_every_waiter() -> None:
    store = FakeStore(delay=3.0)
    cache = cache_of(store, max_bytes=1 << 20, timeout=0.5)

    async def read_later(delay: float) -> BaseException | bytes:
        await asyncio.sleep(delay)
        try:
            return await asyncio.to_thread(cache.read, "o", len(DATA), 0, 100)
        except Exception as err:  # what each waiter gets is the point
            return err

    results = await asyncio.gather(read_later(0), read_later(0.3))
    assert all(isinstance(r, StoreUnreachableError) for r in results), results
    assert all("mem://fake" in str(r) and "o" in str(r) for r in results)
    with pytest.raises(StoreUnreachableError):  # and the next read asks again
        await asyncio.to_thread(cache.read, "o", len(DATA), 0, 100)
    assert len(store.gets) == 2
