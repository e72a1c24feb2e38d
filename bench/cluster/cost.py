"""What a cluster costs beside one node, in interleaved rounds: the figures a cluster that
costs per machine what one node costs is judged by.

One broker (``--fsync always``, LocalLog) and a cluster (3 etcd members with the README's
settings + 3 brokers, ``--fsync always``) run at once on this machine; each round measures
the single node, then the cluster, so both see the same machine. Figures (medians over the
rounds):

1. batch publish throughput (1000 × 100 B requests, 4 senders; the cluster's spread over its
   nodes) and the CPU per message: the single broker's, and all brokers' + etcd's;
2. single publishes at 1,000 msg/s (open loop, round-robin over the nodes): p50 and p99, and
   the CPU of brokers + etcd in cores;
3. broker CPU per applied etcd revision: all brokers' CPU over the latency run divided by the
   revisions each applied (every revision is applied by every node), beside what the nodes'
   diagnostics say their writer threads spent (``apply_cpu_us_per_revision``);
4. a holder's CPU per applied revision: the same 1,000 msg/s all sent to node 0, so nodes 1
   and 2 only apply; their CPU per revision split by thread (the event loop: the watch and
   the answers; the writer thread: the apply; grpc's threads) from /proc, and in the last
   round the frames with the most self time on a holder and on the receiving node (py-spy,
   when installed).

``BENCH_ROUNDS`` (default 3), ``BENCH_SECONDS`` (5) and ``BENCH_LATENCY_COUNT`` (5000) size it.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.cluster.load import Node, start_nodes
from bench.harness.etcd_members import etcd_cluster
from bench.harness.figures import Row, percentile
from bench.harness.flames import py_spy, record, table
from bench.harness.procs import broker
from bench.harness.publish_load import latencies, throughput, with_cpu
from bench.harness.results import add_to_json, command_line, report
from bench.harness.sampling import thread_cpu

RATE = 1000


@dataclass
class Round:
    """One round's figures."""

    single_rate: float = 0.0
    single_cpu_us: float = 0.0  # per message, the single broker
    cluster_rate: float = 0.0
    cluster_cpu_us: float = 0.0  # per message, brokers + etcd
    single_p50: float = 0.0
    single_p99: float = 0.0
    cluster_p50: float = 0.0
    cluster_p99: float = 0.0
    cluster_cores: float = 0.0  # brokers + etcd during the latency run
    revision_us: float = 0.0  # brokers' CPU per applied revision per node
    apply_us: float = 0.0  # the nodes' own apply_cpu_us_per_revision (median)
    per_apply: float = 0.0  # the nodes' revisions_per_apply (median)
    holder: dict[str, float] = field(default_factory=dict)  # µs per revision, by thread
    receiver_us: float = 0.0  # the receiving node's CPU per request in the holder phase
    holder_messages: float = 0.0  # messages per revision in the holder phase
    shares: dict[str, float] = field(default_factory=dict)


async def _revisions(session: aiohttp.ClientSession, urls: list[str]) -> list[int]:
    out = []
    for url in urls:
        async with session.get(f"{url}/messaging/diagnostics") as resp:
            out.append(int((await resp.json())["applied_revision"]))
    return out


async def _apply_cost(session: aiohttp.ClientSession, urls: list[str],
                      window: int) -> tuple[float, float]:
    """The nodes' own apply_cpu_us_per_revision and revisions_per_apply over ``window``
    seconds (medians over the nodes)."""
    costs, batches = [], []
    for url in urls:
        async with session.get(f"{url}/messaging/diagnostics",
                               params={"window": str(window)}) as resp:
            body = await resp.json()
        if body.get("apply_cpu_us_per_revision") is not None:
            costs.append(float(body["apply_cpu_us_per_revision"]))
        if body.get("revisions_per_apply") is not None:
            batches.append(float(body["revisions_per_apply"]))
    return (statistics.median(costs) if costs else 0.0,
            statistics.median(batches) if batches else 0.0)


def _by_thread(pid: int, before: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds of ``pid``'s threads since ``before``, by role: the event loop (the main
    thread), the writer thread, grpc's threads and the rest."""
    roles: dict[str, float] = {"loop": 0.0, "writer": 0.0, "grpc": 0.0, "other": 0.0}
    for tid, (name, seconds) in thread_cpu(pid).items():
        spent = seconds - before.get(tid, (name, 0.0))[1]
        role = ("loop" if tid == pid else "writer" if name.startswith("messaging-write")
                else "grpc" if name.startswith(("event_engine", "grpc")) else "other")
        roles[role] += spent
    return roles


