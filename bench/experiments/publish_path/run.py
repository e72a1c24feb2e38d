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

from bench.harness.checkouts import Code, other_checkout, this_checkout, worktree
from bench.harness.figures import Row
from bench.harness.flames import py_spy, record, table
from bench.harness.procs import Proc, broker
from bench.harness.results import add_to_json, command_line, report
from bench.harness.sampling import cpu_seconds, load_average

LOAD = Path(__file__).with_name("load.py")
BEFORE = "eab2696"
CASES = ("lean", "lean-producer", "client-plain", "client")
RATE = 1000


def one_run(code: Code, url: str, pid: int, case: str, topic: int, seconds: float,
            profile: Path | None) -> dict[str, Any]:
    """One load process against one broker: its JSON, and the broker's CPU per message."""
    before = cpu_seconds(pid)
    proc = subprocess.Popen([sys.executable, str(LOAD), url, case, str(topic), str(RATE),
                             str(seconds)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
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
        flames = [table(tmp / f"{name}.txt", title) for name, title in (
            ("broker", "The after side's broker during case 4 (Client.publish), last round"),
            ("client", "The load process (Client.publish + Conn) in the same run"))
            if (tmp / f"{name}.txt").exists()]
        return {"results": results, "revs": {arm: c.rev for arm, c in sides.items()},
                "flames": flames}


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
        + "\n\nEvery group now writes its state journal line (its commit mark: what makes a "
        "batch all or nothing after a crash) after its frames, and both are fsynced before the "
        "answer: a plain group pays a second fdatasync after its frames' (about 0.1 ms on this "
        "disk, measured alone), an idempotent group paid two before as well (its line was "
        "synced before its frames were written). The "
        "client library's part is aiohttp's request machinery on both sides of the "
        "connection (see the load process's frames below)."
        + "".join(f"\n\n{f}" for f in run["flames"]))
    report("publish-path", "Publish → subscriber through the Python client: where the "
           "milliseconds go (A/B against 11-25)", rows(results), command_line(), notes=notes)
    add_to_json("publish-path", {"runs": results, "revs": run["revs"]})


if __name__ == "__main__":
    main()
