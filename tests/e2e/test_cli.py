"""``messaging broker`` as a user starts it: flags, the data directory, the port, ``--help``.

Every failure to start is one clear line, never a traceback.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

import messaging
from tests.conftest import cli
from tests.raw_http import PING, closed_after, exchange, parse_head


def test_bad_flag_is_one_clear_line() -> None:
    result = cli("broker", "--fsync", "sometimes")
    assert result.returncode == 2
    assert "invalid choice: 'sometimes'" in result.stderr
    result = cli("broker", "--max-segment-size", "lots")
    assert result.returncode == 2 and "invalid size 'lots'" in result.stderr


def test_unusable_data_directory(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = cli("broker", "--data", str(blocker / "data"), "--bind", "127.0.0.1:0")
    assert result.returncode == 1
    assert "cannot use data directory" in result.stderr
    assert "Traceback" not in result.stderr


def test_busy_port(broker_process, tmp_path: Path) -> None:
    first = broker_process().start()
    port = first.url.rsplit(":", 1)[1]
    result = cli("broker", "--data", str(tmp_path / "other"), "--bind", f"127.0.0.1:{port}")
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr


def test_data_directory_in_use(broker_process, tmp_path: Path) -> None:
    first = broker_process(tmp_path / "shared").start()
    assert first.url
    result = cli("broker", "--data", str(tmp_path / "shared"), "--bind", "127.0.0.1:0")
    assert result.returncode == 1 and "in use by another broker" in result.stderr


def test_help_explains_durability() -> None:
    result = cli("broker", "--help")
    assert result.returncode == 0
    for word in ("always", "interval", "never", "group commit", "fsync"):
        assert word in result.stdout


# -- the header timeout and the connection cap --------------------------------------------


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


# -- 11: the data directory ---------------------------------------------------------------


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
    error, see = result.stderr.splitlines()  # the error, then where the help is
    assert error.startswith("messaging broker: error: ") and flag in error
    assert see == "see 'messaging broker --help'"
    assert list(tmp_path.iterdir()) == []
