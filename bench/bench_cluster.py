"""Cluster benchmark: 3 broker nodes on a 3-member etcd cluster, beside a single LocalLog node.

Every process runs on 127.0.0.1 and shares this machine's cores and disk: 3 etcd members
(``--snapshot-count 2000``), 3 broker nodes of one cluster (each talks to a different etcd
member first), the single-node baseline (measured before the cluster starts) and the load
generator (this process). Figures:

1. batch publish throughput: 4 senders of 1000 × 100 B requests, spread over the nodes;
2. single-message publish latency at 1,000 msg/s (open loop, paced), p50 and p99;
3. failover: kill -9 of the etcd *leader* while publishes go on; time to the next publish
   acknowledged that was sent after the kill; the killed member is restarted every round;
4. etcd memory: every member's RSS sampled through the run, with a sustained batch load long
   enough for etcd's in-memory Raft log to reach its bound (``--snapshot-count`` + 5,000).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.etcd_members import Etcd, etcd_cluster, etcd_healthy, etcd_leader, raft_index
from bench.harness import results
from bench.harness.figures import Row, percentile
from bench.harness.loops import bounded_wait, paced
from bench.harness.payloads import PAYLOAD
from bench.harness.plots import plt
from bench.harness.procs import Proc, broker, free_port
from bench.harness.results import command_line, report
from bench.harness.sampling import cpu_seconds, machine_busy, rss_bytes
from messaging.frames import FRAMES_CONTENT_TYPE, encode_batch
from messaging.log.etcd.writer import MAX_PUTS_IN_FLIGHT

SECONDS = float(os.environ.get("BENCH_SECONDS", "5"))
FAILOVERS = int(os.environ.get("BENCH_FAILOVERS", "5"))
#: Sustained load runs until etcd's Raft index moved this far (or SUSTAIN_SECONDS passed):
#: etcd keeps up to snapshot-count + 5,000 = 7,000 entries in memory, so twice that shows
#: whether its memory levels off.
SUSTAIN_ENTRIES = int(os.environ.get("BENCH_ETCD_ENTRIES", "14000"))
SUSTAIN_SECONDS = float(os.environ.get("BENCH_SUSTAIN_SECONDS", "150"))
SNAPSHOT_COUNT = 2000
BATCH = 1000
SENDERS = 4
LATENCY_RATE = 1000
LATENCY_COUNT = 2000
MiB = 2**20

Session = aiohttp.ClientSession


def elapsed_since(start: float) -> float:
    return time.perf_counter() - start


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
        self.proc, _ = broker(self.tmp / f"node{self.i}", "--etcd", self.endpoints,
                              "--cluster", self.cluster, "--advertise", self.url,
                              port=self.port, log=self.log)


async def post(session: Session, url: str, topic: int, body: bytes, batch: bool,
               timeout: float = 30) -> int:
    headers = {"Content-Type": FRAMES_CONTENT_TYPE if batch else "application/octet-stream"}
    async with session.post(f"{url}/messaging/messages", params={"topicID": str(topic)},
                            data=body, headers=headers,
                            timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
        await resp.read()
        return resp.status


async def nodes_ready(session: Session, urls: list[str]) -> bool:
    """Every node's watch is live, it sees quorum, and it acknowledges a publish."""
    for url in urls:
        try:
            async with session.get(f"{url}/messaging/diagnostics",
                                   timeout=aiohttp.ClientTimeout(total=5)) as resp:
                d = await resp.json()
            if not (d.get("watch", {}).get("live") and d.get("quorum")):
                return False
            if await post(session, url, 99, b"ready?", batch=False, timeout=10) != 200:
                return False
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return False
    return True


# -- measurements ------------------------------------------------------------------------------

