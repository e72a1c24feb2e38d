"""Durations and sizes read one way on every path, end to end: the broker's flags, its
environment and settings file, a ``PUT /messaging/topics/{id}`` body and ``messaging topic``.

``12`` used to be 12 s as a flag and 12 ms as a JSON number: now a duration without its
unit is refused everywhere with one line, and ``12h`` is the same 43,200,000 ms in the topic's
settings whichever way it came.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import cli

HALF_DAY_MS = 12 * 3600 * 1000
#: What every path says of ``12`` (after naming the flag, variable, file key or setting).
TWELVE = "12: add a unit: 12s, 12h (units: ms, s, m, h, d)"
NO_UNIT = f"invalid duration {TWELVE}"


def _broker(tmp_path: Path, *args: str, env: dict[str, str] | None = None,
            ) -> subprocess.CompletedProcess[str]:
    """``messaging broker`` that should refuse to start (it would serve for ever otherwise)."""
    return subprocess.run(
        [sys.executable, "-m", "messaging.cli", "broker", "--data", str(tmp_path / "data"),
         "--bind", "127.0.0.1:0", *args], capture_output=True, text=True, timeout=60,
        env={**os.environ, **(env or {})})


@pytest.mark.parametrize("how", ["flag", "environment", "file"])
def test_the_broker_refuses_a_duration_without_a_unit(tmp_path: Path, how: str) -> None:
    config = tmp_path / "broker.toml"
    config.write_text("retention-age = 12\n")
    args, env, where = {
        "flag": (("--retention-age", "12"), None, "argument --retention-age"),
        "environment": ((), {"MESSAGING_RETENTION_AGE": "12"}, "MESSAGING_RETENTION_AGE"),
        "file": (("--config", str(config)), None, f"{config}: retention-age"),
    }[how]
    done = _broker(tmp_path, *args, env=env)
    assert done.returncode != 0 and done.stdout == ""
    # the error first (a flag's is followed by where its help is)
    assert done.stderr.strip().splitlines()[0] == f"messaging broker: error: {where}: {NO_UNIT}"
    assert not (tmp_path / "data").exists()


def test_the_topic_command_refuses_a_duration_without_a_unit(broker_process,
                                                             tmp_path: Path) -> None:
    broker = broker_process(tmp_path / "data").start()
    done = cli("topic", "config", broker.url, "1", "--retention-age", "12", timeout=30)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines()[0].endswith(f"--retention-age: {NO_UNIT}")


async def _put(session: aiohttp.ClientSession, url: str, topic: int, body: Any,
               ) -> tuple[int, dict[str, Any] | str]:
    """``PUT /messaging/topics/{topic}``: the status and the answer (the error line on 400)."""
    async with session.put(f"{url}/messaging/topics/{topic}", data=json.dumps(body)) as resp:
        if resp.status == 400:
            text = await resp.text()
            assert text == resp.headers["X-Broker-Error"] + "\n"
            return resp.status, resp.headers["X-Broker-Error"]
        return resp.status, await resp.json()


async def _age(session: aiohttp.ClientSession, url: str, topic: int) -> dict[str, Any]:
    async with session.get(f"{url}/messaging/topics/{topic}") as resp:
        assert resp.status == 200, await resp.text()
        settings: dict[str, Any] = (await resp.json())["settings"]
        return dict(settings["retention-age"])


@pytest.mark.parametrize("how", ["flag", "environment"])
async def test_twelve_hours_is_the_same_from_a_flag_the_environment_and_a_json_body(
        broker_process, tmp_path: Path, how: str) -> None:
    args, env = (("--retention-age", "12h"), None) if how == "flag" else (
        (), {"MESSAGING_RETENTION_AGE": "12h"})
    broker = broker_process(tmp_path / "data", *args, env=env).start()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        status, _answer = await _put(session, broker.url, 1, {})
        assert status == 201
        assert await _age(session, broker.url, 1) == {"value": HALF_DAY_MS, "source": "broker"}
        status, answer = await _put(session, broker.url, 2, {"retention-age": "12h"})
        assert status == 201 and isinstance(answer, dict)
        assert answer["settings"]["retention-age"] == {"value": HALF_DAY_MS, "source": "topic"}
        for bare in (12, "12"):  # was 12 ms and 12 s: now neither
            status, error = await _put(session, broker.url, 2, {"retention-age": bare})
            assert (status, error) == (400, f"invalid retention-age {TWELVE}")
        assert await _age(session, broker.url, 2) == {"value": HALF_DAY_MS, "source": "topic"}
        for off in (0, "0", "0s"):
            status, answer = await _put(session, broker.url, 2, {"retention-age": off})
            assert status == 200 and isinstance(answer, dict)
            assert answer["settings"]["retention-age"] == {"value": 0, "source": "topic"}
        status, answer = await _put(session, broker.url, 3, {"max-topic-size": 4096,
                                                             "max-segment-size": "4096"})
        assert status == 201 and isinstance(answer, dict)  # a bare size is bytes, everywhere
        assert answer["settings"]["max-topic-size"] == {"value": 4096, "source": "topic"}
        assert answer["settings"]["max-segment-size"] == {"value": 4096, "source": "topic"}
