"""Primary/backup journals against an in-process broker: typed entries and checkpoints,
resuming from a checkpoint, fencing of a deposed writer (older epoch, or the same epoch
claimed twice), prepare/exit around checkpoints, and CaughtUp raised exactly when every entry
committed before the question has been fetched. The worked example with processes is
tests/e2e/test_journal_failover.py."""

from __future__ import annotations

import asyncio
import random

import pytest

from messaging.client.client import Client
from messaging.client.journal import CaughtUp, Checkpoint, Entry, Receiver, Writer
from messaging.errors import FencedError, JournalError
from messaging.http.server import BrokerServer

TOPIC = 5


async def drain(receiver: Receiver) -> list[Entry | Checkpoint]:
    fetched: list[Entry | Checkpoint] = []
    for _ in range(10_000):
        try:
            fetched.append(await receiver.try_fetch_entry())
        except CaughtUp:
            return fetched
    raise AssertionError("never caught up")


async def test_entries_and_checkpoints_arrive_typed_and_in_order(server: BrokerServer) -> None:
    async with Client(server.url) as client:
        receiver = Receiver(client, TOPIC)
        with pytest.raises(CaughtUp) as empty:
            await receiver.try_fetch_entry()
        assert empty.value.index == 0  # no journal at all yet
        writer = Writer(client, TOPIC, epoch=1)
        first = await writer.commit_entry(b"set a=1")
        await writer.commit_entry(b"set b=2")
        after = await writer.checkpoint(b'{"a": 1, "b": 2}')
        last = await writer.commit_entry(b"set c=3")
        assert writer.claimed is not None and writer.claimed < first
        fetched = await drain(receiver)
        assert fetched == [Entry(first, 1, b"set a=1"), Entry(first + 1, 1, b"set b=2"),
                           Checkpoint(after - 1, 1, b'{"a": 1, "b": 2}'),
                           Entry(last, 1, b"set c=3")]
        assert receiver.index == last and receiver.epoch == 1

        restored = Receiver(client, TOPIC)
        restored.set_index(after)  # state restored from the checkpoint: resume after it
        assert await drain(restored) == [Entry(last, 1, b"set c=3")]


async def test_a_deposed_writer_is_fenced(server: BrokerServer) -> None:
    async with Client(server.url) as client:
        old = Writer(client, TOPIC, epoch=1)
        await old.commit_entry(b"old 1")
        receiver = Receiver(client, TOPIC)
        await drain(receiver)
        new = Writer(client, TOPIC, epoch=receiver.epoch + 1)
        claim = await new.claim()
        with pytest.raises(FencedError, match="fenced by a newer one"):
            await old.commit_entry(b"old 2")
        with pytest.raises(FencedError):  # and stays fenced
            await old.checkpoint(b"state")
        index = await new.commit_entry(b"new 1")
        assert index > claim
        fetched = await drain(receiver)
        assert fetched == [Entry(index, 2, b"new 1")]
        assert receiver.epoch == 2


async def test_the_same_epoch_claimed_twice_fences_the_second(server: BrokerServer) -> None:
    async with Client(server.url) as client:
        first = Writer(client, TOPIC, epoch=3)
        second = Writer(client, TOPIC, epoch=3)
        await first.claim()
        with pytest.raises(FencedError, match="claimed epoch 3 first"):
            await second.commit_entry(b"mine")
        await first.commit_entry(b"the real one")
        assert [e.data for e in await drain(Receiver(client, TOPIC))] == [b"the real one"]


async def test_no_entry_is_committed_during_a_checkpoint(server: BrokerServer) -> None:
    async with Client(server.url) as client:
        writer = Writer(client, TOPIC, epoch=1)
        state = {"n": 0}

        async def change(n: int) -> int:
            index = await writer.commit_entry(str(n).encode())
            state["n"] = n
            return index

        await change(1)
        async with writer.prepared():
            waiting = asyncio.ensure_future(change(2))
            await asyncio.sleep(0)  # let it reach the writer
            with pytest.raises(JournalError, match="during a checkpoint"):
                await writer.commit_entry(b"from inside")
            taken = dict(state)  # consistent: nothing can be committed meanwhile
            after = await writer.checkpoint(repr(taken).encode())
            assert not waiting.done()
        assert await asyncio.wait_for(waiting, 10) == after  # right after the checkpoint
        assert taken == {"n": 1}


async def test_fetch_entry_waits_for_the_next_commit(server: BrokerServer) -> None:
    async with Client(server.url) as client:
        receiver = Receiver(client, TOPIC)
        fetching = asyncio.ensure_future(receiver.fetch_entry())
        await asyncio.sleep(0.05)
        assert not fetching.done()
        index = await Writer(client, TOPIC, epoch=1).commit_entry(b"hello")
        assert await asyncio.wait_for(fetching, 10) == Entry(index, 1, b"hello")


@pytest.mark.parametrize("seed", range(3))
async def test_caught_up_exactly_when_every_committed_entry_was_fetched(
        server: BrokerServer, seed: int) -> None:
    rng = random.Random(seed)
    async with Client(server.url) as client:
        writer = Writer(client, TOPIC, epoch=1)
        receiver = Receiver(client, TOPIC)
        committed: list[int] = []
        fetched: list[int] = []
        for _step in range(120):
            if rng.random() < 0.45:
                committed.append(await writer.commit_entry(b"e%d" % len(committed)))
                continue
            existing = list(committed)  # what existed when the receiver asks
            try:
                entry = await receiver.try_fetch_entry()
            except CaughtUp as caught:
                assert fetched == existing  # everything there was, and nothing else
                assert caught.index >= (existing[-1] if existing else 0)
            else:
                assert isinstance(entry, Entry)
                fetched.append(entry.index)
                assert fetched == existing[:len(fetched)]  # not caught up: one was missing
