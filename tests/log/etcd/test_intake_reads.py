"""Fetching what pointers name: one GET per object per node when it applies every log the
object serves, ranges otherwise; failures are tried again, never cached."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from crc32c import crc32c
from prometheus_client import CollectorRegistry

from messaging.log.etcd.entry import body_of
from messaging.log.etcd.intake_metrics import IntakeMetrics
from messaging.log.etcd.intake_reads import IntakeFetchError, IntakeReads, LogReads
from messaging.log.etcd.pointer import Pointer
from messaging.objects.file import FileStore

LOGS = ("/messaging/c~g0/log", "/messaging/c~g1/log")


class CountingStore(FileStore):
    """A file store that counts its ranged reads and can be made to fail them."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.ranges: list[tuple[str, int, int]] = []
        self.down = False

    async def get_range(self, name: str, start: int, end: int) -> bytes:
        self.ranges.append((name, start, end))
        if self.down:
            from messaging.objects.errors import StoreUnreachableError

            raise StoreUnreachableError(self.url, name, "connection refused")
        return await super().get_range(name, start, end)


async def _object(store: CountingStore) -> tuple[list[Pointer], list[bytes]]:
    bodies = [body_of([b"group zero"] * 3), body_of([b"group one"] * 2)]
    data = b"".join(bodies)
    await store.put_if_absent("intake/n-000000000001-00000000", data)
    store.ranges.clear()  # the upload's own read back
    pointers = [Pointer("intake/n-000000000001-00000000", 0, len(bodies[0]),
                        crc32c(bodies[0]), len(data), 3, LOGS),
                Pointer("intake/n-000000000001-00000000", len(bodies[0]), len(bodies[1]),
                        crc32c(bodies[1]), len(data), 2, LOGS)]
    return pointers, bodies


def _reads(store: FileStore, held: set[str]) -> tuple[IntakeReads, IntakeMetrics]:
    return IntakeReads(store, timeout=2.0, held=lambda: held), IntakeMetrics(CollectorRegistry())


async def test_a_node_holding_every_log_gets_the_object_once(tmp_path: Path) -> None:
    store = CountingStore(tmp_path)
    pointers, bodies = await _object(store)
    reads, metrics = _reads(store, set(LOGS))
    got = await asyncio.gather(*(reads.read(p, metrics) for p in pointers))
    assert got == bodies
    assert store.ranges == [(pointers[0].name, 0, pointers[0].size)]
    assert reads.describe()["held"] == 0  # both logs read it: dropped


async def test_a_node_holding_some_logs_gets_its_ranges(tmp_path: Path) -> None:
    store = CountingStore(tmp_path)
    pointers, bodies = await _object(store)
    reads, metrics = _reads(store, {LOGS[1]})
    assert await reads.read(pointers[1], metrics) == bodies[1]
    assert store.ranges == [(pointers[1].name, pointers[1].offset, pointers[1].end)]


async def test_a_failed_fetch_is_not_kept(tmp_path: Path) -> None:
    store = CountingStore(tmp_path)
    pointers, bodies = await _object(store)
    reads, metrics = _reads(store, set(LOGS))
    store.down = True
    with pytest.raises(IntakeFetchError, match="store unreachable"):
        await reads.read(pointers[0], metrics)
    store.down = False
    assert await reads.read(pointers[0], metrics) == bodies[0]
    assert len(store.ranges) == 2


async def test_the_writer_thread_waits_for_the_loops_fetch(tmp_path: Path) -> None:
    store = CountingStore(tmp_path)
    pointers, bodies = await _object(store)
    reads, metrics = _reads(store, set(LOGS))
    log = LogReads(reads, metrics)
    log.prefetch(pointers[0])  # the watch's delivery, on the loop
    assert await asyncio.to_thread(log.fetch, pointers[0]) == bodies[0]
    store.down = True  # the other log's range comes from the object already fetched
    assert await asyncio.to_thread(log.fetch, pointers[1]) == bodies[1]
    assert len(store.ranges) == 1
    store.down = False
    missing = Pointer("intake/n-000000000002-00000000", 0, 4, 0, 4, 1, LOGS[:1])
    log.prefetch(missing)
    with pytest.raises(IntakeFetchError, match="intake/n-000000000002"):
        await asyncio.to_thread(log.fetch, missing)
