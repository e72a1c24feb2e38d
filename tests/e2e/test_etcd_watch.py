"""The watch of etcd's command log against a real etcd member: every revision delivered once
and in order, also across restarted attempts; an attempt held back by a full apply queue
ends at once when cancelled. The watch stream that carries several logs' watches: one stream
at etcd, each key's events to its own watch, a watch that falls behind or is compacted fails
alone, a failed stream fails every watch on it and the next runs on the next endpoint."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from messaging.aio import cancel_and_wait
from messaging.config import EtcdSettings
from messaging.log.etcd import watch_stream
from messaging.log.etcd.apply import Revision
from messaging.log.etcd.client import CompactedError, EtcdClient
from messaging.log.etcd.progress import Progress
from messaging.log.etcd.startup import Startup
from messaging.log.etcd.watch import LogWatch
from messaging.log.etcd.watch_stream import FellBehind, KeyWatch, WatchStream
from tests.conftest import wait_until
from tests.e2e.test_etcd_log import EtcdCluster, serving

log = logging.getLogger(__name__)


@pytest.fixture(scope="module")
def one_member(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """One etcd member of its own for the module."""
    yield from serving(EtcdCluster(tmp_path_factory.mktemp("etcd-watch"), size=1))


def _stream(member: EtcdCluster, copies: int = 1) -> WatchStream:
    """A watch stream on the member (its URL ``copies`` times: endpoints to fail over to)."""
    url = member.members[0].client_url
    client = EtcdClient(EtcdSettings(endpoints=(url,) * copies, cluster="watch"))
    return WatchStream(client, [url] * copies)


def _watch(member: EtcdCluster, key: bytes,
           deliver: Callable[[Revision], Awaitable[None]],
           streams: WatchStream | None = None) -> LogWatch:
    async def never_compacted(revision: int) -> int:
        raise AssertionError(f"compacted at {revision}")

    return LogWatch(streams or _stream(member), key, Progress(), deliver, never_compacted,
                    Startup(log, key.decode(), grace=0.0))


async def test_every_revision_once_in_order_across_restarted_attempts(
        one_member: EtcdCluster) -> None:
    key = f"/watch/{uuid.uuid4().hex}".encode()
    got: list[int] = []

    async def deliver(revision: Revision) -> None:
        got.append(revision.revision)

    watch = _watch(one_member, key, deliver)
    running = asyncio.create_task(watch.run())
    try:
        await wait_until(lambda: _true(watch.live), 10, "the watch to be live")
        put: list[int] = []
        for round_ in range(3):
            for k in range(40):
                put.append(await watch.streams.client.put(key, b"r%d-%d" % (round_, k)))
            # Restart the attempt mid-stream, as the monitor does with a stuck one.
            now = time.monotonic()
            watch.restart_if_stuck(now, put[-1] + 1)
            watch.restart_if_stuck(now + 60, put[-1] + 1)
            await wait_until(functools.partial(_restarted, watch, round_ + 1), 10,
                             "a new attempt")
        for k in range(10):
            put.append(await watch.streams.client.put(key, b"last %d" % k))
        await wait_until(lambda: _true(len(got) >= len(put)), 10, "every revision delivered")
        await asyncio.sleep(0.2)  # nothing more may come
        assert got == put  # each once, in order
        assert watch.diagnostics()["restarts"] >= 3
    finally:
        await cancel_and_wait(running)
        await watch.streams.close()
        await watch.streams.client.close()


async def test_an_attempt_held_back_by_a_full_queue_ends_at_once_when_cancelled(
        one_member: EtcdCluster) -> None:
    key = f"/watch/{uuid.uuid4().hex}".encode()
    held = asyncio.Event()

    async def deliver(_revision: Revision) -> None:
        held.set()
        await asyncio.sleep(60)  # a queue that does not drain

    watch = _watch(one_member, key, deliver)
    running = asyncio.create_task(watch.run())
    try:
        await watch.streams.client.put(key, b"held")
        await wait_until(lambda: _true(held.is_set()), 10, "the delivery to be held back")
        started = time.monotonic()
        await cancel_and_wait(running)
        assert time.monotonic() - started < 2
        assert watch.received == 0  # not delivered: the queue never took it
    finally:
        await cancel_and_wait(running)
        await watch.streams.close()
        await watch.streams.client.close()


async def _etcd_watch_streams(member: EtcdCluster) -> tuple[int, int]:
    """etcd's count of open watch streams and watchers (its /metrics gauges)."""
    url = member.members[0].client_url
    text = await asyncio.to_thread(_read_text, f"{url}/metrics")
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("etcd_debugging_mvcc_watch_stream_total", "etcd_debugging_mvcc_watcher_total"):
            values[name] = int(float(value))
    return (values["etcd_debugging_mvcc_watch_stream_total"],
            values["etcd_debugging_mvcc_watcher_total"])


def _read_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


async def _next(watch: KeyWatch) -> Any:
    return await asyncio.wait_for(anext(watch), 10)


