"""The CLI an operator meets first, in subprocesses against real brokers: contexts, URL
lists, tail's start options, batched publishing of standard input, fast local failures, and a
``tail --follow`` that waits out a broker restart."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from messaging.client.client import Client
from messaging.http.server import BrokerServer
from tests.conftest import free_port
from tests.proxy import dead_url
from tests.raw_server import raw_server
from tests.tls import make_certificates


def run_cli(*args: str, env: dict[str, str] | None = None, stdin: str | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``messaging ARGS`` with ``env`` added to the environment."""
    return subprocess.run([sys.executable, "-m", "messaging.cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


async def acli(*args: str, env: dict[str, str] | None = None, stdin: str | None = None,
               timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """:func:`run_cli` off the event loop (in-process brokers keep serving)."""
    return await asyncio.to_thread(run_cli, *args, env=env, stdin=stdin, timeout=timeout)


@pytest.fixture
def home(tmp_path: Path) -> dict[str, str]:
    """An environment whose contexts live in the test's directory, with no URL set."""
    return {"MESSAGING_CONFIG_DIR": str(tmp_path / "config"), "MESSAGING_URL": "",
            "MESSAGING_CONTEXT": "", "MESSAGING_TOKEN": ""}


async def test_tail_starts_where_asked_and_says_when_nothing_is_there(
        server: BrokerServer, home: dict[str, str]) -> None:
    url = server.url
    async with Client(url) as client:
        for n in range(6):  # topic 1 holds indexes 1, 3, 5 and topic 2 holds 2, 4, 6
            await client.publish(1 + n % 2, b"m%d" % n)

    async def tail(*args: str) -> list[str]:
        result = await acli("tail", url, "1", *args, env=home)
        assert result.returncode == 0 and result.stderr == "", result
        return [line.split("\t")[0] for line in result.stdout.splitlines()]

    assert await tail() == ["1", "3", "5"]
    assert await tail("--from", "earliest") == ["1", "3", "5"]
    assert await tail("--last", "2") == ["3", "5"]
    assert await tail("--last", "10") == ["1", "3", "5"]
    assert await tail("--from", "2", "--limit", "1") == ["3"]
    assert await tail("--from", "latest") == []
    past = await acli("tail", url, "1", "--from", "99", env=home)
    assert (past.returncode, past.stdout) == (0, "")
    assert past.stderr == ("messaging: topic 1 ends at index 5: nothing from index 99 on "
                           "(--follow waits for it)\n")
    missing = await acli("tail", url, "9", "--last", "1", env=home)
    assert (missing.returncode, missing.stderr) == (0, "messaging: topic 9 does not exist\n")
    both = await acli("tail", url, "1", "--last", "1", "--from", "1", env=home)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    # --from latest with --follow prints only what comes after it started
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "messaging.cli", "tail", url, "1", "--from", "latest",
        "--follow", "--limit", "1", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ, **home})
    try:
        await asyncio.sleep(1.0)  # it has started reading after index 5
        async with Client(url) as client:
            new = await client.publish(1, b"new")
        out, err = await asyncio.wait_for(proc.communicate(), 20)
        assert out.decode() == f"{new}\t1\tnew\n" and err == b""
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_contexts_name_a_cluster_and_are_private(server: BrokerServer,
                                                       home: dict[str, str],
                                                       tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("msg_not_needed_by_an_open_broker\n")
    added = await acli("context", "add", "local", "--url", f"{dead_url()},{server.url}",
                       "--token-file", str(token), env=home)
    assert added.returncode == 0, added
    assert added.stdout.startswith("context local (current): ")
    path = Path(home["MESSAGING_CONFIG_DIR"]) / "contexts.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert "msg_not_needed" not in path.read_text()  # the path of the token, never the token
    async with Client(server.url) as client:
        await client.publish(3, b"through the context")
    # no URL anywhere: the current context's (its first URL refuses: failed over)
    result = await acli("tail", "3", env=home)
    assert result.returncode == 0, result
    assert result.stdout.endswith("\t1\tthrough the context\n")
    other = await acli("context", "add", "elsewhere", "--url", dead_url(), env=home)
    assert other.returncode == 0 and "(current)" not in other.stdout
    listing = await acli("context", "list", env=home)
    assert [line.split("\t")[0] for line in listing.stdout.splitlines()] == [
        "  elsewhere", "* local"]
    refused = await acli("topics", "--context", "elsewhere", env=home)
    assert refused.returncode == 1 and "connection refused" in refused.stderr
    assert (await acli("topics", env={**home, "MESSAGING_URL": server.url})).returncode == 0
    # the command line beats the environment: --context over $MESSAGING_URL
    flagged = await acli("tail", "3", "--context", "local",
                         env={**home, "MESSAGING_URL": dead_url()})
    assert flagged.returncode == 0 and flagged.stdout.endswith("through the context\n")
    unknown = await acli("context", "use", "nope", env=home)
    assert unknown.returncode == 1
    assert unknown.stderr == ("messaging context: error: no context 'nope' (known: elsewhere, "
                              "local)\n")
    assert (await acli("context", "use", "elsewhere", env=home)).returncode == 0
    shown = await acli("context", "show", env=home)
    assert shown.stdout.splitlines()[0] == "name:       elsewhere (current)"
    assert (await acli("context", "remove", "elsewhere", env=home)).returncode == 0
    gone = await acli("context", "show", env=home)
    assert gone.returncode == 1 and "no current context" in gone.stderr
    path.write_text("{not json")
    broken = await acli("topics", env=home)
    assert broken.returncode == 1 and broken.stderr.count("\n") == 1
    assert "is not JSON" in broken.stderr


async def test_url_lists_and_positional_shapes(server: BrokerServer,
                                               home: dict[str, str]) -> None:
    dead = dead_url()
    result = await acli("publish", "--url", dead, "--url", server.url, "4", "hello", env=home)
    assert (result.returncode, result.stdout) == (0, "1\n"), result
    result = await acli("tail", f"{dead},{server.url}", "4", env=home)
    assert result.stdout == "1\t1\thello\n"
    result = await acli("tail", "4", env={**home, "MESSAGING_URL": f"{dead},{server.url}"})
    assert result.stdout == "1\t1\thello\n"
    result = await acli("topics", "4", env=home)
    assert result.returncode == 1
    assert result.stderr == ("messaging: '4' is not a broker URL (expected http://HOST:PORT "
                             "or https://HOST:PORT)\n")
    result = await acli("publish", "4", "a", "b", env=home)
    assert result.returncode == 1 and "too many arguments" in result.stderr


async def test_publish_of_standard_input_goes_in_batches(server: BrokerServer,
                                                         home: dict[str, str]) -> None:
    lines = [f"line {n}" for n in range(10_000)]
    result = await acli("publish", server.url, "5", env=home, stdin="\n".join(lines) + "\n")
    assert result.returncode == 0, result
    assert result.stdout.startswith("published 10000 messages to topic 5 in 10 requests, "
                                    "indexes 1..10000 (")
    quiet = await acli("publish", server.url, "5", "--quiet", "--batch-size", "7",
                       env=home, stdin="a\r\nb\nlast without newline")
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", "")
    async with Client(server.url) as client:
        stored = await client.read(5)
    assert [m.data.decode() for m in stored] == [*lines, "a", "b", "last without newline"]


async def test_publish_of_standard_input_fits_the_brokers_request_limit(
        start_server, home: dict[str, str]) -> None:
    """The broker takes requests of at most 100 KiB, less than the CLI assumes: a batch it
    refuses as too big is split, and every line is stored once, in order."""
    server = await start_server(max_request_size=100 * 1024)
    lines = [f"{n:04d} " + "y" * 195 for n in range(1000)]  # 200 KB in one batch
    result = await acli("publish", server.url, "7", env=home, stdin="\n".join(lines) + "\n")
    assert result.returncode == 0 and result.stderr == "", result
    assert result.stdout.startswith("published 1000 messages to topic 7 in ")
    async with Client(server.url) as client:
        assert [m.data.decode() for m in await client.read(7)] == lines


async def test_publish_of_standard_input_stops_at_a_failed_batch(
        start_server, home: dict[str, str]) -> None:
    server = await start_server(max_message_size=100)
    stdin = "".join(f"ok {n}\n" for n in range(5)) + "x" * 200 + "\n" + "never\n"
    result = await acli("publish", server.url, "6", "--batch-size", "5", env=home, stdin=stdin)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert ("(after 5 messages were stored in 1 requests; of this batch of 2, 2 were not)"
            in result.stderr)
    async with Client(server.url) as client:
        assert [m.data for m in await client.read(6)] == [b"ok %d" % n for n in range(5)]
    # input still coming when a batch fails: one line, no traceback from the reading thread
    many = stdin + "".join(f"more {n}\n" for n in range(200_000))
    for _ in range(3):
        result = await acli("publish", server.url, "6", "--batch-size", "5", env=home,
                            stdin=many)
        assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
        assert "Traceback" not in result.stderr and "Fatal" not in result.stderr


@pytest.fixture
async def silent_port() -> AsyncIterator[str]:
    """A TCP server that takes connections and requests and never answers (a hung node)."""
    async def hold(reader: asyncio.StreamReader, _writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)
        await asyncio.sleep(3600)

    async with raw_server(hold) as port:
        yield f"http://127.0.0.1:{port}"


async def test_a_hung_node_first_in_the_list_is_passed_over(
        server: BrokerServer, home: dict[str, str], silent_port: str) -> None:
    urls = f"{silent_port},{server.url}"
    started = time.monotonic()
    result = await acli("publish", urls, "8", "through the second", env=home, timeout=60)
    assert (result.returncode, result.stderr) == (0, ""), result
    result = await acli("tail", urls, "8", env=home, timeout=60)
    assert result.stdout == "1\t1\tthrough the second\n", result
    took = time.monotonic() - started
    assert took < 20, f"two commands took {took:.1f}s past a hung node"


@pytest.fixture
async def mute_port() -> AsyncIterator[str]:
    """A TCP server that answers every connection with a line that is not HTTP."""
    async def greet(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"SSH-2.0-OpenSSH_9.2\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    async with raw_server(greet) as port:
        yield f"http://127.0.0.1:{port}"


async def test_local_causes_fail_in_one_line_within_three_seconds(
        start_server, tmp_path: Path, home: dict[str, str], mute_port: str) -> None:
    plain = await start_server()
    (tmp_path / "tls").mkdir()
    make_certificates(tmp_path / "tls")
    secure = await start_server(tls_cert=tmp_path / "tls" / "server.pem",
                                tls_key=tmp_path / "tls" / "server-key.pem")
    https_port = secure.url.rsplit(":", 1)[1]
    cases = [
        (plain.url.replace("http://", "https://"), "the TLS handshake failed"),
        (f"http://127.0.0.1:{https_port}", "the server closed the connection without an answer"),
        (mute_port, "does not look like a messaging broker"),
        ("ftp://127.0.0.1:1", "unsupported scheme 'ftp'"),
    ]
    for url, expected in cases:
        for command in (("topics",), ("tail", "1", "--follow"), ("publish", "1", "x")):
            started = time.monotonic()
            result = await acli(command[0], url, *command[1:], env=home, timeout=30)
            took = time.monotonic() - started
            assert result.returncode == 1, (url, command, result)
            assert result.stderr.count("\n") == 1 and expected in result.stderr, (
                url, command, result.stderr)
            assert took < 3 + 1.5, (url, command, took)  # 1.5 s: starting the interpreter


async def test_tail_follow_waits_out_a_restart_and_says_so(broker_process, tmp_path: Path,
                                                          home: dict[str, str]) -> None:
    port = free_port()
    broker = broker_process(tmp_path / "data", port=port).start()
    async with Client(broker.url) as client:
        await client.publish(1, b"before")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "messaging.cli", "tail", broker.url, "1", "--follow",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **home})
    assert proc.stdout is not None and proc.stderr is not None
    try:
        assert await asyncio.wait_for(proc.stdout.readline(), 20) == b"1\t1\tbefore\n"
        broker.kill()  # kill -9
        waiting = (await asyncio.wait_for(proc.stderr.readline(), 20)).decode()
        assert waiting.startswith("messaging: waiting for the broker (")
        assert waiting.endswith("; retrying forever\n")
        await asyncio.sleep(16)  # longer than the 15 s a command retries by default
        assert proc.returncode is None
        broker = broker_process(tmp_path / "data", port=port).start()
        assert await asyncio.wait_for(proc.stderr.readline(), 20) == (
            b"messaging: reading again\n")
        async with Client(broker.url) as client:
            index = await client.publish(1, b"after")
        assert await asyncio.wait_for(proc.stdout.readline(), 20) == (
            f"{index}\t1\tafter\n".encode())
    finally:
        proc.kill()
        await proc.wait()


async def test_a_stream_by_name_for_publish_and_tail(server: BrokerServer,
                                                     home: dict[str, str]) -> None:
    async with aiohttp.ClientSession() as http, http.put(f"{server.url}/v1/stream/orders",
                        headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 201
    result = await acli("publish", server.url, "orders", env=home,
                        stdin='{"id": 1}\n{"id": 2}\n')
    assert result.returncode == 0, result
    assert result.stdout.startswith("published 2 messages to stream 'orders' in 1 request, "
                                    "offset "), result.stdout
    one = await acli("publish", server.url, "orders", '{"id": 3}', env=home)
    async with aiohttp.ClientSession() as http, http.head(
            f"{server.url}/v1/stream/orders") as resp:
        assert one.stdout == resp.headers["Stream-Next-Offset"] + "\n"  # not a count
    bad = await acli("publish", server.url, "orders", env=home, stdin="not json\n")
    assert bad.returncode == 1 and "line 1 of this batch is not JSON" in bad.stderr
    tail = await acli("tail", server.url, "orders", env=home)
    assert tail.returncode == 0, tail
    assert [line.split("\t")[2] for line in tail.stdout.splitlines()] == [
        '{"id":1}', '{"id":2}', '{"id":3}']
    as_json = await acli("tail", server.url, "orders", "--last", "1", "--format", "json",
                         env=home)
    (line,) = as_json.stdout.splitlines()
    assert '"topic": "9223372036854775808"' in line  # a stream's id survives JSON.parse

