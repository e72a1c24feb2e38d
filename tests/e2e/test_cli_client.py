"""``messaging publish/tail/topics/ping`` in subprocesses: failures are one line, and bounded."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

from aiohttp import web

from messaging.client.client import DEFAULT_RETRY_TIMEOUT, Client
from messaging.http.server import BrokerServer
from tests.client.test_client import fake_server, html_404
from tests.conftest import StartServer, cli
from tests.proxy import dead_url

COMMANDS = [("tail", "1"), ("tail", "1", "--follow"), ("publish", "1", "x"), ("topics",),
            ("ping",)]


async def timed_cli(*args: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess[str],
                                                              float]:
    """Run ``messaging ARGS`` off the event loop (so in-process servers keep serving)."""
    started = time.monotonic()
    result = await asyncio.to_thread(cli, *args, timeout=timeout)
    return result, time.monotonic() - started


def assert_one_line_error(result: subprocess.CompletedProcess[str], message: str) -> None:
    assert result.returncode == 1, result
    assert result.stderr == f"messaging: {message}\n"


async def test_no_broker_running_fails_within_three_seconds() -> None:
    url = dead_url()
    # What starting the interpreter costs on this machine right now: a command that fails
    # before any network call (a URL it refuses at once).
    _refused, startup = await timed_cli("ping", "ftp://127.0.0.1:1", timeout=20)
    for command, *rest in COMMANDS:
        result, elapsed = await timed_cli(command, url, *rest, timeout=20)
        assert_one_line_error(result, f"cannot connect to {url}: connection refused")
        assert result.stdout == ""
        assert elapsed - startup < 3, (command, elapsed, startup)


async def test_tail_retries_as_long_as_publish_then_fails() -> None:
    async def no_leader(request: web.Request) -> web.Response:
        return web.Response(status=503, text="no leader\n", headers={"X-Broker-Error": "no leader"})

    bounded = [COMMANDS[0], ("tail", "1", "--follow", "--retry", "15s"), COMMANDS[2]]
    async with fake_server(no_leader) as url:
        runs = await asyncio.gather(*(timed_cli(command, url, *rest, timeout=60)
                                      for command, *rest in bounded))
    for (_command, *rest), (result, elapsed) in zip(bounded, runs, strict=True):
        if "--follow" in rest:  # it says it waits, then gives up with one line
            waiting, error = result.stderr.splitlines()
            assert waiting == "messaging: waiting for the broker (no leader); retrying for 15 s"
            result.stderr = error + "\n"
        assert_one_line_error(result, "no leader")
        assert DEFAULT_RETRY_TIMEOUT <= elapsed < DEFAULT_RETRY_TIMEOUT + 15, elapsed


async def test_tail_starts_at_the_first_kept_index(start_server: StartServer) -> None:
    server = await start_server(max_segment_size=100, max_topic_size=0)
    async with Client(server.url) as client:
        for i in range(6):
            await client.publish(1, b"%d" % i * 80)
        await client.request("POST", "/messaging/retention")
        assert (await client.topic(1))["first_index"] == 6
    result, _ = await timed_cli("tail", server.url, "1")
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == "6\t1\t" + "5" * 80 + "\n"
    result, _ = await timed_cli("tail", server.url, "1", "--from", "2")
    assert_one_line_error(result, "topic 1: index below 6 was deleted by retention; "
                                  "first available index is 6")

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "messaging.cli", "tail", server.url, "1", "--follow",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        first = await asyncio.wait_for(proc.stdout.readline(), 20)
        assert first.decode() == "6\t1\t" + "5" * 80 + "\n"
        async with Client(server.url) as client:
            await client.publish(1, b"seven")
        assert await asyncio.wait_for(proc.stdout.readline(), 20) == b"7\t1\tseven\n"
    finally:
        proc.kill()
        await asyncio.wait_for(proc.wait(), 20)


async def test_errors_read_as_a_user_wants() -> None:
    for command, *rest in COMMANDS:
        result, elapsed = await timed_cli(command, "ftp://127.0.0.1:21", *rest, timeout=20)
        assert_one_line_error(result, "invalid broker URL 'ftp://127.0.0.1:21': unsupported "
                                      "scheme 'ftp', expected http://HOST:PORT or "
                                      "https://HOST:PORT")
        assert elapsed < 3
    async with fake_server(html_404) as url:
        for command, *rest in COMMANDS:
            result, _ = await timed_cli(command, url, *rest, timeout=20)
            assert_one_line_error(result, f"{url} does not look like a messaging broker: it "
                                          "answered HTTP 404 Not Found")

    async def bad_ping(request: web.Request) -> web.Response:
        return web.json_response({"nodes": ["http://127.0.0.1:1"]})

    async with fake_server(bad_ping) as url:
        result, _ = await timed_cli("ping", url)
        assert_one_line_error(result, f'{url} does not look like a messaging broker: its '
                                      'answer is not {"urls": [...]}')


async def test_cli_commands(server: BrokerServer) -> None:
    url = server.url
    run = asyncio.to_thread
    result = await run(cli, "publish", url, "7", "hello")
    assert (result.returncode, result.stdout) == (0, "1\n")
    result = await run(cli, "publish", url, "7", stdin="line one\nline two\n")
    assert result.stdout.startswith("published 2 messages to topic 7 in 1 request, indexes "
                                    "2..3 ("), result
    async with Client(url) as client:
        await client.publish(7, b"\xff\x00binary")
    result = await run(cli, "tail", url, "7")
    assert result.stdout.splitlines() == ["1\t1\thello", "2\t1\tline one", "3\t1\tline two",
                                          "4\t1\t0xff0062696e617279"]
    result = await run(cli, "tail", url, "7", "--from", "3", "--format", "json")
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert isinstance(lines[0].pop("time"), int)  # the append time, ms since the epoch
    assert lines[0] == {"index": 3, "topic": 7, "type": 1, "data": "line two"}
    assert lines[1]["data_base64"] == "/wBiaW5hcnk="
    assert lines[1]["time"] >= 0
    result = await run(cli, "topics", url)
    assert result.returncode == 0 and "SUBSCRIBERS" in result.stdout
    assert result.stdout.splitlines()[1].split()[:3] == ["7", "1", "4"]
    result = await run(cli, "ping", url)
    assert result.stdout.strip() == url


async def test_cli_tail_into_a_closed_pipe(server: BrokerServer) -> None:
    async with Client(server.url) as client:
        await client.publish_batch(8, [b"line %d" % i for i in range(20_000)])
    proc = await asyncio.create_subprocess_shell(
        f"{sys.executable} -m messaging.cli.main tail {server.url} 8 | head -2",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert out.decode().splitlines() == ["1\t1\tline 0", "2\t1\tline 1"]
    assert b"Traceback" not in err


async def test_cli_errors_are_one_line(server: BrokerServer) -> None:
    url = dead_url()
    result = await asyncio.to_thread(cli, "ping", url)
    assert result.returncode == 1
    assert result.stderr == f"messaging: cannot connect to {url}: connection refused\n"
    result = await asyncio.to_thread(cli, "tail", server.url, "1", "--from", "x")
    assert result.returncode == 2 and "invalid --from 'x'" in result.stderr
