"""Plain HTTP/1.1 exchanges for the client's small requests: a publish, a heartbeat, a
listing — one request written in one piece, one answer read whole.

aiohttp's client builds a request object, a payload, a writer, a response object and a
stream reader for every request; for a 100-byte publish that machinery cost the client about
as much CPU as the broker spent storing the message, and most of a millisecond at 1,000
publishes a second. :class:`Exchanges` keeps idle kept-alive connections per broker and
speaks just enough HTTP/1.1 for the broker's answers (a status line, headers, a body sized by
``Content-Length`` or chunked, or ending with the connection). Streams (``Conn``), TLS and
anything unusual stay on aiohttp (:mod:`messaging.client.transport`).

Failures say whether the request may have left (:class:`NotSent`: the connection could not be
made) and are otherwise :class:`ConnectionError` (the connection broke or was closed before
a whole answer) or :class:`NotHttp` (the answer is not HTTP); the transport sorts them as it
does aiohttp's (:mod:`messaging.client.failures`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from urllib.parse import quote, urlsplit

#: An idle connection older than this is closed rather than reused: the broker closes
#: connections idle for its --header-timeout (10 s by default), and a request written just as
#: it does would fail after it may have been read.
IDLE_REUSE = 4.0
#: Idle connections kept per broker.
KEEP_IDLE = 16
#: Bodies up to this size are joined to the head (one write); larger ones follow it.
JOIN_BODY = 64 << 10
#: The largest answer head and body this reads (a listing of many topics fits).
MAX_HEAD = 64 << 10
MAX_BODY = 64 << 20


class NotSent(ConnectionError):
    """The connection could not be made: the request never left (``os_error`` says why)."""

    def __init__(self, os_error: OSError) -> None:
        super().__init__(str(os_error))
        self.os_error = os_error


class ServerClosed(ConnectionError):
    """The broker closed the connection before a whole answer."""


class NotHttp(Exception):
    """The answer is not HTTP."""


class Answer:
    """A whole answer: status, headers (as sent, the last of repeated ones), body."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body


