"""Append times in the Python client: ``Message.time`` with ``times=True`` (read and Conn, a
request per stretch of messages, not per message), ``since`` on reads and Conns, ``at`` on a
topic, and the runs' parsing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from messaging.client.client import Client
from messaging.client.times import TimedBatch, TimedMessage, TimeRuns, timed
from messaging.clock import format_moment, now_ms
from messaging.errors import ConnStateError, MessagingError
from messaging.frames import Message
from messaging.http.server import BrokerServer

PAUSE = 0.15  # past the broker's 100 ms time resolution


async def bursts(client: Client) -> tuple[list[int], int]:
    """a, b; a pause; c, d (each pair one request: one time). Returns the indexes and the
    second burst's time."""
    indexes = list(await client.publish_batch(1, [b"a", b"b"]))
    await asyncio.sleep(PAUSE)
    indexes += await client.publish_batch(1, [b"c", b"d"])
    runs = await client.times(1)
    return indexes, runs.time_of(indexes[2]) or 0


class TimesRequests:
    """Counts a client's ``GET /messaging/times`` requests (its ``times`` method, wrapped);
    :meth:`fetch` asks without being counted."""

    def __init__(self, client: Client) -> None:
        self.calls = 0
        self.fetch = client.times
        client.times = self._counted  # type: ignore[method-assign]

    async def _counted(self, *args: Any, **kwargs: Any) -> TimeRuns:
        self.calls += 1
        return await self.fetch(*args, **kwargs)


async def test_messages_read_with_times_carry_them(server: BrokerServer) -> None:
    async with Client(server.url) as client:
        indexes, later = await bursts(client)
        plain = await client.read(1)
        assert [m.time for m in plain] == [None] * 4  # not asked for: not fetched
        messages = await client.read(1, times=True)
        assert messages == plain  # a time does not change what a message is
        assert all(isinstance(m, TimedMessage) for m in messages)
        times = [m.time for m in messages]
        assert times[2] == times[3] == later and times[0] == times[1]
        assert later - (times[0] or 0) >= PAUSE * 1000 * 0.9
        since = await client.read(1, since=later, times=True)
        assert [(m.data, m.time) for m in since] == [(b"c", later), (b"d", later)]
        assert [m.data for m in await client.read(1, since=format_moment(later))] == [b"c", b"d"]
        assert (await client.topic(1, at=later))["index"] == indexes[2]
        assert (await client.topic(1, at=now_ms() + 1000))["index"] is None
        with pytest.raises(ValueError, match="index or since"):
            await client.read(1, index=3, since=later)


async def test_a_conn_hands_out_times_fetching_a_stretch_at_a_time(server: BrokerServer,
                                                                   ) -> None:
    async with Client(server.url) as client:
        await client.publish_batch(1, [b"x%d" % i for i in range(500)])
        requests = TimesRequests(client)
        conn = client.conn(1, times=True)
        await conn.open(streaming=False)
        got = [m async for m in conn]
        await conn.close()
        assert len(got) == 500 and all(isinstance(m.time, int) for m in got)
        assert requests.calls == 1  # one batch, one request


