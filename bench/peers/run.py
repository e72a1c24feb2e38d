"""Peer benchmark: our broker against Redis Streams, NATS JetStream, the Durable Streams Node
reference server and a bare aiohttp server, on the same machine, in the same run.

Workloads (headline figures with an fsync per acknowledged write everywhere):
1. single 100 B publishes, 50 connections; 2. batch publish, 1000 × 100 B per request, 4
senders (and the disk's write+fdatasync ceiling); 3. consuming N stored messages into
objects; 4. publish → subscriber latency at 1,000 msg/s; 5. fan-out to 10 / 100 / 1,000
subscribers; 6. the Durable Streams surface (/v1/stream) against the reference server.

Every server runs in its own process on 127.0.0.1 on a free port, its data in a temporary
directory, and is stopped by its PID. Rounds run the servers in A B … B A order; figures are
medians of the rounds. A peer that cannot be installed or started is skipped with a note.

``--ab`` runs only our broker, before and after a change (by default the commit before append
times against this checkout), single and batch publish rates and latency in interleaved
rounds: see bench/peers/ab.py.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.harness import settings
from bench.harness.figures import Runs
from bench.harness.loops import freeze_startup_objects, run_loop
from bench.harness.procs import raise_nofile
from bench.harness.results import add_to_json, command_line, report, results_under
from bench.harness.sampling import cpu_seconds, generator_cpu
from bench.peers.ab import (
    BEFORE_REV,
    ABSettings,
    ab_notes,
    ab_rows,
    p50_regression,
    run_ab,
    summaries,
    temporary_parent,
)
from bench.peers.cases import SERVERS, Case, Servers, Settings, cases
from bench.peers.report import WORKLOADS, plots, rows_and_notes

#: Seconds a workload's rounds may take, by workload, and the whole run: a round after the
#: first that would go past either is skipped (with a note), so a full run stays in 15 minutes.
ROUND_BUDGET = {"single": 100.0, "batch": 100.0, "consume": 180.0, "latency": 150.0,
                "fanout": 200.0, "durable-streams": 100.0}
TOTAL_BUDGET = 780.0


@dataclass(kw_only=True)
class Result(Runs):
    """The runs of one case: its figures and the CPU used by server and load generator."""

    case: Case
    error: str = ""

    def summary(self) -> dict[str, Any]:
        seconds = statistics.median(f.seconds for f in self.figures) if self.figures else 0
        return {"label": self.case.label, "server": self.case.server, "unit": self.case.unit,
                "role": self.case.role,
                "durable": self.case.durable, "side": self.case.side, "error": self.error,
                "median": self.median(), "p99": self.median("p99"),
                "all_delivered": all(f.extra.get("all_delivered", True) for f in self.figures),
                "values": [f.value for f in self.figures],
                "extra": [f.extra for f in self.figures],
                "seconds": seconds,
                "server_cpu": statistics.median(self.server_cpu) if self.server_cpu else None,
                "client_cpu": statistics.median(self.client_cpu) if self.client_cpu else None}


async def measure(result: Result, servers: Servers) -> None:
    """One run of ``result.case``; a failure is recorded, later rounds of it are skipped."""
    if result.error:
        return
    pid = servers.pid(result.case.server)
    before, client = cpu_seconds(pid), generator_cpu()
    try:
        figure = await asyncio.wait_for(result.case.run(), result.case.timeout)
    except Exception as err:  # any failure of a peer: a note in the table, not a traceback
        result.error = f"{type(err).__name__}: {str(err)[:200]}"
        print(f"    {result.case.label}: failed: {result.error}", flush=True)
        return
    result.server_cpu.append(cpu_seconds(pid) - before)
    result.client_cpu.append(generator_cpu() - client)
    result.figures.append(figure)
    p99 = f", p99 {figure.extra['p99']:.2f} ms" if "p99" in figure.extra else ""
    print(f"    {result.case.label}: {figure.value:,.2f} {result.case.unit}{p99}", flush=True)


async def run(tmp: Path, s: Settings) -> tuple[dict[str, dict[str, Result]], list[str]]:
    servers = Servers(tmp, s.only)
    results: dict[str, dict[str, Result]] = {}
    started = time.monotonic()
    try:
        await servers.start()
        for workload, title in WORKLOADS.items():
            print(f"{workload}: {title}", flush=True)
            try:
                await servers.prepare(workload, s)
            except Exception as err:
                servers.notes.append(f"{workload}: preparing failed: {type(err).__name__}: "
                                     f"{str(err)[:200]}")
                print(f"  {servers.notes[-1]}", flush=True)
            groups = cases(workload, servers, s)
            results[workload] = {}
            for group in groups:
                first = time.monotonic()
                group_results = [Result(case=case) for case in group]
                for result in group_results:
                    results[workload][result.case.key] = result
                for r in range(s.rounds):
                    now = time.monotonic()
                    spent = now - first  # a next round would take about spent / r more
                    if r > 0 and (spent * (r + 1) / r > ROUND_BUDGET[workload] / len(groups)
                                  or now - started + spent / r > TOTAL_BUDGET):
                        servers.notes.append(f"{workload}: {s.rounds - r} of {s.rounds} "
                                             f"rounds skipped (time budget)")
                        print(f"  {servers.notes[-1]}", flush=True)
                        break
                    order = group_results if r % 2 == 0 else group_results[::-1]
                    print(f"  round {r + 1}", flush=True)
                    for result in order:
                        await measure(result, servers)
    finally:
        servers.stop()
    return results, servers.notes


def parse_args() -> tuple[Settings, argparse.Namespace]:
    p = settings.parser(__doc__, "tiny sizes, one round, 10 and 100 subscribers: seconds, not "
                        "minutes")
    p.add_argument("--only", default=",".join(SERVERS),
                   help=f"servers to run, comma-separated, of {','.join(SERVERS)}")
    p.add_argument("--ab", action="store_true",
                   help="only our broker, before (--ab-before) and after (--ab-after): single "
                        "and batch publish rates and latency, interleaved rounds")
    p.add_argument("--ab-before", default=BEFORE_REV, metavar="REV",
                   help=f"the commit whose broker is 'before' (default {BEFORE_REV}, the code "
                        "before append times)")
    p.add_argument("--ab-after", default="", metavar="REV",
                   help="the commit whose broker is 'after' (default: this checkout as it is)")
    p.add_argument("--messages", type=int,
                   help="stored messages consumed in workload 3 (default 1,000,000; "
                        "--quick 10,000)")
    args = p.parse_args()
    only = settings.only(p, args.only, SERVERS, "servers")
    s = Settings(only=only)
    if args.quick:
        s = Settings(rounds=1, seconds=1.0, messages=10_000, latency_seconds=1.0,
                     fanout=(10, 100), fanout_seconds=1.0, only=only)
    if args.messages:
        s.messages = max(1000, args.messages // 1000 * 1000)
    return settings.with_rounds(s, args), args


def ab_settings(args: argparse.Namespace) -> ABSettings:
    """The ``--ab`` run's settings from the command line."""
    s = ABSettings(before=args.ab_before, after=args.ab_after)
    if args.quick:
        s.rounds, s.seconds, s.latency_seconds = 1, 1.0, 1.0
    if args.rounds:
        s.rounds = max(1, args.rounds)
    return s


