"""Where the milliseconds of publish → subscriber go, through the Python client, beside the
code of 2026-11-25 (``make bench-publish-path``).

Two sides run in the same rounds: this checkout ("after") and a git worktree of
``--before`` (default eab2696, the main of 2026-11-25: "before"). Each side's broker
(``--fsync always``, 127.0.0.1, its own data) runs its own code, and each measured run is a
process (:mod:`bench.experiments.publish_path.load`) with that side's checkout first on
``PYTHONPATH``: its client is that side's client. A run publishes 100 B messages at 1,000/s
for a few seconds while one streaming ``Conn`` reads them; per message it times the publish
sent → acknowledged and sent → yielded by the ``Conn``. Four cases take the path apart:

1. ``lean``: a minimal HTTP/1.1 publisher: the broker's own part (HTTP, group commit, the
   fdatasync, the fan-out to the stream) plus the ``Conn``;
2. ``lean-producer``: the same with idempotent producer headers: what the broker's
   idempotent path adds (the state journal's line, synced before the frames);
3. ``client-plain``: ``Client.publish(idempotent=False)``: what the client library adds;
4. ``client``: ``Client.publish`` as users run it (idempotent).

Rounds alternate the sides (A B, then B A, ...); figures are medians of the rounds. In the
last round py-spy (when installed) samples the after side's broker and load process during
case 4: the frames with the most self time go into bench/RESULTS.md.

Then the phases: each side's broker again, started through
:mod:`bench.experiments.publish_path.traced` (a clock reading where each phase of a publish
begins and ends), under case 1 with one message in flight at a time;
:mod:`bench.experiments.publish_path.phases` puts the broker's and the load process's
readings on one time line and takes every message apart: the request reaching the loop,
HTTP and the handler, the hand-off to the writer thread, the write, the fdatasync, the
commit, the hand-off back, the fan-out and its socket write, and the socket to the ``Conn``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench.experiments.publish_path.phases import breakdown as phase_breakdown
from bench.experiments.publish_path.phases import summary as phase_summary
from bench.experiments.publish_path.phases import table as phase_table
from bench.harness.checkouts import Code, other_checkout, this_checkout, worktree
from bench.harness.figures import Row
from bench.harness.flames import py_spy, record, table
from bench.harness.procs import Proc, broker
from bench.harness.results import add_to_json, command_line, report
from bench.harness.sampling import cpu_seconds, load_average

LOAD = Path(__file__).with_name("load.py")
TRACED = Path(__file__).with_name("traced.py")
BEFORE = "eab2696"
CASES = ("lean", "lean-producer", "client-plain", "client")
RATE = 1000


def one_run(code: Code, url: str, pid: int, case: str, topic: int, seconds: float,
            profile: Path | None, times: Path | None = None) -> dict[str, Any]:
    """One load process against one broker: its JSON, and the broker's CPU per message
    (``times``: where the load process writes every message's times)."""
    before = cpu_seconds(pid)
    proc = subprocess.Popen([sys.executable, str(LOAD), url, case, str(topic), str(RATE),
                             str(seconds), *([str(times)] if times else [])],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=code.env, cwd=code.cwd)
    spies = ([record(pid, seconds, profile / "broker.txt"),
              record(proc.pid, seconds, profile / "client.txt")] if profile else [])
    try:
        out, err = proc.communicate(timeout=seconds + 120)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    for spy in spies:
        spy.wait(60)
    if proc.returncode != 0:
        raise RuntimeError(f"{case} on the {code.arm} side failed: {err.strip()[-500:]}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    result["broker_cpu_us_per_message"] = (cpu_seconds(pid) - before) * 1e6 / result["count"]
    return result


def measure(tmp: Path, rounds: int, seconds: float, before_rev: str) -> dict[str, Any]:
    """Every round, both sides, every case."""
    with contextlib.ExitStack() as stack:
        sides = {"before": other_checkout("before", before_rev,
                                          stack.enter_context(worktree(before_rev, tmp))),
                 "after": this_checkout()}
        procs: dict[str, tuple[Proc, str]] = {}
        for arm, code in sides.items():
            code.check_import()
            procs[arm] = broker(tmp / f"data-{arm}", "--fsync", "always", log=tmp / f"{arm}.log",
                                env=code.env, cwd=code.cwd)
            stack.callback(procs[arm][0].stop)
        results: dict[str, dict[str, list[dict[str, Any]]]] = {
            arm: {case: [] for case in CASES} for arm in sides}
        topic = 100
        for k in range(rounds):
            order = list(sides) if k % 2 == 0 else list(reversed(sides))
            for arm in order:
                proc, url = procs[arm]
                for case in CASES:
                    topic += 1
                    profile = (tmp if k == rounds - 1 and arm == "after" and case == "client"
                               and py_spy() is not None else None)
                    run = one_run(sides[arm], url, proc.pid, case, topic, seconds, profile)
                    results[arm][case].append(run)
                    print(f"  round {k + 1} {arm:6} {case:13} ack p50 {run['ack']['p50']:.2f} "
                          f"p99 {run['ack']['p99']:.2f} ms, delivered p50 "
                          f"{run['delivered']['p50']:.2f} p99 {run['delivered']['p99']:.2f} ms; "
                          f"CPU per message: load {run['cpu_us_per_message']:.0f} µs, broker "
                          f"{run['broker_cpu_us_per_message']:.0f} µs", flush=True)
        for proc, _url in procs.values():
            proc.stop()
        phases = {arm: traced_run(tmp, sides[arm], seconds) for arm in ("after", "before")}
        flames = [table(tmp / f"{name}.txt", title) for name, title in (
            ("broker", "The after side's broker during case 4 (Client.publish), last round"),
            ("client", "The load process (Client.publish + Conn) in the same run"))
            if (tmp / f"{name}.txt").exists()]
        return {"results": results, "revs": {arm: c.rev for arm, c in sides.items()},
                "flames": flames, "phases": phases}


def traced_run(tmp: Path, code: Code, seconds: float) -> dict[str, Any]:
    """The lean publisher, one message in flight at a time, against a traced broker of
    ``code``: the phases of its publishes."""
    events, times = tmp / f"phases-broker-{code.arm}.json", tmp / f"phases-load-{code.arm}.json"
    proc, url = broker(tmp / f"phases-data-{code.arm}", "--fsync", "always",
                       log=tmp / f"phases-{code.arm}.log",
                       launcher=[sys.executable, str(TRACED)],
                       env={**code.env, "PUBLISH_PHASES_OUT": str(events)}, cwd=code.cwd)
    try:
        one_run(code, url, proc.pid, "lean-alone", 1, seconds, None, times)
    finally:
        proc.stop()
    found = phase_breakdown(json.loads(times.read_text()), json.loads(events.read_text()))
    print(f"  phases {code.arm}: {found['taken_apart']} of {found['messages']} messages "
          f"taken apart", flush=True)
    return found


def med(runs: list[dict[str, Any]], *keys: str) -> float:
    values = []
    for run in runs:
        value: Any = run
        for key in keys:
            value = value[key]
        values.append(float(value))
    return float(statistics.median(values))


def rows(results: dict[str, dict[str, list[dict[str, Any]]]]) -> list[Row]:
    names = {"lean": "lean HTTP/1.1 publisher (the broker's part)",
             "lean-producer": "lean publisher with producer headers (+ idempotence)",
             "client-plain": "Client.publish, idempotent=False (+ the client library)",
             "client": "Client.publish as users run it (idempotent)"}
    out = []
    for case in CASES:
        after, before = results["after"][case], results["before"][case]
        out.append(Row(f"{names[case]}: publish → Conn p50", med(after, "delivered", "p50"),
                       "ms", "the code of 11-25", med(before, "delivered", "p50")))
        out.append(Row(f"{names[case]}: publish → Conn p99", med(after, "delivered", "p99"),
                       "ms", "the code of 11-25", med(before, "delivered", "p99")))
    return out


def breakdown(results: dict[str, dict[str, list[dict[str, Any]]]], arm: str) -> str:
    """Where one side's p50 goes, case by case (differences of medians)."""
    r = results[arm]

    def p50(case: str, what: str = "delivered") -> float:
        return med(r[case], what, "p50")

    return (f"{arm}: the broker's part (lean) {p50('lean'):.2f} ms, of it "
            f"{p50('lean', 'after_ack'):.2f} ms from the acknowledgement to the Conn; "
            f"idempotence adds {p50('lean-producer') - p50('lean'):+.2f} ms; the client library "
            f"adds {p50('client-plain') - p50('lean'):+.2f} ms; both (Client.publish as users "
            f"run it) {p50('client') - p50('lean'):+.2f} ms. CPU per message of the load "
            f"process (publisher + Conn): lean {med(r['lean'], 'cpu_us_per_message'):.0f} µs, "
            f"Client.publish {med(r['client'], 'cpu_us_per_message'):.0f} µs; of the broker: "
            f"lean {med(r['lean'], 'broker_cpu_us_per_message'):.0f} µs, with producer headers "
            f"{med(r['lean-producer'], 'broker_cpu_us_per_message'):.0f} µs.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--before", default=BEFORE, help="the commit to compare with")
    args = parser.parse_args()
    started = time.perf_counter()
    load = load_average()
    with tempfile.TemporaryDirectory(prefix="bench-publish-path-") as t:
        run = measure(Path(t), args.rounds, args.seconds, args.before)
    results = run["results"]
    notes = (
        f"After: {run['revs']['after']}; before: {run['revs']['before']} (a git worktree, its "
        f"own broker and client). {args.rounds} rounds alternating the sides, each run "
        f"{RATE:,} messages/s of 100 B for {args.seconds:.0f} s, one streaming Conn reading; "
        f"medians of the rounds. Load average at the start: {load}; runtime "
        f"{time.perf_counter() - started:.0f} s.\n\n**Where the milliseconds go.** "
        + breakdown(results, "after") + " " + breakdown(results, "before")
        + "\n\nA group of single-message publishes writes no state journal line (a frame is "
        "whole or cut by its checksum), so it pays one fdatasync; a group with producer "
        "headers writes its line and fsyncs it before its frames. Once a group is durable the "
        "streams that follow its topics are written to before its publishers are answered. "
        "The client library's part is aiohttp's request machinery on both sides of the "
        "connection (see the load process's frames below)."
        + "\n\n" + phases_notes(run["phases"], run["revs"])
        + "".join(f"\n\n{f}" for f in run["flames"]))
    report("publish-path", "Publish → subscriber through the Python client: where the "
           "milliseconds go (A/B against 11-25)", rows(results), command_line(), notes=notes)
    add_to_json("publish-path", {"runs": results, "revs": run["revs"],
                                 "phases": run["phases"]})


def phases_notes(phases: dict[str, dict[str, Any]], revs: dict[str, str]) -> str:
    """The phases table and what it took apart."""
    counts = ", ".join(f"{arm} {p['taken_apart']} of {p['messages']}"
                       for arm, p in phases.items())
    return (f"**The phases of one publish** (case 1's lean publisher with one message in "
            f"flight at a time, 1,000 a second, against a traced broker "
            f"of each side: after {revs['after']}, before {revs['before']}; messages taken "
            f"apart, those alone in flight: {counts}). Each row is the time between two clock "
            f"readings on the system's monotonic clock, in the broker or the load process, "
            f"over the same messages; the means add up to the mean total, the p50s only "
            f"roughly. A phase that a side's code has no reading for shows '-'. After, "
            f"{phase_summary(phases['after'])}; before, {phase_summary(phases['before'])}."
            "\n\n" + phase_table({arm: phases[arm] for arm in ("after", "before")}))


if __name__ == "__main__":
    main()