async def holder_phase(session: aiohttp.ClientSession, urls: list[str], pids: list[int],
                       count: int, r: Round, profile: Path | None) -> None:
    """1,000 msg/s to node 0 only: what the other nodes spend per revision they apply."""
    before = {pid: thread_cpu(pid) for pid in pids}
    revisions = await _revisions(session, urls)
    spies = ([record(pids[1], count / RATE, profile / "holder.txt"),
              record(pids[0], count / RATE, profile / "receiver.txt")] if profile else [])
    await latencies(session, urls[:1], 2, RATE, count)
    applied = [a - b for a, b in zip(await _revisions(session, urls), revisions, strict=True)]
    for spy in spies:
        await asyncio.to_thread(spy.wait, 60)
    holders = [_by_thread(pid, before[pid]) for pid in pids[1:]]
    r.holder = {role: statistics.median(h[role] * 1e6 / n for h, n in
                                        zip(holders, applied[1:], strict=True) if n)
                for role in holders[0]}
    r.holder["total"] = sum(r.holder.values())
    r.receiver_us = sum(_by_thread(pids[0], before[pids[0]]).values()) * 1e6 / (count + 50)
    r.holder_messages = (count + 50) / applied[1] if applied[1] else 0.0


async def one_round(session: aiohttp.ClientSession, single: str, single_pid: int,
                    urls: list[str], groups: dict[str, Any], seconds: float,
                    count: int) -> Round:
    r = Round()
    rate, cpu = await with_cpu({"broker": lambda: [single_pid]},
                               throughput(session, [single], 1, seconds))
    r.single_rate = rate
    r.single_cpu_us = cpu.shares["broker"] * 1e6 / rate if rate else 0.0
    rate, cpu = await with_cpu(groups, throughput(session, urls, 1, seconds))
    r.cluster_rate = rate
    r.cluster_cpu_us = ((cpu.shares["brokers"] + cpu.shares["etcd"]) * 1e6 / rate
                        if rate else 0.0)
    r.shares = dict(cpu.shares)
    lat = await latencies(session, [single], 2, RATE, count)
    r.single_p50, r.single_p99 = percentile(lat, 50) * 1e3, percentile(lat, 99) * 1e3
    before = await _revisions(session, urls)
    lat, cpu = await with_cpu(groups, latencies(session, urls, 2, RATE, count))
    after = await _revisions(session, urls)
    r.cluster_p50, r.cluster_p99 = percentile(lat, 50) * 1e3, percentile(lat, 99) * 1e3
    r.cluster_cores = cpu.shares["brokers"] + cpu.shares["etcd"]
    wall = count / RATE
    applied = sum(a - b for a, b in zip(after, before, strict=True))
    r.revision_us = cpu.shares["brokers"] * wall * 1e6 / applied if applied else 0.0
    r.apply_us, r.per_apply = await _apply_cost(session, urls, int(wall) + 2)
    return r


async def run(tmp: Path, rounds: int, seconds: float, count: int) -> list[Round]:
    single_proc, single = broker(tmp / "single", log=tmp / "single.log")
    members = etcd_cluster(tmp, snapshot_count=2000)
    nodes: list[Node] = []
    try:
        for member in members:
            member.start()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            urls = await start_nodes(session, tmp, members, nodes, "cost")
            groups = {"brokers": lambda: [n.proc.pid if n.proc else None for n in nodes],
                      "etcd": lambda: [m.pid for m in members]}
            await latencies(session, urls, 2, 200, 200)  # warm-up
            pids = [n.proc.pid for n in nodes if n.proc is not None]
            out = []
            for k in range(rounds):
                r = await one_round(session, single, single_proc.pid, urls, groups,
                                    seconds, count)
                last = k == rounds - 1 and py_spy() is not None
                await holder_phase(session, urls, pids, count, r, tmp if last else None)
                out.append(r)
                print(f"  round {k + 1}: batch single {r.single_rate:,.0f} msg/s "
                      f"({r.single_cpu_us:.2f} µs/msg), cluster {r.cluster_rate:,.0f} msg/s "
                      f"({r.cluster_cpu_us:.2f} µs/msg); 1,000/s single p50 "
                      f"{r.single_p50:.2f} ms, cluster p50 {r.cluster_p50:.2f} ms p99 "
                      f"{r.cluster_p99:.1f} ms, {r.cluster_cores:.2f} cores; broker CPU "
                      f"per revision {r.revision_us:.0f} µs (apply {r.apply_us:.0f} µs); a "
                      f"holder per revision {r.holder['total']:.0f} µs "
                      f"({', '.join(f'{k} {v:.0f}' for k, v in r.holder.items() if k != 'total')}"
                      f"), {r.holder_messages:.1f} msg/revision", flush=True)
            return out
    finally:
        for node in nodes:
            if node.proc is not None:
                node.proc.stop()
        for member in members:
            member.stop()
        single_proc.stop()


