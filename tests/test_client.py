"""The async client against a real broker, directly and through a fault-injecting proxy."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web

from messaging.client import Client, Conn
from messaging.config import BrokerConfig
from messaging.errors import (
    ClientConfigError,
    ConnClosedError,
    ConnectionFailedError,
    ConnStateError,
    InvalidURLError,
    NoLeaderError,
    NotABrokerError,
    PublishOutcomeUnknownError,
    TopicTruncatedError,
)
from messaging.message import HEADER_SIZE
from messaging.server import BrokerServer
from tests.conftest import StartServer, cli, free_port, wait_until
from tests.proxy import FaultProxy, dead_url


@pytest.fixture
async def proxy(server: BrokerServer) -> AsyncIterator[FaultProxy]:
    p = await FaultProxy(server.port).start()
    yield p
    await p.stop()


@contextlib.asynccontextmanager
async def fake_server(
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> AsyncIterator[str]:
    """A tiny aiohttp server on 127.0.0.1 answering every path with ``handler``; its URL."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def tcp_server(greeting: bytes) -> AsyncIterator[str]:
    """A TCP server that writes ``greeting`` (maybe nothing) and hangs up; its URL."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(greeting)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


HTML_404 = "<html><head><title>404 Not Found</title></head><body>nginx</body></html>"


async def html_404(request: web.Request) -> web.Response:
    return web.Response(status=404, text=HTML_404, content_type="text/html")


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


async def test_no_broker_reachable_fails_fast_when_refused() -> None:
    url = dead_url()
    async with Client([url], retry_timeout=30) as client:
        with pytest.raises(ConnectionFailedError) as info:
            await asyncio.wait_for(client.topics(), 3)  # not the 30 s retry budget
        assert str(info.value) == f"cannot connect to {url}: connection refused"
    other = dead_url()
    async with Client([url, other], retry_timeout=30) as client:
        with pytest.raises(ConnectionFailedError) as info:
            await asyncio.wait_for(client.publish(1, b"x"), 3)
        assert str(info.value) == (f"cannot connect to any broker ({url}: connection refused; "
                                   f"{other}: connection refused)")


async def test_retries_for_retry_timeout_when_a_broker_has_no_leader() -> None:
    async def no_leader(request: web.Request) -> web.Response:
        return web.Response(status=503, text="no leader\n", headers={"X-Broker-Error": "no leader"})

    async with fake_server(no_leader) as url, Client(url, retry_timeout=1) as client:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(NoLeaderError, match=r"^no leader$"):
            await asyncio.wait_for(client.publish(1, b"x"), 10)
        assert loop.time() - started >= 1
        conn = client.conn(1)
        await conn.open()
        started = loop.time()
        with pytest.raises(NoLeaderError, match=r"^no leader$"):
            await collect(conn, 1, timeout=10)
        assert loop.time() - started >= 1
        await conn.close()


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
        with pytest.raises(PublishOutcomeUnknownError, match="may or may not") as info:
            await client.publish(1, b"did it land?")
    assert str(info.value) == (
        f"POST {proxy.url}/messaging/messages: the server closed the connection after the "
        "request was sent; the publish may or may not have been applied")
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
        await conn.close()
        with pytest.raises(TopicTruncatedError):
            await client.read(1, index=2)


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
    url = dead_url()
    result = await asyncio.to_thread(cli, "ping", url)
    assert result.returncode == 1
    assert result.stderr == f"messaging: cannot connect to {url}: connection refused\n"
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


# -- answers no broker gives: only MessagingErrors leave the client, worded for users ------------


async def test_publish_answer_without_a_valid_index() -> None:
    answers = iter([web.Response(text="ok", headers={"X-Broker-Index": "xxx"}),
                    web.Response(text="ok"),
                    web.Response(text="<html>not json</html>"),
                    web.json_response({"first": "1", "last": 2})])

    async def handler(request: web.Request) -> web.Response:
        return next(answers)

    async with fake_server(handler) as url, Client(url) as client:
        with pytest.raises(NotABrokerError) as info:
            await client.publish(1, b"x")
        assert str(info.value) == (f"{url} does not look like a messaging broker: "
                                   "invalid X-Broker-Index 'xxx'")
        with pytest.raises(NotABrokerError, match=r"its answer has no X-Broker-Index$"):
            await client.publish(1, b"x")
        with pytest.raises(NotABrokerError, match=r"its answer is not JSON$"):
            await client.publish_batch(1, [b"x"])
        with pytest.raises(NotABrokerError, match=r"no valid 'first' index$"):
            await client.publish_batch(1, [b"x"])


@pytest.mark.parametrize("body", [b"pong", b"\xff\xfe", b"[]", b'{"urls": 5}',
                                  b'{"nodes": []}', b'{"urls": [1]}', b'{"urls": ["ftp://a"]}'])
async def test_invalid_ping_answers(body: bytes, tmp_path: Path) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    config = tmp_path / "client.json"
    async with fake_server(handler) as url, Client(url, config_path=config) as client:
        with pytest.raises(NotABrokerError, match=f"^{url} does not look like a messaging"):
            await client.ping()
        assert client.urls == [url]
    assert not config.exists()


async def test_invalid_list_and_read_answers() -> None:
    async def handler(request: web.Request) -> web.Response:
        if request.path == "/messaging/topics":
            return web.json_response({"topics": []})
        return web.Response(text="<html>welcome</html>", content_type="text/html")

    async with fake_server(handler) as url, Client(url) as client:
        with pytest.raises(NotABrokerError, match="topic list is not a JSON list"):
            await client.topics()
        with pytest.raises(NotABrokerError, match=r"its answer is not JSON$"):
            await client.topic(1)
        with pytest.raises(NotABrokerError, match="it sent text/html; charset=utf-8, not frames"):
            await client.read(1)
        for streaming in (True, False):
            conn = client.conn(1)
            await conn.open(streaming=streaming)
            with pytest.raises(NotABrokerError, match=r"not frames$"):
                await collect(conn, 1, timeout=5)
            await conn.close()


@pytest.mark.parametrize(("content", "why"), [
    ("not json at all", "not JSON"),
    ("", "not JSON"),
    ("[]", 'expected JSON {"urls"'),
    ('{"urls": "http://127.0.0.1:1"}', 'expected JSON {"urls"'),
    ('{"urls": [null]}', 'expected JSON {"urls"'),
    ("{}", 'expected JSON {"urls"'),
    ('{"urls": ["ftp://127.0.0.1:1"]}', "unsupported scheme 'ftp'"),
])
async def test_invalid_config_file_names_the_file(content: str, why: str,
                                                  tmp_path: Path) -> None:
    config = tmp_path / "client.json"
    config.write_text(content)
    with pytest.raises(ClientConfigError) as info:
        await Client("http://127.0.0.1:1", config_path=config).open()
    assert str(info.value).startswith(f"invalid client config {config}: ")
    assert why in str(info.value)


async def test_unreadable_config_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ClientConfigError) as info:
        await Client("http://127.0.0.1:1", config_path=tmp_path).open()
    assert str(info.value) == f"cannot read client config {tmp_path}: is a directory"


async def test_error_pages_without_a_broker_error_are_not_dumped() -> None:
    async with fake_server(html_404) as url, Client(url) as client:
        expected = f"{url} does not look like a messaging broker: it answered HTTP 404 Not Found"
        for call in (client.publish(1, b"x"), client.topics(), client.ping(), client.read(1)):
            with pytest.raises(NotABrokerError) as info:
                await call
            assert str(info.value) == expected
        conn = client.conn(1)
        await conn.open()
        with pytest.raises(NotABrokerError) as info:
            await collect(conn, 1, timeout=5)
        assert str(info.value) == expected
        await conn.close()


async def test_a_server_that_does_not_speak_http() -> None:
    async with tcp_server(b"SSH-2.0-OpenSSH_9.2\r\n") as url, Client(url) as client:
        expected = f"{url} does not look like a messaging broker: its answer is not valid HTTP"
        for call in (client.publish(1, b"x"), client.topics()):
            with pytest.raises(NotABrokerError) as info:
                await asyncio.wait_for(call, 5)
            assert str(info.value) == expected
        conn = client.conn(1)
        await conn.open()
        with pytest.raises(NotABrokerError, match=r"not valid HTTP$"):
            await collect(conn, 1, timeout=5)
        await conn.close()


@pytest.mark.parametrize(("url", "why"), [
    ("ftp://127.0.0.1:21", "unsupported scheme 'ftp'"),
    ("127.0.0.1:8086", "expected http://HOST:PORT or https://HOST:PORT"),
    ("http://", "expected http://HOST:PORT"),
    ("http://127.0.0.1:99999", "the port must be a number from 1 to 65535"),
    ("http://127.0.0.1:port", "the port must be a number from 1 to 65535"),
])
def test_unusable_urls_are_rejected_at_once(url: str, why: str) -> None:
    with pytest.raises(InvalidURLError) as info:
        Client(url)
    assert str(info.value).startswith(f"invalid broker URL {url!r}: ")
    assert why in str(info.value)
