"""The applier's linger: a steady stream of other nodes' revisions is applied a batch at a time,
while this node's own puts, a revision after a quiet spell and anyone waiting are never held
back by it. A real broker and writer thread; revisions are delivered as the watch would."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from messaging.broker.broker import Broker
from messaging.broker.commands import validate_publish
from messaging.errors import BrokerClosedError, StorageFailedError
from messaging.frames import encode_batch
from messaging.log.etcd.apply import LINGER_REVISIONS, Applier, Revision
from messaging.log.etcd.checkpoint import Checkpoints
from messaging.log.etcd.entry import encode_entry, entry_writer
from messaging.log.etcd.progress import Progress
from messaging.log.etcd.writer import LogWriter
from messaging.log.local import DeferredSync
from messaging.log.serial import SerialExecutor
from tests.listening import followers_heard_first

THIS_NODE = b"this-nod"
OTHER_NODE = b"other-no"
LINGER = 0.5  # long, so that "not yet applied" is not a race with the timer
TOPIC = 9


@dataclass
class Answers:
    """What the applier hands this node's writer: the answers of its own puts."""

    node_id: bytes = THIS_NODE
    answered: list[tuple[bytes, int]] = field(default_factory=list)

    def answer(self, node: bytes, seq: int, results: Any, timing: Any) -> None:
        if node == self.node_id:
            self.answered.append((node, seq))

    def fail_waiting(self, error: Any, failure: Any) -> None:
        raise AssertionError(f"the applier stopped: {failure}")


@dataclass
class Setup:
    applier: Applier
    progress: Progress
    answers: Answers
    revision: int = 0

    def entry(self, node: bytes) -> Revision:
        """The next revision, one put of ``node`` holding one message."""
        self.revision += 1
        value = encode_entry(node, self.revision,
                             [validate_publish(encode_batch(TOPIC, [b"m%d" % self.revision]))])
        return Revision(self.revision, value, time.monotonic())

    def applied(self) -> int:
        """The revision applied through (one message each)."""
        return self.progress.applied


@contextlib.asynccontextmanager
async def applier_on(path: Path, linger: float,
                     answers: Answers | None = None) -> AsyncIterator[Setup]:
    """An applier with ``linger`` over a real broker in ``path`` and its writer thread
    (``answers``: what stands for this node's writer; by default one that fails the test
    when the applier stops)."""
    broker = await asyncio.to_thread(Broker.open, path)
    writer = SerialExecutor("messaging-writer")
    progress = Progress()
    unsynced = DeferredSync(broker)
    checkpoints = Checkpoints(broker, "test", progress, unsynced)
    answers = answers if answers is not None else Answers()
    applier = Applier(broker, writer, cast(LogWriter, answers), progress, checkpoints,
                      unsynced, b"/messaging/test/log", linger=linger)
    try:
        yield Setup(applier, progress, answers)
    finally:
        applier.close()
        await asyncio.to_thread(writer.shutdown)
        await asyncio.to_thread(broker.close)


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    async with applier_on(tmp_path, LINGER) as made:
        yield made


async def until_applied(setup: Setup, count: int, within: float) -> float:
    """Seconds until ``count`` messages are applied (fails after ``within``)."""
    started = time.monotonic()
    while setup.applied() < count:
        assert time.monotonic() - started < within, (
            f"{setup.applied()} of {count} messages applied after {within}s")
        await asyncio.sleep(0.005)
    return time.monotonic() - started


async def settled() -> None:
    """Let the writer thread finish the drain under way (its tail: the checkpoint check, the
    next drain's check), well within the linger: a busy writer takes what comes at once."""
    await asyncio.sleep(0.05)


def test_entry_writer_reads_the_node_from_the_header_alone() -> None:
    value = encode_entry(OTHER_NODE, 3, [b"x" * 600])  # compressed body: header untouched
    assert entry_writer(value) == OTHER_NODE
    assert entry_writer(b"short") == b""


async def test_a_stream_of_other_nodes_revisions_is_applied_a_batch_per_linger(
        setup: Setup) -> None:
    applier = setup.applier
    applier.deliver(setup.entry(OTHER_NODE))  # after a quiet spell: at once
    assert await until_applied(setup, 1, LINGER * 0.8) < LINGER * 0.8
    await settled()
    batches = applier.cost.batches
    for _ in range(5):  # within the linger of that drain: they wait for the next one
        applier.deliver(setup.entry(OTHER_NODE))
    await asyncio.sleep(LINGER * 0.3)
    assert setup.applied() == 1
    await until_applied(setup, 6, LINGER * 3)
    assert applier.cost.batches == batches + 1  # the five went in one batch
    report = applier.cost.report(60)
    assert report["revisions_per_apply"] == 3.0  # 6 revisions in 2 batches


async def test_a_revision_of_this_node_is_applied_at_once_with_what_waits(
        setup: Setup) -> None:
    applier = setup.applier
    applier.deliver(setup.entry(OTHER_NODE))
    await until_applied(setup, 1, LINGER * 0.8)
    await settled()
    applier.deliver(setup.entry(OTHER_NODE))  # lingers
    applier.deliver(setup.entry(THIS_NODE))  # its publisher waits: no linger
    assert await until_applied(setup, 3, LINGER * 0.8) < LINGER * 0.8
    assert setup.answers.answered == [(THIS_NODE, 3)]


async def test_waiting_for_the_applier_ends_a_linger(setup: Setup) -> None:
    applier = setup.applier
    applier.deliver(setup.entry(OTHER_NODE))
    await until_applied(setup, 1, LINGER * 0.8)
    await settled()
    applier.deliver(setup.entry(OTHER_NODE))
    started = time.monotonic()
    await asyncio.wait_for(applier.drained(), LINGER * 3)
    assert time.monotonic() - started < LINGER * 0.8
    assert setup.applied() == 2


