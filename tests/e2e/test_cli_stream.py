"""``messaging stream create|delete|head|tail`` (issue 42, item 11) in subprocesses against a
real broker: named (Durable Streams) streams made, described, read (also following new
appends) and deleted from the command line, each outcome one exact line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import BrokerProcess


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """An environment with no broker, token or context of the user's."""
    return {**os.environ, "MESSAGING_CONFIG_DIR": str(tmp_path / "config"), "MESSAGING_URL": "",
            "MESSAGING_CONTEXT": "", "MESSAGING_TOKEN": ""}


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``messaging ARGS`` in ``env``."""
    return subprocess.run([sys.executable, "-m", "messaging", *args], capture_output=True,
                          text=True, timeout=60, env=env)


def said(result: subprocess.CompletedProcess[str]) -> tuple[int, str, str]:
    return result.returncode, result.stdout, result.stderr


def test_create_head_tail_and_delete_a_stream(broker_process, env: dict[str, str]) -> None:
    broker: BrokerProcess = broker_process().start()
    url = broker.url
    assert said(run(env, "stream", "create", url, "chat", "--content-type", "text/plain",
                    "--ttl", "90m")) == (0, "created stream 'chat' (text/plain)\n", "")
    assert said(run(env, "stream", "create", url, "chat", "--content-type", "text/plain",
                    "--ttl", "90m")) == (0, "stream 'chat' exists (text/plain), as asked\n", "")
    assert said(run(env, "stream", "create", url, "chat")) == (
        1, "", "messaging: stream 'chat' exists with another configuration\n")
    assert run(env, "publish", url, "chat", "hello").returncode == 0
    offset = run(env, "publish", url, "chat", "world").stdout.strip()

    head = run(env, "stream", "head", url, "chat")
    assert said(head) == (0, "stream 'chat'\n"
                             "  content-type   text/plain\n"
                             f"  next-offset    {offset}\n"
                             "  ttl            5400 s\n"
                             "  expires-at     -\n"
                             "  closed         no\n", "")
    assert json.loads(run(env, "stream", "head", url, "chat", "--format", "json").stdout) == {
        "name": "chat", "content_type": "text/plain", "next_offset": offset, "ttl": 5400,
        "expires_at": None, "closed": False}

    tail = run(env, "stream", "tail", url, "chat")
    assert tail.returncode == 0 and tail.stderr == "", tail
    assert [line.split("\t")[1:] for line in tail.stdout.splitlines()] == [
        ["1", "hello"], ["1", "world"]]
    last = run(env, "stream", "tail", url, "chat", "--last", "1", "--format", "json")
    assert json.loads(last.stdout)["data"] == "world"

    assert said(run(env, "stream", "delete", url, "chat")) == (0, "deleted stream 'chat'\n", "")
    for action in ("head", "tail", "delete"):
        assert said(run(env, "stream", action, url, "chat")) == (
            1, "", "messaging: stream 'chat' not found\n")


def test_stream_tail_follows_new_appends(broker_process, env: dict[str, str]) -> None:
    broker: BrokerProcess = broker_process().start()
    assert run(env, "stream", "create", broker.url, "events").returncode == 0
    proc = subprocess.Popen([sys.executable, "-m", "messaging", "stream", "tail", broker.url,
                             "events", "--follow", "--limit", "2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        for data in ("one", "two"):
            assert run(env, "publish", broker.url, "events", data).returncode == 0
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (proc.returncode, err) == (0, "")
    assert [line.split("\t")[2] for line in out.splitlines()] == ["one", "two"]


def test_stream_options_are_checked(env: dict[str, str]) -> None:
    result = run(env, "stream", "create", "orders", "--ttl", "1.5s")
    assert said(result) == (2, "", "messaging stream create: error: argument --ttl: invalid --ttl "
                                   "'1.5s': whole seconds (90s, 15m)\nsee 'messaging stream "
                                   "create --help'\n")
    both = run(env, "stream", "create", "orders", "--ttl", "1h", "--expires-at",
               "2030-01-01T00:00:00Z")
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    assert said(run(env, "stream", "head", "http://127.0.0.1:1")) == (
        1, "", "messaging: NAME is missing (http://127.0.0.1:1 is a broker URL)\n")
