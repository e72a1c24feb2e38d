"""What a cluster costs before a broker does any work of its own: etcd's CPU for the puts of
the cluster cost benchmark's loads, and one watch per node receiving them
(``make bench-etcd-floor``).

The cluster cost targets (issue "a cluster that costs per machine what one node costs") are
sums: all brokers' CPU plus etcd's. This experiment measures the part no broker code can
remove while every byte goes through etcd and every revision reaches every node: three etcd
members with the README's settings take paced puts of real log entries (what
:func:`~messaging.log.etcd.entry.encode_entry` makes of the publishes, compressed when it
pays) while three watcher processes, one per member, receive every revision the way a node
does (:mod:`bench.harness.etcd_watcher`, grpc.aio), each measuring its own CPU.
One broker (``--fsync always``) in the same run gives the baselines: its CPU per message for
1,000 × 100 B batches and its cores at 1,000 single publishes a second.

The operating points are the cluster cost benchmark's (bench/RESULTS.md "Cluster cost"): a
batch revision holds one or two 1,000 × 100 B random batches (the receiving node puts what
arrived while its last put was in flight), at the revision rates the cluster reached; single
publishes at 1,000 a second give about 270 revisions a second (3.7 messages each), and 100 a
second if a put waited to hold ten. ``--rounds`` (3) repeats every point; figures are medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench.harness.etcd_members import Etcd, etcd_cluster, wait_for_leader
from bench.harness.etcd_watcher import KEY
from bench.harness.figures import Row
from bench.harness.payloads import PAYLOAD
from bench.harness.procs import broker, child_env
from bench.harness.publish_load import BATCH, cpu_of, latencies, throughput, with_cpu
from bench.harness.results import add_to_json, command_line, report
from bench.harness.sampling import cpu_seconds
from messaging.frames import encode_batch
from messaging.log.etcd.entry import encode_entry
from messaging.log.etcd.writer import MAX_PUTS_IN_FLIGHT

#: What a broker may cost per message beside the single node's, and the cores at 1,000 msg/s.
BATCH_TARGET = 3.0
CORES_TARGET = 0.8
WARM = 30


@dataclass(frozen=True)
class Point:
    """One load: ``rate`` puts a second, each holding ``commands`` publishes of ``messages``
    100 B messages, for ``seconds``."""

    name: str
    rate: int
    commands: int
    messages: int
    seconds: float

    @property
    def per_put(self) -> int:
        return self.commands * self.messages


POINTS = (Point("batches, 1 per revision, 180 revisions/s", 180, 1, BATCH, 5.0),
          Point("batches, 2 per revision, 95 revisions/s", 95, 2, BATCH, 5.0),
          Point("1,000 single publishes/s, 2 per revision (500 revisions/s)", 500, 2, 1, 4.0),
          Point("1,000 single publishes/s, 3.7 per revision (270 revisions/s)", 270, 1, 0, 5.0),
          Point("1,000 single publishes/s, 10 per revision (100 revisions/s)", 100, 10, 1, 5.0))
#: Publishes a second each of the three nodes takes at 1,000 msg/s over the cluster.
PER_NODE = 1000 / 3


def _values(point: Point, count: int) -> list[bytes]:
    """``count`` log entries of ``point``'s shape, random messages (incompressible, as the
    cluster cost benchmark sends)."""
    node = os.urandom(8)
    values = []
    for seq in range(count):
        if point.messages:
            commands = [encode_batch(1, [os.urandom(len(PAYLOAD)) for _ in range(point.messages)])
                        for _ in range(point.commands)]
        else:  # 3.7 single publishes a put on average: 3 or 4 alternately, 7 in 10 of 4
            commands = [encode_batch(1, [os.urandom(len(PAYLOAD))])
                        for _ in range(4 if seq % 10 < 7 else 3)]
        values.append(encode_entry(node, seq, commands))
    return values


def _watchers(members: list[Etcd], count: int) -> list[subprocess.Popen[str]]:
    return [subprocess.Popen(
        [sys.executable, "-m", "bench.harness.etcd_watcher", "grpc-aio",
         m.client_url, str(WARM), str(count)], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=child_env()) for m in members]


async def _put(url: str, rate: int, values: list[bytes]) -> float:
    """Put ``values`` to KEY, each started on schedule at ``rate`` a second (at most
    MAX_PUTS_IN_FLIGHT at once, as a node writes); the seconds it took."""
    from messaging.config import EtcdSettings
    from messaging.log.etcd.client import EtcdClient

    client = EtcdClient(EtcdSettings((url,), "bench"))
    in_flight = asyncio.Semaphore(MAX_PUTS_IN_FLIGHT)

    async def one(value: bytes) -> None:
        async with in_flight:  # in order: a waiting put starts when one ends
            await client.put(KEY, value)

    try:
        started = time.perf_counter()
        tasks = []
        for k, value in enumerate(values):
            tasks.append(asyncio.create_task(one(value)))
            delay = started + (k + 1) / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        return time.perf_counter() - started
    finally:
        await client.close()


def one_point(members: list[Etcd], point: Point) -> dict[str, float]:
    """etcd's cores and CPU per put, and a watcher's CPU per revision, for ``point``."""
    count = int(point.rate * point.seconds)
    values = _values(point, WARM + count + 5)
    watchers = _watchers(members, count)
    try:
        time.sleep(2.0)  # every watch is created: each takes the puts from the next on
        pids = [m.pid for m in members]
        asyncio.run(_put(members[0].client_url, point.rate, values[:WARM]))
        before = cpu_of(pids)
        seconds = asyncio.run(_put(members[0].client_url, point.rate, values[WARM:]))
        etcd = cpu_of(pids) - before
        watch = []
        for proc in watchers:
            out, err = proc.communicate(timeout=60)
            if proc.returncode != 0:
                raise RuntimeError(f"a watcher failed: {err.strip()[-800:]}")
            watch.append(float(json.loads(out.strip().splitlines()[-1])["cpu_us_per_event"]))
    finally:
        for proc in watchers:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    puts = len(values) - WARM
    return {"etcd_cores": etcd / seconds, "etcd_us_per_put": etcd * 1e6 / puts,
            "watch_us_per_revision": statistics.median(watch),
            "rate": puts / seconds, "bytes_per_put": statistics.mean(map(len, values))}


async def single_baselines(url: str, pid: int, seconds: float) -> tuple[float, float]:
    """The single node's CPU per message for batches (µs) and its cores at 1,000 single
    publishes a second."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await latencies(session, [url], 2, 200, 200)  # warm-up
        rate, cpu = await with_cpu({"broker": lambda: [pid]},
                                   throughput(session, [url], 1, seconds))
        before, started = cpu_seconds(pid), time.perf_counter()
        await latencies(session, [url], 2, 1000, 3000)
        cores = (cpu_seconds(pid) - before) / (time.perf_counter() - started)
    return cpu.shares["broker"] * 1e6 / rate, cores