async def test_conn_batches_carry_times_when_asked(server: BrokerServer) -> None:
    """``conn.batches()`` of a Conn made with ``times=True``: every batch looks up its
    messages' times and decodes them with their times (one request per stretch), also the
    rest of a batch that iteration message by message had started; without ``times``, plain
    batches with no request."""
    async with Client(server.url) as client:
        indexes, later = await bursts(client)
        await client.publish_batch(1, [b"e%d" % i for i in range(300)])
        requests = TimesRequests(client)
        conn = client.conn(1, times=True)
        await conn.open(streaming=False)
        first = await anext(conn)  # message by message first, then the rest in batches
        assert (first.data, first.time) == (b"a", (await requests.fetch(1)).time_of(indexes[0]))
        batches = [batch async for batch in conn.batches()]
        await conn.close()
        assert batches and all(isinstance(batch, TimedBatch) for batch in batches)
        messages = [m for batch in batches for m in batch.messages()]
        assert [m.data for m in messages][:3] == [b"b", b"c", b"d"] and len(messages) == 303
        assert all(isinstance(m, TimedMessage) and isinstance(m.time, int) for m in messages)
        assert [m.time for m in messages[1:3]] == [later, later]
        head = batches[0]
        assert isinstance(head, TimedBatch)
        assert head.time_of(indexes[2]) == later and head.time_of(10**9) is None
        assert requests.calls <= len(batches)  # a request per stretch, never per message

        requests.calls = 0
        plain = client.conn(1)
        await plain.open(streaming=False)
        batches = [batch async for batch in plain.batches()]
        await plain.close()
        assert not any(isinstance(batch, TimedBatch) for batch in batches)
        assert sum(batch.count for batch in batches) == 304 and requests.calls == 0


async def test_a_following_conn_since_a_time_starts_there_and_follows(
        server: BrokerServer) -> None:
    async with Client(server.url) as client:
        _indexes, later = await bursts(client)
        conn = client.conn(1, times=True)
        await conn.open(since=later)
        got = [await anext(conn), await anext(conn)]
        await asyncio.sleep(PAUSE)
        await client.publish(1, b"e")
        got.append(await asyncio.wait_for(anext(conn), 10))
        await conn.close()
        assert [m.data for m in got] == [b"c", b"d", b"e"]
        times = [m.time or 0 for m in got]
        assert times[0] == later and times[2] > later
        with pytest.raises(ConnStateError, match="not more than one"):
            await client.conn(1).open(index=3, since=later)


def test_runs_look_up_times_and_refuse_malformed_answers() -> None:
    runs = TimeRuns.parse({"index": 5, "through": 20, "runs": [[5, 100], ["9", None],
                                                                 [12, 130]]})
    assert [runs.time_of(i) for i in (5, 8, 9, 11, 12, 20)] == [100, 100, None, None, 130, 130]
    assert runs.covers(5) and runs.covers(20) and not runs.covers(21) and not runs.covers(4)
    for bad in ({}, {"index": 1, "through": 2, "runs": [[1]]}, {"index": "x", "through": 1,
                                                                 "runs": []}):
        with pytest.raises(MessagingError, match="malformed"):
            TimeRuns.parse(bad)
    message = Message(7, 1, 2, b"x")
    assert message.time is None and timed(message, 55).time == 55
    assert timed(message, 55) == message and hash(timed(message, 55)) == hash(message)


def test_a_timed_message_copied_by_replace_has_no_time() -> None:
    message = timed(Message(7, 1, 2, b"x"), 55)
    copy = message._replace(data=b"y")
    assert copy.data == b"y" and copy.time is None


async def test_times_are_asked_again_while_the_answering_node_is_behind(
        server: BrokerServer) -> None:
    """A node behind the one that served the messages answers runs that stop short: the
    client asks again rather than give the rest no time (or the last run's)."""
    async with Client(server.url) as client:
        indexes = list(await client.publish_batch(1, [b"a", b"b", b"c"]))
        fetch = client.times
        calls = 0

        async def lagging(topic: int | str, index: int = 0, end: int | None = None,
                          ) -> TimeRuns:
            nonlocal calls
            calls += 1
            runs = await fetch(topic, index, end)
            if calls == 1:  # the first answer covers only the first message
                runs.through = indexes[0]
            return runs

        client.times = lagging  # type: ignore[method-assign]
        messages = await client.read(1, times=True)
        assert calls == 2 and all(isinstance(m.time, int) for m in messages)
        calls = 0
        conn = client.conn(1, times=True)
        await conn.open(streaming=False)
        got = [m async for m in conn]
        await conn.close()
        assert calls == 2 and all(isinstance(m.time, int) for m in got)
