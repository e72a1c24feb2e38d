"""Conn, a subscription: resuming after breaks, giving up, heartbeats, batches, iteration.

Against a real broker (directly and through a fault-injecting proxy), and through a fake
:class:`~messaging.client.conn.BrokerClient` for what needs no broker.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from messaging.client.client import Client
from messaging.client.conn import Conn
from messaging.client.times import TimeRuns
from messaging.config import BrokerConfig
from messaging.errors import (
    ConnClosedError,
    ConnectionFailedError,
    ConnStateError,
    NoLeaderError,
    TopicTruncatedError,
)
from messaging.failover import RetryPolicy
from messaging.frames import FRAMES_CONTENT_TYPE, HEADER_SIZE, Message, encode_many
from messaging.http.server import BrokerServer
from tests.client.test_client import collect, fake_server, tcp_server
from tests.conftest import StartServer, free_port, wait_until
from tests.proxy import FaultProxy, dead_url


class FakeClient:
    """A :class:`~messaging.client.conn.BrokerClient` serving canned answers, recording
    heartbeats."""

    def __init__(self, answers: list[list[bytes | BaseException] | BaseException]) -> None:
        self.answers = answers
        self.requests: list[dict[str, str]] = []
        self.heartbeats: list[tuple[int, int, str]] = []
        self.retry_policy = RetryPolicy(budget=5, start=0.001)
        self.reached = True

    @contextlib.asynccontextmanager
    async def stream(self, path: str, params: dict[str, str],
                     content_type: str) -> AsyncIterator[AsyncIterator[bytes]]:
        assert (path, content_type) == ("/messaging/messages", FRAMES_CONTENT_TYPE)
        self.requests.append(params)
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer

        async def chunks() -> AsyncIterator[bytes]:
            for chunk in answer:
                if isinstance(chunk, BaseException):
                    raise chunk
                yield chunk

        yield chunks()

    async def heartbeat(self, topic: int, index: int, url: str) -> None:
        self.heartbeats.append((topic, index, url))

    async def times(self, topic: int | str, index: int = 0,
                    end: int | None = None) -> TimeRuns:
        raise AssertionError("these Conns do not ask for times")


async def test_a_fake_client_resumes_after_the_last_whole_message() -> None:
    body = encode_many(Message(i, 1, 3, b"m%d" % i) for i in (4, 7, 9))
    cut = HEADER_SIZE + 2 + 5  # inside the second frame
    client = FakeClient([
        ConnectionFailedError("cannot connect to x: connection refused"),
        [*(body[i:i + 1] for i in range(cut)),  # byte by byte, then the stream breaks
         ConnectionFailedError("cannot connect to x: the server closed the connection")],
        NoLeaderError("no leader"),
        [body[HEADER_SIZE + 2:]],
    ])
    conn = Conn(client, 3, "reporter", heartbeat_interval=60)
    await conn.open(index=2, streaming=False)
    assert [(m.index, m.data) async for m in conn] == [(4, b"m4"), (7, b"m7"), (9, b"m9")]
    assert [r["index"] for r in client.requests] == ["2", "2", "5", "5"]
    assert conn.reconnects == 3
    await conn.close()
    assert client.heartbeats[0] == (3, 1, "reporter") and client.heartbeats[-1] == (3, 9,
                                                                                    "reporter")


async def test_a_fake_client_refusing_everywhere_ends_the_conn() -> None:
    refused = ConnectionFailedError("cannot connect to x: connection refused", refused=True)
    client = FakeClient([refused] * 10)
    client.reached = False
    conn = Conn(client, 1, None, heartbeat_interval=60)
    await conn.open()
    with pytest.raises(ConnectionFailedError, match="connection refused"):
        await collect(conn, 1, timeout=5)
    assert len(client.requests) == RetryPolicy().refused_rounds
    await conn.close()


async def test_non_streaming_ends_at_the_end_of_the_topic(server: BrokerServer) -> None:
    async with Client(server.url) as client:
        await client.publish_batch(1, [b"a", b"b", b"c"])
        conn = client.conn(1)
        await conn.open(index=2, streaming=False)
        assert [m.data async for m in conn] == [b"b", b"c"]
        await conn.close()


@pytest.mark.e2e  # over half a second: left out of the unit run
async def test_resume_after_cuts_never_loses_or_repeats(server: BrokerServer,
                                                        proxy: FaultProxy) -> None:
    async with Client(server.url) as direct:
        datas = [f"message {i:05d}".encode() for i in range(400)]
        await direct.publish_batch(1, datas[:200])
        proxy.cut_after = 1500  # every connection is cut after 1500 bytes, mid-frame
        async with Client(proxy.url) as client:
            conn = client.conn(1)
            await conn.open(index=0)
            first = await collect(conn, 100)
            await direct.publish_batch(1, datas[200:])
            rest = await collect(conn, 300)
            await conn.close()
    got = [m.index for m in first + rest]
    assert got == list(range(1, 401))
    assert [m.data for m in first + rest] == datas
    assert proxy.cuts > 10 and conn.reconnects > 10


@pytest.mark.e2e  # over a second: left out of the unit run
async def test_conn_gives_up_after_retry_timeout_without_a_broker() -> None:
    async with tcp_server(b"") as url, Client(url, retry_timeout=1) as client:
        loop = asyncio.get_running_loop()
        for streaming in (True, False):
            conn = client.conn(1)
            await conn.open(streaming=streaming)
            started = loop.time()
            with pytest.raises(ConnectionFailedError, match=f"^cannot connect to {url}: "):
                await collect(conn, 1, timeout=10)
            assert loop.time() - started >= 1
            await conn.close()


@pytest.mark.e2e  # over half a second: left out of the unit run
async def test_conn_fails_fast_when_every_url_refuses() -> None:
    url = dead_url()
    async with Client([url], retry_timeout=30) as client:
        for streaming in (True, False):
            conn = client.conn(1)
            await conn.open(streaming=streaming)
            with pytest.raises(ConnectionFailedError) as info:
                await collect(conn, 1, timeout=3)
            assert str(info.value) == f"cannot connect to {url}: connection refused"
            await conn.close()


@pytest.mark.e2e  # over a second: left out of the unit run
async def test_a_subscriber_keeps_retrying_while_its_broker_restarts(tmp_path: Path) -> None:
    """Refusals end the wait at once only if no broker ever answered: a restart is not that."""
    config = BrokerConfig(data=tmp_path / "data", host="127.0.0.1", port=free_port())
    server = BrokerServer(config)
    await server.start()
    try:
        async with Client(server.url, retry_timeout=30) as client:
            await client.publish(1, b"before")
            conn = client.conn(1)
            await conn.open()
            assert [m.data for m in await collect(conn, 1)] == [b"before"]
            await server.stop()
            await asyncio.sleep(1)  # refused for longer than a fresh client's quick rounds
            server = BrokerServer(config)
            await server.start()
            assert await client.publish(1, b"after") == 2
            assert [m.data for m in await collect(conn, 1)] == [b"after"]
            await conn.close()
    finally:
        await server.stop()


async def test_heartbeats_hold_retention_until_the_subscriber_moves_on(
        start_server: StartServer) -> None:
    server = await start_server(max_segment_size=100, max_topic_size=0)
    async with Client(server.url) as client:
        for i in range(12):
            await client.publish(1, f"{i:02d}".encode() * 20)
        conn = client.conn(1, data_url="reporter-1", heartbeat_interval=0.05)
        await conn.open(index=0)
        await collect(conn, 3)

        async def registered() -> bool:
            return bool((await client.topic(1))["subscribers"].get("reporter-1") == 3)

        await wait_until(registered, what="the heartbeat of index 3")
        assert server.broker is not None
        await asyncio.to_thread(server.broker.enforce_retention)
        assert (await client.topic(1))["first_index"] <= 4
        await collect(conn, 9)

        async def moved() -> bool:
            return bool((await client.topic(1))["subscribers"].get("reporter-1") == 12)

        await wait_until(moved, what="the heartbeat of index 12")
        await asyncio.to_thread(server.broker.enforce_retention)
        assert (await client.topic(1))["first_index"] >= 11
        await conn.close()


async def test_reading_from_zero_starts_at_the_first_kept_index(
        start_server: StartServer) -> None:
    server = await start_server(max_segment_size=100, max_topic_size=0)
    async with Client(server.url) as client:
        for i in range(6):
            await client.publish(1, b"%d" % i * 80)
        deleted = (await client.request("POST", "/messaging/retention")).json()
        assert deleted["deleted_bytes"] > 0
        first = (await client.topic(1))["first_index"]
        assert first == 6
        assert [m.index for m in await client.read(1)] == [6]
        for streaming in (False, True):
            conn = client.conn(1, data_url=f"from-zero-{streaming}", heartbeat_interval=0.05)
            await conn.open(index=0, streaming=streaming)
            assert [m.index for m in await collect(conn, 1)] == [6]
            await conn.close()
        conn = client.conn(1)
        await conn.open(index=0)
        later = asyncio.ensure_future(collect(conn, 2))
        assert await client.publish(1, b"seven") == 7
        assert [m.index for m in await later] == [6, 7]
        await conn.close()


async def test_reading_below_retention_raises(start_server: StartServer) -> None:
    server = await start_server(max_segment_size=100, max_topic_size=0)
    async with Client(server.url) as client:
        for _ in range(6):
            await client.publish(1, b"x" * 80)
        assert server.broker is not None
        await asyncio.to_thread(server.broker.enforce_retention)
        conn = client.conn(1)
        await conn.open(index=1)
        with pytest.raises(TopicTruncatedError) as info:
            await collect(conn, 1)
        assert info.value.first_index == 6
        assert info.value.topic == 1  # from the X-Broker-Topic header
        await conn.close()
        with pytest.raises(TopicTruncatedError) as info:
            await client.read(1, index=2)
        assert str(info.value) == ("topic 1: index below 6 was deleted by retention; "
                                   "first available index is 6")


async def test_async_for_contract(server: BrokerServer) -> None:
    async with Client(server.url) as client:
        conn = client.conn(1)
        with pytest.raises(ConnStateError, match="open"):
            await conn.__anext__()
        await conn.open()
        with pytest.raises(ConnStateError, match="already open"):
            await conn.open()
        waiting = asyncio.ensure_future(collect(conn, 1))
        await asyncio.sleep(0.1)
        await conn.close()
        assert await asyncio.wait_for(waiting, 5) == []  # close ended the iteration
        with pytest.raises(ConnClosedError):
            await conn.__anext__()
        with pytest.raises(ConnClosedError):
            await conn.open()


async def test_batches(server: BrokerServer) -> None:
    async with Client(server.url) as client:
        await client.publish_batch(5, [b"%d" % i for i in range(1000)])
        conn = client.conn(5)
        await conn.open(streaming=False)
        total = 0
        async for batch in conn.batches():
            assert batch.count == len(batch.messages())
            total += len(batch)
        assert total == 1000 and conn.index == 1000
        await conn.close()


async def test_switching_to_batches_hands_over_the_original_frames(server: BrokerServer) -> None:
    async with Client(server.url) as client:
        await client.publish_batch(6, [b"m%d" % i for i in range(10)])
        raw = (await client.request("GET", "/messaging/messages", params={"topicID": 6})).body
        conn = client.conn(6)
        await conn.open(streaming=False)
        first = await conn.__anext__()
        assert first.data == b"m0"
        batches = [b async for b in conn.batches()]
        assert b"".join(b.buffer for b in batches) == raw[HEADER_SIZE + 2:]
        assert [m.data for b in batches for m in b] == [b"m%d" % i for i in range(1, 10)]
        assert conn.index == 10
        await conn.close()


@pytest.mark.parametrize("taken", [1, 63, 64, 65, 200, 299, 300])
@pytest.mark.parametrize("uniform", [True, False])
async def test_iteration_then_batches_at_any_point(server: BrokerServer, taken: int,
                                                   uniform: bool) -> None:
    """Messages are made into objects a slice at a time; switching to batches() anywhere,
    inside a slice or at its edge, hands over exactly the rest of the frames as they came."""
    datas = [b"%04d" % i if uniform else b"m" * (i % 7) for i in range(300)]
    async with Client(server.url) as client:
        await client.publish_batch(7, datas)
        raw = (await client.request("GET", "/messaging/messages", params={"topicID": 7})).body
        conn = client.conn(7)
        await conn.open(streaming=False)
        first = [await conn.__anext__() for _ in range(taken)]
        assert [m.data for m in first] == datas[:taken]
        assert [m.index for m in first] == list(range(1, taken + 1))
        assert conn.index == taken
        batches = [b async for b in conn.batches()]
        used = sum(HEADER_SIZE + len(data) for data in datas[:taken])
        assert b"".join(b.buffer for b in batches) == raw[used:]
        rest = [m for b in batches for m in b]
        assert [m.data for m in rest] == datas[taken:]
        assert [m.index for m in rest] == list(range(taken + 1, 301))
        assert conn.index == 300
        await conn.close()


@pytest.mark.e2e  # slow: over a third of a second
async def test_retention_under_load_never_takes_what_a_subscriber_needs(
        start_server: StartServer) -> None:
    server = await start_server(max_segment_size=2048, max_topic_size=4096,
                                truncation_interval=0.05)
    async with Client(server.url) as client:
        conn = client.conn(1, data_url="tail-1", heartbeat_interval=0.02)
        await conn.open(index=0)
        received: list[int] = []

        async def consume() -> None:
            async for message in conn:
                received.append(int(message.data))
                if len(received) == 3000:
                    return
                if len(received) % 100 == 0:
                    await asyncio.sleep(0.01)  # a subscriber a little slower than publishing

        consumer = asyncio.ensure_future(consume())

        async def registered() -> bool:  # open() registers the subscriber at once
            return server.broker is not None and "tail-1" in server.broker.subscribers(1)

        await wait_until(registered, what="the subscriber's first heartbeat")
        for start in range(0, 3000, 50):
            await client.publish_batch(1, [b"%d" % i for i in range(start, start + 50)])
        await asyncio.wait_for(consumer, 60)
        await conn.close()
    assert received == list(range(3000))
    assert server.broker is not None
    deleted = server.broker.metrics.registry.get_sample_value(
        "messaging_retention_deleted_segments_total")
    assert deleted is not None and deleted > 10




async def test_a_subscription_follows_a_redirect(server: BrokerServer) -> None:
    async def redirect(request: web.Request) -> web.Response:
        return web.Response(status=307, headers={"Location": server.url + request.path_qs})

    async with fake_server(redirect) as url, Client(url) as client:
        await client.publish_batch(1, [b"a", b"b"])  # followed, and the leader remembered
        assert client.leader == server.url
        conn = client.conn(1)
        await conn.open(streaming=False)
        assert [m.data async for m in conn] == [b"a", b"b"]
        await conn.close()