def rows(out: list[Round]) -> list[Row]:
    def med(name: str) -> float:
        return float(statistics.median(float(getattr(r, name)) for r in out))

    n = len(out)
    single_rate, cluster_rate = med("single_rate"), med("cluster_rate")
    single_us, cluster_us = med("single_cpu_us"), med("cluster_cpu_us")
    p50, p99, cores = med("cluster_p50"), med("cluster_p99"), med("cluster_cores")
    revision = med("revision_us")
    holder = float(statistics.median(r.holder["total"] for r in out))
    return [
        Row(f"batch publish 1000 × 100 B, 4 senders, median of {n} interleaved rounds",
            cluster_rate, "msg/s", "single node", single_rate, "≥ 0.33× single",
            cluster_rate >= 0.33 * single_rate),
        Row("batch CPU per message, all brokers + etcd", cluster_us, "µs", "single node",
            single_us, "≤ 3× single", cluster_us <= 3 * single_us),
        Row("single publishes at 1,000 msg/s over 3 nodes: p50", p50, "ms", "single node",
            med("single_p50"), "≤ 5 ms", p50 <= 5),
        Row("single publishes at 1,000 msg/s over 3 nodes: p99", p99, "ms", "single node",
            med("single_p99"), "≤ 50 ms", p99 <= 50),
        Row("CPU at 1,000 msg/s, brokers + etcd", cores, "cores", "", None, "≤ 0.8 cores",
            cores <= 0.8),
        Row("broker CPU per applied revision (whole process)", revision, "µs",
            "the writer thread's apply alone", med("apply_us"), "≤ 200 µs", revision <= 200),
        Row("a holder's CPU per applied revision (node 0 takes every request)", holder, "µs",
            "the same node's writer thread", float(statistics.median(
                r.holder["writer"] for r in out)), "-", None),
    ]


def main() -> None:
    rounds = int(os.environ.get("BENCH_ROUNDS", "3"))
    seconds = float(os.environ.get("BENCH_SECONDS", "5"))
    count = int(os.environ.get("BENCH_LATENCY_COUNT", "5000"))
    with tempfile.TemporaryDirectory(prefix="bench-cost-",
                                     dir=os.environ.get("BENCH_DIR")) as t:
        out = asyncio.run(run(Path(t), rounds, seconds, count))
        flames = [table(Path(t) / f"{name}.txt", title) for name, title in (
            ("holder", "A holder (node 1) in the last round's holder phase"),
            ("receiver", "The receiving node (node 0) in the same phase"))
            if (Path(t) / f"{name}.txt").exists()]
    holder = {role: statistics.median(r.holder[role] for r in out) for role in out[0].holder}
    notes = ("Every process shares this machine's 2 cores and one disk; each round measures "
             "the single node and then the cluster while the other idles. Rounds: "
             + "; ".join(f"single {r.single_rate:,.0f} / cluster {r.cluster_rate:,.0f} msg/s, "
                         f"p50 {r.cluster_p50:.2f} ms, {r.revision_us:.0f} µs/revision"
                         for r in out) + ".\n\n"
             "**Where a revision's CPU goes on a node that only applies** (1,000 single "
             "publishes/s all sent to node 0; nodes 1 and 2 apply every revision and take no "
             f"request; {statistics.median(r.holder_messages for r in out):.1f} messages per "
             "revision; medians over rounds and the two holders, from /proc per thread): "
             + ", ".join(f"{role} {us:.0f} µs" for role, us in holder.items())
             + " per revision (loop: the watch's grpc reads, the hand-off and the answers; "
             "writer: decoding and applying; grpc: its own threads). The receiving node spent "
             f"{statistics.median(r.receiver_us for r in out):.0f} µs per request (HTTP, the "
             "put to etcd, its own apply and answer). In the latency run (requests over the "
             "three nodes) a node's writer applied "
             f"{statistics.median(r.per_apply for r in out):.2f} revisions per wake-up "
             "(other nodes' revisions that stream in wait up to --cluster-apply-linger, 20ms, "
             "to be applied together; its own at once)." + "".join(f"\n\n{f}" for f in flames))
    report("cluster-cost", "Cluster cost beside one node (interleaved rounds)", rows(out),
           command_line(), notes=notes)
    add_to_json("cluster-cost", {"rounds": [r.__dict__ for r in out]})


if __name__ == "__main__":
    main()
