"""The fan-out: every parked stream gets every commit, in order, across slices and rolls."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import cast

import aiohttp
import pytest

from messaging.broker.metrics import BrokerMetrics
from messaging.frames import BatchDecoder, encode
from messaging.http.fanout import SLICE, FanOut, Follower
from messaging.http.server import BrokerServer
from messaging.topic.topic import Topic
from tests.conftest import StartServer, wait_until


async def follow(session: aiohttp.ClientSession, server: BrokerServer, count: int,
                 ready: asyncio.Event, connected: list[int]) -> list[bytes]:
    got: list[bytes] = []
    decoder = BatchDecoder(after=0)
    async with session.get(f"{server.url}/messaging/messages",
                           params={"topicID": "1", "streaming": "true"}) as resp:
        assert resp.status == 200
        connected.append(1)
        await ready.wait()
        async for data in resp.content.iter_any():
            got.extend(m.data for batch in decoder.feed(data) for m in batch.messages())
            if len(got) >= count:
                break
    return got


@pytest.mark.e2e  # over half a second: left out of the unit run
async def test_every_parked_stream_gets_every_commit_in_order(start_server: StartServer,
                                                              ) -> None:
    server = await start_server(max_segment_size=2000)  # rolls every few commits
    streams, count = 150, 40  # more streams than one slice of the fan-out writes
    ready = asyncio.Event()
    connected: list[int] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=60)) as session:
        followers = [asyncio.ensure_future(follow(session, server, count, ready, connected))
                     for _ in range(streams)]

        async def all_connected() -> bool:
            return len(connected) == streams

        await wait_until(all_connected, timeout=30, what="every stream connected")
        ready.set()
        for n in range(count):
            async with session.post(f"{server.url}/messaging/messages",
                                    params={"topicID": "1"}, data=b"m%03d" % n * 20) as resp:
                assert resp.status == 200
        results = await asyncio.wait_for(asyncio.gather(*followers), 60)
    expected = [b"m%03d" % n * 20 for n in range(count)]
    assert all(got == expected for got in results)


class RecordingTransport:
    """A transport that keeps what is written to it (never buffers, never closes)."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def write(self, data: bytes) -> None:
        self.writes.append(data)


async def _publish(topic: Topic, index: int, data: bytes) -> None:
    def publish() -> None:  # file I/O: on a thread, as the broker's writer does
        topic.append(encode(1, 1, data, index))
        topic.commit(notify=False)

    await asyncio.to_thread(publish)


async def _park(fanout: FanOut, topic: Topic, start: int, chunked: bool = True,
                ) -> tuple[Follower, RecordingTransport]:
    reader = topic.reader(start)
    # Positioned at the end (after every frame from ``start`` on): a stream that caught up.
    assert await asyncio.to_thread(reader.read)
    transport = RecordingTransport()
    follower = Follower(reader, cast(asyncio.Transport, transport), chunked)
    fanout.park(follower)
    return follower, transport


def _unchunk(chunk: bytes) -> bytes:
    """The data of one HTTP chunk."""
    size, rest = chunk.split(b"\r\n", 1)
    assert rest[int(size, 16):] == b"\r\n"
    return rest[: int(size, 16)]


async def _passes_done(fanout: FanOut) -> None:
    for _ in range(1000):
        if not fanout.busy:
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the fan-out never finished its pass")