async def throughput(session: Session, urls: list[str], topic: int, seconds: float) -> float:
    """msg/s of SENDERS concurrent 1000-message batch publishers, spread over ``urls``."""
    body = encode_batch(topic, [PAYLOAD] * BATCH)  # framed once: the client is not measured
    count = 0
    deadline = time.perf_counter() + seconds

    async def sender(k: int) -> None:
        nonlocal count
        url = urls[k % len(urls)]
        for _ in range(1_000_000):
            if time.perf_counter() >= deadline:
                return
            status = await post(session, url, topic, body, batch=True)
            if status != 200:
                raise RuntimeError(f"batch publish to {url}: HTTP {status}")
            count += BATCH

    started = time.perf_counter()
    await asyncio.gather(*(sender(k) for k in range(SENDERS)))
    return count / elapsed_since(started)


async def latencies(session: Session, urls: list[str], topic: int) -> list[float]:
    """Seconds per single 100 B publish, LATENCY_COUNT of them paced at LATENCY_RATE/s (open
    loop: each starts on schedule whether or not earlier ones were answered)."""
    delays: list[float] = []

    async def one(k: int) -> None:
        started = time.perf_counter()
        status = await post(session, urls[k % len(urls)], topic, PAYLOAD, batch=False)
        if status != 200:
            raise RuntimeError(f"publish: HTTP {status}")
        delays.append(elapsed_since(started))

    for warm in range(50):
        await one(warm)
    delays.clear()
    await paced(LATENCY_RATE, LATENCY_COUNT, one, drain=60)
    if len(delays) < LATENCY_COUNT:
        raise RuntimeError(f"{LATENCY_COUNT - len(delays)} of {LATENCY_COUNT} publishes not "
                           "answered in time")
    return delays


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


# -- the run -----------------------------------------------------------------------------------

@dataclass
class Results:
    single_rate: float = 0.0
    single_lat: list[float] = field(default_factory=list)
    single_cpu: CpuUse | None = None
    cluster_rate: float = 0.0
    cluster_rates: list[float] = field(default_factory=list)
    cluster_lat: list[float] = field(default_factory=list)
    cluster_cpu: CpuUse | None = None
    cluster_lat_cpu: CpuUse | None = None
    sustained_rate: float = 0.0
    sustained_seconds: float = 0.0
    chunks: list[tuple[float, CpuUse]] = field(default_factory=list)  # sustained, per run
    sustain_from: int = 0  # index into samples where the sustained load started
    failovers: list[Failover] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    converged: str = ""
    load_at_start: tuple[float, float, float] = (0.0, 0.0, 0.0)


async def run_single(tmp: Path, res: Results) -> None:
    proc, url = broker(tmp / "single", log=tmp / "single.log")
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            rates = []
            for i in range(3):
                rate, cpu = await with_cpu({"broker": lambda: [proc.pid]},
                                           throughput(session, [url], 1, SECONDS))
                rates.append(rate)
                res.single_cpu = cpu if i == 1 else res.single_cpu
                print(f"  single node batch publish: {rate:,.0f} msg/s ({cpu.text()})",
                      flush=True)
            res.single_rate = statistics.median(rates)
            res.single_lat = await latencies(session, [url], 2)
            print(f"  single node latency p50 {percentile(res.single_lat, 50) * 1000:.2f} ms "
                  f"p99 {percentile(res.single_lat, 99) * 1000:.2f} ms", flush=True)
    finally:
        proc.stop()


