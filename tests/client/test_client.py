"""The async client against a real broker, directly and through a fault-injecting proxy."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web

from messaging.client import exchange
from messaging.client.client import Client, Conn
from messaging.errors import (
    ClientConfigError,
    ConnectionFailedError,
    InvalidURLError,
    NoLeaderError,
    NotABrokerError,
    PublishOutcomeUnknownError,
    TopicDeletedError,
    TopicTruncatedError,
)
from messaging.http.server import BrokerServer
from tests.proxy import FaultProxy, dead_url
from tests.raw_server import app_server, raw_server


@contextlib.asynccontextmanager
async def fake_server(
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> AsyncIterator[str]:
    """A tiny aiohttp server on 127.0.0.1 answering every path with ``handler`` (but the map
    of topic groups: 404, as a broker with one group); its URL."""
    app = web.Application()
    app.router.add_get("/messaging/groups", _no_groups)
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def _no_groups(request: web.Request) -> web.Response:
    return web.Response(status=404)


@contextlib.asynccontextmanager
async def tcp_server(greeting: bytes) -> AsyncIterator[str]:
    """A TCP server that writes ``greeting`` (maybe nothing) and hangs up; its URL."""
    async def handle(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(greeting)
        with contextlib.suppress(ConnectionError):
            await writer.drain()

    async with raw_server(handle) as port:
        yield f"http://127.0.0.1:{port}"


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


async def test_failover_when_the_first_url_is_down(server: BrokerServer) -> None:
    async with Client([dead_url(), server.url]) as client:
        assert await client.publish(1, b"x") == 1
        conn = client.conn(1)
        await conn.open()
        assert [m.data for m in await collect(conn, 1)] == [b"x"]
        await conn.close()


@pytest.mark.e2e  # over half a second: left out of the unit run
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


@pytest.mark.e2e  # over a second: left out of the unit run
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


async def test_redirect_is_followed_and_remembered(server: BrokerServer) -> None:
    hits = []

    async def redirect(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response(status=307, headers={"Location": server.url + request.path_qs})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", redirect)
    async with app_server(app) as url, Client(url) as client:
        assert await client.publish(1, b"a") == 1
        assert client.leader == server.url
        assert await client.publish(1, b"b") == 2
        # (The client asked once for the map of topic groups: a 404 there, none.)
        assert hits == ["/messaging/groups", "/messaging/messages"]


async def test_publish_cut_mid_request_is_outcome_unknown(server: BrokerServer,
                                                          proxy: FaultProxy) -> None:
    proxy.drop_responses = True
    async with Client(proxy.url, idempotent=False) as client:
        with pytest.raises(PublishOutcomeUnknownError, match="may or may not") as info:
            await client.publish(1, b"did it land?")
    assert str(info.value) == (
        f"POST {proxy.url}/messaging/messages: the server closed the connection after the "
        "request was sent; the publish may or may not have been applied")
    async with Client(server.url) as direct:
        # It did land: retrying blindly would have stored it twice.
        assert [m.data for m in await direct.read(1)] == [b"did it land?"]


async def test_idempotent_publish_whose_answer_is_lost_is_stored_once(
        server: BrokerServer, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default client sends a publish again when its answer is lost; the broker's
    producer state stores it once, single and batch alike."""
    monkeypatch.setattr(exchange, "IDLE_REUSE", 0.0)  # every publish on a new connection
    async with Client(proxy.url) as client:
        # A publish elsewhere first: the client has asked for the cluster's map of topic
        # groups (there is none), so the connections counted below are the publish's own.
        await client.publish(2, b"warm-up")
        used = proxy.connections
        proxy.drop_connections = {used + 1, used + 2}  # two answers lost, the third arrives
        index = await client.publish(1, b"exactly once")
        assert proxy.connections == used + 3
        proxy.drop_connections = {used + 4}  # a new connection, whose answer is lost
        first, last = await client.publish_batch(1, [b"a", b"b", b"c"])
        assert proxy.connections == used + 5
    async with Client(server.url) as direct:
        messages = await direct.read(1)
    assert [m.data for m in messages] == [b"exactly once", b"a", b"b", b"c"]
    assert [m.index for m in messages] == [index, first, first + 1, last]


