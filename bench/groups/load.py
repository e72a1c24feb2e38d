"""The load generator (this process, on the host): closed-loop publishers spread over every
broker node and every topic, mostly batches with a share of single publishes, and the CPU
every process used meanwhile.

:data:`SENDERS` closed loops; sender k always publishes to node k mod N and goes round all the
topics; each sends :data:`SINGLES_EVERY` batch requests of :data:`BATCH` messages of
:data:`MESSAGE` random bytes (incompressible: a put's body is compressed when that pays), then
one single publish of :data:`MESSAGE` random bytes, and so on: a fifth of the requests are
single publishes, and the share does not depend on how fast the cluster is. Batches are framed
before the run (the load generator mostly does HTTP); each sender has its own bodies, so no
put can coalesce two identical requests. Every answer's ``X-Messaging-Node`` says which node
served it: another than the one asked means the request was forwarded to a holder of its
group.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import aiohttp

from bench.harness.figures import percentile
from bench.harness.sampling import CLK_TCK, cpu_seconds, machine_busy
from messaging.frames import FRAMES_CONTENT_TYPE, encode_batch
from messaging.placement import group_of_topic

T = TypeVar("T")
Session = aiohttp.ClientSession
NODE_HEADER = "X-Messaging-Node"
BATCH = 100
MESSAGE = 200
SENDERS = 16
#: Batch requests between two single publishes of a sender.
SINGLES_EVERY = 4
#: Distinct bodies per sender and topic (round-robin).
BODIES = 2
TOPICS = 32


def balanced_topics(count: int = TOPICS, groups: int = 8) -> list[int]:
    """``count`` topic ids from 1 up, the same number in each of ``groups`` groups (so also in
    each group of any G dividing ``groups``): every group is as busy as every other."""
    per = count // groups
    chosen: dict[int, list[int]] = {g: [] for g in range(groups)}
    for topic in range(1, 100_000):
        g = group_of_topic(topic, groups)
        if len(chosen[g]) < per:
            chosen[g].append(topic)
        if all(len(v) == per for v in chosen.values()):
            break
    return sorted(t for v in chosen.values() for t in v)


@dataclass
class Tally:
    """What the load generator saw in one run."""

    messages: int = 0  # acknowledged (200)
    batch_messages: int = 0
    single_messages: int = 0
    requests: int = 0
    entry: Counter[str] = field(default_factory=Counter)  # messages per node asked
    served: Counter[str] = field(default_factory=Counter)  # messages per node that served
    forwarded: int = 0  # messages served by another node than the one asked
    forwarded_in: Counter[str] = field(default_factory=Counter)  # per node: those it served
    errors: Counter[str] = field(default_factory=Counter)
    single_latencies: list[float] = field(default_factory=list)
    batch_latencies: list[float] = field(default_factory=list)
    per_second: list[int] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, other: Tally) -> None:
        """Add another run's figures to these (one configuration's rounds)."""
        for name in ("messages", "batch_messages", "single_messages", "requests", "forwarded",
                     "seconds"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for counter in ("entry", "served", "forwarded_in", "errors"):
            getattr(self, counter).update(getattr(other, counter))
        self.single_latencies += other.single_latencies
        self.batch_latencies += other.batch_latencies
        self.per_second += other.per_second

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0

    def record(self, asked: str, served: str, count: int, started: float, t0: float) -> None:
        self.messages += count
        self.requests += 1
        self.entry[asked] += count
        self.served[served] += count
        if served != asked:
            self.forwarded += count
            self.forwarded_in[served] += count
        second = int(started - t0)
        while len(self.per_second) <= second:
            self.per_second.append(0)
        self.per_second[second] += count

    def latency_text(self) -> str:
        """The batch and single publishes' round trips, p50 and p99."""
        parts = []
        for name, lat in (("batch", self.batch_latencies), ("single", self.single_latencies)):
            if lat:
                parts.append(f"{name} publish p50 {percentile(lat, 50) * 1000:.1f} ms, p99 "
                             f"{percentile(lat, 99) * 1000:.1f} ms")
        return "; ".join(parts) or "no publish answered"


def batch_bodies(topics: list[int]) -> list[dict[int, list[bytes]]]:
    """Per sender, per topic, :data:`BODIES` framed batches of random messages."""
    return [{t: [encode_batch(t, [os.urandom(MESSAGE) for _ in range(BATCH)])
                 for _ in range(BODIES)] for t in topics} for _ in range(SENDERS)]


