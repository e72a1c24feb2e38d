"""The embedded log's writer thread: deferred fsyncs by mode, and a writer that cannot be
stopped by a failed flush or leave a publish unanswered."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from messaging.broker.broker import Broker
from messaging.broker.commands import validate_publish
from messaging.errors import BrokerClosedError
from messaging.frames import encode_batch
from messaging.log.local import FSYNC_INTERVAL, DeferredSync, LocalLog, WriterWakeup
from tests.conftest import StartServer
from tests.listening import followers_heard_first


def command(topic: int = 5) -> bytes:
    """A validated one-message publish."""
    return validate_publish(encode_batch(topic, [b"x"]))


async def test_a_stream_deleted_before_the_interval_fsync_leaves_writes_working(
        start_server: StartServer, http: aiohttp.ClientSession) -> None:
    """The deferred fsync of a topic whose stream was deleted meanwhile skips it; writes go
    on (the flush once raised for the missing topic and took the writer down)."""
    server = await start_server(fsync="interval")
    url = f"{server.url}/v1/stream"
    headers = {"Content-Type": "application/octet-stream"}
    async with http.put(f"{url}/gone", headers=headers) as resp:
        assert resp.status == 201
    async with http.post(f"{url}/gone", data=b"data", headers=headers) as resp:
        assert resp.status == 204
    async with http.delete(f"{url}/gone") as resp:
        assert resp.status == 204
    await asyncio.sleep(FSYNC_INTERVAL * 3)  # a flush ran over the removed topic
    async with http.put(f"{url}/next", headers=headers) as resp:
        assert resp.status == 201, await resp.text()
    async with http.post(f"{server.url}/messaging/messages", params={"topicID": "3"},
                         data=b"native") as resp:
        assert resp.status == 200, await resp.text()


async def test_a_failed_flush_is_logged_and_writes_go_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    broker = await asyncio.to_thread(Broker.open, tmp_path)
    log = LocalLog(broker, "http://test", fsync="interval")
    failures = [RuntimeError("flush broke")]

    def flush(self: DeferredSync) -> None:
        if failures:
            raise failures.pop()

    monkeypatch.setattr(DeferredSync, "flush", flush)
    await log.start()
    try:
        await log.apply(command())
        await asyncio.sleep(FSYNC_INTERVAL * 3)
        assert not failures
        assert (await asyncio.wait_for(log.apply(command()), 10)).count == 1
    finally:
        await log.close()
        await asyncio.to_thread(broker.close)
    assert "periodic fsync failed" in caplog.text


@pytest.mark.e2e  # slow: over a third of a second
async def test_never_fsyncs_only_when_closing(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    broker = await asyncio.to_thread(Broker.open, tmp_path)
    synced: list[float] = []
    real = Broker.sync

    def counting(self: Broker, topic_ids: object) -> None:
        synced.append(time.monotonic())
        real(self, topic_ids)  # type: ignore[arg-type]

    monkeypatch.setattr(Broker, "sync", counting)
    log = LocalLog(broker, "http://test", fsync="never")
    await log.start()
    await log.apply(command())
    await asyncio.sleep(FSYNC_INTERVAL * 4)
    assert synced == []  # no periodic fsync in this mode
    await log.close()
    assert len(synced) == 1  # the written topic, fsynced once on the way out
    await asyncio.to_thread(broker.close)


async def test_a_writer_that_ends_answers_every_queued_publish(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """If the writer thread ends for any reason, publishes queued behind it are answered
    (503: the broker's writer stopped), never left waiting; later ones are refused."""
    broker = await asyncio.to_thread(Broker.open, tmp_path)
    log = LocalLog(broker, "http://test", fsync="interval")
    inside = threading.Event()

    def flush(self: DeferredSync) -> None:
        inside.set()
        time.sleep(0.2)  # a publish queues up meanwhile
        raise SystemExit("the thread is told to end")

    monkeypatch.setattr(DeferredSync, "flush", flush)
    monkeypatch.setattr(threading, "excepthook", lambda args: None)
    await log.start()
    await asyncio.get_running_loop().run_in_executor(None, inside.wait, 5)
    with pytest.raises(BrokerClosedError):
        await asyncio.wait_for(log.apply(command()), 10)
    with pytest.raises(BrokerClosedError):
        await log.apply(command())
    await log.close()
    await asyncio.to_thread(broker.close)


async def test_the_periodic_flush_hands_the_executor_nothing_while_idle(
        tmp_path: Path) -> None:
    """A cluster node runs :meth:`DeferredSync.run` per group log: an idle tick must not wake
    the writer thread (ten times a second per group adds up); a written topic is flushed at
    the next tick."""
    from concurrent.futures import ThreadPoolExecutor

    broker = await asyncio.to_thread(Broker.open, tmp_path)
    jobs: list[object] = []

    class Counting(ThreadPoolExecutor):
        def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            jobs.append(fn)
            return super().submit(fn, *args, **kwargs)

    executor = Counting(max_workers=1)
    unsynced = DeferredSync(broker)
    running = asyncio.create_task(unsynced.run(executor, interval=0.01))
    try:
        await asyncio.sleep(0.2)  # about twenty idle ticks
        assert jobs == []
        await asyncio.to_thread(broker.write_group, [command(7)], durable=False)
        unsynced.add([7])
        for _ in range(200):
            if jobs and not unsynced.pending:
                break
            await asyncio.sleep(0.01)
        assert len(jobs) == 1 and not unsynced.pending
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        executor.shutdown()
        await asyncio.to_thread(broker.close)


async def test_followers_hear_of_a_commit_before_its_publisher_is_answered(
        tmp_path: Path) -> None:
    """A durable group wakes the fan-out of its topics first and answers its publishers
    after: the message reaches the streams that wait for it without waiting for the answers
    (each a turn of a handler task) to be written."""
    broker = await asyncio.to_thread(Broker.open, tmp_path)
    log = LocalLog(broker, "http://test", fsync="always")
    await log.start()
    try:
        await log.apply(command())  # the topic exists from here on
        topic = broker.store.get(5)
        assert topic is not None
        assert await followers_heard_first(topic, lambda: log.apply(command()))
    finally:
        await log.close()
        await asyncio.to_thread(broker.close)


def test_the_writer_sleeps_only_without_work_and_a_ring_wakes_it() -> None:
    """WriterWakeup: no sleep when work is there; a ring wakes a sleeping writer; a sleep
    with a limit ends at it; a ring while nobody sleeps leaves nothing pending."""
    wakeup = WriterWakeup()
    started = time.monotonic()
    wakeup.sleep(lambda: True, None)  # work queued: no sleep at all
    assert time.monotonic() - started < 1.0
    started = time.monotonic()
    wakeup.sleep(lambda: False, 0.05)  # nobody rings: the limit ends it
    assert time.monotonic() - started >= 0.04
    wakeup.ring()  # nobody asleep: nothing is left pending for the next sleep
    started = time.monotonic()
    wakeup.sleep(lambda: False, 0.05)
    assert time.monotonic() - started >= 0.04
    woke, checked = threading.Event(), threading.Event()

    def nothing_queued() -> bool:
        checked.set()  # asked under the lock a ring takes: a ring from now on wakes it
        return False

    def writer() -> None:
        wakeup.sleep(nothing_queued, None)
        woke.set()

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    assert checked.wait(10)
    wakeup.ring()
    assert woke.wait(10)
    thread.join(10)


def test_no_ring_is_lost_between_a_writer_and_a_busy_loop() -> None:
    """Thousands of queue-then-ring against check-then-sleep: every item is taken, none
    waits for a sleep's limit (the writer sleeps without one)."""
    wakeup = WriterWakeup()
    queued: deque[int] = deque()
    total = 20_000
    taken: list[int] = []

    def writer() -> None:
        while len(taken) < total:
            wakeup.sleep(lambda: bool(queued), None)
            while queued:
                taken.append(queued.popleft())

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    for k in range(total):
        queued.append(k)
        wakeup.ring()
        if k % 97 == 0:
            time.sleep(0)  # let the writer fall asleep now and then
    thread.join(30)
    assert not thread.is_alive(), f"{len(taken)} of {total} taken: a ring was lost"
    assert taken == list(range(total))