async def test_concurrent_idempotent_publishes_take_lanes(server: BrokerServer) -> None:
    """Concurrent publishes to one topic each use a producer lane of their own: none is
    refused as out of order, and each is stored once."""
    async with Client(server.url) as client:
        indexes = await asyncio.gather(*(client.publish(2, b"%d" % i) for i in range(50)))
        assert client.producers is not None
        assert [m.data for m in await client.read(2)] == [
            b"%d" % i for i in sorted(range(50), key=lambda i: indexes[i])]


async def test_ping_persists_urls(server: BrokerServer, tmp_path: Path) -> None:
    config = tmp_path / "client.json"
    async with Client(server.url, config_path=config) as client:
        assert await client.ping() == [server.url]
    assert json.loads(config.read_text()) == {"urls": [server.url]}
    async with Client([dead_url()], config_path=config) as client:
        assert await client.publish(1, b"found through the saved urls") == 1


# -- answers no broker gives: only MessagingErrors leave the client, worded for users ------------


async def test_publish_answer_without_a_valid_index() -> None:
    answers = iter([web.Response(text="ok", headers={"X-Broker-Index": "xxx"}),
                    web.Response(text="ok"),
                    web.Response(text="<html>not json</html>"),
                    web.json_response({"first": "1.0", "last": 2})])  # "1" would be read

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


@pytest.mark.parametrize(("headers", "topic", "message"), [
    ({"X-Broker-First-Index": "6", "X-Broker-Topic": "12"}, 12,
     "topic 12: index below 6 was deleted by retention; first available index is 6"),
    ({"X-Broker-First-Index": "6"}, None,
     "index below 6 was deleted by retention; first available index is 6"),
])
async def test_a_410_names_its_topic_from_a_header_not_the_text(
        headers: dict[str, str], topic: int | None, message: str) -> None:
    async def gone(request: web.Request) -> web.Response:
        return web.Response(status=410, text="topic 99: whatever\n",
                            headers={"X-Broker-Error": "topic 99: whatever", **headers})

    async with fake_server(gone) as url, Client(url) as client:
        with pytest.raises(TopicTruncatedError) as info:
            await client.read(1, index=2)
    assert (info.value.topic, info.value.first_index, str(info.value)) == (topic, 6, message)


@pytest.mark.parametrize(("headers", "first_index"), [
    ({"X-Broker-Deleted-At": "9", "X-Broker-Topic": "12"}, 0),
    ({"X-Broker-Deleted-At": "9", "X-Broker-Topic": "12", "X-Broker-First-Index": "10"}, 10),
])
async def test_a_410_of_a_deleted_topic_is_a_topic_deleted_error(
        headers: dict[str, str], first_index: int) -> None:
    """A deleted topic (created again or not) is told apart by X-Broker-Deleted-At."""
    async def gone(request: web.Request) -> web.Response:
        return web.Response(status=410, headers={"X-Broker-Error": "deleted", **headers})

    async with fake_server(gone) as url, Client(url) as client:
        with pytest.raises(TopicDeletedError) as info:
            await client.read(12, index=2)
    assert (info.value.topic, info.value.deleted_at, info.value.first_index) == (
        12, 9, first_index)


@pytest.mark.parametrize("header", ["X-Broker-First-Index", "X-Broker-Topic",
                                    "X-Broker-Deleted-At"])
async def test_a_410_with_an_invalid_number_is_not_from_a_broker(header: str) -> None:
    async def gone(request: web.Request) -> web.Response:
        return web.Response(status=410, headers={
            "X-Broker-Error": "gone", "X-Broker-First-Index": "6", "X-Broker-Topic": "1",
            header: "٣"})

    async with fake_server(gone) as url, Client(url) as client:
        with pytest.raises(NotABrokerError) as info:
            await client.read(1, index=2)
    assert str(info.value) == (f"{url} does not look like a messaging broker: invalid "
                               f"{header} '٣'")


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
