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
from tests.conftest import free_port, wait_until
from tests.e2e.test_etcd_log import EtcdCluster, serving

log = logging.getLogger(__name__)


@pytest.fixture(scope="module")
def one_member(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """One etcd member of its own for the module."""
    yield from serving(EtcdCluster(tmp_path_factory.mktemp("etcd-watch"), size=1))


def _stream(member: EtcdCluster, copies: int = 1, *, dead_first: bool = False) -> WatchStream:
    """A watch stream on the member (its URL ``copies`` times: endpoints to fail over to;
    ``dead_first``: behind an endpoint where nothing listens)."""
    urls = [member.members[0].client_url] * copies
    if dead_first:
        urls.insert(0, f"http://127.0.0.1:{free_port()}")
    client = EtcdClient(EtcdSettings(endpoints=tuple(urls), cluster="watch"))
    return WatchStream(client, urls)


async def _room() -> None:
    """An apply queue that always has room."""


def _watch(member: EtcdCluster, key: bytes, deliver: Callable[[Revision], None],
           streams: WatchStream | None = None,
           room: Callable[[], Awaitable[None]] = _room) -> LogWatch:
    async def never_compacted(revision: int) -> int:
        raise AssertionError(f"compacted at {revision}")

    return LogWatch(streams or _stream(member), key, Progress(), deliver, room,
                    never_compacted, Startup(log, key.decode(), grace=0.0))


async def test_every_revision_once_in_order_across_restarted_attempts(
        one_member: EtcdCluster) -> None:
    key = f"/watch/{uuid.uuid4().hex}".encode()
    got: list[int] = []

    def deliver(revision: Revision) -> None:
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


async def test_an_attempt_held_back_by_a_full_queue_is_not_stuck_and_delivers_once(
        one_member: EtcdCluster) -> None:
    """A revision is queued once: the attempt held back by a full apply queue is not judged
    stuck (however long), ends at once when cancelled, and the next attempt goes on after
    what was queued (a revision delivered twice would get other indexes here than on the
    other nodes)."""
    key = f"/watch/{uuid.uuid4().hex}".encode()
    got: list[int] = []
    full = asyncio.Event()
    full.set()

    def deliver(revision: Revision) -> None:
        got.append(revision.revision)

    async def room() -> None:
        while full.is_set():  # a queue that does not drain (bounded: the test ends first)
            await asyncio.sleep(0.01)

    watch = _watch(one_member, key, deliver, room=room)
    running = asyncio.create_task(watch.run())
    try:
        first = await watch.streams.client.put(key, b"held")
        second = await watch.streams.client.put(key, b"next")
        await wait_until(lambda: _true(got == [first]), 10, "the delivery to be held back")
        watch.restart_if_stuck(time.monotonic() + 60, first + 5)
        assert watch.diagnostics()["restarts"] == 0 and not running.done()
        started = time.monotonic()
        await cancel_and_wait(running)
        assert time.monotonic() - started < 2
        assert watch.received == first  # queued, so never delivered again
        full.clear()
        running = asyncio.create_task(watch.run())
        last = await watch.streams.client.put(key, b"last")
        await wait_until(lambda: _true(bool(got) and got[-1] == last), 10, "the rest")
        assert got == [first, second, last]
        assert watch.streams.generation == 1  # one watch cancelled: its stream went on
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
        assert streams.generation == 1 and streams.watches() == 4
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
    """A watch whose consumer does not read is cancelled once more than BUFFERED_RESPONSES
    wait: its consumer still gets what it held, then FellBehind; the watch beside it on the
    same stream keeps getting its events, never held back."""
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
        held: list[bytes] = []
        with pytest.raises(FellBehind, match="fell 6 responses"):
            while True:
                response = await _next(slow)
                held.extend(bytes(event.kv.value) for event in response.events)
        assert held == [b"s%d" % n for n in range(5)]  # created + 5: what it held
        assert streams.watches() == 1 and streams.generation == 1
        await streams.client.put(busy_key, b"still")
        assert await _events(busy, 1) == [b"still"]
    finally:
        await streams.close()
        await streams.client.close()


async def test_a_log_watch_that_falls_behind_gets_every_revision_once_in_order(
        one_member: EtcdCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """An apply slower than etcd sends: its watch falls behind and is opened again after what
    it held, as often as it takes, and every revision arrives once, in order."""
    monkeypatch.setattr(watch_stream, "BUFFERED_RESPONSES", 5)
    key = f"/watch/{uuid.uuid4().hex}".encode()
    got: list[int] = []

    async def slow() -> None:
        await asyncio.sleep(0.02)

    watch = _watch(one_member, key, lambda r: got.append(r.revision), room=slow)
    running = asyncio.create_task(watch.run())
    try:
        await wait_until(lambda: _true(watch.live), 10, "the watch to be live")
        put = [await watch.streams.client.put(key, b"%d" % n) for n in range(40)]
        await wait_until(lambda: _true(len(got) >= len(put)), 20, "every revision")
        await asyncio.sleep(0.2)  # nothing more may come
        assert got == put
        assert watch.diagnostics()["restarts"] >= 1  # it did fall behind
        assert watch.streams.generation == 1  # and only its own watch was opened again
    finally:
        await cancel_and_wait(running)
        await watch.streams.close()
        await watch.streams.client.close()


async def test_a_watch_etcd_refuses_fails_the_stream_and_the_next_one_serves(
        one_member: EtcdCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """etcd refuses a watch (here: its id is taken, made so by the test; an expired token or
    a permission looks the same: a cancel, of watch -1 for a refused create): the stream
    fails for every watch on it, and the watches opened next run on a new one."""
    streams = _stream(one_member)
    key = f"/watch/{uuid.uuid4().hex}".encode()
    try:
        live = await streams.open(key, 0)
        assert (await _next(live)).created
        head = await streams.client.put(key, b"now")
        create = EtcdClient.watch_create
        with monkeypatch.context() as patch:
            patch.setattr(streams.client, "watch_create",
                          lambda key, start, _watch_id=0: create(key, start, live.watch_id))
            refused = await streams.open(key, head)
        for watch in (refused, live):
            with pytest.raises(ConnectionError, match=r"cancelled a watch.*duplicate"):
                while True:
                    await _next(watch)
        again = await streams.open(key, head)
        assert await _events(again, 1) == [b"now"]
        assert streams.generation == 2
    finally:
        await streams.close()
        await streams.client.close()


async def test_a_watch_etcd_does_not_confirm_fails_the_stream(
        one_member: EtcdCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watch_stream, "CREATED_WITHIN", 0.0)
    streams = _stream(one_member)
    try:
        watch = await streams.open(f"/watch/{uuid.uuid4().hex}".encode(), 0)
        with pytest.raises(TimeoutError, match="did not confirm"):
            while True:
                await _next(watch)
        assert streams.watches() == 0
    finally:
        await streams.close()
        await streams.client.close()


async def test_a_log_watch_whose_first_endpoint_is_down_goes_live_on_the_next(
        one_member: EtcdCluster) -> None:
    key = f"/watch/{uuid.uuid4().hex}".encode()
    got: list[int] = []
    watch = _watch(one_member, key, lambda r: got.append(r.revision),
                   streams=_stream(one_member, dead_first=True))
    running = asyncio.create_task(watch.run())
    try:
        await wait_until(lambda: _true(watch.live), 10, "the watch to be live")
        revision = await watch.streams.client.put(key, b"x")
        await wait_until(lambda: _true(got == [revision]), 10, "the revision")
        assert watch.streams.endpoint == 1
    finally:
        await cancel_and_wait(running)
        await watch.streams.close()
        await watch.streams.client.close()


async def test_a_log_watch_held_back_by_its_apply_does_not_restart_its_neighbours_stream(
        one_member: EtcdCluster) -> None:
    """Two logs on one stream; one's apply queue stays full and the monitor asks whether it
    is stuck: it is not (nothing restarts), and the other log keeps getting its revisions."""
    streams = _stream(one_member)
    keys = [f"/watch/{uuid.uuid4().hex}".encode() for _ in range(2)]
    got: list[list[int]] = [[], []]

    async def full() -> None:
        await asyncio.sleep(60)  # bounded: the test cancels it first

    watches = [_watch(one_member, keys[0], lambda r: got[0].append(r.revision), streams,
                      room=full),
               _watch(one_member, keys[1], lambda r: got[1].append(r.revision), streams)]
    running = [asyncio.create_task(w.run()) for w in watches]
    try:
        for watch in watches:
            await wait_until(functools.partial(_live, watch), 10, "both watches live")
        held = await streams.client.put(keys[0], b"held")
        await wait_until(lambda: _true(got[0] == [held]), 10, "the held revision")
        later = [await streams.client.put(keys[0], b"more")]
        for _ in range(3):
            watches[0].restart_if_stuck(time.monotonic() + 60, later[-1] + 1)
            later.append(await streams.client.put(keys[1], b"other"))
        await wait_until(lambda: _true(got[1] == later[1:]), 10, "the other log's revisions")
        assert streams.generation == 1
        assert [w.diagnostics()["restarts"] for w in watches] == [0, 0]
    finally:
        for task in running:
            await cancel_and_wait(task)
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
        streams.restart("stuck", streams.generation)
        for watch in watches:
            with pytest.raises(TimeoutError, match="stuck"):
                await _next(watch)
        assert streams.endpoint == 1 and streams.watches() == 0
        put = [await streams.client.put(key, b"meanwhile") for key in keys]
        again = [await streams.open(key, revision) for key, revision in zip(keys, put, strict=True)]
        for watch in again:
            assert await _events(watch, 1) == [b"meanwhile"]
        assert streams.generation == 2 and streams.watches() == 2
    finally:
        await streams.close()
        await streams.client.close()


async def _now(member: EtcdCluster, expected: tuple[int, int]) -> bool:
    return await _etcd_watch_streams(member) == expected


async def _live(watch: LogWatch) -> bool:
    return watch.live


async def _true(value: bool) -> bool:
    return value


async def _restarted(watch: LogWatch, restarts: int) -> bool:
    return bool(watch.diagnostics()["restarts"] >= restarts and watch.live)