async def run_cluster(tmp: Path, res: Results) -> None:
    members = etcd_cluster(tmp, snapshot_count=SNAPSHOT_COUNT)
    nodes: list[Node] = []
    try:
        for member in members:
            member.start()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            await bounded_wait(lambda: etcd_healthy(session, members), 60, "etcd healthy", 0.2)
            sampler = Sampler(session, members)
            sampler.start()
            for i in range(3):
                order = members[i:] + members[:i]  # each node talks to another member first
                nodes.append(Node(tmp, i, ",".join(m.client_url for m in order), "bench"))
            await asyncio.gather(*(asyncio.to_thread(n.start) for n in nodes))
            urls = [n.url for n in nodes]
            await bounded_wait(lambda: nodes_ready(session, urls), 60, "nodes ready", 0.2)
            groups: dict[str, Callable[[], list[int | None]]] = {
                "brokers": lambda: [n.proc.pid if n.proc else None for n in nodes],
                "etcd": lambda: [m.pid for m in members]}

            sampler.phase = "throughput"
            for i in range(3):
                rate, cpu = await with_cpu(groups, throughput(session, urls, 1, SECONDS))
                res.cluster_rates.append(rate)
                res.cluster_cpu = cpu if i == 1 else res.cluster_cpu
                print(f"  cluster batch publish: {rate:,.0f} msg/s ({cpu.text()})", flush=True)
            res.cluster_rate = statistics.median(res.cluster_rates)

            sampler.phase = "latency"
            res.cluster_lat, res.cluster_lat_cpu = await with_cpu(
                groups, latencies(session, urls, 2))
            print(f"  cluster latency p50 {percentile(res.cluster_lat, 50) * 1000:.2f} ms "
                  f"p99 {percentile(res.cluster_lat, 99) * 1000:.2f} ms "
                  f"({res.cluster_lat_cpu.text()})", flush=True)

            sampler.phase = "sustained"
            first = await sampler.sample()
            res.sustain_from = len(sampler.samples) - 1
            started = time.perf_counter()
            messages = 0.0
            for _ in range(int(SUSTAIN_SECONDS / SECONDS) + 1):
                if elapsed_since(started) >= SUSTAIN_SECONDS:
                    break
                now = await sampler.sample()
                if now.raft_index - first.raft_index >= SUSTAIN_ENTRIES:
                    break
                rate, use = await with_cpu(groups, throughput(session, urls, 1, SECONDS))
                res.chunks.append((rate, use))
                messages += rate * SECONDS
                big = max(now.rss) / MiB
                print(f"  sustained: {elapsed_since(started):.0f} s, raft index "
                      f"{now.raft_index}, largest etcd RSS {big:,.0f} MiB, {rate:,.0f} msg/s "
                      f"({use.text()})", flush=True)
            res.sustained_seconds = elapsed_since(started)
            res.sustained_rate = messages / res.sustained_seconds
            await sampler.sample()

            sampler.phase = "failover"
            for r in range(FAILOVERS):
                f = await failover_round(session, members, urls, 3)
                res.failovers.append(f)
                print(f"  failover {r + 1}: first ack {f.first_ack:.2f} s, every node "
                      f"{f.all_nodes:.2f} s, errors {dict(f.errors)}, all put slots busy "
                      f"up to {f.slots_full:.1f} s, up to {f.max_pending} pending", flush=True)
            await sampler.stop()
            res.samples = sampler.samples
            res.converged = await converged(session, urls)
    finally:
        for node in nodes:
            if node.proc is not None:
                node.proc.stop()
        for member in members:
            member.stop()
        for log in sorted(tmp.glob("node*.log")):
            errors = [line for line in log.read_text(errors="replace").splitlines()
                      if "ERROR" in line or "Traceback" in line]
            if errors:
                print(f"  {log.name}: {len(errors)} error lines, e.g. {errors[0][:300]}")


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


