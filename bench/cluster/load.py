"""The cluster benchmark's load and probes: its settings, the broker nodes, batch throughput
and paced latency over the nodes, a failover round (kill -9 of the etcd leader under load),
etcd's RSS sampled through the run, the CPU each group of processes used, convergence."""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.harness import settings
from bench.harness.cluster_nodes import nodes_ready, post
from bench.harness.etcd_members import Etcd, etcd_healthy, etcd_leader, raft_index
from bench.harness.loops import bounded_wait
from bench.harness.procs import Proc, broker, free_port
from bench.harness.publish_load import elapsed_since
from bench.harness.sampling import rss_bytes
from messaging.log.etcd.writer import MAX_PUTS_IN_FLIGHT

Session = aiohttp.ClientSession


@dataclass
class Settings(settings.Settings):
    """One run's sizes: ``rounds`` batch runs of ``seconds`` per setup (median), failover
    rounds, and a sustained load until etcd's Raft index moved ``sustain_entries`` (or
    ``sustain_seconds`` passed): etcd keeps up to snapshot-count + 5,000 = 7,000 entries in
    memory, so twice that shows whether its memory levels off."""

    seconds: float = 5.0
    failovers: int = 5
    sustain_entries: int = 14_000
    sustain_seconds: float = 240.0
    snapshot_count: int = 2000

    @classmethod
    def from_env(cls) -> Settings:
        """The defaults, or BENCH_SECONDS, BENCH_FAILOVERS, BENCH_ETCD_ENTRIES and
        BENCH_SUSTAIN_SECONDS from the environment."""
        env = os.environ.get
        return cls(seconds=float(env("BENCH_SECONDS", "5")),
                   failovers=int(env("BENCH_FAILOVERS", "5")),
                   sustain_entries=int(env("BENCH_ETCD_ENTRIES", "14000")),
                   sustain_seconds=float(env("BENCH_SUSTAIN_SECONDS", "240")))


# -- broker nodes ------------------------------------------------------------------------------

@dataclass
class Node:
    """One broker node of the cluster (fixed port, its own data directory and log)."""

    tmp: Path
    i: int
    endpoints: str
    cluster: str
    port: int = field(default_factory=free_port)
    proc: Proc | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.tmp / f"node{self.i}.log"

    def start(self) -> None:
        # The defaults (--cluster-apply-linger 20ms among them), as users run a cluster.
        self.proc, _ = broker(self.tmp / f"node{self.i}", "--etcd", self.endpoints,
                              "--cluster", self.cluster, "--advertise", self.url,
                              port=self.port, log=self.log)


async def start_nodes(session: Session, tmp: Path, members: list[Etcd], nodes: list[Node],
                      cluster: str) -> list[str]:
    """Three broker nodes on the (started) etcd ``members``, each talking to another member
    first, appended to ``nodes`` as they are made (the caller stops them); their URLs once
    etcd is healthy and every node is ready."""
    await bounded_wait(lambda: etcd_healthy(session, members), 60, "etcd healthy", 0.2)
    for i in range(3):
        order = members[i:] + members[:i]
        nodes.append(Node(tmp, i, ",".join(m.client_url for m in order), cluster))
    await asyncio.gather(*(asyncio.to_thread(n.start) for n in nodes))
    urls = [n.url for n in nodes]
    await bounded_wait(lambda: nodes_ready(session, urls), 60, "nodes ready", 0.2)
    return urls


# -- measurements ------------------------------------------------------------------------------

@dataclass
class Failover:
    first_ack: float  # kill → first acknowledged publish sent after the kill
    all_nodes: float  # kill → every node has acknowledged such a publish
    errors: Counter[str]
    max_pending: int = 0  # most commands a node held back, waiting for a put slot
    slots_full: float = 0.0  # longest a node had every put slot busy after the kill, s