class _Connection(asyncio.Protocol):
    """One kept-alive connection, one exchange at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._waiter: asyncio.Future[None] | None = None
        self._closed: BaseException | None = None
        self.reusable = True
        self.idle_since = time.monotonic()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        self._wake()

    def eof_received(self) -> bool | None:
        self._closed = ServerClosed("the server closed the connection")
        self._wake()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = exc or ServerClosed("the server closed the connection")
        self.reusable = False
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _more(self) -> None:
        """Wait for more bytes (or the end of the connection)."""
        if self._closed is not None:
            raise self._closed if isinstance(self._closed, ConnectionError) else \
                ConnectionError(str(self._closed))
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def exchange(self, request: list[bytes], head_only: bool) -> Answer:
        """Write ``request`` (its parts in order); read its whole answer."""
        assert self.transport is not None
        self.transport.writelines(request)
        buffer = self._buffer
        while (end := buffer.find(b"\r\n\r\n")) < 0:
            if len(buffer) > MAX_HEAD:
                raise NotHttp("answer head too long")
            if buffer and not buffer.startswith(b"HTTP/"[:len(buffer)]):
                raise NotHttp("not an HTTP status line")
            await self._more()
        status, headers, close = _head(bytes(buffer[:end]))
        del buffer[:end + 4]
        length = headers.get("Content-Length") or headers.get("content-length")
        chunked = "chunked" in (headers.get("Transfer-Encoding")
                                or headers.get("transfer-encoding") or "").lower()
        if head_only or status in (204, 304) or 100 <= status < 200:
            body = b""
        elif chunked:
            body = await self._chunked()
        elif length is not None:
            try:
                size = int(length)
            except ValueError as err:
                raise NotHttp("invalid Content-Length") from err
            if not 0 <= size <= MAX_BODY:
                raise NotHttp("invalid Content-Length")
            while len(buffer) < size:
                await self._more()
            body = bytes(buffer[:size])
            del buffer[:size]
        else:  # the body ends with the connection
            close = True
            while self._closed is None:
                if len(buffer) > MAX_BODY:
                    raise NotHttp("answer too long")
                self._waiter = asyncio.get_running_loop().create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
            body = bytes(buffer)
            buffer.clear()
        if close or buffer:
            self.reusable = False
        return Answer(status, headers, body)

    async def _chunked(self) -> bytes:
        buffer = self._buffer
        parts: list[bytes] = []
        size_total = 0
        while True:
            while (eol := buffer.find(b"\r\n")) < 0:
                await self._more()
            try:
                size = int(bytes(buffer[:eol]).split(b";", 1)[0], 16)
            except ValueError as err:
                raise NotHttp("invalid chunk size") from err
            if size < 0 or size_total + size > MAX_BODY:
                raise NotHttp("invalid chunk size")
            while len(buffer) < eol + 2 + size + 2:
                await self._more()
            if size == 0:  # the last chunk (trailers are not used by the broker)
                del buffer[:eol + 4]
                return b"".join(parts)
            parts.append(bytes(buffer[eol + 2:eol + 2 + size]))
            size_total += size
            del buffer[:eol + 2 + size + 2]

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None:
            self.transport.close()


def _head(raw: bytes) -> tuple[int, dict[str, str], bool]:
    """Status, headers and whether the broker closes the connection after the answer."""
    lines = raw.split(b"\r\n")
    status_line = lines[0]
    if not status_line.startswith(b"HTTP/1.") or len(status_line) < 12 \
            or not status_line[9:12].isdigit():
        raise NotHttp("not an HTTP status line")
    status = int(status_line[9:12])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise NotHttp("invalid header line")
        headers[name.strip().decode("latin-1")] = value.strip().decode("latin-1")
    connection = (headers.get("Connection") or headers.get("connection") or "").lower()
    close = connection == "close" or (status_line.startswith(b"HTTP/1.0")
                                      and connection != "keep-alive")
    return status, headers, close


class Exchanges:
    """Kept-alive plain-HTTP connections per broker, for whole-answer requests."""

    def __init__(self, connect_timeout: float, headers: Mapping[str, str] | None = None) -> None:
        self.connect_timeout = connect_timeout
        self._headers = b"".join(f"{k}: {v}\r\n".encode("latin-1")
                                 for k, v in (headers or {}).items())
        self._idle: dict[str, list[_Connection]] = {}

    async def request(self, method: str, base: str, path: str, query: Mapping[str, str],
                      data: bytes | None = None,
                      headers: Mapping[str, str] | None = None) -> Answer:
        """One exchange with the broker at ``base`` (``http://host:port``)."""
        parts = urlsplit(base)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        target = quote(path, safe="/%:@!$&'()*+,;=-._~")
        if query:
            target += "?" + "&".join(f"{quote(k, safe='')}={quote(v, safe='')}"
                                     for k, v in query.items())
        head = [f"{method} {target} HTTP/1.1\r\nHost: {parts.netloc}\r\n".encode("latin-1"),
                self._headers]
        for name, value in (headers or {}).items():
            head.append(f"{name}: {value}\r\n".encode("latin-1"))
        body = data or b""
        if body or method in ("POST", "PUT", "PATCH"):
            head.append(b"Content-Length: %d\r\n" % len(body))
        head.append(b"\r\n")
        # A small request goes out in one write (one packet); a large body is not copied.
        writes = [b"".join(head) + body] if len(body) <= JOIN_BODY else [b"".join(head), body]
        connection = self._take(base)
        if connection is None:
            connection = await self._connect(host, port)
        try:
            answer = await connection.exchange(writes, head_only=method == "HEAD")
        except BaseException:
            connection.close()
            raise
        self._give_back(base, connection)
        return answer

    def _take(self, base: str) -> _Connection | None:
        idle = self._idle.get(base)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if connection.reusable and now - connection.idle_since < IDLE_REUSE:
                return connection
            connection.close()
        return None

    def _give_back(self, base: str, connection: _Connection) -> None:
        idle = self._idle.setdefault(base, [])
        if not connection.reusable or len(idle) >= KEEP_IDLE:
            connection.close()
            return
        connection.idle_since = time.monotonic()
        idle.append(connection)

    async def _connect(self, host: str, port: int) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _transport, connection = await loop.create_connection(_Connection, host, port)
        except OSError as err:
            raise NotSent(err) from err
        except TimeoutError as err:
            raise NotSent(TimeoutError("timed out")) from err
        return connection

    def close(self) -> None:
        """Close every idle connection."""
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()
