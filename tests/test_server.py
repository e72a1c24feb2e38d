"""The broker process around the app: header timeout, connection cap, CLI checks."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

import messaging
from messaging.message import BatchDecoder
from messaging.server import BrokerServer
from tests.conftest import StartServer, wait_until
from tests.test_http_edges import exchange, parse_head, read_response

TIMEOUT = 0.5  # the header timeout these tests give their brokers
PING = b"GET /messaging/ping HTTP/1.1\r\nHost: t\r\n\r\n"


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


async def open_streaming_get(server: BrokerServer, topic: int,
                             ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(f"GET /messaging/messages?topicID={topic}&streaming=true HTTP/1.1\r\n"
                 "Host: t\r\n\r\n".encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert parse_head(head)[0] == 200
    return reader, writer


# -- 9: header timeout --------------------------------------------------------------------


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


# -- the flags, end to end ----------------------------------------------------------------


async def test_broker_flags_set_the_header_timeout_and_the_cap(broker_process) -> None:
    proc = broker_process(None, "--header-timeout", "500ms", "--max-connections", "2").start()
    port = int(proc.url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /messaging/ping HTTP/1.1\r\nHo")
    _held, held_writer = await asyncio.open_connection("127.0.0.1", port)
    raw = await exchange(port, PING)  # a third connection
    assert parse_head(raw)[0] == 503
    assert await closed_after(reader) < 3
    writer.close()
    held_writer.close()
    for request in [b"G\x00T / HTTP/1.1\r\n\r\n", b"GET /x%00 HTTP/1.1\r\n\r\n"] * 20:
        assert parse_head(await exchange(port, request))[0] in (400, 404, 503)
    assert proc.terminate() == 0
    log = proc.log.read_text()
    assert "Traceback" not in log
    assert log.count(" WARNING ") <= 25, log


# -- 11: the data directory -------------------------------------------------------------------


def run_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``messaging`` from this source tree, run in ``cwd``."""
    source = str(Path(messaging.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [source, *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, "-m", "messaging.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("data", ["", "   "])
def test_broker_refuses_an_empty_data_directory(tmp_path: Path, data: str) -> None:
    result = run_cli(tmp_path, "broker", "--data", data, "--bind", "127.0.0.1:0")
    assert result.returncode != 0
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--data" in lines[0] and "error" in lines[0], result.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written into the current directory


@pytest.mark.parametrize(("flag", "value"), [("--header-timeout", "0"),
                                             ("--max-connections", "0"),
                                             ("--max-connections", "１０")])
def test_broker_refuses_limits_that_cannot_work(tmp_path: Path, flag: str, value: str) -> None:
    result = run_cli(tmp_path, "broker", "--data", str(tmp_path / "d"), flag, value)
    assert result.returncode == 2
    assert flag in result.stderr.strip().splitlines()[-1]
    assert list(tmp_path.iterdir()) == []
