"""Single publishes that meet in a group, staged one by one or as one run
(``make bench-group-staging``).

Two brokers run at once, ``--fsync always``, on 127.0.0.1 with their own data: this checkout
("after": a group's consecutive publishes to one topic are staged as one command, see
:mod:`messaging.broker.coalesce`) and a git worktree of ``--before`` (default e929d74, where
each was staged on its own). Rounds alternate the sides; each round is ``wrk -t2 -c50`` of
single 100 B POSTs to one topic for ``--seconds``, so every group commit holds the publishes
that arrived during the one before. Figures: medians over the rounds of the requests per
second, wrk's latency p50 and p99, and the broker's CPU per request.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench.harness.ab_brokers import ab_brokers, round_order
from bench.harness.figures import Row
from bench.harness.http_load import wrk_rate
from bench.harness.procs import ensure_tool
from bench.harness.results import add_to_json, command_line, report
from bench.harness.sampling import cpu_seconds

BEFORE = "e929d74"
PATH = "/messaging/messages?topicID=1"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--before", default=BEFORE, help="the commit to compare with")
    args = parser.parse_args()
    wrk = ensure_tool("wrk", "wrk")
    if wrk is None:
        raise SystemExit("this benchmark needs wrk: apt-get install wrk")
    figures: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    with tempfile.TemporaryDirectory(prefix="bench-group-staging-",
                                     dir=os.environ.get("BENCH_DIR")) as t:
        tmp = Path(t)
        with ab_brokers(args.before, tmp, "--fsync", "always") as (codes, procs):
            for _proc, url in procs.values():
                wrk_rate(wrk, url, PATH, 1)  # warm-up: the topic exists
            for k in range(args.rounds):
                for arm in round_order(k):
                    proc, url = procs[arm]
                    cpu = cpu_seconds(proc.pid)
                    figure = wrk_rate(wrk, url, PATH, args.seconds)
                    used = cpu_seconds(proc.pid) - cpu
                    side = figures[arm]
                    side.setdefault("rate", []).append(figure.value)
                    side.setdefault("p50", []).append(figure.extra["latency_p50_ms"])
                    side.setdefault("p99", []).append(figure.extra["latency_p99_ms"])
                    side.setdefault("cpu", []).append(
                        used * 1e6 / (figure.value * args.seconds))
                    print(f"  round {k + 1} {arm:6} {figure.value:,.0f} req/s, p50 "
                          f"{side['p50'][-1]:.2f} ms, p99 {side['p99'][-1]:.2f} ms, "
                          f"broker CPU {side['cpu'][-1]:.0f} µs/request", flush=True)

    def median(arm: str, key: str) -> float:
        return statistics.median(figures[arm][key])

    before = f"the code of {codes['before'].rev}: each publish staged on its own"
    rows = [Row("single POSTs, wrk -t2 -c50: requests/s", median("after", "rate"), "req/s",
                before, median("before", "rate")),
            Row("single POSTs: wrk's latency p50", median("after", "p50"), "ms", before,
                median("before", "p50")),
            Row("single POSTs: wrk's latency p99", median("after", "p99"), "ms", before,
                median("before", "p99")),
            Row("broker CPU per request", median("after", "cpu"), "µs", before,
                median("before", "cpu"))]
    notes = (f"After: {codes['after'].rev}; before: {codes['before'].rev} (a git worktree, its "
             f"own broker). {args.rounds} rounds alternating the sides, each `wrk -t2 -c50` "
             f"of single 100 B POSTs to one topic for {args.seconds} s; medians of the "
             "rounds. A group commit holds the publishes that arrived while the one before "
             "was written and fsynced; after, its consecutive publishes to one topic are "
             "stamped and appended as one run and answered one by one.")
    report("group-staging", "Single publishes that meet in a group: staged one by one or as "
           "one run", rows, command_line(), notes)
    add_to_json("group-staging", {"rounds": figures})


if __name__ == "__main__":
    main()
