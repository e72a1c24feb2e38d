"""The worked example examples/journal_failover.py with real processes: the primary is
killed with SIGKILL at a random change, the secondary takes over, and the final state has
every change exactly once; the journal holds each change once, the old epoch's before the
new one's."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from examples.journal_failover import expected_state
from messaging.client.client import Client
from messaging.client.journal import CaughtUp, Checkpoint, Entry, Receiver

EXAMPLE = Path(__file__).parents[2] / "examples" / "journal_failover.py"
CHANGES = 300


def example(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(EXAMPLE), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


async def journal(url: str, topic: int) -> list[Entry | Checkpoint]:
    fetched: list[Entry | Checkpoint] = []
    async with Client(url) as client:
        receiver = Receiver(client, topic)
        for _ in range(10 * CHANGES):
            try:
                fetched.append(await receiver.try_fetch_entry())
            except CaughtUp:
                return fetched
    raise AssertionError("the journal never ended")


@pytest.mark.parametrize("seed", [1, 2])
async def test_the_secondary_takes_over_without_losing_or_repeating_a_change(
        broker_process, tmp_path: Path, seed: int) -> None:
    broker = broker_process(tmp_path / "data").start()
    common = ["--url", broker.url, "--topic", "9", "--changes", str(CHANGES)]
    primary = example("primary", *common, "--delay", "0.002")
    secondary = example("secondary", *common, "--primary-pid", str(primary.pid))
    try:
        kill_at = random.Random(seed).randrange(20, CHANGES - 50)
        assert primary.stdout is not None
        for _ in range(CHANGES + 10):  # bounded: one line per change
            line = await asyncio.to_thread(primary.stdout.readline)
            if line.strip() == f"change {kill_at}":
                break
        else:
            pytest.fail("the primary never got going")
        primary.send_signal(signal.SIGKILL)
        primary.wait(10)
        out, err = await asyncio.to_thread(secondary.communicate, timeout=60)
        assert secondary.returncode == 0, err
        assert "taking over" in out and "primary with epoch 2" in out
        assert json.loads(out.splitlines()[-1]) == expected_state(CHANGES)
    finally:
        for process in (primary, secondary):  # only ours, by PID
            if process.poll() is None:
                process.kill()
                process.wait(10)
            for stream in (process.stdout, process.stderr):
                if stream is not None:
                    stream.close()

    entries = [e for e in await journal(broker.url, 9) if isinstance(e, Entry)]
    assert [json.loads(e.data)["n"] for e in entries] == list(range(1, CHANGES + 1))
    epochs = [e.epoch for e in entries]
    assert epochs == sorted(epochs) and set(epochs) == {1, 2}


async def test_a_secondary_whose_primary_ended_before_it_looked_takes_over(
        broker_process, tmp_path: Path) -> None:
    """The README's race: the primary was killed (and reaped) before the secondary opened a
    pidfd on it, so there is no such process any more; that is an ended primary too."""
    broker = broker_process(tmp_path / "data").start()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(30)
    secondary = example("secondary", "--url", broker.url, "--topic", "9", "--changes", "50",
                        "--primary-pid", str(gone.pid))
    try:
        out, err = await asyncio.to_thread(secondary.communicate, timeout=60)
    finally:
        if secondary.poll() is None:  # only ours, by PID
            secondary.kill()
            secondary.communicate(timeout=10)
    assert secondary.returncode == 0, err
    assert "Traceback" not in err and "ProcessLookupError" not in err, err
    assert f"primary {gone.pid} is gone: taking over" in out and "primary with epoch 1" in out
    assert json.loads(out.splitlines()[-1]) == expected_state(50)