async def test_followers_at_one_position_share_one_framed_chunk(tmp_path: Path) -> None:
    topic = await asyncio.to_thread(Topic.open, tmp_path / "t", 1)
    await _publish(topic, 1, b"m1")
    metrics = BrokerMetrics()
    fanout = FanOut(topic, metrics)
    behind = await _park(fanout, topic, 1)  # after frame 1: it will be one frame behind
    before_m2 = time.perf_counter()
    await _publish(topic, 2, b"m2")  # (no broadcast: as if it came before the others parked)
    level = [await _park(fanout, topic, 2) for _ in range(5)]  # after frame 2
    raw = await _park(fanout, topic, 2, chunked=False)
    await _publish(topic, 3, b"m3")
    fanout.broadcast()
    await _passes_done(fanout)
    writes = [transport.writes for _, transport in level]
    assert all(len(w) == 1 for w in writes)
    assert all(w[0] is writes[0][0] for w in writes)  # one bytes object for all five
    frame3 = encode(1, 1, b"m3", 3)
    assert writes[0][0] == b"%x\r\n%b\r\n" % (len(frame3), frame3)
    frame2 = encode(1, 1, b"m2", 2)
    assert behind[1].writes == [b"%x\r\n%b\r\n" % (2 * len(frame3), frame2 + frame3)]
    assert raw[1].writes == [frame3]
    assert all(f.reader.last_index == 3 for f, _ in [*level, behind, raw])
    assert len(fanout.followers) == 7  # all still parked
    assert metrics.messages_streamed.value == 8  # 7 followers, one of them 2 behind
    # One slice, one lag figure: the age of the oldest commit it sent (m2, to ``behind``).
    assert sum(metrics.fanout_lag.counts) == 1
    assert 0 < metrics.fanout_lag.total <= time.perf_counter() - before_m2


async def test_commits_during_a_pass_reach_every_follower_once(tmp_path: Path) -> None:
    topic = await asyncio.to_thread(Topic.open, tmp_path / "t", 1)
    await _publish(topic, 1, b"m1")
    metrics = BrokerMetrics()
    fanout = FanOut(topic, metrics)
    parked = [await _park(fanout, topic, 1) for _ in range(3 * SLICE)]
    await _publish(topic, 2, b"m2")
    topic.append(encode(1, 1, b"m3", 3))
    await asyncio.to_thread(topic.write)  # the file I/O of commit 3, before the pass
    fanout.broadcast()  # writes the first slice now, the others in later callbacks
    assert fanout.busy
    topic.commit(notify=False)  # commit 3 (no I/O left), between the first and second slice
    fanout.broadcast()  # during the pass: one more pass after it, not a second one now
    await _passes_done(fanout)
    frame2, frame3 = encode(1, 1, b"m2", 2), encode(1, 1, b"m3", 3)
    for follower, transport in parked:
        assert b"".join(map(_unchunk, transport.writes)) == frame2 + frame3
        assert follower.reader.last_index == 3
    # The followers of the first slice got commit 3 from the next pass; the others got both
    # commits in one write.
    counts = sorted(len(transport.writes) for _, transport in parked)
    assert counts == [1] * (2 * SLICE) + [2] * SLICE
    # A lag figure for every slice that sent something: three, then one of the second pass.
    assert sum(metrics.fanout_lag.counts) == 4


async def test_a_stream_from_the_next_index_follows_from_memory(tmp_path: Path) -> None:
    topic = await asyncio.to_thread(Topic.open, tmp_path / "t", 1)
    for index in (1, 2):
        await _publish(topic, index, b"m%d" % index)
    reader = topic.reader(3)  # the next index: nothing to read yet, but a place to wait
    assert await asyncio.to_thread(reader.read) == b""
    ahead = topic.reader(4)  # not the next index: frame 3 must be skipped, so no place yet
    assert await asyncio.to_thread(ahead.read) == b""
    assert ahead.tail_position() is None
    transport = RecordingTransport()
    fanout = FanOut(topic, BrokerMetrics())
    follower = Follower(reader, cast(asyncio.Transport, transport), True)
    fanout.park(follower)
    await _publish(topic, 3, b"m3")
    fanout.broadcast()
    await _passes_done(fanout)
    assert [_unchunk(w) for w in transport.writes] == [encode(1, 1, b"m3", 3)]
    assert follower in fanout.followers  # from the tail, without leaving the fan-out
    assert reader.last_index == 3 and reader.delivered == 1
    await _publish(topic, 4, b"m4")
    assert await asyncio.to_thread(ahead.read) == encode(1, 1, b"m4", 4)
