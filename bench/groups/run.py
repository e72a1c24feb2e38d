"""Topic-groups benchmark: 4 broker nodes on a 3-member etcd cluster with G = 1, 2, 4, 8 groups
held by R = 2 nodes each, then G = 8 with half the groups on a second etcd cluster.

Every broker node and every etcd member runs in a network namespace of its own, joined to the
others and to the host by veths and a bridge (:mod:`bench.groups.netns`); the load generator
(this process) runs on the host. For each configuration a new etcd cluster (or two) and four
new broker nodes are started, the group placement settles, a warm-up load runs, and then the
measured load (:mod:`bench.groups.load`): messages/s, the CPU of every process per published
message, and the messages each node applied (exact: each held group's counter, read while
the cluster is quiet before and after). Everything started is stopped by its PID and every
namespace removed at the end, on errors too.

``--quick`` (or BENCH_SECONDS / BENCH_WARMUP) shortens the runs; ``--only g1,g8`` picks
configurations (g1, g2, g4, g8, g8x2).
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.groups.cluster import (
    BrokerNode,
    Config,
    NsEtcd,
    endpoints,
    etcd_members,
    group_totals,
    log_errors,
    network_machines,
    quiet_counts,
    settled,
    start_etcd,
    stop_all,
)
from bench.groups.load import balanced_topics, batch_bodies, run_load, with_cpu
from bench.groups.model import Measured, Setup, print_row, table_header, write_results
from bench.groups.netns import Machine, Network, rtt_note
from bench.harness import settings
from bench.harness.results import results_under

NODES = 4
REPLICAS = 2
CONFIGS = [Config(1, REPLICAS), Config(2, REPLICAS), Config(4, REPLICAS), Config(8, REPLICAS),
           Config(8, REPLICAS, second_etcd=(1, 3, 5, 7))]


@dataclass
class Settings(settings.Settings):
    """Seconds of measured load per configuration, and of warm-up before it."""

    seconds: float = 25.0
    warmup: float = 5.0


async def run_config(tmp: Path, machines: dict[str, list[Machine]], config: Config,
                     s: Settings, setup: Setup, started: list[BrokerNode | NsEtcd]) -> Measured:
    """Start one configuration, load it, measure it, stop it."""
    here = tmp / config.name
    here.mkdir()
    first = etcd_members(here, machines["etcd0"], "a")
    second = etcd_members(here, machines["etcd1"], "b") if config.second_etcd else []
    members = first + second
    nodes = [BrokerNode(m, here / f"node{i}", here / f"node{i}.log")
             for i, m in enumerate(machines["brokers"])]
    urls = [n.url for n in nodes]
    started.extend(members)
    started.extend(nodes)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        try:
            await start_etcd(session, first)
            if second:
                await start_etcd(session, second)
            await asyncio.gather(*(asyncio.to_thread(
                n.start, config.args(endpoints(first, i % len(first)), second))
                for i, n in enumerate(nodes)))
            placed = await settled(session, urls, config)
            if not setup.rtt:
                setup.rtt = await asyncio.to_thread(rtt_note, setup.net, nodes[0].machine,
                                                    nodes[1].machine, 8080)
                print(f"  {setup.rtt}", flush=True)
            held = ", ".join(f"node{i} {sorted(placed.held[u])}" for i, u in enumerate(urls))
            print(f"  {config.label}: placement settled, groups held: {held}", flush=True)
            warm = await run_load(session, urls, setup.topics, setup.bodies, s.warmup)
            if warm.errors:
                print(f"  warm-up errors: {dict(warm.errors)}", flush=True)
            placed0, before = await quiet_counts(session, urls, config)

            def pids() -> dict[str, int | None]:
                named: dict[str, int | None] = {f"node{i}": n.pid for i, n in enumerate(nodes)}
                named.update({f"etcd-{m.name}": m.pid for m in members})
                return named

            tally, cpu = await with_cpu(pids, asyncio.ensure_future(
                run_load(session, urls, setup.topics, setup.bodies, s.seconds)))
            placed1, after = await quiet_counts(session, urls, config)
        finally:
            await stop_all(nodes, members)
    moved = placed0.held != placed1.held
    applied = {u: sum(after[u][g] - before[u].get(g, 0) for g in after[u]) for u in urls}
    totals0, totals1 = group_totals(before), group_totals(after)
    per_group = {g: totals1[g] - totals0.get(g, 0) for g in totals1}
    logs = log_errors([n.log for n in nodes] + [m.data.with_suffix(".log") for m in members])
    return Measured(config=config, nodes=urls, tally=tally, cpu=cpu, applied=applied,
                    per_group=per_group, held=placed1.held, holders=placed1.holders,
                    placement_moved=moved, log_errors=logs)


async def run_all(tmp: Path, s: Settings, configs: list[Config], setup: Setup,
                  started: list[BrokerNode | NsEtcd]) -> list[Measured]:
    """Every configuration in turn; the table printed as it goes."""
    machines = network_machines(setup.net, NODES, 2 if any(c.second_etcd for c in configs)
                                else 1)
    print(f"  machines: {len(setup.net.machines)} namespaces on {setup.net.switch}'s bridge "
          f"({setup.net.delay_note})", flush=True)
    results: list[Measured] = []
    print(table_header(), flush=True)
    for config in configs:
        t0 = time.perf_counter()
        m = await run_config(tmp, machines, config, s, setup, started)
        m.wall = time.perf_counter() - t0
        results.append(m)
        print_row(m, results[0] if results[0].config.groups == 1 else None)
        for line in m.log_errors:
            print(f"    {line}", flush=True)
    return results


def main() -> None:
    p = settings.parser(__doc__, "4 s of load after 2 s of warm-up per configuration",
                        rounds=False)
    p.add_argument("--only", default="", help="configurations: g1,g2,g4,g8,g8x2")
    args = p.parse_args()
    s = Settings(seconds=float(os.environ.get("BENCH_SECONDS", "4" if args.quick else "25")),
                 warmup=float(os.environ.get("BENCH_WARMUP", "2" if args.quick else "5")))
    names = [c.name for c in CONFIGS]
    chosen = settings.only(p, args.only, names, "configuration") if args.only else names
    configs = [c for c in CONFIGS if c.name in chosen]
    if os.geteuid() != 0:
        sys.exit("bench-groups makes network namespaces: run it as root")
    results_under(args.out, quick=args.quick, bench="groups")

    def terminate(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(f"signal {signum}: stopping everything this benchmark started")

    signal.signal(signal.SIGTERM, terminate)
    topics = balanced_topics()
    print(f"topic groups: {NODES} broker nodes, R = {REPLICAS}, {len(topics)} topics; "
          f"{s.warmup:.0f} s warm-up + {s.seconds:.0f} s measured per configuration",
          flush=True)
    load_at_start = os.getloadavg()
    net = Network()
    started: list[BrokerNode | NsEtcd] = []
    began = time.perf_counter()
    try:
        net.open()
        setup = Setup(net=net, topics=topics, bodies=batch_bodies(topics))
        with tempfile.TemporaryDirectory(prefix="bench-groups-",
                                         dir=os.environ.get("BENCH_DIR")) as t:
            results = asyncio.run(run_all(Path(t), s, configs, setup, started))
    finally:
        for proc in started:  # whatever the configuration's own cleanup did not stop
            proc.stop()
        net.close()
    took = time.perf_counter() - began
    print(f"\nthe benchmark took {took / 60:.1f} minutes; load average at start "
          f"{', '.join(f'{x:.2f}' for x in load_at_start)}", flush=True)
    write_results(results, setup, s.seconds, s.warmup, load_at_start, took,
                  statistics.median([m.tally.rate for m in results]))


if __name__ == "__main__":
    main()
