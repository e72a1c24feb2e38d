"""What the client commands say when there is nothing to print, when Ctrl-C stops them, and
when they fail for a cause on the user's side (issue 42, item 11), in subprocesses against
real brokers: each is one exact line on standard error, worded in terms of the command line
(its flags, its lines, the token file, the CA), with the exit status asserted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from messaging.clock import format_moment
from tests.conftest import BrokerProcess
from tests.tls import make_certificates


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """An environment with no broker, token or context of the user's."""
    return {**os.environ, "MESSAGING_CONFIG_DIR": str(tmp_path / "config"), "MESSAGING_URL": "",
            "MESSAGING_CONTEXT": "", "MESSAGING_TOKEN": "", "MESSAGING_CA": ""}


def run(env: dict[str, str], *args: str, stdin: str | None = None,
        ) -> subprocess.CompletedProcess[str]:
    """``messaging ARGS`` in ``env``."""
    return subprocess.run([sys.executable, "-m", "messaging", *args], input=stdin,
                          capture_output=True, text=True, timeout=60, env=env)


def failed(result: subprocess.CompletedProcess[str], line: str, status: int = 1) -> None:
    """The command printed nothing, said ``messaging: LINE`` and exited with ``status``."""
    assert (result.returncode, result.stdout, result.stderr) == (
        status, "", f"messaging: {line}\n"), result


def last_index(url: str, topic: int) -> int:
    """The topic's last index, as its broker says (0 before it exists)."""
    try:
        with urllib.request.urlopen(f"{url}/messaging/topics/{topic}", timeout=10) as answer:
            return int(json.load(answer)["last_index"])
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return 0
        raise


def test_tail_since_says_when_nothing_is_that_recent(broker_process,
                                                    env: dict[str, str]) -> None:
    broker: BrokerProcess = broker_process().start()
    assert run(env, "publish", broker.url, "1", "old").stdout == "1\n"
    future = int(time.time() * 1000) + 3_600_000
    failed(run(env, "tail", broker.url, "1", "--since", str(future)),
           f"topic 1 ends at index 1: nothing appended since {format_moment(future)} "
           "(--follow waits for it)", status=0)
    failed(run(env, "tail", broker.url, "2", "--since", "1h"), "topic 2 does not exist",
           status=0)
    assert run(env, "tail", broker.url, "1", "--since", "1h").stdout == "1\t1\told\n"


