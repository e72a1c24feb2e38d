"""The load generator (this process, on the host): batch publishes in closed loops and paced
single publishes, both spread over every broker node and every topic, and the CPU every
process used meanwhile.

Batch publishes: :data:`BATCH_SENDERS` closed loops, sender k always to node k mod N, each
going round all the topics; a request is :data:`BATCH` messages of :data:`MESSAGE` random
bytes (incompressible: a put's body is compressed when that pays), framed before the run (the
load generator mostly does HTTP). Each sender has its own bodies, so no put can coalesce two
identical requests. Single publishes: :data:`SINGLE_RATE` a second, open loop (each starts on
schedule, at most :data:`SINGLE_IN_FLIGHT` unanswered), round-robin over nodes and topics.
Every answer's ``X-Messaging-Node`` says which node served it: another than the one asked
means the request was forwarded to a holder of its group.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from bench.harness.figures import percentile
from bench.harness.sampling import cpu_seconds, machine_busy
from messaging.frames import FRAMES_CONTENT_TYPE, encode_batch
from messaging.placement import group_of_topic

Session = aiohttp.ClientSession
NODE_HEADER = "X-Messaging-Node"
BATCH = 100
MESSAGE = 200
BATCH_SENDERS = 16
#: Distinct bodies per sender and topic (round-robin).
BODIES = 2
SINGLE_RATE = 200
SINGLE_IN_FLIGHT = 400
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
    singles_skipped: int = 0  # not sent: SINGLE_IN_FLIGHT unanswered already
    single_latencies: list[float] = field(default_factory=list)
    per_second: list[int] = field(default_factory=list)
    seconds: float = 0.0

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

    def singles_text(self) -> str:
        lat = self.single_latencies
        if not lat:
            return "no single publish answered"
        return (f"single publishes p50 {percentile(lat, 50) * 1000:.1f} ms, p99 "
                f"{percentile(lat, 99) * 1000:.1f} ms")


def batch_bodies(topics: list[int]) -> list[dict[int, list[bytes]]]:
    """Per sender, per topic, :data:`BODIES` framed batches of random messages."""
    return [{t: [encode_batch(t, [os.urandom(MESSAGE) for _ in range(BATCH)])
                 for _ in range(BODIES)] for t in topics} for _ in range(BATCH_SENDERS)]


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
                   singles: bool = True) -> Tally:
    """Batch senders and paced single publishes for ``seconds``; what was acknowledged."""
    tally = Tally()
    t0 = time.perf_counter()
    deadline = t0 + seconds

    async def sender(k: int) -> None:
        url = urls[k % len(urls)]
        for n in range(1_000_000):
            if time.perf_counter() >= deadline:
                return
            topic = topics[(k * 5 + n) % len(topics)]
            started = time.perf_counter()
            body = bodies[k][topic][(n // len(topics)) % BODIES]
            served = await publish(session, url, topic, body, True, tally)
            if served is None:
                await asyncio.sleep(0.05)  # a refusal is not retried at full speed
                continue
            tally.batch_messages += BATCH
            tally.record(url, served, BATCH, started, t0)

    async def single(k: int) -> None:
        url = urls[k % len(urls)]
        topic = topics[(k * 7) % len(topics)]
        started = time.perf_counter()
        served = await publish(session, url, topic, os.urandom(MESSAGE), False, tally)
        if served is not None:
            tally.single_latencies.append(time.perf_counter() - started)
            tally.single_messages += 1
            tally.record(url, served, 1, started, t0)

    async def pacer() -> None:
        tasks: set[asyncio.Task[None]] = set()
        for k in range(int(seconds * SINGLE_RATE)):
            delay = t0 + k / SINGLE_RATE - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if len(tasks) >= SINGLE_IN_FLIGHT:
                tally.singles_skipped += 1
                continue
            task = asyncio.ensure_future(single(k))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(list(tasks), timeout=40)

    work = [sender(k) for k in range(BATCH_SENDERS)]
    if singles:
        work.append(pacer())
    await asyncio.gather(*work)
    tally.seconds = time.perf_counter() - t0
    return tally


@dataclass
class CpuWindow:
    """CPU seconds each process used over a window, the load generator's and the machine's."""

    seconds: float
    processes: dict[str, float]  # name → CPU seconds
    load_generator: float
    machine: float


async def with_cpu(pids: Callable[[], dict[str, int | None]],
                   work: asyncio.Future[Tally] | asyncio.Task[Tally]) -> tuple[Tally, CpuWindow]:
    """Run ``work``, reading every named process's CPU before and after it."""
    before = {name: cpu_seconds(pid) for name, pid in pids().items()}
    me, busy, started = time.process_time(), machine_busy(), time.perf_counter()
    tally = await work
    wall = time.perf_counter() - started
    after = {name: cpu_seconds(pid) for name, pid in pids().items()}
    return tally, CpuWindow(wall, {n: after[n] - before.get(n, 0.0) for n in after},
                            time.process_time() - me, machine_busy() - busy)
