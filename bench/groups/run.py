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

Last, G = 8 once more with the load generator sending each request to a holder of its topic's
group (as the Python client does once it has the group map) instead of to any node: what
forwarding costs.

``--quick`` (or BENCH_SECONDS / BENCH_WARMUP) shortens the runs; ``--only g1,g8`` picks
configurations (g1, g2, g4, g8, g8x2, g8h).
"""

from __future__ import annotations

import asyncio
import copy
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.groups.cluster import (
    BROKER_PORT,
    BrokerNode,
    Config,
    NsEtcd,
    difference,
    endpoints,
    etcd_members,
    etcd_revision,
    log_errors,
    network_machines,
    quiet_counts,
    settled,
    start_etcd,
    stop_all,
)
from bench.groups.load import (
    balanced_topics,
    batch_bodies,
    run_load,
    wait_for_quiet,
    with_cpu,
)
from bench.groups.model import Context, Measured, print_row, table_header, write_results
from bench.groups.netns import Machine, Network, rtt_note
from bench.harness import settings
from bench.harness.results import results_under, source_state
from messaging.placement import group_of_topic

NODES = 4
REPLICAS = 2
CONFIGS = [Config(1, REPLICAS), Config(2, REPLICAS), Config(4, REPLICAS), Config(8, REPLICAS),
           Config(8, REPLICAS, second_etcd=(1, 3, 5, 7)), Config(8, REPLICAS, to_holders=True)]
#: Seconds the whole run may spend, on this shared machine, waiting for other work to calm
#: down before a round (at most QUIET_WAIT each time) and running again a round during which
#: other work kept more than NOISY cores busy (at most MAX_ATTEMPTS runs of a round); past it
#: every round is kept as it came.
EXTRA_BUDGET = 180.0
QUIET_WAIT = 60.0
NOISY = 0.2
MAX_ATTEMPTS = 3
#: Seconds the CPU of the settled, idle cluster is measured (the cost of groups without load).
IDLE_SECONDS = 3.0


@dataclass
class Setup:
    """What every configuration shares: the machines' network, the topics, the bodies."""

    net: Network
    topics: list[int]
    bodies: list[dict[int, list[bytes]]]
    rtt: str = ""
    #: Rounds run again because other work on the machine was busy during them.
    discarded: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Settings(settings.Settings):
    """Rounds of each configuration, seconds of measured load in each, and of warm-up before
    it."""

    rounds: int = 2
    seconds: float = 20.0
    warmup: float = 5.0


async def run_config(tmp: Path, machines: dict[str, list[Machine]], config: Config,
                     s: Settings, setup: Setup, started: list[BrokerNode | NsEtcd],
                     round_: int) -> Measured:
    """Start one configuration, load it, measure it, stop it."""
    here = tmp / f"{config.name}-{round_}"
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
            route = ({t: placed.holders[group_of_topic(t, config.groups)] for t in setup.topics}
                     if config.to_holders else None)
            if not setup.rtt:
                setup.rtt = await asyncio.to_thread(rtt_note, setup.net, nodes[0].machine,
                                                    nodes[1].machine, BROKER_PORT)
                print(f"  {setup.rtt}", flush=True)

            def pids() -> dict[str, int | None]:
                named: dict[str, int | None] = {f"node{i}": n.pid for i, n in enumerate(nodes)}
                named.update({f"etcd-{m.name}": m.pid for m in members})
                return named

            _, idle = await with_cpu(pids, asyncio.sleep(IDLE_SECONDS))
            warm = await run_load(session, urls, setup.topics, setup.bodies, s.warmup, route)
            if warm.errors:
                print(f"  {config.label}: warm-up errors {dict(warm.errors)}", flush=True)
            placed0, before = await quiet_counts(session, urls, config)
            revisions = {"a": await etcd_revision(session, first)}
            if second:
                revisions["b"] = await etcd_revision(session, second)
            tally, cpu = await with_cpu(pids, run_load(session, urls, setup.topics,
                                                       setup.bodies, s.seconds, route))
            writes = {"a": await etcd_revision(session, first) - revisions["a"]}
            if second:
                writes["b"] = await etcd_revision(session, second) - revisions["b"]
            placed1, after = await quiet_counts(session, urls, config)
            logs = log_errors([n.log for n in nodes] + [m.data.with_suffix(".log")
                                                          for m in members])
        finally:
            await stop_all(nodes, members)
    return Measured(config=config, nodes=urls, tally=tally, cpu=cpu,
                    applied_groups=difference(before.applied, after.applied),
                    puts_groups=difference(before.puts, after.puts), held=placed1.held,
                    holders=placed1.holders, placement_moved=placed0.held != placed1.held,
                    log_errors=logs, round_rates=[tally.rate], idle=idle, etcd_writes=writes)