def rows_and_notes(res: Results) -> tuple[list[Row], str]:
    ms = 1000
    single50, single99 = percentile(res.single_lat, 50) * ms, percentile(res.single_lat, 99) * ms
    c50, c99 = percentile(res.cluster_lat, 50) * ms, percentile(res.cluster_lat, 99) * ms
    firsts = [f.first_ack for f in res.failovers]
    alls = [f.all_nodes for f in res.failovers]
    median = statistics.median(firsts)
    sustained = res.samples[res.sustain_from:]
    sustained = [s for s in sustained if s.phase == "sustained"] or sustained
    end = sustained[-1]
    big = max(range(len(end.rss)), key=lambda i: end.rss[i])
    start_rss = res.samples[0].rss[big]
    peak = max(s.rss[big] for s in res.samples)
    entries = end.raft_index - sustained[0].raft_index
    first_slope = growth(sustained, big, 0)
    last_slope = growth(sustained, big, 2)
    levels = last_slope <= 0.25 * first_slope
    target_rate = res.cluster_rate >= 0.5 * res.single_rate and res.cluster_rate >= 200_000
    rows = [
        Row(f"batch publish 1000 × 100 B, 4 senders over 3 nodes, median of 3 × {SECONDS:.0f} s",
            res.cluster_rate, "msg/s", "single node", res.single_rate,
            "≥ 50% of single and ≥ 200,000 msg/s", target_rate),
        Row(f"batch publish sustained {res.sustained_seconds:.0f} s ({entries:,} etcd entries)",
            res.sustained_rate, "msg/s", "single node", res.single_rate),
        Row("single publish latency p50 at 1,000 msg/s", c50, "ms", "single node", single50),
        Row("single publish latency p99 at 1,000 msg/s", c99, "ms", "single node", single99),
        Row(f"failover: etcd leader kill -9 → next ack, median of {len(firsts)}", median, "s",
            "", None, "≤ 3 s", median <= 3.0),
        Row("failover, slowest round", max(firsts), "s"),
        Row("failover: kill → every node acknowledging again, median", statistics.median(alls),
            "s"),
        Row(f"etcd RSS, largest member: end of sustained load (start of run "
            f"{start_rss / MiB:,.0f} MiB, peak {peak / MiB:,.0f} MiB)", end.rss[big] / MiB,
            "MiB"),
        Row("etcd RSS growth per 1,000 Raft entries, largest member, last third of the "
            "sustained load", last_slope, "MiB", "first third", first_slope,
            "levels off: ≤ 25% of the first third", levels),
    ]
    errors: Counter[str] = Counter()
    for f in res.failovers:
        errors.update(f.errors)
    l1, l5, l15 = res.load_at_start
    cores = os.cpu_count() or 1

    def cpu(use: CpuUse | None) -> str:
        if use is None:
            return "-"
        total = use.machine
        bound = "all cores busy: CPU-bound" if total >= 0.9 * cores else "cores not saturated"
        return f"{use.text()}; machine {total:.2f} of {cores} ({bound})"

    rates = [r for r, _ in res.chunks] or [0.0]
    others = [u.others for _, u in res.chunks] or [0.0]
    slots = max((f.slots_full for f in res.failovers), default=0.0)
    pending = max((f.max_pending for f in res.failovers), default=0)
    notes = (
        f"Everything shares this machine's {cores} cores and one disk: 3 etcd 3.4 members "
        f"(`--snapshot-count {SNAPSHOT_COUNT}`, a WAL fsync per commit), 3 broker nodes "
        "(`--fsync always`, one Python event loop each, each talking to a different etcd "
        "member first) and the load generator (this Python process). The single node "
        "(`messaging broker` without `--etcd`, `--fsync always`) is measured first, alone with "
        "the load generator. Batch bodies are framed once, so the load generator mostly does "
        "HTTP. CPU in cores during the middle batch run — single node: "
        f"{cpu(res.single_cpu)}; cluster: {cpu(res.cluster_cpu)}. A single broker is bound "
        "by its one event loop (a core); the cluster's batch figures are bound by the "
        "machine: every message is applied by 3 brokers and passes through 3 etcd members "
        "on the same 2 cores. During the cluster latency run (1,000 msg/s): "
        f"{cpu(res.cluster_lat_cpu)}; every node applies (and fsyncs) every revision, "
        "however small. The failover rounds run a light load (300 publishes/s).\n\n"
        f"Cluster batch runs: {', '.join(f'{r:,.0f}' for r in res.cluster_rates)} msg/s; "
        f"the sustained load's {len(res.chunks)} runs of {SECONDS:.0f} s ranged "
        f"{min(rates):,.0f}–{max(rates):,.0f} msg/s while other processes on the machine "
        f"used {min(others):.2f}–{max(others):.2f} cores. "
        f"Latency: {LATENCY_COUNT} open-loop publishes of 100 B after 50 warm-up ones, "
        "round-robin over the nodes; a cluster publish is acknowledged after etcd committed "
        "it (leader and a follower fsynced), the node's watch delivered it and the node "
        "applied and fsynced it.\n\n"
        "Failover: publishes at 300/s (open loop, round-robin over the 3 nodes); the etcd "
        "leader (found with etcd's maintenance status) is killed with SIGKILL; the figure is "
        "the time from the kill to the first acknowledgement of a publish *sent after* the "
        "kill; then the member is restarted and the next round waits until etcd is healthy "
        f"and every node acknowledges. Rounds: {', '.join(f'{x:.2f}' for x in firsts)} s "
        f"(every node: {', '.join(f'{x:.2f}' for x in alls)} s). Failed publishes over all "
        f"rounds: {dict(errors) or 'none'}. After a kill, nodes had all "
        f"{MAX_PUTS_IN_FLIGHT} put slots busy for up to {slots:.1f} s with up to {pending} "
        "commands waiting behind them"
        + (": puts sent around the kill are not answered by etcd (a proposal forwarded to "
           "the dead leader is lost) and end only at the client's 5 s put deadline (504), "
           "so failover takes that long rather than the 1–2 s election. " if slots >= 2 else
           ". ")
        + f"Afterwards {res.converged}.\n\n"
        f"etcd memory: every member's RSS sampled twice a second; the sustained load ran "
        f"{res.sustained_seconds:.0f} s ({entries:,} Raft entries, mostly ~126 KB puts) after "
        "the measured runs; etcd keeps about snapshot-count + 5,000 entries in memory. "
        f"Load average when the benchmark started: {l1:.2f}, {l5:.2f}, {l15:.2f}; other "
        "work on the machine (the 'other processes' CPU above) makes the figures noisy: "
        "the single-node baseline alone has varied between about 500,000 and 850,000 msg/s "
        "from one run to the next here.\n\n"
        "![etcd RSS](results/cluster-etcd-rss.png)")
    return rows, notes