async def test_a_full_half_of_the_inbox_is_applied_without_waiting(setup: Setup) -> None:
    applier = setup.applier
    applier.deliver(setup.entry(OTHER_NODE))
    await until_applied(setup, 1, LINGER * 0.8)
    await settled()
    for _ in range(LINGER_REVISIONS):
        applier.deliver(setup.entry(OTHER_NODE))
    assert await until_applied(setup, 1 + LINGER_REVISIONS, LINGER * 0.8) < LINGER * 0.8


async def test_a_linger_of_zero_applies_each_revision_as_it_comes(tmp_path: Path) -> None:
    async with applier_on(tmp_path, 0) as setup:
        for count in range(1, 4):
            setup.applier.deliver(setup.entry(OTHER_NODE))
            await until_applied(setup, count, 5)
        assert setup.applier.cost.batches == 3


async def test_hurry_ends_a_linger(setup: Setup) -> None:
    """What a quorum read that finds the log ahead does: apply what waits now."""
    applier = setup.applier
    applier.deliver(setup.entry(OTHER_NODE))
    await until_applied(setup, 1, LINGER * 0.8)
    await settled()
    applier.deliver(setup.entry(OTHER_NODE))
    applier.hurry()
    assert await until_applied(setup, 2, LINGER * 0.8) < LINGER * 0.8


async def test_waiting_for_a_revision_ends_a_linger_and_waits_for_its_delivery(
        setup: Setup) -> None:
    """What a read barrier waits for: a revision applied, whether it is lingering in the
    inbox or not delivered yet; one applied already returns at once."""
    applier = setup.applier
    applier.deliver(setup.entry(OTHER_NODE))
    await until_applied(setup, 1, LINGER * 0.8)
    await settled()
    await asyncio.wait_for(applier.applied_through(1), 0.5)  # applied: no wait
    applier.deliver(setup.entry(OTHER_NODE))  # lingers
    started = time.monotonic()
    await asyncio.wait_for(applier.applied_through(2), LINGER * 3)
    assert time.monotonic() - started < LINGER * 0.8
    await settled()
    waiting = asyncio.ensure_future(applier.applied_through(4))
    await asyncio.sleep(0)  # it waits now: what is delivered next does not linger
    assert not waiting.done()
    applier.deliver(setup.entry(OTHER_NODE))
    assert await until_applied(setup, 3, LINGER * 0.8) < LINGER * 0.8
    assert not waiting.done()
    applier.deliver(setup.entry(OTHER_NODE))
    await asyncio.wait_for(waiting, LINGER * 0.8)
    assert setup.applied() == 4


async def test_a_wait_given_up_leaves_nothing_behind(setup: Setup) -> None:
    """A read that times out (or whose client left) does not leave its waiter for the next
    batch: reads against a node that does not move on must not pile up."""
    applier = setup.applier
    for _ in range(50):
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(applier.applied_through(99), 0.001)
    assert applier.waiting == 0


async def test_a_wait_ends_when_the_applier_closes_or_a_snapshot_moves_it_on(
        setup: Setup) -> None:
    applier = setup.applier
    waiting = asyncio.ensure_future(applier.applied_through(10))
    await asyncio.sleep(0)
    setup.progress.reset(12)  # what a snapshot install through revision 12 does
    applier.wake()
    await asyncio.wait_for(waiting, 1)
    waiting = asyncio.ensure_future(applier.applied_through(20))
    await asyncio.sleep(0)
    applier.close()
    with pytest.raises(BrokerClosedError):
        await asyncio.wait_for(waiting, 1)


@dataclass
class Tolerant(Answers):
    """Answers that take the applier stopping (the fixture's fail the test on it)."""

    failed: list[Any] = field(default_factory=list)

    def fail_waiting(self, error: Any, failure: Any) -> None:
        self.failed.append(failure)


async def test_a_wait_hears_that_this_node_stopped_applying(tmp_path: Path) -> None:
    async with applier_on(tmp_path, LINGER, Tolerant()) as setup:
        applier = setup.applier
        waiting = asyncio.ensure_future(applier.applied_through(1))
        await asyncio.sleep(0)
        applier.deliver(Revision(1, b"not a log entry at all", time.monotonic()))
        with pytest.raises(StorageFailedError, match="stopped applying the log at revision 1"):
            await asyncio.wait_for(waiting, 5)
        with pytest.raises(StorageFailedError):  # and so does every later wait, at once
            await asyncio.wait_for(applier.applied_through(1), 0.5)


@dataclass
class ResolvingAnswers(Answers):
    """Answers that resolve a future per put, as this node's writer does: its publisher's
    handler resumes in a loop callback of its own."""

    waiting: dict[int, asyncio.Future[None]] = field(default_factory=dict)

    def answer(self, node: bytes, seq: int, results: Any, timing: Any) -> None:
        super().answer(node, seq, results, timing)
        future = self.waiting.get(seq)
        if future is not None and not future.done():
            future.set_result(None)


async def test_followers_hear_of_this_nodes_revision_before_its_publisher_is_answered(
        tmp_path: Path) -> None:
    """The applier wakes the fan-out of the touched topics first and answers this node's
    publishers after, as a single node does."""
    answers = ResolvingAnswers()
    async with applier_on(tmp_path, LINGER, answers) as setup:
        setup.applier.deliver(setup.entry(OTHER_NODE))
        await until_applied(setup, 1, 10)
        topic = setup.applier.broker.store.get(TOPIC)
        assert topic is not None
        answered = answers.waiting[2] = asyncio.get_running_loop().create_future()

        async def publish() -> None:
            setup.applier.deliver(setup.entry(THIS_NODE))
            await answered

        assert await followers_heard_first(topic, publish)
