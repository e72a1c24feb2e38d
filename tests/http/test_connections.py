"""The broker's connections, in process: the header timeout, the connection cap, and
malformed requests (floods of what aiohttp cannot parse) logged as one rate-limited warning
line each, never a traceback.

The ``messaging broker`` command (its flags, the data directory) is tests/e2e/test_cli.py.
"""

from __future__ import annotations

import asyncio
import logging
import re

import aiohttp
import pytest

from messaging.frames import BatchDecoder
from messaging.http.connections import RejectionLog
from messaging.http.server import BrokerServer
from tests.conftest import StartServer, wait_until
from tests.raw_http import PING, closed_after, exchange, parse_head, read_response, responses

TIMEOUT = 0.5  # the header timeout these tests give their brokers


async def open_streaming_get(server: BrokerServer, topic: int,
                             ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(f"GET /messaging/messages?topicID={topic}&streaming=true HTTP/1.1\r\n"
                 "Host: t\r\n\r\n".encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert parse_head(head)[0] == 200
    return reader, writer


# -- 9: header timeout --------------------------------------------------------------------


@pytest.mark.e2e  # over a second: left out of the unit run
async def test_slowloris_connections_are_closed_after_the_header_timeout(
        start_server: StartServer, http: aiohttp.ClientSession) -> None:
    server = await start_server(header_timeout=TIMEOUT)
    stream = await http.get(f"{server.url}/messaging/messages",
                            params={"topicID": "1", "streaming": "true"})
    assert stream.status == 200
    connections = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(40)]
    for _reader, writer in connections:
        writer.write(b"GET /messaging/ping HTTP/1.1\r\nHost: t\r\nX-Slow: ab")  # half a line
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.gather(*(writer.drain() for _reader, writer in connections))
    await asyncio.wait_for(asyncio.gather(*(closed_after(reader) for reader, _w in connections)),
                           10)
    elapsed = loop.time() - started
    assert TIMEOUT * 0.8 < elapsed < TIMEOUT + 3
    assert server.connections is not None

    async def only_the_stream_is_left() -> bool:
        return server.connections is not None and server.connections.open == 1

    await wait_until(only_the_stream_is_left, timeout=5, what="the slow connections to close")
    for _reader, writer in connections:
        writer.close()

    # The streaming GET outlives the header timeout several times over and still delivers.
    await asyncio.sleep(3 * TIMEOUT)  # the passing of time is what is being tested
    assert server.connections.open == 1
    async with http.post(f"{server.url}/messaging/messages", params={"topicID": "1"},
                         data=b"still streaming") as resp:
        assert resp.status == 200
    decoder = BatchDecoder(after=0)
    got: list = []
    while not got:
        batches = decoder.feed(await asyncio.wait_for(stream.content.readany(), 10))
        got.extend(m for batch in batches for m in batch.messages())
    assert [m.data for m in got] == [b"still streaming"]
    stream.close()


@pytest.mark.e2e  # over a second: left out of the unit run
async def test_requests_that_finish_their_headers_in_time_are_served(
        start_server: StartServer) -> None:
    server = await start_server(header_timeout=TIMEOUT)
    # Headers in pieces, complete within the timeout.
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    for piece in (b"GET /messaging/pi", b"ng HTTP/1.1\r\nHo", b"st: t\r\n", b"\r\n"):
        writer.write(piece)
        await asyncio.sleep(TIMEOUT / 8)
    assert (await read_response(reader))[0] == 200
    # A kept-alive connection serves a second request sent soon after the first.
    await asyncio.sleep(TIMEOUT / 2)
    writer.write(PING)
    assert (await read_response(reader))[0] == 200
    writer.close()

    # A body that trickles in for longer than the timeout: the head was complete in time.
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"POST /messaging/messages?topicID=2 HTTP/1.1\r\nHost: t\r\n"
                 b"Content-Length: 8\r\n\r\n")
    for piece in (b"sl", b"ow", b" b", b"ody"):
        await asyncio.sleep(TIMEOUT / 2)
        writer.write(piece)
    status, headers, _body = await read_response(reader)
    assert status == 200 and headers["x-broker-index"] == "1"
    writer.close()


@pytest.mark.e2e  # 0.5 s a case, over two in all: left out of the unit run
@pytest.mark.parametrize("case", ["idle", "partial-second", "pipelined-partial",
                                  "declined-upgrade-tail"])
async def test_kept_alive_connections_are_held_to_the_header_timeout(
        start_server: StartServer, case: str) -> None:
    server = await start_server(header_timeout=TIMEOUT)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    if case == "pipelined-partial":  # a whole request and half of the next in one write
        writer.write(PING + b"GET /messaging/ping HTTP/1.1\r\nX-Slow: a")
    elif case == "declined-upgrade-tail":
        writer.write(b"GET /messaging/ping HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\n"
                     b"Upgrade: nothing\r\n\r\n\x00\x01")
    else:
        writer.write(PING)
    assert (await read_response(reader))[0] == 200
    if case == "partial-second":
        writer.write(b"GET /messaging/ping HTTP/1.1\r\nX-Slow: a")
    assert await closed_after(reader) < TIMEOUT + 3
    writer.close()


async def fresh_get(url: str) -> tuple[int, str, str]:
    """GET on a new connection: status, X-Broker-Error and the body."""
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url) as resp:
        return resp.status, resp.headers.get("X-Broker-Error", ""), await resp.text()


# -- 9: connection cap --------------------------------------------------------------------