def main_ab(args: argparse.Namespace) -> None:
    """``--ab``: our broker before and after (see bench/peers/ab.py), nothing else."""
    s = ab_settings(args)
    raise_nofile()
    freeze_startup_objects()
    started = time.perf_counter()
    tmp = temporary_parent()
    try:
        run_result = run_loop(run_ab(tmp, s))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    runtime = time.perf_counter() - started
    where = results_under(args.out, quick=args.quick, bench="peers_ab")
    code = run_result["code"]
    rows = ab_rows(run_result["results"], f"before: {code['before']['rev']}")
    report("peers_ab", "Our broker before and after (A/B, same run)", rows,
           command_line(), notes=ab_notes(run_result, s, runtime))
    add_to_json("peers_ab", {"settings": asdict(s), "code": code,
                             "time_files": run_result["time_files"],
                             "workloads": summaries(run_result["results"]),
                             "notes": run_result["notes"], "runtime_seconds": runtime})
    print(f"runtime {runtime:.0f} s; results in {where}")
    regression = p50_regression(run_result["results"])
    if regression is not None:
        print(f"\n{'!' * 78}\n{regression}\n{'!' * 78}", file=sys.stderr)
        if not args.quick:  # a quick run is too short to judge by
            sys.exit(1)


def main() -> None:
    s, args = parse_args()
    if args.ab:
        main_ab(args)
        return
    raise_nofile()
    freeze_startup_objects()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-peers-", dir=os.environ.get("BENCH_DIR")) as t:
        results, notes = run_loop(run(Path(t), s))
    runtime = time.perf_counter() - started
    where = results_under(args.out, quick=args.quick, bench="peers")
    summaries = {w: {k: r.summary() for k, r in cases_.items()} for w, cases_ in results.items()}
    rows, text = rows_and_notes(summaries, notes, asdict(s), runtime)
    report("peers", "Peers: Redis, NATS JetStream, the Durable Streams reference server",
           rows, command_line(), notes=text + "\n\n" + plots(summaries))
    add_to_json("peers", {"settings": asdict(s), "workloads": summaries, "notes": notes,
                          "runtime_seconds": runtime})
    print(f"runtime {runtime:.0f} s; results in {where}")


if __name__ == "__main__":
    main()
