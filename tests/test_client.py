"""The async client against a real broker, directly and through a fault-injecting proxy."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from messaging.client import Client, Conn
from messaging.errors import (
    ConnClosedError,
    ConnectionFailedError,
    ConnStateError,
    PublishOutcomeUnknownError,
    TopicTruncatedError,
)
from messaging.message import HEADER_SIZE
from messaging.server import BrokerServer
from tests.conftest import StartServer, cli, wait_until
from tests.proxy import FaultProxy, dead_url


@pytest.fixture
async def proxy(server: BrokerServer) -> AsyncIterator[FaultProxy]:
    p = await FaultProxy(server.port).start()
    yield p
    await p.stop()


async def collect(conn: Conn, count: int, timeout: float = 20) -> list:
    got = []

    async def run() -> None:
        async for message in conn:
            got.append(message)
            if len(got) >= count:
                return

    await asyncio.wait_for(run(), timeout)
    return got


async def test_publish_and_subscribe(server: BrokerServer) -> None:
    async with Client([server.url]) as client:
        assert await client.publish(1, b"one") == 1
        assert await client.publish_batch(1, [b"two", b"three"]) == (2, 3)
        conn = client.conn(1)
        await conn.open(index=0)
        got = await collect(conn, 3)
        assert [(m.index, m.data) for m in got] == [(1, b"one"), (2, b"two"), (3, b"three")]
        assert conn.index == 3
        later = asyncio.ensure_future(collect(conn, 1))
        await client.publish(1, b"four")
        assert [m.data for m in await later] == [b"four"]
        await conn.close()
        assert [m.index for m in await client.read(1, index=2, end=4)] == [2, 3]


async def test_publish_batch_splits_over_max_request_size(server: BrokerServer) -> None:
    async with Client(server.url, max_request_size=1000) as client:
        datas = [f"{i:04d}".encode() * 20 for i in range(50)]
        first, last = await client.publish_batch(2, datas)
        assert (first, last) == (1, 50)
        assert [m.data for m in await client.read(2)] == datas
        assert server.broker is not None and server.log is not None
        assert server.log.diagnostics()["groups"] >= 5


async def test_non_streaming_ends_at_the_end_of_the_topic(server: BrokerServer) -> None:
    async with Client(server.url) as client:
        await client.publish_batch(1, [b"a", b"b", b"c"])
        conn = client.conn(1)
        await conn.open(index=2, streaming=False)
        assert [m.data async for m in conn] == [b"b", b"c"]
        await conn.close()


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


async def test_failover_when_the_first_url_is_down(server: BrokerServer) -> None:
    async with Client([dead_url(), server.url]) as client:
        assert await client.publish(1, b"x") == 1
        conn = client.conn(1)
        await conn.open()
        assert [m.data for m in await collect(conn, 1)] == [b"x"]
        await conn.close()


async def test_no_broker_reachable(server: BrokerServer) -> None:
    async with Client([dead_url()], retry_timeout=0.5) as client:
        with pytest.raises(ConnectionFailedError, match="no broker reachable"):
            await client.topics()


async def test_redirect_is_followed_and_remembered(server: BrokerServer) -> None:
    hits = []

    async def redirect(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response(status=307, headers={"Location": server.url + request.path_qs})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", redirect)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with Client(f"http://127.0.0.1:{port}") as client:
            assert await client.publish(1, b"a") == 1
            assert client.leader == server.url
            assert await client.publish(1, b"b") == 2
            assert hits == ["/messaging/messages"]
    finally:
        await runner.cleanup()


async def test_publish_cut_mid_request_is_outcome_unknown(server: BrokerServer,
                                                          proxy: FaultProxy) -> None:
    proxy.drop_responses = True
    async with Client(proxy.url) as client:
        with pytest.raises(PublishOutcomeUnknownError, match="may or may not"):
            await client.publish(1, b"did it land?")
    async with Client(server.url) as direct:
        # It did land: retrying blindly would have stored it twice.
        assert [m.data for m in await direct.read(1)] == [b"did it land?"]


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
        server.broker.enforce_retention()
        assert (await client.topic(1))["first_index"] <= 4
        await collect(conn, 9)

        async def moved() -> bool:
            return bool((await client.topic(1))["subscribers"].get("reporter-1") == 12)

        await wait_until(moved, what="the heartbeat of index 12")
        server.broker.enforce_retention()
        assert (await client.topic(1))["first_index"] >= 11
        await conn.close()


async def test_reading_below_retention_raises(start_server: StartServer) -> None:
    server = await start_server(max_segment_size=100, max_topic_size=0)
    async with Client(server.url) as client:
        for _ in range(6):
            await client.publish(1, b"x" * 80)
        assert server.broker is not None
        server.broker.enforce_retention()
        conn = client.conn(1)
        await conn.open(index=1)
        with pytest.raises(TopicTruncatedError) as info:
            await collect(conn, 1)
        assert info.value.first_index == 6
        await conn.close()


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


async def test_ping_persists_urls(server: BrokerServer, tmp_path: Path) -> None:
    config = tmp_path / "client.json"
    async with Client(server.url, config_path=config) as client:
        assert await client.ping() == [server.url]
    assert json.loads(config.read_text()) == {"urls": [server.url]}
    async with Client([dead_url()], config_path=config) as client:
        assert await client.publish(1, b"found through the saved urls") == 1


async def test_cli_commands(server: BrokerServer) -> None:
    url = server.url
    run = asyncio.to_thread
    result = await run(cli, "publish", url, "7", "hello")
    assert (result.returncode, result.stdout) == (0, "1\n")
    result = await run(cli, "publish", url, "7", stdin="line one\nline two\n")
    assert result.stdout.split() == ["2", "3"]
    async with Client(url) as client:
        await client.publish(7, b"\xff\x00binary")
    result = await run(cli, "tail", url, "7")
    assert result.stdout.splitlines() == ["1\t1\thello", "2\t1\tline one", "3\t1\tline two",
                                          "4\t1\t0xff0062696e617279"]
    result = await run(cli, "tail", url, "7", "--from", "3", "--format", "json")
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines[0] == {"index": 3, "topic": 7, "type": 1, "data": "line two"}
    assert lines[1]["data_base64"] == "/wBiaW5hcnk="
    result = await run(cli, "topics", url)
    assert result.returncode == 0 and "SUBSCRIBERS" in result.stdout
    assert result.stdout.splitlines()[1].split()[:3] == ["7", "1", "4"]
    result = await run(cli, "ping", url)
    assert result.stdout.strip() == url


async def test_cli_tail_into_a_closed_pipe(server: BrokerServer) -> None:
    async with Client(server.url) as client:
        await client.publish_batch(8, [b"line %d" % i for i in range(20_000)])
    proc = await asyncio.create_subprocess_shell(
        f"{sys.executable} -m messaging.cli tail {server.url} 8 | head -2",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert out.decode().splitlines() == ["1\t1\tline 0", "2\t1\tline 1"]
    assert b"Traceback" not in err


async def test_cli_errors_are_one_line(server: BrokerServer) -> None:
    result = await asyncio.to_thread(cli, "ping", dead_url())
    assert result.returncode == 1
    assert result.stderr.startswith("messaging ping: error: no broker reachable")
    assert "Traceback" not in result.stderr
    result = await asyncio.to_thread(cli, "tail", server.url, "x")
    assert result.returncode == 2 and "invalid number 'x'" in result.stderr


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
    assert server.broker.metrics.retention_deleted_segments._value.get() > 10