async def _events(watch: KeyWatch, count: int) -> list[bytes]:
    """The values of the next ``count`` events of ``watch``."""
    values: list[bytes] = []
    while len(values) < count:
        response = await _next(watch)
        values.extend(bytes(event.kv.value) for event in response.events)
    return values


async def test_several_logs_watched_on_one_stream_each_get_their_own_events(
        one_member: EtcdCluster) -> None:
    """Four log keys watched through one WatchStream make one watch stream at etcd with four
    watchers, and each watch gets its key's events, in order, and no other key's."""
    streams = _stream(one_member)
    keys = [f"/watch/{uuid.uuid4().hex}/{k}".encode() for k in range(4)]
    try:
        before = await _etcd_watch_streams(one_member)
        watches = [await streams.open(key, 0) for key in keys]
        for watch in watches:
            assert (await _next(watch)).created
        assert await _etcd_watch_streams(one_member) == (before[0] + 1, before[1] + 4)
        for n in range(5):
            for k, key in enumerate(keys):
                await streams.client.put(key, b"%d:%d" % (k, n))
        for k, watch in enumerate(watches):
            assert await _events(watch, 5) == [b"%d:%d" % (k, n) for n in range(5)]
        assert streams.streams == 1 and streams.watches() == 4
        watches[0].close()  # one closed: the others go on, etcd drops its watcher
        await streams.client.put(keys[1], b"after")
        assert await _events(watches[1], 1) == [b"after"]
        await wait_until(lambda: _now(one_member, (before[0] + 1, before[1] + 3)), 10,
                         "etcd to drop the closed watcher")
    finally:
        await streams.close()
        await streams.client.close()


async def test_a_watch_that_falls_behind_fails_alone(one_member: EtcdCluster,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A watch whose consumer does not read is cancelled once BUFFERED_RESPONSES wait, with
    FellBehind; the watch beside it on the same stream keeps getting its events."""
    monkeypatch.setattr(watch_stream, "BUFFERED_RESPONSES", 5)
    streams = _stream(one_member)
    slow_key, busy_key = (f"/watch/{uuid.uuid4().hex}".encode() for _ in range(2))
    try:
        slow = await streams.open(slow_key, 0)
        busy = await streams.open(busy_key, 0)
        assert (await _next(busy)).created
        for n in range(8):
            await streams.client.put(slow_key, b"s%d" % n)
            await streams.client.put(busy_key, b"b%d" % n)
            assert await _events(busy, 1) == [b"b%d" % n]
        with pytest.raises(FellBehind, match="fell 6 responses"):
            while True:
                await _next(slow)
        assert streams.watches() == 1 and streams.streams == 1
        await streams.client.put(busy_key, b"still")
        assert await _events(busy, 1) == [b"still"]
    finally:
        await streams.close()
        await streams.client.close()


async def test_a_compacted_start_fails_that_watch_alone(one_member: EtcdCluster) -> None:
    streams = _stream(one_member)
    key = f"/watch/{uuid.uuid4().hex}".encode()
    try:
        live = await streams.open(key, 0)
        assert (await _next(live)).created
        first = await streams.client.put(key, b"old")
        last = await streams.client.put(key, b"new")
        await streams.client.compact(last)
        compacted = await streams.open(key, first)
        with pytest.raises(CompactedError):
            while True:
                await _next(compacted)
        assert await _events(live, 2) == [b"old", b"new"]
        await streams.client.put(key, b"later")
        assert await _events(live, 1) == [b"later"]
    finally:
        await streams.close()
        await streams.client.close()


async def test_a_restarted_stream_fails_every_watch_and_runs_on_the_next_endpoint(
        one_member: EtcdCluster) -> None:
    """A stream restarted (a watch judged stuck) fails each watch on it; the watches opened
    next share one new stream, on the next endpoint, and miss nothing from where they ask."""
    streams = _stream(one_member, copies=2)
    keys = [f"/watch/{uuid.uuid4().hex}".encode() for _ in range(2)]
    try:
        watches = [await streams.open(key, 0) for key in keys]
        for watch in watches:
            assert (await _next(watch)).created
        assert streams.endpoint == 0
        streams.restart("stuck")
        for watch in watches:
            with pytest.raises(TimeoutError, match="stuck"):
                await _next(watch)
        assert streams.endpoint == 1 and streams.watches() == 0
        put = [await streams.client.put(key, b"meanwhile") for key in keys]
        again = [await streams.open(key, revision) for key, revision in zip(keys, put, strict=True)]
        for watch in again:
            assert await _events(watch, 1) == [b"meanwhile"]
        assert streams.streams == 2 and streams.watches() == 2
    finally:
        await streams.close()
        await streams.client.close()


async def _now(member: EtcdCluster, expected: tuple[int, int]) -> bool:
    return await _etcd_watch_streams(member) == expected


async def _true(value: bool) -> bool:
    return value


async def _restarted(watch: LogWatch, restarts: int) -> bool:
    return bool(watch.diagnostics()["restarts"] >= restarts and watch.live)

