"""Latency budget: where the p50 of publish → subscriber at 1,000 msg/s goes, and what it would
take to reach Redis's, every figure measured in the same run.

Measurements, each a p50 and a p99 at 1,000 messages/s (paced, open loop):

1. the disk alone, 126 B (one 100 B message as a frame) per write, on the filesystem the
   broker's data lives on: (a) append + fdatasync to a growing file; (b) overwrite at the next
   offset of a file preallocated with zeros (fsynced once) + fdatasync; (c) the same in a file
   preallocated with posix_fallocate (unwritten extents); (d) pwrite with O_DSYNC, appending;
2. the thread hand-off alone on a uvloop loop, as LocalLog does it (deque append +
   threading.Event to a sleeping writer thread, back with call_soon_threadsafe), and with (a)
   on the writer thread;
3. the floor of a single-threaded Python server on this disk (floor_server.py, its own
   process): length-prefixed messages in, append + fdatasync inline on the loop as Redis does,
   frames out to a subscriber; the same with the fdatasync on a writer thread (our design
   minus HTTP); both again with a preallocated file;
4. our broker (--fsync always, and --fsync never) and Redis (appendonly, appendfsync always)
   end to end with the peer benchmark's lean socket clients.

Every server runs on 127.0.0.1 on a free port, its data in a temporary directory, and is
stopped by its PID. Rounds run the measurements in A B … B A order; figures are medians of
the rounds.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench.experiments.latency_budget.floor import floor_latency
from bench.experiments.latency_budget.handoff import Handoff
from bench.experiments.latency_budget.report import (
    DISK,
    LABELS,
    Summary,
    budget,
    detail_table,
    other_load,
    plot,
    table_rows,
)
from bench.harness import lean_clients as raw
from bench.harness import peer_servers as peers
from bench.harness import settings
from bench.harness.disk import fill
from bench.harness.figures import Figure, latencies
from bench.harness.loops import paced, run_loop
from bench.harness.payloads import FRAME, PAYLOAD
from bench.harness.procs import PortServer, Proc, Unavailable, broker, free_port
from bench.harness.results import add_to_json, command_line, report, results_under
from bench.harness.sampling import CLK_TCK, cpu_seconds, machine_busy
from messaging.frames import encode

GROUPS = ("disk", "handoff", "floor", "ours", "redis")
#: One 100 B message as our segments store it (a 26 B header and the payload).
RECORD = encode(1, 1, PAYLOAD)
#: Seconds a run may overrun its paced duration (a slow disk) before it stops early.
GRACE = 10.0
#: Seconds all rounds may take: a round after the first that would go past it is skipped.
TOTAL_BUDGET = 600.0

#: The Python floor's servers: key → (--mode, preallocated file).
FLOOR_SERVERS = {"floor-inline": ("inline", False), "floor-thread": ("thread", False),
                 "floor-inline-prealloc": ("inline", True),
                 "floor-thread-prealloc": ("thread", True)}


@dataclass
class Settings(settings.Settings):
    """Sizes of one run (``--quick`` shrinks them): ``rounds`` even, so that in A B … B A
    order every measurement sits at the same mean time; one round of one measurement is
    ``rate`` × ``seconds`` messages."""

    rounds: int = 4
    seconds: float = 1.25
    rate: int = 1000
    only: tuple[str, ...] = GROUPS

    @property
    def count(self) -> int:
        """Messages per round of one measurement."""
        return int(self.rate * self.seconds)


@dataclass
class Measurement:
    """One measured path: how to run it once, and its figures (µs) round by round."""

    key: str
    run: Callable[[], Awaitable[Figure]]
    timeout: float
    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""

    def summary(self) -> Summary:
        """Medians of the rounds (µs), every round's figures, the error if it failed."""
        others = [r["other_cores"] for r in self.runs]
        return {"label": LABELS[self.key], "error": self.error,
                "p50_us": statistics.median(self.p50) if self.p50 else None,
                "p99_us": statistics.median(self.p99) if self.p99 else None,
                "other_cores": max(others) if others else None,
                "all_delivered": all(r.get("all_delivered", True) for r in self.runs),
                "rounds": self.runs}