def growth(samples: list[Sample], member: int, third: int) -> float:
    """MiB of RSS per 1,000 Raft entries (least squares) over one third (0, 1, 2) of the
    samples, by time."""
    t0, t1 = samples[0].t, samples[-1].t
    lo, hi = t0 + (t1 - t0) * third / 3, t0 + (t1 - t0) * (third + 1) / 3
    part = [s for s in samples if lo <= s.t <= hi and s.rss[member]]
    xs = [float(s.raft_index) for s in part]
    if len(part) < 3 or max(xs) == min(xs):
        return float("nan")
    slope = statistics.linear_regression(xs, [s.rss[member] / MiB for s in part]).slope
    return slope * 1000


def plot_rss(samples: list[Sample]) -> None:
    fig, ax = plt.subplots(figsize=(11, 4))
    for i in range(len(samples[0].rss)):
        ax.plot([s.t for s in samples], [s.rss[i] / MiB for s in samples], label=f"etcd {i}")
    shown: set[str] = set()
    for s in samples:
        if s.phase not in shown:
            shown.add(s.phase)
            ax.axvline(s.t, color="grey", linestyle=":", linewidth=1)
            ax.text(s.t, 0.98, f" {s.phase}", fontsize=8, rotation=90, va="top",
                    transform=ax.get_xaxis_transform())
    ax.set_xlabel("seconds since etcd started")
    ax.set_ylabel("RSS (MiB)")
    ax.set_title("etcd members' RSS through the cluster benchmark")
    ax.legend(loc="lower right")
    fig.tight_layout()
    results.RESULTS.mkdir(parents=True, exist_ok=True)
    fig.savefig(results.RESULTS / "cluster-etcd-rss.png", dpi=90)
    plt.close(fig)


def main() -> None:
    res = Results(load_at_start=os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="bench-cluster-",
                                     dir=os.environ.get("BENCH_DIR")) as t:
        print("single node (LocalLog):", flush=True)
        asyncio.run(run_single(Path(t), res))
        print("cluster (3 etcd members, 3 broker nodes):", flush=True)
        asyncio.run(run_cluster(Path(t), res))
    rows, notes = rows_and_notes(res)
    plot_rss(res.samples)
    report("cluster", "Cluster on etcd (3 etcd members + 3 brokers on one machine)", rows,
           command_line(), notes=notes)


if __name__ == "__main__":
    main()