async def publish(session: Session, url: str, topic: int, body: bytes, batch: bool,
                  tally: Tally, timeout: float = 30.0) -> str | None:
    """One publish; the node that served it, or None (the failure is counted)."""
    headers = {"Content-Type": FRAMES_CONTENT_TYPE if batch else "application/octet-stream"}
    try:
        async with session.post(f"{url}/messaging/messages", params={"topicID": str(topic)},
                                data=body, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            await resp.read()
            if resp.status == 200:
                return resp.headers.get(NODE_HEADER, url)
            tally.errors[f"HTTP {resp.status} {resp.headers.get('X-Messaging-Error', '')}"
                         .strip()[:160]] += 1
    except (aiohttp.ClientError, TimeoutError) as err:
        tally.errors[type(err).__name__] += 1
    return None


async def run_load(session: Session, urls: list[str], topics: list[int],
                   bodies: list[dict[int, list[bytes]]], seconds: float,
                   holders: dict[int, list[str]] | None = None) -> Tally:
    """The senders for ``seconds``; what was acknowledged. With ``holders`` (topic → the
    holders of its group) sender k sends each request to holder k mod R of its topic's group
    instead of always to node k mod N."""
    tally = Tally()
    t0 = time.perf_counter()
    deadline = t0 + seconds

    async def sender(k: int) -> None:
        for n in range(1_000_000):
            if time.perf_counter() >= deadline:
                return
            topic = topics[(k * 5 + n) % len(topics)]
            url = urls[k % len(urls)] if holders is None else \
                holders[topic][k % len(holders[topic])]
            single = n % (SINGLES_EVERY + 1) == SINGLES_EVERY
            body = os.urandom(MESSAGE) if single else \
                bodies[k][topic][(n // len(topics)) % BODIES]
            started = time.perf_counter()
            served = await publish(session, url, topic, body, not single, tally)
            if served is None:
                await asyncio.sleep(0.05)  # a refusal is not retried at full speed
                continue
            took = time.perf_counter() - started
            if single:
                tally.single_messages += 1
                tally.single_latencies.append(took)
            else:
                tally.batch_messages += BATCH
                tally.batch_latencies.append(took)
            tally.record(url, served, 1 if single else BATCH, started, t0)

    await asyncio.gather(*(sender(k) for k in range(SENDERS)))
    tally.seconds = time.perf_counter() - t0
    return tally


@dataclass
class CpuWindow:
    """CPU seconds each process used over a window, the load generator's and the machine's."""

    seconds: float
    processes: dict[str, float]  # name → CPU seconds
    load_generator: float
    machine: float
    kernel: float = 0.0  # interrupts and softirqs (the veths' and bridge's packets among them)

    def add(self, other: CpuWindow) -> None:
        """Add another window (one configuration's rounds)."""
        self.seconds += other.seconds
        for name, value in other.processes.items():
            self.processes[name] = self.processes.get(name, 0.0) + value
        self.load_generator += other.load_generator
        self.machine += other.machine
        self.kernel += other.kernel

    @property
    def others(self) -> float:
        """CPU seconds the machine spent beyond our processes and interrupts: other work on
        this shared machine."""
        return max(0.0, self.machine - sum(self.processes.values()) - self.load_generator
                   - self.kernel)


async def with_cpu(pids: Callable[[], dict[str, int | None]],
                   work: Awaitable[T]) -> tuple[T, CpuWindow]:
    """Run ``work``, reading every named process's CPU before and after it."""
    before = {name: cpu_seconds(pid) for name, pid in pids().items()}
    me, busy, started = time.process_time(), machine_busy(), time.perf_counter()
    kernel = interrupt_seconds()
    result = await work
    wall = time.perf_counter() - started
    after = {name: cpu_seconds(pid) for name, pid in pids().items()}
    return result, CpuWindow(wall, {n: after[n] - before.get(n, 0.0) for n in after},
                             time.process_time() - me, machine_busy() - busy,
                             interrupt_seconds() - kernel)


def interrupt_seconds() -> float:
    """Seconds all cores spent in interrupts and softirqs since boot (``/proc/stat``)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    return (int(fields[5]) + int(fields[6])) / CLK_TCK


async def busy_cores(seconds: float = 1.0) -> float:
    """Cores the machine kept busy over ``seconds`` (between configurations: other work)."""
    before, started = machine_busy(), time.perf_counter()
    await asyncio.sleep(seconds)
    return (machine_busy() - before) / (time.perf_counter() - started)


async def wait_for_quiet(limit: float, threshold: float = 0.5) -> tuple[float, float]:
    """Wait (at most ``limit`` seconds) until other work keeps under ``threshold`` cores busy;
    the seconds waited and the last reading."""
    started = time.perf_counter()
    busy = await busy_cores()
    for _ in range(int(limit) + 1):
        if busy < threshold or time.perf_counter() - started >= limit:
            break
        busy = await busy_cores()
    return time.perf_counter() - started, busy