# -- 1. the disk alone ---------------------------------------------------------------------------

def disk_latency(kind: str, directory: Path, rate: int, count: int) -> Figure:
    """Seconds per 126 B durable write of ``kind`` (one of report.DISK), ``count``
    writes paced at ``rate``/s into a new file in ``directory`` (blocking: run it on a
    thread)."""
    path = directory / kind
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    flags |= {"disk-append": os.O_APPEND, "disk-dsync": os.O_DSYNC}.get(kind, 0)
    fd = os.open(path, flags, 0o644)
    delays: list[float] = []
    try:
        if kind == "disk-zeroed":
            fill(fd, count * FRAME)
        elif kind == "disk-fallocate":
            os.posix_fallocate(fd, 0, count * FRAME)
            os.fsync(fd)
        started = time.perf_counter()
        deadline = started + count / rate + GRACE
        for k in range(count):
            delay = started + k / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            before = time.perf_counter()
            if before > deadline:
                break
            if kind == "disk-append":
                os.write(fd, RECORD)
                os.fdatasync(fd)
            elif kind == "disk-dsync":
                os.pwrite(fd, RECORD, k * FRAME)
            else:
                os.pwrite(fd, RECORD, k * FRAME)
                os.fdatasync(fd)
            delays.append(time.perf_counter() - before)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return latencies(delays, count, len(delays))


# -- 2. the thread hand-off ----------------------------------------------------------------------

async def handoff_latency(path: Path | None, rate: int, seconds: float) -> Figure:
    """Round trips through a ``Handoff`` (LocalLog's) paced at ``rate``/s: from queueing a
    126 B record to its future resolving on the loop. With ``path``, the writer thread
    appends each group to that file and fdatasyncs it; without, it does nothing."""
    loop = asyncio.get_running_loop()
    fd = None
    if path is not None:
        fd = await asyncio.to_thread(os.open, path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC
                                     | os.O_APPEND, 0o644)

    def write(records: list[bytes]) -> None:
        if fd is not None:
            os.write(fd, b"".join(records))
            os.fdatasync(fd)

    def settle(futures: list[asyncio.Future[None]], error: BaseException | None) -> None:
        for future in futures:
            if not future.done():
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)

    handoff: Handoff[asyncio.Future[None]] = Handoff(loop, write, settle)
    delays: list[float] = []

    async def publish(k: int) -> None:
        future = loop.create_future()
        started = time.perf_counter()
        handoff.submit(RECORD, future)
        await future
        delays.append(time.perf_counter() - started)

    handoff.start()
    try:
        sent = await paced(rate, int(rate * seconds), publish)
    finally:
        await handoff.close()
        if fd is not None and path is not None:
            await asyncio.to_thread(os.close, fd)
            await asyncio.to_thread(partial(path.unlink, missing_ok=True))
    return latencies(delays, sent, len(delays))


# -- the servers ---------------------------------------------------------------------------------