async def test_connections_past_the_cap_get_503_and_are_closed(
        start_server: StartServer) -> None:
    server = await start_server(max_connections=3)
    streams = [await open_streaming_get(server, 1) for _ in range(3)]
    assert server.connections is not None and server.connections.open == 3

    raw = await exchange(server.port, PING)  # read to the end: the broker closes it
    status, headers = parse_head(raw)
    assert status == 503
    assert "too many connections" in headers["x-broker-error"]
    assert headers["connection"] == "close"
    status, error, text = await fresh_get(f"{server.url}/messaging/ping")
    assert status == 503 and "at most 3" in error and "too many connections" in text

    _reader, writer = streams.pop()
    writer.close()

    async def below_the_cap() -> bool:
        return server.connections is not None and server.connections.open < 3

    await wait_until(below_the_cap, timeout=5, what="a connection to be released")
    assert (await fresh_get(f"{server.url}/messaging/ping"))[0] == 200
    for _reader, writer in streams:
        writer.close()


async def test_refused_connection_that_never_closes_is_cut(start_server: StartServer) -> None:
    server = await start_server(max_connections=1)
    _held = await open_streaming_get(server, 1)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert parse_head(head)[0] == 503
    # The client neither reads on nor closes: the broker cuts it after a short linger.
    assert await closed_after(reader) < 5
    writer.close()
    _held[1].close()


# -- 10: malformed requests are one rate-limited warning line, never a traceback ------------

MALFORMED = [
    b"G\x00T / HTTP/1.1\r\nHost: t\r\n\r\n",                         # bad method
    b"GET\r\n\r\n",                                                   # bad request line
    b"GET / HTTP/9.Z\r\nHost: t\r\n\r\n",                             # bad version
    b"GET / HTTP/1.1\r\nHo st: t\r\n\r\n",                            # invalid header name
    b"GET / HTTP/1.1\r\nX: a\x00b\r\n\r\n",                           # invalid header value
    b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n",                    # request line too long
    b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 300 + b"\r\n",              # too many headers
    b"GET /\xc3\xa9 HTTP/1.1\r\nHost: t\r\n\r\n",                      # raw non-ASCII path
    b"POST /messaging/messages?topicID=1 HTTP/1.1\r\nHost: t\r\n"
    b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",       # bad chunk size
    b"POST /messaging/messages?topicID=1 HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",                   # smuggling attempt
    b"POST /messaging/messages?topicID=1 HTTP/1.1\r\nHost: t\r\n"
    b"Content-Length: abc\r\n\r\n",                                   # bad Content-Length
    b"POST /messaging/messages?topicID=1 HTTP/1.1\r\nHost: t\r\n"
    b"Content-Encoding: gzip\r\nContent-Length: 5\r\n\r\nhello",      # not gzip
    b"POST /messaging/messages HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n"
    b"Content-Type: application/x-messaging-frames\r\n"
    b"Content-Encoding: deflate\r\n\r\nhello",                          # not deflate
    b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + b"\x00" * 40,  # TLS on the HTTP port
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",                              # HTTP/2 preface
]


@pytest.mark.e2e  # slow: over a third of a second
async def test_malformed_requests_log_no_tracebacks(server: BrokerServer,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    requests = MALFORMED * 20  # 300 requests
    limit = asyncio.Semaphore(50)

    async def send(request: bytes) -> bytes:
        async with limit:
            return await exchange(server.port, request)

    loop = asyncio.get_running_loop()
    started = loop.time()
    answers = await asyncio.wait_for(asyncio.gather(*(send(r) for r in requests)), 60)
    elapsed = loop.time() - started
    assert server.connections is not None
    server.connections.rejections.flush()

    for request, raw in zip(requests, answers, strict=True):
        status, headers = responses(raw)[-1]
        assert status == 400, (request[:60], raw[:300])
        assert headers["x-broker-error"], raw[:300]

    assert "Traceback" not in caplog.text
    assert not [r for r in caplog.records if r.exc_info], caplog.text[:3000]
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert all(r.name == "messaging.http.connections" for r in warnings), {
        r.name for r in warnings}
    rejected = [r for r in warnings if r.getMessage().startswith("rejected")]
    summaries = [int(m.group(1)) for r in warnings
                 if (m := re.match(r"(\d+) more rejected", r.getMessage()))]
    assert len(warnings) == len(rejected) + len(summaries)
    # A rejection logged after a window whose summary had not fired yet (a busy loop) carries
    # the count held back before it instead of a summary line.
    carried = [int(m.group(1)) for r in rejected
               if (m := re.search(r"\((\d+) more like it not logged\)$", r.getMessage()))]
    assert len(rejected) + sum(summaries) + sum(carried) == len(requests)  # each exactly once
    seconds = int(elapsed) + 2  # rate windows the flood can touch
    assert len(rejected) <= seconds * server.connections.rejections.per_second
    assert len(summaries) <= seconds


@pytest.mark.e2e  # over a second: left out of the unit run
async def test_rejection_log_summarises_past_its_rate(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    rejections = RejectionLog(logging.getLogger("test.rejections"), per_second=3)
    for i in range(10):
        rejections.warning("rejected %d", i)
    assert [r.getMessage() for r in caplog.records] == ["rejected 0", "rejected 1", "rejected 2"]
    await asyncio.sleep(1.2)  # the summary is due when the one-second window ends
    assert caplog.records[-1].getMessage().startswith("7 more rejected")
    rejections.warning("rejected again")
    assert caplog.records[-1].getMessage() == "rejected again"
    assert len(caplog.records) == 5
