"""The watch of etcd's command log against a real etcd member: every revision delivered once
and in order, also across restarted attempts; an attempt held back by a full apply queue
ends at once when cancelled."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator

import pytest

from messaging.aio import cancel_and_wait
from messaging.config import EtcdSettings
from messaging.log.etcd.apply import Revision
from messaging.log.etcd.client import EtcdClient
from messaging.log.etcd.progress import Progress
from messaging.log.etcd.startup import Startup
from messaging.log.etcd.watch import LogWatch
from tests.conftest import wait_until
from tests.e2e.test_etcd_log import EtcdCluster, serving

log = logging.getLogger(__name__)


@pytest.fixture(scope="module")
def one_member(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """One etcd member of its own for the module."""
    yield from serving(EtcdCluster(tmp_path_factory.mktemp("etcd-watch"), size=1))


def _watch(member: EtcdCluster, key: bytes,
           deliver: Callable[[Revision], Awaitable[None]]) -> LogWatch:
    url = member.members[0].client_url
    client = EtcdClient(EtcdSettings(endpoints=(url,), cluster="watch"))

    async def never_compacted(revision: int) -> int:
        raise AssertionError(f"compacted at {revision}")

    return LogWatch(client, key, [url], Progress(), deliver, never_compacted,
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
                put.append(await watch.client.put(key, b"r%d-%d" % (round_, k)))
            # Restart the attempt mid-stream, as the monitor does with a stuck one.
            now = time.monotonic()
            watch.restart_if_stuck(now, put[-1] + 1)
            watch.restart_if_stuck(now + 60, put[-1] + 1)
            await wait_until(functools.partial(_restarted, watch, round_ + 1), 10,
                             "a new attempt")
        for k in range(10):
            put.append(await watch.client.put(key, b"last %d" % k))
        await wait_until(lambda: _true(len(got) >= len(put)), 10, "every revision delivered")
        await asyncio.sleep(0.2)  # nothing more may come
        assert got == put  # each once, in order
        assert watch.diagnostics()["restarts"] >= 3
    finally:
        await cancel_and_wait(running)
        await watch.client.close()


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
        await watch.client.put(key, b"held")
        await wait_until(lambda: _true(held.is_set()), 10, "the delivery to be held back")
        started = time.monotonic()
        await cancel_and_wait(running)
        assert time.monotonic() - started < 2
        assert watch.received == 0  # not delivered: the queue never took it
    finally:
        await cancel_and_wait(running)
        await watch.client.close()


async def _true(value: bool) -> bool:
    return value


async def _restarted(watch: LogWatch, restarts: int) -> bool:
    return bool(watch.diagnostics()["restarts"] >= restarts and watch.live)

