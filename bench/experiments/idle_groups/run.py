"""What an idle cluster node costs by the number of topic groups it holds
(``make bench-idle-groups``).

One etcd member and one broker node on 127.0.0.1 (``--fsync always``, ``--replicas 1``, so the
node holds every group). For each group count (``--groups``, default 1, 4 and 16) a fresh node
starts, settles for a few seconds, and then idles for ``--seconds`` (10) while its CPU is read
from /proc per thread (the event loop, the writer threads, grpc's threads) together with
etcd's CPU. Rounds (``--rounds``, 2) repeat every count; figures are medians, in ms of CPU per
second of idling (1,000 ms/s is one core).

``--ab REV``: each count is measured for this checkout and for the code of REV (a git worktree,
its own node), alternating which goes first, and each figure is shown beside REV's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))


from bench.harness.ab_brokers import round_order
from bench.harness.checkouts import Code, other_checkout, this_checkout, worktree
from bench.harness.etcd_members import etcd_cluster, wait_for_leader
from bench.harness.figures import Row
from bench.harness.procs import broker
from bench.harness.results import add_to_json, command_line, report
from bench.harness.sampling import cpu_seconds, thread_cpu

SETTLE = 6.0


def _role(name: str) -> str:
    if name.startswith("messaging-writ"):
        return "writers"
    if name.startswith(("event_engine", "grpc")):
        return "grpc"
    return "loop and the rest"


def _groups(count: int) -> str:
    return f"{count} group{'' if count == 1 else 's'}"


def idle_cost(tmp: Path, etcd_url: str, etcd_pid: int, groups: int,
              seconds: float, code: Code | None = None) -> dict[str, float]:
    """ms/s of CPU of one idle node holding ``groups`` groups, by thread role, and etcd's
    (``code``: the checkout the node runs; None: this one)."""
    proc, _url = broker(tmp / f"node-{groups}-{time.monotonic_ns()}", "--etcd", etcd_url,
                        "--cluster", f"idle{groups}x{os.getpid()}{time.monotonic_ns()}",
                        "--groups", str(groups), "--replicas", "1",
                        env=code.env if code else None, cwd=code.cwd if code else None)
    try:
        time.sleep(SETTLE)
        assert proc.pid is not None
        before = thread_cpu(proc.pid)
        node, etcd = cpu_seconds(proc.pid), cpu_seconds(etcd_pid)
        time.sleep(seconds)
        roles: dict[str, float] = {}
        for tid, (name, spent) in thread_cpu(proc.pid).items():
            earlier = before.get(tid, (name, 0.0))[1]
            roles[_role(name)] = roles.get(_role(name), 0.0) + (spent - earlier) * 1000 / seconds
        roles["node"] = (cpu_seconds(proc.pid) - node) * 1000 / seconds
        roles["etcd"] = (cpu_seconds(etcd_pid) - etcd) * 1000 / seconds
        return roles
    finally:
        proc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ab", metavar="REV", help="measure the code of REV beside this one")
    args = parser.parse_args()
    if args.ab:
        ab(args)
        return
    figures: dict[int, dict[str, list[float]]] = {g: {} for g in args.groups}
    with tempfile.TemporaryDirectory(prefix="bench-idle-groups-",
                                     dir=os.environ.get("BENCH_DIR")) as t:
        tmp = Path(t)
        member = etcd_cluster(tmp, size=1)[0]
        member.start()
        try:
            wait_for_leader([member])
            assert member.pid is not None
            for k in range(args.rounds):
                for groups in args.groups:
                    roles = idle_cost(tmp, member.client_url, member.pid, groups, args.seconds)
                    for role, ms in roles.items():
                        figures[groups].setdefault(role, []).append(ms)
                    print(f"  round {k + 1}, {groups} groups: " + ", ".join(
                        f"{role} {ms:.0f}" for role, ms in roles.items()) + " ms/s", flush=True)
        finally:
            member.stop()
    first, last = args.groups[0], args.groups[-1]

    def med(groups: int, role: str) -> float:
        return float(statistics.median(figures[groups].get(role, [0.0])))

    rows: list[Row] = []
    for groups in args.groups:
        for role, what in (("node", "the node"), ("loop and the rest", "its event loop"),
                           ("grpc", "grpc's threads"), ("writers", "its writer threads"),
                           ("etcd", "etcd")):
            rows.append(Row(f"{_groups(groups)} idle: {what}", med(groups, role), "ms/s",
                            _groups(first), med(first, role)))
    notes = (f"{args.rounds} rounds; medians. Each count starts a fresh node in a new cluster "
             f"on one etcd member, waits {SETTLE:g} s, then measures {args.seconds:g} s of "
             "idling. The group logs a node holds in one etcd cluster share one client, one "
             "watch stream, one lease (kept alive once a second) and one read a tick of their "
             "quorum (every half second) and node lists (every second); the node's clock "
             "check is one for all its groups.\n\n"
             f"**What it says.** Idle, each group a node holds costs it about "
             f"{med(last, 'node') / last:.1f} ms/s and etcd about "
             f"{med(last, 'etcd') / last:.1f} ms/s at {last} groups: a node holding "
             f"{last} groups spends {med(last, 'node') / 10:.1f}% of a core doing nothing.")
    report("idle-groups", "An idle cluster node by the number of groups it holds", rows,
           command_line(), notes)
    add_to_json("idle-groups", {"rounds": {str(g): v for g, v in figures.items()}})


def ab(args: argparse.Namespace) -> None:
    """Each count for REV's code and this checkout's, alternating, in one run."""
    figures: dict[str, dict[int, dict[str, list[float]]]] = {
        arm: {g: {} for g in args.groups} for arm in ("before", "after")}
    with tempfile.TemporaryDirectory(prefix="bench-idle-groups-",
                                     dir=os.environ.get("BENCH_DIR")) as t:
        tmp = Path(t)
        with worktree(args.ab, tmp) as tree:
            codes = {"before": other_checkout("before", args.ab, tree), "after": this_checkout()}
            for code in codes.values():
                code.check_import()
            member = etcd_cluster(tmp, size=1)[0]
            member.start()
            try:
                wait_for_leader([member])
                assert member.pid is not None
                for k in range(args.rounds):
                    for groups in args.groups:
                        for arm in round_order(k):
                            roles = idle_cost(tmp, member.client_url, member.pid, groups,
                                              args.seconds, codes[arm])
                            for role, ms in roles.items():
                                figures[arm][groups].setdefault(role, []).append(ms)
                            print(f"  round {k + 1}, {groups} groups, {arm}: " + ", ".join(
                                f"{role} {ms:.0f}" for role, ms in roles.items()) + " ms/s",
                                flush=True)
            finally:
                member.stop()

    def med(arm: str, groups: int, role: str) -> float:
        return float(statistics.median(figures[arm][groups].get(role, [0.0])))

    before = f"the code of {codes['before'].rev}"
    rows: list[Row] = []
    for groups in args.groups:
        for role, what in (("node", "the node"), ("loop and the rest", "its event loop"),
                           ("grpc", "grpc's threads"), ("etcd", "etcd")):
            rows.append(Row(f"{_groups(groups)} idle: {what}", med("after", groups, role),
                            "ms/s", before, med("before", groups, role)))
    last = args.groups[-1]
    notes = (f"After: {codes['after'].rev}; before: {codes['before'].rev} (a git worktree, "
             f"its own node). {args.rounds} rounds alternating the sides; medians. Each count "
             f"starts a fresh node in a new cluster on one etcd member, waits {SETTLE:g} s, "
             f"then measures {args.seconds:g} s of idling.\n\n"
             f"**What it says.** At {last} groups the idle node costs "
             f"{med('after', last, 'node'):.0f} ms/s against {med('before', last, 'node'):.0f} "
             f"before ({med('after', last, 'node') / last:.1f} against "
             f"{med('before', last, 'node') / last:.1f} ms/s per group), and etcd "
             f"{med('after', last, 'etcd'):.0f} against {med('before', last, 'etcd'):.0f} ms/s.")
    report("idle-groups", "An idle cluster node by the number of groups it holds (A/B)", rows,
           command_line(), notes)
    add_to_json("idle-groups", {"ab": args.ab, "rounds": {
        arm: {str(g): v for g, v in by.items()} for arm, by in figures.items()}})


if __name__ == "__main__":
    main()