def test_ctrl_c_during_a_publish_of_standard_input_says_what_was_stored(
        broker_process, env: dict[str, str]) -> None:
    broker: BrokerProcess = broker_process().start()
    proc = subprocess.Popen([sys.executable, "-m", "messaging", "publish", broker.url, "3"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    try:
        assert proc.stdin is not None
        proc.stdin.write(b"".join(b"line %d\n" % n for n in range(2500)))
        proc.stdin.flush()  # and left open: only Ctrl-C ends this publish
        deadline = time.monotonic() + 30
        while last_index(broker.url, 3) < 2500:
            assert time.monotonic() < deadline, "the lines were not stored within 30 s"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (proc.returncode, out, err) == (
        130, b"", b"messaging: interrupted: 2500 lines stored in topic 3, the last at index "
                  b"2500\n")


def test_a_type_and_a_message_too_big_are_said_in_the_command_lines_terms(
        broker_process, env: dict[str, str]) -> None:
    broker: BrokerProcess = broker_process().start()
    result = run(env, "publish", broker.url, "5", "x", "--type", "40000")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "messaging publish: error: argument --type: 40000 is not a message type: 0 to 32767 "
        "(from 32768 up the types are the broker's own)\nsee 'messaging publish --help'\n")
    failed(run(env, "publish", broker.url, "5", stdin="y" * 3_000_000 + "\n"),
           "line 1 is 3000000 bytes: more than topic 5 takes (the broker's --max-message-size) "
           "(nothing was stored)")  # a new topic: the broker's limit
    assert run(env, "publish", broker.url, "6", "first").returncode == 0
    failed(run(env, "publish", broker.url, "6", stdin="y" * 3_000_000 + "\n"),
           "line 1 is 3000000 bytes: more than topic 6 takes (max-message-size 1048576 bytes) "
           "(nothing was stored)")
    assert run(env, "topic", "create", broker.url, "5", "--max-message-size", "10K",
               ).returncode == 0
    failed(run(env, "publish", broker.url, "5", "z" * 100_000),
           "DATA is 100000 bytes: more than topic 5 takes (max-message-size 10240 bytes)")
    failed(run(env, "publish", broker.url, "5", stdin="ok\n" + "z" * 20_000 + "\n"),
           "line 2 is 20000 bytes: more than topic 5 takes (max-message-size 10240 bytes) "
           "(nothing was stored)")


def test_an_auth_failure_names_the_token_file(broker_process, tmp_path: Path,
                                              env: dict[str, str]) -> None:
    tokens, admin, bad = tmp_path / "tokens", tmp_path / "admin.token", tmp_path / "bad.token"
    made = run(env, "token", "create", "--name", "admin", "--scope", "admin", "--tokens",
               str(tokens), "--token-file", str(admin))
    assert made.returncode == 0, made
    bad.write_text("msg_not_a_token_of_this_broker\n")
    broker: BrokerProcess = broker_process(None, "--tokens", str(tokens)).start()
    url = broker.url
    for command in (["topics", url], ["publish", url, "1", "x"], ["tail", url, "1"],
                    ["stream", "head", url, "s"]):
        failed(run(env, *command),
               "the broker requires a token: give one with --token-file FILE (or --token, "
               "$MESSAGING_TOKEN, a context's token file)")
        failed(run(env, *command, "--token-file", str(bad)),
               f"the broker refused the token from --token-file {bad} (invalid token): give a "
               "valid one with --token-file FILE")
    assert run(env, "publish", broker.url, "1", "x", "--token-file", str(admin)).stdout == "1\n"


def test_a_tls_failure_names_the_ca(broker_process, tmp_path: Path,
                                    env: dict[str, str]) -> None:
    certs = tmp_path / "certs"
    certs.mkdir()
    make_certificates(certs)
    broker: BrokerProcess = broker_process(
        None, "--tls-cert", str(certs / "server.pem"), "--tls-key",
        str(certs / "server-key.pem")).start()
    refused = f"messaging: cannot connect to {broker.url}: the TLS certificate was not accepted ("
    cure = "): give the CA that signed the broker's certificate with --ca FILE\n"
    for command in (("topics",), ("publish", "1", "x"), ("tail", "1", "--follow")):
        result = run(env, command[0], broker.url, *command[1:])
        assert (result.returncode, result.stdout) == (1, ""), result
        assert result.stderr.startswith(refused) and result.stderr.endswith(cure), result
        assert result.stderr.count("\n") == 1
        wrong = run(env, command[0], broker.url, *command[1:], "--ca",
                    str(certs / "client.pem"))
        assert wrong.returncode == 1 and wrong.stderr.startswith(refused), wrong
        assert wrong.stderr.endswith(f"; CA file {certs / 'client.pem'}{cure}"), wrong
    ca = str(certs / "ca.pem")
    assert run(env, "publish", broker.url, "1", "x", "--ca", ca).stdout == "1\n"


def test_topic_create_says_whether_the_topic_existed(broker_process,
                                                     env: dict[str, str]) -> None:
    broker: BrokerProcess = broker_process().start()
    made = run(env, "topic", "create", broker.url, "7")
    assert (made.returncode, made.stderr) == (0, "messaging: created topic 7\n"), made
    assert made.stdout.startswith("topic 7\n")
    again = run(env, "topic", "create", broker.url, "7", "--retention-age", "1h")
    assert (again.returncode, again.stderr) == (0, "messaging: topic 7 exists, configured\n")
    assert "retention-age              1h  topic" in again.stdout
    same = run(env, "topic", "create", broker.url, "7", "--format", "json")
    assert (same.returncode, same.stderr) == (
        0, "messaging: topic 7 exists (no setting given: left as it was)\n")
    assert json.loads(same.stdout)["settings"]["retention-age"]["value"] == 3_600_000
