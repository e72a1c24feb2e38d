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
from collections.abc import Callable
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.cluster.load import (
    Node,
    Sampler,
    Settings,
    converged,
    failover_round,
    start_nodes,
)
from bench.cluster.report import (
    SWEEP_RATES,
    MiB,
    Results,
    SweepPoint,
    budget_table,
    plot_rss,
    publish_budget,
    rows_and_notes,
)
from bench.harness.etcd_members import etcd_cluster, etcd_healthy
from bench.harness.figures import percentile
from bench.harness.loops import bounded_wait
from bench.harness.procs import broker
from bench.harness.publish_load import (
    elapsed_since,
    json_event,
    latencies,
    throughput,
    with_cpu,
)
from bench.harness.results import command_line, report


async def run_single(tmp: Path, res: Results, s: Settings) -> None:
    proc, url = broker(tmp / "single", log=tmp / "single.log")
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            rates = []
            for i in range(s.rounds):
                rate, cpu = await with_cpu({"broker": lambda: [proc.pid]},
                                           throughput(session, [url], 1, s.seconds))
                rates.append(rate)
                res.single_cpu = cpu if i == s.rounds // 2 else res.single_cpu
                print(f"  single node batch publish: {rate:,.0f} msg/s ({cpu.text()})",
                      flush=True)
            res.single_rate = statistics.median(rates)
            res.single_json_rate = statistics.median(
                [await throughput(session, [url], 1, s.seconds, json_event)
                 for _ in range(s.rounds)])
            print(f"  single node batch publish of JSON events: {res.single_json_rate:,.0f} "
                  "msg/s", flush=True)
            res.single_lat = await latencies(session, [url], 2)
            print(f"  single node latency p50 {percentile(res.single_lat, 50) * 1000:.2f} ms "
                  f"p99 {percentile(res.single_lat, 99) * 1000:.2f} ms", flush=True)
    finally:
        proc.stop()


async def run_cluster(tmp: Path, res: Results, s: Settings) -> None:
    members = etcd_cluster(tmp, snapshot_count=s.snapshot_count)
    nodes: list[Node] = []
    try:
        for member in members:
            member.start()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            await bounded_wait(lambda: etcd_healthy(session, members), 60, "etcd healthy", 0.2)
            sampler = Sampler(session, members)
            sampler.start()
            urls = await start_nodes(session, tmp, members, nodes, "bench")
            groups: dict[str, Callable[[], list[int | None]]] = {
                "brokers": lambda: [n.proc.pid if n.proc else None for n in nodes],
                "etcd": lambda: [m.pid for m in members]}

            sampler.phase = "throughput"
            for i in range(s.rounds):
                rate, cpu = await with_cpu(groups, throughput(session, urls, 1, s.seconds))
                res.cluster_rates.append(rate)
                res.cluster_cpu = cpu if i == s.rounds // 2 else res.cluster_cpu
                print(f"  cluster batch publish: {rate:,.0f} msg/s ({cpu.text()})", flush=True)
            res.cluster_rate = statistics.median(res.cluster_rates)
            json_rates = []
            for _ in range(s.rounds):
                rate, cpu = await with_cpu(groups, throughput(session, urls, 1, s.seconds,
                                                              json_event))
                json_rates.append(rate)
                print(f"  cluster batch publish of JSON events: {rate:,.0f} msg/s "
                      f"({cpu.text()})", flush=True)
            res.cluster_json_rate = statistics.median(json_rates)

            sampler.phase = "latency"
            started = time.perf_counter()
            res.cluster_lat, res.cluster_lat_cpu = await with_cpu(
                groups, latencies(session, urls, 2))
            window = int(elapsed_since(started)) + 1
            print(f"  cluster latency p50 {percentile(res.cluster_lat, 50) * 1000:.2f} ms "
                  f"p99 {percentile(res.cluster_lat, 99) * 1000:.2f} ms "
                  f"({res.cluster_lat_cpu.text()})", flush=True)
            res.budgets = [await publish_budget(session, url, window) for url in urls]
            print(budget_table(res.budgets, res.cluster_lat, res.cluster_lat_cpu), flush=True)
            for rate in SWEEP_RATES:  # where latency starts to climb
                await asyncio.sleep(2.0)  # the budget's window must not reach the run before
                started = time.perf_counter()
                lat, use = await with_cpu(groups, latencies(session, urls, 2, rate, 2 * rate))
                window = int(elapsed_since(started)) + 1
                budgets = [await publish_budget(session, url, window) for url in urls]
                res.sweep.append(SweepPoint(rate, lat, budgets, use))
                print(f"  at {rate} msg/s: {res.sweep[-1].text()}", flush=True)

            sampler.phase = "sustained"
            first = await sampler.sample()
            res.sustain_from = len(sampler.samples) - 1
            started = time.perf_counter()
            messages = 0.0
            for _ in range(int(s.sustain_seconds / s.seconds) + 1):
                if elapsed_since(started) >= s.sustain_seconds:
                    break
                now = await sampler.sample()
                if now.raft_index - first.raft_index >= s.sustain_entries:
                    break
                rate, use = await with_cpu(groups, throughput(session, urls, 1, s.seconds))
                res.chunks.append((rate, use))
                messages += rate * s.seconds
                big = max(now.rss) / MiB
                print(f"  sustained: {elapsed_since(started):.0f} s, raft index "
                      f"{now.raft_index}, largest etcd RSS {big:,.0f} MiB, {rate:,.0f} msg/s "
                      f"({use.text()})", flush=True)
            res.sustained_seconds = elapsed_since(started)
            res.sustained_rate = messages / res.sustained_seconds
            await sampler.sample()

            sampler.phase = "failover"
            for r in range(s.failovers):
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


def main() -> None:
    s = Settings.from_env()
    res = Results(load_at_start=os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="bench-cluster-",
                                     dir=os.environ.get("BENCH_DIR")) as t:
        print("single node (LocalLog):", flush=True)
        asyncio.run(run_single(Path(t), res, s))
        print("cluster (3 etcd members, 3 broker nodes):", flush=True)
        asyncio.run(run_cluster(Path(t), res, s))
    rows, notes = rows_and_notes(res, s)
    plot_rss(res.samples)
    report("cluster", "Cluster on etcd (3 etcd members + 3 brokers on one machine)", rows,
           command_line(), notes=notes)


if __name__ == "__main__":
    main()
