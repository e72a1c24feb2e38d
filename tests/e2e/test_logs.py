"""What a broker's log says, read as an operator reads it: a normal cluster start without
WARNINGs, no GOAWAY from etcd over a long idle stretch, one JSON line per line with
``--log-format json``, request and group-commit detail at ``--log-level debug``, and a node
etcd does not admit saying so first."""

from __future__ import annotations

import asyncio
import functools
import json
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import START_WITHIN, cli, wait_until
from tests.e2e.etcd_idle_channels import READ_WITHIN
from tests.e2e.test_etcd_log import EtcdCluster
from tests.e2e.test_etcd_security import SecureEtcd, enable_auth, tls_etcd

__all__ = ["tls_etcd"]  # an etcd with TLS, for authentication (a fixture)

#: Lines etcd's gRPC server causes in a client that pings more than it accepts.
GOAWAY = re.compile(r"GOAWAY|too_many_pings|ENHANCE_YOUR_CALM")
#: How long the cluster stays idle: etcd sends GOAWAY after the third ping it finds too many,
#: about 30 s into an idle connection with a ping every 10 s.
IDLE = 35.0


async def publish(session: aiohttp.ClientSession, url: str, count: int) -> None:
    for n in range(count):
        async with session.post(f"{url}/messaging/messages", params={"topicID": "1"},
                                data=f"message {n}".encode()) as resp:
            assert resp.status == 200, resp.headers.get("X-Broker-Error")