def _what_it_says(med: dict[str, dict[str, float]], base_us: float, base_cores: float) -> str:
    """The floor against each cluster cost target, in words, from this run's figures."""
    batch = [p for p in POINTS if p.messages == BATCH]
    singles = [p for p in POINTS if p.messages != BATCH]

    def floor(p: Point) -> float:
        m = med[p.name]
        return m["etcd_cores"] + 3 * m["watch_us_per_revision"] * m["rate"] / 1e6

    per_msg = [floor(p) * 1e6 / (med[p.name]["rate"] * p.per_put) for p in batch]
    cores = {p.name: floor(p) + base_cores for p in singles}
    cheapest = min(singles, key=lambda p: cores[p.name])
    watches = [med[p.name]["watch_us_per_revision"] for p in singles]
    taking = [base_cores * 1e6 / (3 * med[p.name]["rate"]) for p in singles]
    least = min(w + t for w, t in zip(watches, taking, strict=True))
    gather = cheapest.per_put / PER_NODE * 1e3
    return (
        "**What it says.** Batches: etcd and one watch per node alone cost "
        f"{min(per_msg):.2f}-{max(per_msg):.2f} µs per message, "
        f"{min(per_msg) / base_us:.1f}-{max(per_msg) / base_us:.1f}× the single node's whole "
        f"batch publish ({base_us:.2f} µs), against a target of ≤ {BATCH_TARGET:g}× for "
        "everything: while every byte of a batch goes through etcd, no broker code reaches "
        "it. Single publishes at 1,000 a second: with the publishes taken (the single node's "
        f"{base_cores:.2f} cores), the floor is "
        + ", ".join(f"{cores[p.name]:.2f} cores at {med[p.name]['rate']:.0f} revisions/s"
                    for p in singles)
        + f"; the cheapest, {cheapest.name.split(', ', 1)[1]}, is "
        f"{cores[cheapest.name]:.2f} cores against the target's {CORES_TARGET}, and there a "
        f"node's put gathers {gather:.0f} ms of its publishes (a publish waits about half "
        "of that before its put, against a p50 target of 5 ms). Per applied revision, a "
        f"node's watch alone costs {min(watches):.0f}-{max(watches):.0f} µs and taking the "
        f"publishes {min(taking):.0f}-{max(taking):.0f} µs: at least {least:.0f} µs before "
        "anything is applied, against a target of 200 µs for everything.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    figures: dict[str, dict[str, list[float]]] = {p.name: {} for p in POINTS}
    single_us: list[float] = []
    single_cores: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-etcd-floor-",
                                     dir=os.environ.get("BENCH_DIR")) as t:
        tmp = Path(t)
        single, url = broker(tmp / "single", log=tmp / "single.log")
        members = etcd_cluster(tmp, snapshot_count=2000)
        try:
            for member in members:
                member.start()
            wait_for_leader(members)
            for k in range(args.rounds):
                us, cores = asyncio.run(single_baselines(url, single.pid, 5.0))
                single_us.append(us)
                single_cores.append(cores)
                for point in POINTS:
                    result = one_point(members, point)
                    for name, value in result.items():
                        figures[point.name].setdefault(name, []).append(value)
                    print(f"  round {k + 1}, {point.name}: etcd {result['etcd_cores']:.2f} "
                          f"cores, {result['etcd_us_per_put']:.0f} µs/put; a watch "
                          f"{result['watch_us_per_revision']:.0f} µs/revision", flush=True)
                print(f"  round {k + 1}, single node: batch {us:.2f} µs/msg, 1,000 single "
                      f"publishes/s {cores:.2f} cores", flush=True)
        finally:
            for member in members:
                member.stop()
            single.stop()
    med = {p.name: {k: statistics.median(v) for k, v in figures[p.name].items()}
           for p in POINTS}
    base_us, base_cores = statistics.median(single_us), statistics.median(single_cores)
    rows: list[Row] = []
    for point in POINTS:
        m = med[point.name]
        floor = m["etcd_cores"] + 3 * m["watch_us_per_revision"] * m["rate"] / 1e6
        if point.messages == BATCH:
            per_msg = floor * 1e6 / (m["rate"] * point.per_put)
            rows.append(Row(f"{point.name}: etcd + 3 watches, CPU per message", per_msg, "µs",
                            "the single node's whole batch publish", base_us,
                            f"≤ {BATCH_TARGET:g}× single", per_msg <= BATCH_TARGET * base_us))
        else:
            per_put = 3.7 if not point.messages else point.per_put
            gather = per_put / PER_NODE * 1e3
            total = floor + base_cores
            rows.append(Row(f"{point.name}: etcd + 3 watches + taking the publishes (a put "
                            f"gathers {gather:.0f} ms of a node's publishes)", total, "cores",
                            "etcd + 3 watches alone", floor,
                            f"≤ {CORES_TARGET} cores (brokers + etcd)", total <= CORES_TARGET))
            per_revision = base_cores * 1e6 / (3 * m["rate"])
            rows.append(Row(f"{point.name}: taking the publishes alone, per applied revision "
                            "(the single node's CPU over every node's revisions)", per_revision,
                            "µs", target="≤ 200 µs (brokers' whole CPU per applied revision)",
                            met=per_revision <= 200))
        rows.append(Row(f"{point.name}: etcd per put (3 members)", m["etcd_us_per_put"], "µs"))
        rows.append(Row(f"{point.name}: a node's watch per revision", m["watch_us_per_revision"],
                        "µs"))
    notes = (f"{args.rounds} rounds; medians. Three etcd members (the README's settings), "
             "three watcher processes (grpc.aio, one per member, as nodes watch), puts of "
             "real log entries of random 100 B messages paced from one client (at most "
             f"{MAX_PUTS_IN_FLIGHT} in flight, as a node puts); the single node "
             "(`--fsync always`) in the same run. \"etcd + 3 watches\" is a floor under what "
             "the cluster costs: no node has yet taken a request, applied a revision or "
             "answered anyone. \"Taking the publishes\" is the single node's whole CPU for the "
             "same 1,000 publishes a second: the least the receiving nodes spend between them "
             "(HTTP, validation, the answer).\n\n" + _what_it_says(med, base_us, base_cores))
    report("etcd-floor", "What etcd and the watches cost before a broker works", rows,
           command_line(), notes)
    add_to_json("etcd-floor", {"points": med, "single_batch_us_per_message": single_us,
                               "single_cores_at_1000": single_cores})


if __name__ == "__main__":
    main()
