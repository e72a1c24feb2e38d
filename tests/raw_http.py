"""Raw HTTP/1.1 over sockets, for tests that send what no HTTP client would: half a request
line, control characters, garbage, pipelined and never-finished requests."""

from __future__ import annotations

import asyncio
import re

PRINTABLE_HEADER = re.compile(rb"[ -~]*")
PING = b"GET /messaging/ping HTTP/1.1\r\nHost: t\r\n\r\n"


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


async def closed_after(reader: asyncio.StreamReader, limit: float = 10.0) -> float:
    """Seconds until the broker closes the connection (reading and dropping any bytes)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        while await asyncio.wait_for(reader.read(65536), limit):
            pass
    except ConnectionResetError:
        pass
    return loop.time() - started