class Servers:
    """The server processes selected, started once, stopped by their PIDs at the end."""

    def __init__(self, tmp: Path, s: Settings) -> None:
        self.tmp, self.s = tmp, s
        self.procs: list[Proc | PortServer] = []
        self.urls: dict[str, str] = {}
        self.ports: dict[str, tuple[int, int]] = {}  # floor: (publish, subscribe)
        self.redis_port: int | None = None
        self.notes: list[str] = []

    def start(self) -> None:
        """Start every selected server (blocking: before the loop runs)."""
        tmp, s = self.tmp, self.s
        if "floor" in s.only:
            # Every message of every round fits in the preallocated file.
            prealloc = (s.rounds * s.count * FRAME // (1 << 20) + 2) << 20
            for key, (mode, preallocated) in FLOOR_SERVERS.items():
                ports = (free_port(), free_port())
                args = ["--prealloc", str(prealloc)] if preallocated else []
                if self._start(key, partial(
                        Proc, [sys.executable, "-m",
                               "bench.experiments.latency_budget.floor_server",
                               str(ports[0]), str(ports[1]), str(tmp / f"{key}.log"),
                               "--mode", mode, *args], "ready", log=tmp / "floor.stderr")):
                    self.ports[key] = ports
        if "ours" in s.only:
            for key, fsync in (("ours", "always"), ("ours-nofsync", "never")):
                self._start(key, partial(broker, tmp / key, "--fsync", fsync,
                                         log=tmp / f"{key}.stderr"))
        if "redis" in s.only:
            self._start("redis", lambda: peers.redis(tmp / "redis"))

    def _start(self, key: str, start: Callable[[], Any]) -> bool:
        """Start one server; one that cannot start is a note, and False."""
        try:
            started = start()
        except (Unavailable, RuntimeError, OSError) as err:
            self.notes.append(f"{key}: skipped ({str(err).splitlines()[0][:200]})")
            print(f"  {self.notes[-1]}", flush=True)
            return False
        if isinstance(started, tuple):
            self.procs.append(started[0])
            self.urls[key] = started[1]
        else:
            self.procs.append(started)
            if isinstance(started, PortServer):
                self.redis_port = started.port
        return True

    def stop(self) -> None:
        """Stop every server started, by its PID."""
        for proc in self.procs:
            try:
                proc.stop()
            except Exception as err:  # the others are still stopped
                print(f"stopping pid {proc.pid}: {err}", file=sys.stderr)


def measurements(servers: Servers, s: Settings) -> list[Measurement]:
    """Every measurement whose group is selected and whose server started, in run order."""
    tmp, rate, secs = servers.tmp, s.rate, s.seconds
    timeout = secs + GRACE + 30
    out: list[Measurement] = []
    if "disk" in s.only:
        for key in DISK:
            out.append(Measurement(key, partial(asyncio.to_thread, disk_latency, key, tmp,
                                                rate, s.count), timeout))
    if "handoff" in s.only:
        out.append(Measurement("handoff", partial(handoff_latency, None, rate, secs),
                               timeout))
        out.append(Measurement("handoff-disk", partial(
            handoff_latency, tmp / "handoff-disk", rate, secs), timeout))
    for key in FLOOR_SERVERS:
        if key in servers.ports:
            out.append(Measurement(key, partial(floor_latency, *servers.ports[key], rate,
                                                secs), timeout))
    topics = iter(range(1, 1_000_000))  # a fresh topic per run of ours

    def ours(url: str) -> Awaitable[Figure]:
        return raw.ours_fanout_raw(url, next(topics), 1, rate, secs, 1)

    for key in ("ours", "ours-nofsync"):
        if key in servers.urls:
            out.append(Measurement(key, partial(ours, servers.urls[key]), timeout))
    if servers.redis_port is not None:
        out.append(Measurement("redis", partial(raw.redis_fanout_raw, servers.redis_port,
                                                "latency", 1, rate, secs, 1), timeout))
    return out


def own_seconds(pids: list[int]) -> float:
    """CPU seconds this process (every thread) and the servers it started have used, and the
    kernel's threads (children of kthreadd, pid 2): they flush our writes as well as others'."""
    kernel = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # it ended meanwhile
        if fields[1] == "2":  # its parent's pid
            kernel += int(fields[11]) + int(fields[12])
    return (time.process_time() + sum(cpu_seconds(pid) for pid in pids)
            + kernel / CLK_TCK)


async def measure(m: Measurement, pids: list[int]) -> None:
    """One run of ``m``; a failure is recorded and its later rounds are skipped.

    Also records how many cores other processes kept busy meanwhile (the machine's busy time
    minus this process's, its servers' and the kernel threads'): a figure taken beside
    someone else's load says so in the report.
    """
    if m.error:
        return
    busy, own, started = machine_busy(), own_seconds(pids), time.perf_counter()
    try:
        figure = await asyncio.wait_for(m.run(), m.timeout)
    except Exception as err:  # a failed path is a note in the table, not a traceback
        m.error = f"{type(err).__name__}: {str(err)[:200]}"
        print(f"    {m.key}: failed: {m.error}", flush=True)
        return
    elapsed = time.perf_counter() - started
    others = max(0.0, (machine_busy() - busy) - (own_seconds(pids) - own)) / elapsed
    p50, p99 = figure.value * 1000, figure.extra["p99"] * 1000  # ms → µs
    m.p50.append(p50)
    m.p99.append(p99)
    m.runs.append({"p50_us": p50, "p99_us": p99, "sent": figure.extra.get("sent"),
                   "received": figure.extra.get("received"),
                   "all_delivered": figure.extra.get("all_delivered", True),
                   "other_cores": others})
    print(f"    {m.key}: p50 {p50:,.0f} µs, p99 {p99:,.0f} µs (other processes: "
          f"{others:.2f} cores)", flush=True)


async def run(ms: list[Measurement], s: Settings, notes: list[str], pids: list[int]) -> None:
    """Every round, in A B … B A order, while the time budget lasts."""
    started = time.monotonic()
    for r in range(s.rounds):
        spent = time.monotonic() - started
        if r > 0 and spent * (r + 1) / r > TOTAL_BUDGET:
            notes.append(f"{s.rounds - r} of {s.rounds} rounds skipped (time budget)")
            print(f"  {notes[-1]}", flush=True)
            return
        print(f"  round {r + 1}", flush=True)
        for m in ms if r % 2 == 0 else ms[::-1]:
            await measure(m, pids)


def parse_args() -> tuple[Settings, Path | None, bool]:
    """The settings, the ``--out`` directory and ``--quick`` from the command line."""
    p = settings.parser(__doc__, "one round of 400 messages per measurement: seconds, not "
                        "minutes")
    p.add_argument("--only", default=",".join(GROUPS),
                   help=f"measurements to run, comma-separated, of {','.join(GROUPS)}")
    args = p.parse_args()
    only = settings.only(p, args.only, GROUPS, "measurements")
    s = Settings(rounds=1, seconds=0.4, only=only) if args.quick else Settings(only=only)
    return settings.with_rounds(s, args), args.out, args.quick


def main() -> None:
    """Start the servers, run every round, stop the servers by PID, write the report."""
    s, out, quick = parse_args()
    started = time.perf_counter()
    ms: list[Measurement] = []
    # The broker's data directory in the peer benchmark: the same filesystem here.
    with tempfile.TemporaryDirectory(prefix="bench-latency-",
                                     dir=os.environ.get("BENCH_DIR")) as t:
        servers = Servers(Path(t), s)
        try:
            servers.start()
            ms = measurements(servers, s)
            run_loop(run(ms, s, servers.notes, [proc.pid for proc in servers.procs]))
        finally:
            servers.stop()
    runtime = time.perf_counter() - started
    where = results_under(out, quick=quick, bench="latency")
    summaries = {m.key: m.summary() for m in ms}
    text, computed = budget(summaries)
    how = (f"Every figure at {s.rate:,} messages/s, paced open loop: {s.rounds} round(s) of "
           f"{s.count:,} messages per measurement in A B … B A order; p50 and p99 are medians "
           f"of the rounds' figures. 126 B per write is one 100 B message as a frame. The data "
           f"of every server and of the disk runs is on the same filesystem (a temporary "
           f"directory, as the peer benchmark's). Runtime {runtime:.0f} s. "
           + other_load(summaries))
    notes = "\n\n".join([how, text, detail_table(summaries)]
                        + ([f"Notes: {'; '.join(servers.notes)}."] if servers.notes else [])
                        + ["![latency budget](results/latency-budget.png)"])
    report("latency", "Latency budget: publish → subscriber p50 at 1,000 msg/s",
           table_rows(summaries), command_line(), notes=notes)
    plot(summaries)
    add_to_json("latency", {"settings": asdict(s), "measurements": summaries, "budget": computed,
                            "notes": servers.notes, "runtime_seconds": runtime})
    print(text)
    print(f"runtime {runtime:.0f} s; results in {where}")


if __name__ == "__main__":
    main()
