"""Our broker before and after a change, in the same run (``bench/peers/run.py --ab``).

"Before" is the broker of another commit (by default 1b2e5e1, the code before append times):
a git worktree of it in a temporary directory, started with this venv's Python, that
worktree first on ``PYTHONPATH`` and as its working directory (``python -m`` puts the working
directory first on ``sys.path``, before ``PYTHONPATH`` and the editable install). "After" is
this checkout as it is (or a worktree of ``--ab-after``). Both brokers run at once, each on
127.0.0.1 on a free port with its own data directory and ``--fsync always``, and are stopped
by their PIDs; the worktrees are removed at the end (``git worktree remove --force``).

Which copy of ``messaging`` each broker imports is checked before it starts (the same
interpreter, environment and working directory print ``messaging.__file__``) and after the
runs (the before-times broker must have written no time index, ``*.time``, and the other
must have).

Workloads, each run in rounds that alternate the two brokers (before, after; then after,
before; ...), figures the medians of the rounds:

1. single 100 B POSTs, ``wrk -t2 -c50``: requests/s, and wrk's latency p50/p99 under it;
2. batch publish, 1000 × 100 B per request, 4 senders: messages/s;
3. single publish round trip at 1,000 POSTs/s (open loop, lean socket client, 8
   connections): p50 and p99.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.harness.checkouts import git, other_checkout, this_checkout, worktree
from bench.harness.figures import Figure, Row, doubled_p50, fmt, percentile
from bench.harness.http_load import aiohttp_rate, wrk_rate
from bench.harness.lean_clients import (
    PUBLISHERS,
    RequestReply,
    close_all,
    connect,
    http_response,
    ours_fanout_raw,
    publish_paced,
)
from bench.harness.payloads import PAYLOAD
from bench.harness.procs import Proc, broker, ensure_tool
from bench.harness.sampling import cpu_seconds, load_average
from bench.peers.load import ours_batch_rate

#: The commit before append times (5bfb532 added them).
BEFORE_REV = "1b2e5e1"
SINGLE_TOPIC, BATCH_TOPIC, LATENCY_TOPIC = 1, 2, 3
#: Each publish → subscriber run streams a topic of its own, from this id on.
DELIVERY_TOPICS = 1000
#: Targets: batch throughput after ≥ this share of before; single-publish p50 after ≤
#: before + this many ms.
BATCH_SHARE, P50_SLACK_MS = 0.95, 0.050
#: A single-publish p50 after this many times before's fails the A/B run (exit status 1):
#: the latency that the same run's peers are measured against has doubled.
P50_REGRESSION = 2.0


def p50_regression(results: dict[str, dict[str, ArmResult]]) -> str | None:
    """Why the run must fail (:func:`~bench.harness.figures.doubled_p50` of the single
    publish round trip's medians, or of publish → subscriber's), or None."""
    for workload, what in (("latency", "single publish"),
                           ("delivery", "publish → subscriber")):
        arms = results.get(workload)
        if arms is None:
            continue
        reason = doubled_p50(arms["after"].median(), arms["before"].median(), P50_REGRESSION,
                             what)
        if reason is not None:
            return reason
    return None
ARMS = ("before", "after")


@dataclass
class ABSettings:
    """Rounds (each runs both brokers once per workload) and each run's seconds."""

    rounds: int = 7
    seconds: float = 2.0
    latency_seconds: float = 3.0
    rate: int = 1000
    before: str = BEFORE_REV
    after: str = ""  # a commit, or "" for this checkout as it is


@dataclass
class ArmResult:
    """One broker's runs of one workload: each run's figure and the broker's CPU seconds."""

    figures: list[Figure] = field(default_factory=list)
    server_cpu: list[float] = field(default_factory=list)

    def median(self, key: str = "value") -> float | None:
        values = [f.value if key == "value" else f.extra.get(key) for f in self.figures]
        numbers = [float(v) for v in values if isinstance(v, int | float)]
        return statistics.median(numbers) if numbers else None


