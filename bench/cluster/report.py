"""The cluster benchmark's figures and report: what a run found (:class:`Results`), the
table rows and notes, etcd's RSS growth per Raft entry and its plot."""

from __future__ import annotations

import os
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bench.cluster.load import Failover, Sample, Settings
from bench.harness import results
from bench.harness.figures import Row, percentile
from bench.harness.plots import plt
from bench.harness.publish_load import LATENCY_COUNT, LATENCY_RATE, CpuUse
from messaging.log.etcd.budget import PHASES
from messaging.log.etcd.writer import MAX_PUTS_IN_FLIGHT

MiB = 2**20


#: Single-publish rates (msg/s) measured besides LATENCY_RATE, to see where latency climbs.
SWEEP_RATES = (100, 300)


@dataclass
class SweepPoint:
    """Single publishes at one rate: what the client saw, the nodes' budgets, the CPU."""

    rate: int
    latencies: list[float]
    budgets: list[dict[str, Any]]
    cpu: CpuUse

    def text(self) -> str:
        def node(phase: str) -> float:
            figures = [b[phase]["p50_ms"] for b in self.budgets if phase in b]
            return statistics.median(figures) if figures else float("nan")

        shares = self.cpu.shares
        return (f"client p50 {percentile(self.latencies, 50) * 1000:.2f} ms, p99 "
                f"{percentile(self.latencies, 99) * 1000:.2f} ms; in the nodes p50 "
                f"{node('total'):.2f} ms (etcd put {node('put'):.2f} ms, queued "
                f"{node('queued'):.2f} ms, apply {node('apply'):.2f} ms); brokers "
                f"{shares.get('brokers', 0):.2f} + etcd {shares.get('etcd', 0):.2f} cores")


@dataclass
class Results:
    """What one run found, phase by phase: single node, cluster, sustained load, failover."""

    single_rate: float = 0.0
    single_json_rate: float = 0.0
    cluster_json_rate: float = 0.0
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
    budgets: list[dict[str, Any]] = field(default_factory=list)  # per node, latency run
    sweep: list[SweepPoint] = field(default_factory=list)


async def publish_budget(session: aiohttp.ClientSession, url: str,
                         window: int) -> dict[str, Any]:
    """A node's publish budget over the last ``window`` seconds (its diagnostics)."""
    async with session.get(f"{url}/messaging/diagnostics", params={"window": str(window)}) as r:
        report: dict[str, Any] = (await r.json())["publish_budget"]
        return report


def budget_table(budgets: list[dict[str, Any]], client: list[float], cpu: CpuUse | None,
                 ) -> str:
    """Where the latency run's publishes spent their time, inside the nodes (the median over
    the nodes of each phase's percentile) beside what the client saw; and the CPU each
    process group used per published message."""
    lines = ["| phase | p50 ms | p90 ms | p99 ms |", "|---|---|---|---|"]
    for phase in PHASES:
        figures = [b[phase] for b in budgets if phase in b]
        if figures:
            cells = [f"{statistics.median(f[f'p{p}_ms'] for f in figures):.2f}"
                     for p in (50, 90, 99)]
            lines.append(f"| {phase} | {' | '.join(cells)} |")
    if client:
        lines.append("| client: request sent → answer read | "
                     + " | ".join(f"{percentile(client, p) * 1000:.2f}" for p in (50, 90, 99))
                     + " |")
    if cpu is not None:
        lines.append("")
        lines.append("CPU per published message at 1,000 msg/s: " + ", ".join(
            f"{name} {cores / LATENCY_RATE * 1e6:,.0f} µs" for name, cores in cpu.shares.items()))
    return "\n".join(lines)


def rows_and_notes(res: Results, s: Settings) -> tuple[list[Row], str]:
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
    target_rate = res.cluster_rate >= 0.5 * res.single_rate
    lat_cpu = res.cluster_lat_cpu
    cluster_cores = (lat_cpu.shares.get("brokers", 0.0) + lat_cpu.shares.get("etcd", 0.0)
                     if lat_cpu is not None else 0.0)
    rows = [
        Row(f"batch publish 1000 × 100 B random, 4 senders over 3 nodes, median of "
            f"{s.rounds} × {s.seconds:.0f} s",
            res.cluster_rate, "msg/s", "single node", res.single_rate,
            "≥ 0.5× single", target_rate),
        Row(f"batch publish 1000 JSON events (~70 B, compressible), 4 senders over 3 nodes, "
            f"median of {s.rounds} × {s.seconds:.0f} s", res.cluster_json_rate, "msg/s",
            "single node", res.single_json_rate, "≥ 0.5× single",
            res.cluster_json_rate >= 0.5 * res.single_json_rate),
        Row(f"batch publish sustained {res.sustained_seconds:.0f} s ({entries:,} etcd entries)",
            res.sustained_rate, "msg/s", "single node", res.single_rate),
        Row("single publish latency p50 at 1,000 msg/s", c50, "ms", "single node", single50,
            "≤ 5 ms", c50 <= 5),
        Row("single publish latency p99 at 1,000 msg/s", c99, "ms", "single node", single99,
            "≤ 50 ms", c99 <= 50),
        Row("CPU of the whole cluster (brokers + etcd) at 1,000 single publishes/s",
            cluster_cores, "cores", "", None, "≤ 0.8 cores", cluster_cores <= 0.8),
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
        f"(`--snapshot-count {s.snapshot_count}`, a WAL fsync per commit), 3 broker nodes "
        "(`--fsync always`, one Python event loop each, each talking to a different etcd "
        "member first) and the load generator (this Python process). The single node "
        "(`messaging broker` without `--etcd`, `--fsync always`) is measured first, alone with "
        "the load generator. Messages are 100 random bytes (incompressible: log entries are "
        "compressed) unless said otherwise. Batch bodies are framed once, so the load "
        "generator mostly does HTTP. CPU in cores during the middle batch run — single node: "
        f"{cpu(res.single_cpu)}; cluster: {cpu(res.cluster_cpu)}. A single broker is bound "
        "by its one event loop (a core); the cluster's batch figures are bound by the "
        "machine: every message is applied by 3 brokers and passes through 3 etcd members "
        "on the same 2 cores. During the cluster latency run (1,000 msg/s): "
        f"{cpu(res.cluster_lat_cpu)}; every node applies (and fsyncs) every revision, "
        "however small. The failover rounds run a light load (300 publishes/s).\n\n"
        f"Cluster batch runs: {', '.join(f'{r:,.0f}' for r in res.cluster_rates)} msg/s; "
        f"the sustained load's {len(res.chunks)} runs of {s.seconds:.0f} s ranged "
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
        "Where a single publish's time goes during the latency run (each node's "
        "`GET /messaging/diagnostics?window=S` publish budget, median over the nodes; see "
        "`messaging/log/etcd/budget.py` for the phases):\n\n"
        + budget_table(res.budgets, res.cluster_lat, res.cluster_lat_cpu) + "\n\n"
        "The same at lower rates: "
        + "; ".join(f"at {p.rate} msg/s {p.text()}" for p in res.sweep) + ".\n\n"
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
