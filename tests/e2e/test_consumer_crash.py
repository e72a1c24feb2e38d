"""Kill -9 of a transactional consumer process at random points — inside the handler, after
its read set is saved, between the publishes' acknowledgement and the store commit, after the
commit, and at random moments from outside — over many rounds, with both stores: the final
state equals a straight run's and every derived message exists exactly once."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from messaging.client.client import Client
from messaging.client.consumer import COMMITTED, HANDLED, INTENT, PUBLISHED
from tests.client.test_consumer import (
    check_exactly_once,
    publish_inputs,
    until,
)

STEPS = ["handler", HANDLED, INTENT, PUBLISHED, COMMITTED, "outside"]


def start_worker(url: str, kind: str, directory: Path, ends: dict[int, int], step: str,
                 at: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.consumer_worker", url, kind, str(directory),
         json.dumps(ends), step, str(at)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


async def rounds(url: str, kind: str, directory: Path, ends: dict[int, int],
                 rng: random.Random, workers: list[subprocess.Popen[str]]) -> int:
    """Start workers until one finishes; returns how many were killed."""
    kills = 0
    for _round in range(30):  # bounded: each round ends in a kill or the finish
        step = rng.choice(STEPS)
        at = rng.randrange(1, 8)
        worker = start_worker(url, kind, directory, ends, step, at)
        workers.append(worker)
        if step == "outside":
            try:
                await asyncio.to_thread(worker.wait, rng.uniform(0.3, 1.2))
            except subprocess.TimeoutExpired:
                worker.send_signal(signal.SIGKILL)
        out, err = await asyncio.to_thread(worker.communicate, timeout=60)
        if worker.returncode == -signal.SIGKILL:
            kills += 1
            continue
        assert worker.returncode == 0, err
        assert out.strip() == "done"
        return kills
    pytest.fail("the consumer never finished")


@pytest.mark.parametrize("kind", ["json", "sqlite"])
async def test_kill_9_at_random_points_applies_everything_exactly_once(
        broker_process, tmp_path: Path, kind: str) -> None:
    broker = broker_process(tmp_path / "broker").start()
    workers: list[subprocess.Popen[str]] = []
    async with Client(broker.url) as client:
        published = await publish_inputs(client, 150, seed=3)
        ends = until(published)
        try:
            kills = await rounds(broker.url, kind, tmp_path, ends, random.Random(kind), workers)
        finally:
            for worker in workers:  # only ours, by PID
                if worker.poll() is None:
                    worker.kill()
                    worker.wait(10)
        assert kills >= 8, "too few rounds were killed to mean anything"
        await check_exactly_once(client, kind, tmp_path, published)
        # The broker holds the committed positions (heartbeats), for retention and the lag.
        listed = {c["topic"]: c["index"] for c in await client.consumers(name=f"worker-{kind}")}
        assert listed == ends