async def failover_round(session: Session, members: list[Etcd], urls: list[str],
                         topic: int) -> Failover:
    """kill -9 the etcd leader while publishes go to every node (100/s each, open loop)."""
    acks: list[tuple[float, float, str]] = []  # (sent, acknowledged, node)
    errors: Counter[str] = Counter()
    stop = asyncio.Event()
    tasks: set[asyncio.Task[None]] = set()

    async def one(url: str) -> None:
        sent = time.perf_counter()
        try:
            status = await post(session, url, topic, b"f" * 100, batch=False, timeout=15)
        except (aiohttp.ClientError, TimeoutError) as err:
            errors[type(err).__name__] += 1
            return
        if status == 200:
            acks.append((sent, time.perf_counter(), url))
        else:
            errors[f"HTTP {status}"] += 1

    async def pacer() -> None:
        started = time.perf_counter()
        for k in range(100_000):  # bounded; stopped long before
            if stop.is_set():
                return
            delay = started + k / 300 - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if len(tasks) < 600:
                task = asyncio.ensure_future(one(urls[k % len(urls)]))
                tasks.add(task)
                task.add_done_callback(tasks.discard)

    pending: dict[str, int] = {}
    full_since: dict[str, float] = {}
    full_for: dict[str, float] = {}

    async def watch_nodes() -> None:
        """Each node's write path (puts in flight, commands pending) every 0.1 s."""
        for _ in range(600):
            for url in urls:
                try:
                    async with session.get(f"{url}/messaging/diagnostics",
                                           timeout=aiohttp.ClientTimeout(total=1)) as resp:
                        d = await resp.json()
                except (aiohttp.ClientError, TimeoutError, ValueError):
                    continue
                now = time.perf_counter()
                pending[url] = max(pending.get(url, 0), int(d.get("pending", 0)))
                if d.get("puts_in_flight", 0) >= MAX_PUTS_IN_FLIGHT:
                    full_since.setdefault(url, now)
                    full_for[url] = max(full_for.get(url, 0.0), now - full_since[url])
                else:
                    full_since.pop(url, None)
            await asyncio.sleep(0.1)

    pacing = asyncio.ensure_future(pacer())
    watching: asyncio.Future[None] | None = None
    try:
        await bounded_wait(lambda: _true(len(acks) >= 150), 30, "publishes before the kill")
        leader = await etcd_leader(session, members)
        killed = time.perf_counter()
        leader.kill()
        watching = asyncio.ensure_future(watch_nodes())

        def after() -> dict[str, float]:
            firsts: dict[str, float] = {}
            for sent, acked, url in acks:
                if sent > killed:
                    firsts[url] = min(firsts.get(url, acked), acked)
            return firsts

        await bounded_wait(lambda: _true(len(after()) == len(urls)), 60,
                           "every node acknowledging after the etcd leader's kill", 0.01)
        firsts = after()
    finally:
        stop.set()
        if watching is not None:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
        await asyncio.wait_for(pacing, 5)
        if tasks:
            await asyncio.wait(list(tasks), timeout=20)
    leader.start()
    await bounded_wait(lambda: etcd_healthy(session, members), 90, "etcd healthy again", 0.2)
    await bounded_wait(lambda: nodes_ready(session, urls), 60, "nodes ready again", 0.2)
    return Failover(min(firsts.values()) - killed, max(firsts.values()) - killed, errors,
                    max(pending.values(), default=0), max(full_for.values(), default=0.0))


async def _true(value: bool) -> bool:
    return value


# -- memory sampling ---------------------------------------------------------------------------

@dataclass
class Sample:
    t: float
    phase: str
    rss: list[int]  # per etcd member, bytes (0 while it is down)
    raft_index: int


class Sampler:
    """Samples every etcd member's RSS twice a second (and etcd's Raft index once a second)."""

    def __init__(self, session: Session, members: list[Etcd]) -> None:
        self.session, self.members = session, members
        self.samples: list[Sample] = []
        self.phase = "idle"
        self.started = time.perf_counter()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def sample(self) -> Sample:
        index = await raft_index(self.session, self.members)
        s = Sample(elapsed_since(self.started), self.phase,
                   [rss_bytes(m.pid) for m in self.members], index)
        self.samples.append(s)
        return s

    async def _run(self) -> None:
        for _ in range(3600):  # at most 30 minutes at 2 samples/s
            await self.sample()
            await asyncio.sleep(0.5)


async def converged(session: Session, urls: list[str]) -> str:
    """Whether every node ends with the same last index on every topic."""
    seen: list[dict[int, int]] = []

    async def same() -> bool:
        seen.clear()
        for url in urls:
            try:
                async with session.get(f"{url}/messaging/topics") as resp:
                    topics = await resp.json()
            except (aiohttp.ClientError, ValueError):
                return False
            seen.append({t["id"]: t["last_index"] for t in topics})
        return all(s == seen[0] for s in seen)

    try:
        await bounded_wait(same, 30, "nodes converging", 0.5)
        return "all three nodes ended with the same last index on every topic"
    except RuntimeError:
        return f"the nodes did NOT converge: {seen}"