async def single_rate(wrk: str | None, url: str, seconds: float) -> Figure:
    path = f"/messaging/messages?topicID={SINGLE_TOPIC}"
    if wrk is None:
        return await aiohttp_rate(url + path, seconds)
    return await asyncio.to_thread(wrk_rate, wrk, url, path, seconds)


async def publish_latency(url: str, rate: int, seconds: float) -> Figure:
    """Round trips (request written → answer parsed) of single 100 B POSTs sent at ``rate``
    a second (open loop) over 8 kept-alive connections: p50 (the value) and p99 in ms."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    head = b"POST /messaging/messages?topicID=%d HTTP/1.1\r\nHost: %b\r\n" % (
        LATENCY_TOPIC, host.encode())
    request = head + b"Content-Length: %d\r\n\r\n%b" % (len(PAYLOAD), PAYLOAD)
    round_trips: list[float] = []
    pool: list[RequestReply] = []
    try:
        async with asyncio.timeout(30):
            pool = [await connect(host, port, lambda: RequestReply(http_response))
                    for _ in range(PUBLISHERS)]
        started = time.perf_counter()
        sent = await publish_paced(pool, rate, seconds, lambda _k: request,
                                   lambda status: status == 200, round_trips)
        elapsed = time.perf_counter() - started
    finally:
        close_all([p.transport for p in pool])
    if not round_trips:
        raise RuntimeError("no publish was answered")
    return Figure(percentile(round_trips, 50) * 1000, elapsed,
                  {"p99": percentile(round_trips, 99) * 1000, "sent": sent,
                   "answered": len(round_trips)})


WORKLOADS = {
    "single": "single 100 B POST, 50 connections (wrk -t2 -c50)",
    "batch": "batch publish, 1000 × 100 B per request, 4 senders",
    "latency": "single publish round trip at 1,000 POSTs/s (lean socket client)",
    "delivery": "publish → subscriber at 1,000 msg/s (lean socket clients, as the peer run's "
                "latency workload)",
}


async def run_ab(tmp: Path, s: ABSettings) -> dict[str, Any]:
    """Both brokers, every workload's rounds; what they measured, and where the code came
    from."""
    wrk = ensure_tool("wrk", "wrk")
    notes: list[str] = [f"load average at the start {load_average()}"]
    if wrk is None:
        notes.append("wrk could not be installed: single POSTs use an aiohttp load generator")
    with contextlib.ExitStack() as stack:
        codes = {"before": other_checkout("before", s.before,
                                          stack.enter_context(worktree(s.before, tmp))),
                 "after": (other_checkout("after", s.after,
                                          stack.enter_context(worktree(s.after, tmp)))
                           if s.after else this_checkout())}
        procs: dict[str, Proc] = {}
        urls: dict[str, str] = {}
        try:
            for arm, code in codes.items():
                code.check_import()
                print(f"  {arm}: {code.rev}, imports {code.imported}", flush=True)
                procs[arm], urls[arm] = broker(tmp / f"data-{arm}", "--fsync", "always",
                                               log=tmp / f"{arm}.log", env=code.env,
                                               cwd=code.cwd)
            results = await rounds(s, wrk, procs, urls)
            notes.append(f"at the end {load_average()} (other work on this shared machine "
                         "makes runs noisy; the brokers alternate so that both see it)")
        finally:
            for proc in procs.values():
                with contextlib.suppress(Exception):
                    proc.stop()
        time_files = {arm: len(list((tmp / f"data-{arm}").rglob("*.time"))) for arm in ARMS}
        # The default sides are the code before and after append times: their data shows
        # which code ran. Other commits both write time files.
        default = codes["before"].rev == git("rev-parse", "--short", BEFORE_REV)
        if default and (time_files["before"] != 0 or time_files["after"] == 0):
            raise RuntimeError(f"time index files written: {time_files}; expected none before "
                               "and some after: the brokers did not run the code they should")
    return {"results": results, "notes": notes, "time_files": time_files,
            "code": {arm: {"rev": c.rev, "imported": c.imported} for arm, c in codes.items()}}


async def rounds(s: ABSettings, wrk: str | None, procs: dict[str, Proc],
                 urls: dict[str, str]) -> dict[str, dict[str, ArmResult]]:
    runs: dict[str, Callable[[str], Awaitable[Figure]]] = {
        "single": lambda url: single_rate(wrk, url, s.seconds),
        "batch": partial(_batch, seconds=s.seconds),
        "latency": lambda url: publish_latency(url, s.rate, s.latency_seconds),
        "delivery": lambda url: ours_fanout_raw(url, next(topics), 1, s.rate,
                                                s.latency_seconds, 1),
    }
    topics = itertools.count(DELIVERY_TOPICS)
    results = {w: {arm: ArmResult() for arm in ARMS} for w in WORKLOADS}
    for workload, title in WORKLOADS.items():
        print(f"{workload}: {title}", flush=True)
        for r in range(s.rounds):
            order = ARMS if r % 2 == 0 else ARMS[::-1]
            for arm in order:
                before = cpu_seconds(procs[arm].pid)
                figure = await asyncio.wait_for(runs[workload](urls[arm]),
                                                s.latency_seconds + s.seconds + 120)
                result = results[workload][arm]
                result.server_cpu.append(cpu_seconds(procs[arm].pid) - before)
                result.figures.append(figure)
                extra = ", ".join(f"{k} {v:.3f}" for k, v in figure.extra.items()
                                  if k.endswith(("_ms", "p99")))
                print(f"  round {r + 1} {arm}: {figure.value:,.3f}"
                      + (f" ({extra})" if extra else ""), flush=True)
    return results


async def _batch(url: str, *, seconds: float) -> Figure:
    return await ours_batch_rate(url, BATCH_TOPIC, seconds)


def ab_rows(results: dict[str, dict[str, ArmResult]], before_name: str) -> list[Row]:
    """The table: each of "after"'s figures beside "before"'s, with the targets."""
    def pair(workload: str, key: str = "value") -> tuple[float | None, float | None]:
        arms = results[workload]
        return arms["after"].median(key), arms["before"].median(key)

    rows: list[Row] = []

    def add(name: str, workload: str, unit: str, key: str = "value", target: str = "",
            check: Callable[[float, float], bool] | None = None) -> None:
        after, before = pair(workload, key)
        if after is None or before is None:
            return
        rows.append(Row(name, after, unit, before_name, before, target,
                        check(after, before) if check else None))

    add("batch publish 1000 × 100 B, 4 senders", "batch", "msg/s",
        target=f"≥ {BATCH_SHARE:.2f}x before", check=lambda a, b: a >= BATCH_SHARE * b)
    add("single publish round trip p50 at 1,000 POSTs/s", "latency", "ms",
        target=f"≤ before + {P50_SLACK_MS * 1000:.0f} µs",
        check=lambda a, b: a <= b + P50_SLACK_MS)
    add("single publish round trip p99 at 1,000 POSTs/s", "latency", "ms", key="p99")
    add("publish → subscriber p50 at 1,000 msg/s", "delivery", "ms",
        target=f"< {P50_REGRESSION:g}x before", check=lambda a, b: a < P50_REGRESSION * b)
    add("publish → subscriber p99 at 1,000 msg/s", "delivery", "ms", key="p99")
    add("single POST rate, 50 connections (wrk -t2 -c50)", "single", "req/s")
    add("single POST latency p50 under that load (wrk)", "single", "ms", key="latency_p50_ms")
    add("single POST latency p99 under that load (wrk)", "single", "ms", key="latency_p99_ms")
    return rows


def cpu_per_op(result: ArmResult) -> float | None:
    """The broker's CPU µs per request or message over the runs (the value being a rate)."""
    done = sum(f.value * f.seconds for f in result.figures)
    return sum(result.server_cpu) / done * 1e6 if done else None


