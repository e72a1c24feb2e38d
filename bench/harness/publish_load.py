"""Publish load over broker URLs and the CPU it costs, shared by the cluster benchmarks and
the experiments beside them: SENDERS concurrent 1000-message batch publishers, paced single
publishes (open loop), and the CPU that groups of processes spent meanwhile."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from bench.harness.cluster_nodes import post
from bench.harness.loops import paced
from bench.harness.payloads import PAYLOAD
from bench.harness.sampling import cpu_seconds, machine_busy
from examples.generate_events import make_events
from messaging.frames import encode_batch

BATCH = 1000
SENDERS = 4
#: Distinct batch bodies per sender (random messages, reused round-robin).
BODIES = 8
LATENCY_RATE = 1000
LATENCY_COUNT = 2000

Session = aiohttp.ClientSession


def elapsed_since(start: float) -> float:
    """Seconds since ``start`` (``time.perf_counter``)."""
    return time.perf_counter() - start


def random_message(k: int) -> bytes:
    """100 random bytes: incompressible (etcd log entries are compressed, and the other
    benchmarks' b"x" * 100 would shrink to nothing)."""
    return os.urandom(len(PAYLOAD))


_EVENTS = [json.dumps(e).encode() for e in make_events(SENDERS * BODIES * BATCH, 60)]


def json_event(k: int) -> bytes:
    """A JSON event like the Spark example's (about 70 bytes; zstd takes it to about 0.15)."""
    return _EVENTS[k % len(_EVENTS)]


async def throughput(session: Session, urls: list[str], topic: int, seconds: float,
                     message: Callable[[int], bytes] = random_message) -> float:
    """msg/s of SENDERS concurrent 1000-message batch publishers, spread over ``urls``."""
    # Framed once (the client is not measured). Each sender has its own bodies, so that a put
    # coalescing several requests holds no repeats.
    bodies = [[encode_batch(topic, [message((k * BODIES + b) * BATCH + i) for i in range(BATCH)])
               for b in range(BODIES)] for k in range(SENDERS)]
    count = 0
    deadline = time.perf_counter() + seconds

    async def sender(k: int) -> None:
        nonlocal count
        url = urls[k % len(urls)]
        for n in range(1_000_000):
            if time.perf_counter() >= deadline:
                return
            status = await post(session, url, topic, bodies[k][n % BODIES], batch=True)
            if status != 200:
                raise RuntimeError(f"batch publish to {url}: HTTP {status}")
            count += BATCH

    started = time.perf_counter()
    await asyncio.gather(*(sender(k) for k in range(SENDERS)))
    return count / elapsed_since(started)


async def latencies(session: Session, urls: list[str], topic: int, rate: int = LATENCY_RATE,
                    count: int = LATENCY_COUNT) -> list[float]:
    """Seconds per single 100 B publish, ``count`` of them paced at ``rate``/s (open loop:
    each starts on schedule whether or not earlier ones were answered)."""
    delays: list[float] = []

    async def one(k: int) -> None:
        started = time.perf_counter()
        status = await post(session, urls[k % len(urls)], topic, os.urandom(len(PAYLOAD)),
                            batch=False)
        if status != 200:
            raise RuntimeError(f"publish: HTTP {status}")
        delays.append(elapsed_since(started))

    for warm in range(50):
        await one(warm)
    delays.clear()
    await paced(rate, count, one, drain=60)
    if len(delays) < count:
        raise RuntimeError(f"{count - len(delays)} of {count} publishes not "
                           "answered in time")
    return delays


def cpu_of(pids: list[int | None]) -> float:
    return sum(cpu_seconds(p) for p in pids)


@dataclass
class CpuUse:
    """CPU used during one phase, in cores: by each group of our processes, and by the
    whole machine (the difference is other work on it)."""

    shares: dict[str, float]
    machine: float

    @property
    def others(self) -> float:
        return max(0.0, self.machine - sum(self.shares.values()))

    def text(self) -> str:
        return ", ".join([*(f"{name} {cores:.2f}" for name, cores in self.shares.items()),
                          f"other processes {self.others:.2f}"])


async def with_cpu(groups: dict[str, Callable[[], list[int | None]]],
                   work: Awaitable[Any]) -> tuple[Any, CpuUse]:
    before = {name: cpu_of(pids()) for name, pids in groups.items()}
    me = time.process_time()
    busy = machine_busy()
    started = time.perf_counter()
    result = await work
    wall = elapsed_since(started)
    shares = {name: (cpu_of(pids()) - before[name]) / wall for name, pids in groups.items()}
    shares["load generator"] = (time.process_time() - me) / wall
    return result, CpuUse(shares, (machine_busy() - busy) / wall)


