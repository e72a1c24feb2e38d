"""Hostile and malformed HTTP over raw sockets: control characters, bad encodings, odd
numbers, and floods of requests aiohttp cannot parse."""

from __future__ import annotations

import asyncio
import gzip
import logging
import re

import aiohttp
import pytest

from messaging.http import RejectionLog, error_response
from messaging.message import decode
from messaging.server import BrokerServer

PRINTABLE_HEADER = re.compile(rb"[ -~]*")


async def exchange(port: int, request: bytes, timeout: float = 10.0) -> bytes:
    """Send ``request`` on a new connection and read until the broker closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()


async def read_response(reader: asyncio.StreamReader, timeout: float = 10.0,
                        ) -> tuple[int, dict[str, str], bytes]:
    """One response with a Content-Length from a kept-alive connection."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    status, headers = parse_head(head)
    length = int(headers.get("content-length", "0"))
    body = await asyncio.wait_for(reader.readexactly(length), timeout)
    return status, headers, body


def parse_head(raw: bytes) -> tuple[int, dict[str, str]]:
    """Status and headers (lower-cased names) of a raw response; every header line must be
    printable ASCII, or a client could not read it."""
    head = raw.split(b"\r\n\r\n", 1)[0]
    status_line, *lines = head.split(b"\r\n")
    assert status_line.startswith(b"HTTP/1."), raw[:200]
    headers = {}
    for line in lines:
        assert PRINTABLE_HEADER.fullmatch(line), line
        name, _, value = line.decode("ascii").partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers


def body_of(raw: bytes) -> bytes:
    return raw.split(b"\r\n\r\n", 1)[1]


def responses(raw: bytes) -> list[tuple[int, dict[str, str]]]:
    """Status and headers of every response in ``raw`` (each has a Content-Length)."""
    found = []
    while raw:
        status, headers = parse_head(raw)
        start = raw.index(b"\r\n\r\n") + 4
        raw = raw[start + int(headers["content-length"]):]
        found.append((status, headers))
    return found


# -- 7: control characters echoed into X-Broker-Error ------------------------------------------


@pytest.mark.parametrize("escape", ["%00", "%01", "%7F", "%0A", "%0D%0A", "%1B", "%C3%A9"])
async def test_control_characters_in_the_path_get_a_sanitised_404(server: BrokerServer,
                                                                  escape: str) -> None:
    raw = await exchange(server.port, f"GET /nowhere{escape}x HTTP/1.1\r\nHost: t\r\n"
                                      f"Connection: close\r\n\r\n".encode())
    status, headers = parse_head(raw)
    assert status == 404
    message = headers["x-broker-error"]
    assert message.startswith("not found: GET /nowhere") and message.endswith("x")
    assert body_of(raw).decode("ascii") == message + "\n"


async def test_control_characters_in_a_parameter_get_a_sanitised_400(server: BrokerServer,
                                                                     ) -> None:
    raw = await exchange(server.port, b"GET /messaging/topics/1%00%7F HTTP/1.1\r\nHost: t\r\n"
                                      b"Connection: close\r\n\r\n")
    status, headers = parse_head(raw)
    assert status == 400
    assert headers["x-broker-error"] == (r"invalid topic id '1\x00\x7f': "
                                         "expected an unsigned integer")
    raw = await exchange(server.port, b"GET /messaging/messages?topicID=%01 HTTP/1.1\r\n"
                                      b"Host: t\r\nConnection: close\r\n\r\n")
    assert parse_head(raw)[0] == 400


def test_error_response_escapes_every_non_printable_character() -> None:
    message = "".join(map(chr, range(256))) + "\u2028\U0001f600"
    response = error_response(400, message)
    header = response.headers["X-Broker-Error"]
    assert PRINTABLE_HEADER.fullmatch(header.encode("ascii"))
    assert response.text == header + "\n"
    assert r"\x00" in header and r"\x7f" in header and r"\u2028" in header
    assert "".join(map(chr, range(32, 127))) in header  # printable ASCII kept as is


# -- 8: bodies that do not decode, numbers int() would take ---------------------------------


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_body_that_does_not_match_its_content_encoding_is_400(
        server: BrokerServer, http: aiohttp.ClientSession, encoding: str) -> None:
    for content_type in ("application/octet-stream", "application/x-messaging-frames"):
        async with http.post(f"{server.url}/messaging/messages", params={"topicID": "1"},
                             data=b"this is not compressed",
                             headers={"Content-Encoding": encoding,
                                      "Content-Type": content_type}) as resp:
            assert resp.status == 400, await resp.text()
            assert f"not valid {encoding} data" in resp.headers["X-Broker-Error"]
    assert server.broker is not None and server.broker.index == 0


async def test_gzip_body_is_decoded(server: BrokerServer, http: aiohttp.ClientSession) -> None:
    async with http.post(f"{server.url}/messaging/messages", params={"topicID": "1"},
                         data=gzip.compress(b"squeezed"),
                         headers={"Content-Encoding": "gzip"}) as resp:
        assert resp.status == 200, await resp.text()
    async with http.get(f"{server.url}/messaging/messages", params={"topicID": "1"}) as resp:
        assert [m.data for m in decode(await resp.read(), after=0)[0]] == [b"squeezed"]


@pytest.mark.parametrize("value", ["１２", "1_0", "+7", " 1 ", "1 ", "-0", "٣", "²", "0x1",
                                   "1e3", "1.0", "9" * 21, "1" * 5000])
async def test_numbers_are_ascii_digits_only(server: BrokerServer, http: aiohttp.ClientSession,
                                             value: str) -> None:
    async with http.post(f"{server.url}/messaging/messages", params={"topicID": value},
                         data=b"x") as resp:
        assert resp.status == 400, await resp.text()
        assert "invalid topicID" in resp.headers["X-Broker-Error"]
    async with http.get(f"{server.url}/messaging/messages",
                        params={"topicID": "1", "index": value}) as resp:
        assert resp.status == 400
        assert "invalid index" in resp.headers["X-Broker-Error"]
    async with http.get(f"{server.url}/messaging/topics/{value.strip() or 'x'}x") as resp:
        assert resp.status in (400, 404)
    assert server.broker is not None and server.broker.index == 0


async def test_plain_numbers_still_work(server: BrokerServer, http: aiohttp.ClientSession) -> None:
    for topic in ("007", str(2**64 - 1)):
        async with http.post(f"{server.url}/messaging/messages", params={"topicID": topic},
                             data=b"x") as resp:
            assert resp.status == 200, await resp.text()
    async with http.get(f"{server.url}/messaging/topics/7") as resp:
        assert (await resp.json())["id"] == 7


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
    assert all(r.name == "messaging.http" for r in warnings), {r.name for r in warnings}
    rejected = [r for r in warnings if r.getMessage().startswith("rejected")]
    summaries = [int(m.group(1)) for r in warnings
                 if (m := re.match(r"(\d+) more rejected", r.getMessage()))]
    assert len(warnings) == len(rejected) + len(summaries)
    assert len(rejected) + sum(summaries) == len(requests)  # each one exactly once
    seconds = int(elapsed) + 2  # rate windows the flood can touch
    assert len(rejected) <= seconds * server.connections.rejections.per_second
    assert len(summaries) <= seconds


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

