"""Plain HTTP/1.1 exchanges (messaging.client.exchange) against raw sockets: every way a
broker's answer can be framed, kept-alive reuse, and every way it can fail."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from messaging.client import exchange
from messaging.client.exchange import Exchanges, NotHttp, NotSent, ServerClosed
from messaging.client.failures import NOT_SENT, definitive, describe
from tests.raw_server import Handler, raw_server


@contextlib.asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[str]:
    """A raw server on 127.0.0.1; yields its base URL."""
    async with raw_server(handler) as port:
        yield f"http://127.0.0.1:{port}"


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head, await reader.readexactly(length)


def answering(*answers: bytes, close: bool = False) -> Handler:
    """A handler that reads a request and writes the next answer, for each answer."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for answer in answers:
            await read_request(reader)
            writer.write(answer)
            await writer.drain()
        if not close:
            with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
                await reader.read()

    return handler


async def test_a_request_is_written_whole_and_answers_are_read_by_length() -> None:
    seen: list[tuple[bytes, bytes]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(3):
            seen.append(await read_request(reader))
            writer.write(b"HTTP/1.1 200 OK\r\nX-Broker-Index: 7\r\nContent-Length: 5\r\n\r\nhello")
            await writer.drain()

    async with serving(handler) as url:
        exchanges = Exchanges(5.0, {"Authorization": "Bearer t"})
        for _ in range(3):  # one connection, kept alive
            answer = await exchanges.request("POST", url, "/messaging/messages",
                                             {"topicID": "3", "x y": "a&b"}, b"body",
                                             {"Producer-Id": "p"})
            assert (answer.status, answer.headers["X-Broker-Index"], answer.body) == (
                200, "7", b"hello")
        exchanges.close()
    head, body = seen[0]
    assert body == b"body"
    assert head.startswith(b"POST /messaging/messages?topicID=3&x%20y=a%26b HTTP/1.1\r\n")
    for line in (b"Authorization: Bearer t", b"Producer-Id: p", b"Content-Length: 4"):
        assert line in head.split(b"\r\n")
    assert len(seen) == 3


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhel\r\n2;x=y\r\nlo\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello",
])
async def test_chunked_and_lowercase_answers(answer: bytes) -> None:
    async with serving(answering(answer, answer)) as url:
        exchanges = Exchanges(5.0)
        for _ in range(2):
            assert (await exchanges.request("POST", url, "/p", {}, b"x")).body == b"hello"
        exchanges.close()


async def test_an_answer_that_ends_with_the_connection() -> None:
    async with serving(answering(b"HTTP/1.0 200 OK\r\n\r\nall of it", close=True)) as url:
        exchanges = Exchanges(5.0)
        answer = await exchanges.request("POST", url, "/p", {}, b"x")
        assert answer.body == b"all of it"
        exchanges.close()


async def test_connection_close_is_not_reused() -> None:
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await read_request(reader)
        writer.write(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
        await writer.drain()

    async with serving(handler) as url:
        exchanges = Exchanges(5.0)
        for _ in range(3):
            assert (await exchanges.request("POST", url, "/p", {}, b"x")).status == 204
        exchanges.close()
    assert connections == 3


async def test_an_idle_connection_past_its_reuse_time_is_replaced(
        monkeypatch: pytest.MonkeyPatch) -> None:
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await answering(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n" * 1)(reader, writer)

    monkeypatch.setattr(exchange, "IDLE_REUSE", 0.0)
    async with serving(handler) as url:
        exchanges = Exchanges(5.0)
        for _ in range(2):
            await exchanges.request("POST", url, "/p", {}, b"x")
        exchanges.close()
    assert connections == 2


async def test_a_refused_connection_was_never_sent() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    exchanges = Exchanges(5.0)
    with pytest.raises(NotSent) as info:
        await exchanges.request("POST", f"http://127.0.0.1:{port}", "/p", {}, b"x")
    assert isinstance(info.value, NOT_SENT)
    assert definitive(info.value)
    assert describe(info.value) == "connection refused"


@pytest.mark.parametrize("answer", [
    b"",  # closed without a word
    b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf",  # cut off in the body
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",  # cut off in a chunk
])
async def test_a_connection_closed_before_a_whole_answer(answer: bytes) -> None:
    async with serving(answering(answer, close=True)) as url:
        exchanges = Exchanges(5.0)
        with pytest.raises(ConnectionError) as info:
            await exchanges.request("POST", url, "/p", {}, b"x")
        assert not isinstance(info.value, NOT_SENT)  # it may have been read
        if not answer:
            assert isinstance(info.value, ServerClosed)
            assert describe(info.value) == "the server closed the connection"
        exchanges.close()


@pytest.mark.parametrize("answer", [
    b"SSH-2.0-OpenSSH_9.2\r\n",
    b"HTTP/1.1 2xx OK\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: -4\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
])
async def test_an_answer_that_is_not_http(answer: bytes) -> None:
    async with serving(answering(answer)) as url:
        exchanges = Exchanges(5.0)
        with pytest.raises(NotHttp):
            await asyncio.wait_for(exchanges.request("POST", url, "/p", {}, b"x"), 5)
        exchanges.close()


async def test_a_large_body_arrives_whole() -> None:
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _head, body = await read_request(reader)
        seen.append(body)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()

    body = bytes(range(256)) * 4096  # 1 MiB: written after the head, not joined to it
    async with serving(handler) as url:
        exchanges = Exchanges(5.0)
        assert (await exchanges.request("POST", url, "/p", {}, body)).body == b"ok"
        exchanges.close()
    assert seen == [body]