async def ready(session: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with session.get(f"{url}/readyz") as resp:
            return resp.status == 200
    except aiohttp.ClientError:
        return False


async def test_a_cluster_start_warns_of_nothing_and_idle_channels_get_no_goaway(
        tmp_path: Path, broker_process) -> None:
    """The README's start: three etcd members and three nodes started together (the nodes
    while etcd elects its first leader), some publishes, then 35 s idle: no node logs a
    WARNING or worse, nor a GOAWAY. The etcd client, with a channel to every member and all
    but one idle, hears no GOAWAY either (it did while it pinged idle connections)."""
    (tmp_path / "etcd").mkdir()
    etcd = EtcdCluster(tmp_path / "etcd")
    try:
        etcd.members[0].start()  # alone, it has no leader: the nodes start against that
        # grpc's core is silent in a broker unless told: here it says what it would.
        nodes = [broker_process(tmp_path / f"node{i}", "--etcd", etcd.endpoints,
                                "--cluster", "logs", env={"GRPC_VERBOSITY": "ERROR"}).start()
                 for i in range(3)]
        for member in etcd.members[1:]:
            member.start()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            for url in [node.url for node in nodes]:
                await wait_until(functools.partial(ready, session, url), timeout=30,
                                 what=f"{url} ready")
            await asyncio.gather(*(publish(session, node.url, 50) for node in nodes))
            idle = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tests.e2e.etcd_idle_channels", etcd.endpoints,
                str(IDLE), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            # Its reads (two through each member) retry while they connect: its bound.
            reads = 2 * len(etcd.members) * READ_WITHIN
            out, err = await asyncio.wait_for(idle.communicate(), IDLE + reads + 30)
            await publish(session, nodes[0].url, 10)  # every node still takes writes
        assert idle.returncode == 0 and out == b"ok\n", err.decode(errors="replace")
        assert not GOAWAY.search(err.decode(errors="replace")), err.decode(errors="replace")
        for node in nodes:
            text = node.log.read_text()
            assert " INFO messaging.log.etcd.log: /messaging/logs/log: ready " in text, text
            loud = [line for line in text.splitlines()
                    if re.search(r" (WARNING|ERROR|CRITICAL) ", line) or GOAWAY.search(line)]
            assert loud == [], f"{node.url}:\n" + "\n".join(loud)
    finally:
        etcd.stop()


class JSONBroker:
    """``messaging broker --log-format json`` in a subprocess, its standard output read
    here, its standard error in ``log``; stopped by PID."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.log = tmp_path / "broker.log"
        with self.log.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "messaging.cli", "broker", "--data",
                 str(tmp_path / "data"), "--bind", "127.0.0.1:0", "--log-format", "json",
                 *args], stdout=subprocess.PIPE, stderr=err, text=True)
        assert self.proc.stdout is not None
        lines: list[str] = []
        stdout = self.proc.stdout
        reader = threading.Thread(target=lambda: lines.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(START_WITHIN)
        if not lines or not lines[0]:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"no startup line; log: {self.log.read_text()}")
        self.startup = json.loads(lines[0])
        found = re.search(r"listening on (http://\S+)", lines[0])
        assert found, lines[0]
        self.url = found.group(1)

    def stop(self) -> str:
        """SIGTERM, then what it wrote to standard output after the startup line."""
        assert self.proc.stdout is not None
        self.proc.send_signal(signal.SIGTERM)
        rest = self.proc.stdout.read()
        assert self.proc.wait(20) == 0
        self.proc.stdout.close()
        return rest

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


async def test_json_lines_and_debug_detail(tmp_path: Path) -> None:
    """``--log-format json --log-level debug``: the startup line is one JSON object on
    standard output (the URL, data directory, fsync mode), the only line there; every line
    on standard error is JSON too, and each request and each group commit has a DEBUG
    line."""
    broker = JSONBroker(tmp_path, "--log-level", "debug", "--fsync", "always")
    try:
        assert broker.startup["level"] == "INFO" and broker.startup["logger"] == "messaging.ready"
        assert broker.startup["message"] == (f"messaging broker listening on {broker.url} "
                                             f"(data {tmp_path / 'data'}, fsync always)")
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            await publish(session, broker.url, 3)
            async with session.get(f"{broker.url}/messaging/messages",
                                   params={"topicID": "1", "index": "0"}) as resp:
                assert resp.status == 200
        assert await asyncio.to_thread(broker.stop) == ""
    finally:
        broker.kill()
    entries = [json.loads(line) for line in broker.log.read_text().splitlines()]
    messages = [(e["level"], e["logger"], e["message"]) for e in entries]
    assert all(logger != "messaging.ready" for _level, logger, _message in messages)
    access = [e for e in entries if e["logger"] == "messaging.access"]
    assert [(e["level"], e["method"], e["path"], e["status"]) for e in access] == [
        ("DEBUG", "POST", "/messaging/messages", 200)] * 3 + [
        ("DEBUG", "GET", "/messaging/messages", 200)]
    commits = [m for level, _logger, m in messages
               if level == "DEBUG" and m.startswith("group commit: 1 commands")]
    assert len(commits) == 3 and all("fsynced" in m for m in commits), messages
    assert ("INFO", "messaging", "shutting down") in messages


@pytest.mark.parametrize("level", ["warning", "error"])
def test_the_startup_line_is_written_at_any_level(tmp_path: Path, level: str) -> None:
    """Tools wait for the startup line: it comes whatever --log-level says, and a broker
    that runs and stops without trouble writes nothing else."""
    broker = JSONBroker(tmp_path, "--log-level", level)
    try:
        assert broker.startup["message"].startswith("messaging broker listening on http://")
        assert broker.stop() == ""
    finally:
        broker.kill()
    assert broker.log.read_text() == ""


async def test_a_node_etcd_does_not_admit_says_so_first(
        tls_etcd: SecureEtcd, broker_process, tmp_path: Path) -> None:
    """Without --etcd-user against an etcd with authentication on: every line of the log
    that carries etcd's reason names the refusal first (never "no quorum" or "cannot
    reach" before it), and a node of a cluster of topic groups refuses to start with it."""
    await enable_auth(tls_etcd)
    ca = str(tls_etcd.certs / "ca.pem")
    node = broker_process(tmp_path / "anonymous", "--etcd", tls_etcd.url, "--cluster", "anon",
                          "--etcd-ca", ca).start()
    first = ("etcd refused authentication (user name is empty): start with --etcd-user USER "
             "(its password in $MESSAGING_ETCD_PASSWORD)")

    async def refused_in_log() -> bool:
        return first in node.log.read_text()

    await wait_until(refused_in_log, timeout=10, what="the refusal in the log")
    for line in node.log.read_text().splitlines():
        if "user name is empty" in line:
            message = line.split(": ", 1)[1]  # after "time LEVEL logger"
            before = message[:message.index("etcd refused")]
            assert "quorum" not in before and "cannot reach" not in before, line
    grouped = await asyncio.to_thread(
        cli, "broker", "--data", str(tmp_path / "grouped"), "--bind", "127.0.0.1:0",
        "--etcd", tls_etcd.url, "--cluster", "anon-groups", "--groups", "2",
        "--etcd-ca", ca, timeout=60)
    assert grouped.returncode == 1 and grouped.stdout == ""
    [line] = grouped.stderr.strip().splitlines()[-1:]
    assert line.startswith(f"messaging broker: error: {first}"), grouped.stderr
