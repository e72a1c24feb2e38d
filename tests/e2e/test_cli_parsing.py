"""The command line as ``rpk`` and ``nats`` users expect it (issue 42, item 10), in
subprocesses: no abbreviated options, an error is one line from the subcommand that has it and
a pointer to its help, options other servers use are translated, and a broker given as
``HOST:PORT`` is ``http://HOST:PORT``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import BrokerProcess, cli


def assert_usage_error(result: subprocess.CompletedProcess[str], prog: str,
                       message: str) -> None:
    """Exit status 2, nothing on standard output, and exactly two lines on standard error:
    ``PROG: error: MESSAGE`` and ``see 'PROG --help'``."""
    assert (result.returncode, result.stdout) == (2, ""), result
    assert result.stderr == f"{prog}: error: {message}\nsee '{prog} --help'\n"


def test_options_are_never_abbreviated() -> None:
    # --form was taken as --format (and "latest" refused as a format): now it is unknown.
    assert_usage_error(cli("tail", "http://127.0.0.1:1", "1", "--form", "latest"),
                       "messaging tail",
                       "unrecognized arguments: --form latest (did you mean --format or "
                       "--from?)")
    assert_usage_error(cli("publish", "1", "x", "--qui"), "messaging publish",
                       "unrecognized arguments: --qui (did you mean --quiet?)")
    assert_usage_error(cli("token", "create", "--name", "x", "--scope", "read", "--tok", "f"),
                       "messaging token create",
                       "unrecognized arguments: --tok f (did you mean --token-file or "
                       "--tokens?)")


def test_errors_come_from_the_subcommand_in_one_line() -> None:
    assert_usage_error(cli("tail", "1", "--format", "xml"), "messaging tail",
                       "argument --format: invalid choice: 'xml' (choose from 'text', 'json')")
    assert_usage_error(cli("tail", "1", "--bogus"), "messaging tail",
                       "unrecognized arguments: --bogus")
    assert_usage_error(cli("topic", "create", "1", "--bogus"), "messaging topic create",
                       "unrecognized arguments: --bogus")
    assert_usage_error(cli("tail"), "messaging tail",
                       "the following arguments are required: TOPIC")
    assert_usage_error(cli("stream"), "messaging stream",
                       "the following arguments are required: ACTION")
    result = cli("tial", "1")
    assert (result.returncode, result.stdout) == (2, "")
    error, see = result.stderr.splitlines()
    assert error.startswith("messaging: error: argument COMMAND: invalid choice: 'tial' "
                            "(choose from 'broker', ")
    assert see == "see 'messaging --help'"


@pytest.mark.parametrize(("given", "meant"), [
    (["--port", "9000"], "--bind 127.0.0.1:9000"),
    (["--port=9000", "--host", "0.0.0.0"], "--bind 0.0.0.0:9000"),
    (["--host", "10.0.0.5"], "--bind 10.0.0.5:8086"),
])
def test_broker_port_suggests_bind(tmp_path: Path, given: list[str], meant: str) -> None:
    result = cli("broker", "--data", str(tmp_path / "data"), *given)
    assert_usage_error(result, "messaging broker",
                       f"unrecognized arguments: {' '.join(given)} (did you mean {meant}?)")
    assert not (tmp_path / "data").exists()


def test_a_broker_without_a_scheme_is_http(broker_process, tmp_path: Path) -> None:
    broker: BrokerProcess = broker_process().start()
    bare = broker.url.removeprefix("http://")  # 127.0.0.1:PORT
    env = {**os.environ, "MESSAGING_CONFIG_DIR": str(tmp_path / "config"), "MESSAGING_URL": "",
           "MESSAGING_CONTEXT": "", "MESSAGING_TOKEN": ""}

    def run(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "messaging", *args], capture_output=True,
                              text=True, timeout=60, env={**env, **extra})

    assert run("publish", bare, "1", "first").stdout == "1\n"
    assert run("publish", "--url", bare, "1", "second").stdout == "2\n"
    assert run("tail", bare, "1").stdout == "1\t1\tfirst\n2\t1\tsecond\n"
    assert run("tail", f"{bare},127.0.0.1:1", "1", "--last", "1").stdout == "2\t1\tsecond\n"
    assert run("tail", "1", "--last", "1", MESSAGING_URL=bare).stdout == "2\t1\tsecond\n"
    added = run("context", "add", "local", "--url", bare)
    assert added.stdout == f"context local (current): http://{bare}\n"
    assert run("ping").stdout == f"{broker.url}\n"