def ab_notes(run: dict[str, Any], s: ABSettings, runtime: float) -> str:
    results: dict[str, dict[str, ArmResult]] = run["results"]
    code = run["code"]

    def rounds_text(workload: str, key: str = "value") -> str:
        """Each arm's runs, and the median of the rounds' after/before ratios."""
        parts = []
        numbers = {}
        for arm in ARMS:
            values = [f.value if key == "value" else f.extra.get(key)
                      for f in results[workload][arm].figures]
            numbers[arm] = [float(v) for v in values if isinstance(v, int | float)]
            parts.append(f"{arm} " + ", ".join(
                fmt(float(v)) if isinstance(v, int | float) else "-" for v in values))
        ratios = [a / b for a, b in zip(numbers["after"], numbers["before"], strict=False) if b]
        if ratios and len(ratios) == len(numbers["before"]):
            parts.append(f"median of the rounds' ratios {statistics.median(ratios):.2f}x")
        return "; ".join(parts)

    cpu = []
    for workload, unit in (("single", "request"), ("batch", "message")):
        figures = {arm: cpu_per_op(results[workload][arm]) for arm in ARMS}
        before, after = figures["before"], figures["after"]
        if before is not None and after is not None:
            cpu.append(f"{workload}: {before:.2f} µs per {unit} before, {after:.2f} after")
    default_before = code["before"]["rev"] == git("rev-parse", "--short", BEFORE_REV)
    text = [
        f"**Before**: the broker of commit {code['before']['rev']}"
        f"{' (the code before append times)' if default_before else ''}, from a git "
        f"worktree (`git worktree add --detach <tmp> {s.before}`) started "
        "with this venv's Python, the worktree as its working directory and first on "
        f"`PYTHONPATH` (it imported `{code['before']['imported']}`). **After**: "
        f"{'commit ' if s.after else 'this checkout, '}{code['after']['rev']} (it imported "
        f"`{code['after']['imported']}`). Both run at once, `--fsync always`, each on "
        "127.0.0.1 with its own data directory; time index files (`*.time`) in their data "
        f"directories afterwards: before {run['time_files']['before']}, after "
        f"{run['time_files']['after']}. {s.rounds} rounds per workload, the two brokers "
        "alternating (before, after; then after, before; ...), medians; throughput runs of "
        f"{s.seconds:g} s, latency runs of {s.latency_seconds:g} s at {s.rate:,} POSTs/s "
        "(open loop, 8 kept-alive connections of a lean socket client; the round trip is from "
        "the request written to the answer parsed; publish → subscriber adds one streaming "
        "GET of a fresh topic and times each message from its request written to its bytes "
        "read from the stream). Targets: batch throughput after ≥ "
        f"{BATCH_SHARE:.2f}x before; single-publish p50 after ≤ before + "
        f"{P50_SLACK_MS * 1000:.0f} µs; the run fails (exit 1) when either p50 after is "
        f"{P50_REGRESSION:g}x before's or more. Runtime {runtime:.0f} s.",
        "Rounds: batch msg/s: " + rounds_text("batch") + ". Round-trip p50 ms: "
        + rounds_text("latency") + "; p99 ms: " + rounds_text("latency", "p99")
        + ". Publish → subscriber p50 ms: " + rounds_text("delivery") + "; p99 ms: "
        + rounds_text("delivery", "p99")
        + ". Single POST req/s: " + rounds_text("single") + "; wrk p50 ms: "
        + rounds_text("single", "latency_p50_ms") + ".",
    ]
    if cpu:
        text.append("Broker CPU: " + "; ".join(cpu) + ".")
    if run["notes"]:
        text.append("Notes: " + "; ".join(run["notes"]) + ".")
    return "\n\n".join(text)


def summaries(results: dict[str, dict[str, ArmResult]]) -> dict[str, Any]:
    """Every run's figures, for the JSON."""
    return {workload: {arm: {"values": [f.value for f in r.figures],
                             "extra": [f.extra for f in r.figures],
                             "seconds": [f.seconds for f in r.figures],
                             "server_cpu": r.server_cpu, "median": r.median()}
                       for arm, r in arms.items()}
            for workload, arms in results.items()}


def temporary_parent() -> Path:
    """A new temporary directory for the worktrees and the brokers' data."""
    return Path(tempfile.mkdtemp(prefix="bench-peers-ab-", dir=os.environ.get("BENCH_DIR")))