async def run_all(tmp: Path, s: Settings, configs: list[Config], setup: Setup,
                  started: list[BrokerNode | NsEtcd]) -> tuple[list[Measured], list[Measured]]:
    """Every configuration, ``s.rounds`` times in the order A B … B A; each round's row is
    printed as it goes. Each configuration's rounds added up, and every round."""
    machines = network_machines(setup.net, NODES, 2 if any(c.second_etcd for c in configs)
                                else 1)
    print(f"  {len(setup.net.machines)} namespaces on {setup.net.switch}'s bridge "
          f"({setup.net.delay_note})", flush=True)
    order = [c for r in range(s.rounds) for c in (configs if r % 2 == 0 else configs[::-1])]
    merged: dict[str, Measured] = {}
    rounds: list[Measured] = []
    extra = 0.0  # seconds spent waiting for quiet and on rounds run again
    print(table_header(), flush=True)
    for k, config in enumerate(order):
        for attempt in range(MAX_ATTEMPTS):
            took, busy = await wait_for_quiet(min(QUIET_WAIT, max(0.0, EXTRA_BUDGET - extra)))
            extra += took
            if took >= 1.5:
                print(f"    (waited {took:.0f} s for other work on the machine to calm down: "
                      f"{busy:.2f} cores busy)", flush=True)
            t0 = time.perf_counter()
            m = await run_config(tmp, machines, config, s, setup, started, k * 10 + attempt)
            m.wall = time.perf_counter() - t0
            base = merged.get(configs[0].name) if configs[0].groups == 1 else None
            print_row(m, base if base is not None else (m if config.groups == 1 else None))
            others = m.cpu.others / m.cpu.seconds
            if others <= NOISY or attempt == MAX_ATTEMPTS - 1 or extra + m.wall > EXTRA_BUDGET:
                break
            extra += m.wall
            setup.discarded.append({"config": config.name, "msg_per_s": m.rate,
                                    "other_cores": others})
            print(f"    (other processes on the machine took {others:.2f} cores during this "
                  "round: it is run again)", flush=True)
        rounds.append(m)
        if config.name in merged:
            merged[config.name].add(m)
        else:
            merged[config.name] = copy.deepcopy(m)
    results = [merged[c.name] for c in configs]
    if s.rounds > 1:
        print(f"\nall {s.rounds} rounds added up:\n{table_header()}", flush=True)
        base = results[0] if results[0].config.groups == 1 else None
        for m in results:
            print_row(m, base)
    return results, rounds


def main() -> None:
    p = settings.parser(__doc__, "one round of 4 s of load after 2 s of warm-up per "
                        "configuration")
    p.add_argument("--only", default="", help="configurations: g1,g2,g4,g8,g8x2,g8h")
    args = p.parse_args()
    s = settings.with_rounds(Settings(
        rounds=1 if args.quick else 2,
        seconds=float(os.environ.get("BENCH_SECONDS", "4" if args.quick else "20")),
        warmup=float(os.environ.get("BENCH_WARMUP", "2" if args.quick else "5"))), args)
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
          f"{s.rounds} round(s) of {s.warmup:.0f} s warm-up + {s.seconds:.0f} s measured per "
          "configuration",
          flush=True)
    load_at_start = os.getloadavg()
    source = source_state()
    net = Network()
    started: list[BrokerNode | NsEtcd] = []
    began = time.perf_counter()
    try:
        net.open()
        setup = Setup(net=net, topics=topics, bodies=batch_bodies(topics))
        with tempfile.TemporaryDirectory(prefix="bench-groups-",
                                         dir=os.environ.get("BENCH_DIR")) as t:
            results, rounds = asyncio.run(run_all(Path(t), s, configs, setup, started))
    finally:
        for proc in started:  # whatever the configuration's own cleanup did not stop
            proc.stop()
        net.close()
    took = time.perf_counter() - began
    print(f"\nthe benchmark took {took / 60:.1f} minutes; load average at start "
          f"{', '.join(f'{x:.2f}' for x in load_at_start)}", flush=True)
    write_results(results, rounds, Context(topics, setup.rtt, net.delay_note, s.seconds,
                                           s.warmup, load_at_start, took, s.rounds,
                                           setup.discarded, source, NOISY))


if __name__ == "__main__":
    main()
