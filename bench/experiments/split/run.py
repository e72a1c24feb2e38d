"""Split experiment: is one process (one GIL, one loop) what holds single POSTs below bare?

Single 100 B POSTs, ``wrk -t2 -c50``, ``--fsync always``, against four configurations:
bare aiohttp answering 204; our broker as it is (HTTP and the log's writer thread in one
process); and the split (processes.py beside this file): HTTP fronts running the broker's own
publish handler, which hand each command over a Unix socket to a log process running the real
``Broker`` and ``LocalLog(fsync="always")``, with one front and with two (SO_REUSEPORT).

Every server runs on 127.0.0.1 on a free port and is stopped by its PID. Rounds run the
configurations in A B … B A order; figures are medians of the rounds. Around every run the
CPU of each process (and of wrk) is read, so the table says CPU µs per request and cores per
process; the log's group counter says how many commands each write + fdatasync carried.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench.experiments.split.wire import ANSWER, STATS_KIND, stats_request
from bench.harness import results, settings
from bench.harness.disk import disk_rate
from bench.harness.figures import Row, fmt
from bench.harness.http_load import CONNECTIONS, wrk_rate
from bench.harness.payloads import PAYLOAD
from bench.harness.plots import plt
from bench.harness.procs import Proc, bare_server, broker, ensure_tool, free_port
from bench.harness.results import add_to_json, command_line, report, results_under
from bench.harness.sampling import children_cpu, cpu_seconds, machine_times

SINGLE_PATH = "/messaging/messages?topicID=1"
TARGET = 0.9
#: A process (or the machine) counts as saturated from this share of its cores.
BUSY = 0.85
#: The log's writer counts as disk-bound from this share of its time in fdatasync.
DISK_BOUND = 0.8
FRONTS = {"split-1": 1, "split-2": 2}
LABELS = {"bare": "bare aiohttp 204",
          "broker": "broker as it is (one process)",
          "split-1": "split: 1 HTTP front + log process",
          "split-2": "split: 2 HTTP fronts (SO_REUSEPORT) + log process"}


@dataclass
class Settings(settings.Settings):
    """Rounds and durations of one run (``--quick`` shrinks them); ``seconds``: one wrk run."""

    warmup: float = 1.0  # one unrecorded wrk run per configuration first (0: none)


@dataclass
class Config:
    """One column: where wrk sends its POSTs, the processes doing the work, and how to read
    the log's (groups written, broker index) when there is a log."""

    key: str
    url: str
    path: str
    pids: dict[str, int]
    stats: Callable[[], tuple[int, int]] | None = None


@dataclass
class Run:
    """One wrk run against one configuration."""

    rate: float
    seconds: float  # wrk's -d
    wall: float  # around the whole wrk run
    cpu: dict[str, float]  # process → CPU seconds during the run, "wrk" included
    machine: float  # cores of the whole machine busy during the run (anyone's work)
    groups: int | None = None
    commands: int | None = None

    @property
    def requests(self) -> float:
        return self.rate * self.seconds

    def us_per_request(self, process: str) -> float:
        return self.cpu[process] / self.requests * 1e6 if self.requests else 0.0

    def cores(self, process: str) -> float:
        return self.cpu[process] / self.wall if self.wall else 0.0


@dataclass
class Column:
    """A configuration's runs and their medians."""

    config: Config
    runs: list[Run] = field(default_factory=list)
    error: str = ""

    def median(self, figure: Callable[[Run], float | None]) -> float | None:
        values = [v for v in (figure(r) for r in self.runs) if v is not None]
        return statistics.median(values) if values else None

    @property
    def rate(self) -> float | None:
        return self.median(lambda r: r.rate)

    def processes(self) -> list[str]:
        return [*self.config.pids, "wrk"]

    def _process(self, process: str) -> dict[str, float | None]:
        return {"us_per_request": self.median(lambda r: r.us_per_request(process)),
                "cores": self.median(lambda r: r.cores(process))}

    def summary(self) -> dict[str, Any]:
        per_process = {p: self._process(p) for p in self.processes()}
        servers = list(self.config.pids)
        groups_per_s = self.median(lambda r: r.groups / r.wall if r.groups else None)
        per_group = self.median(
            lambda r: r.commands / r.groups if r.groups and r.commands is not None else None)
        return {"key": self.config.key, "label": LABELS[self.config.key], "error": self.error,
                "rate": self.rate,
                "rates": [r.rate for r in self.runs], "processes": per_process,
                "server_us_per_request": self.median(
                    lambda r: sum(r.us_per_request(p) for p in servers)),
                "all_cores": self.median(lambda r: sum(r.cores(p) for p in r.cpu)),
                "machine_cores": self.median(lambda r: r.machine),
                "groups_per_s": groups_per_s, "commands_per_group": per_group,
                "ceilings": ceilings(per_process, os.cpu_count() or 1),
                "runs": [asdict(r) for r in self.runs]}


def broker_stats(url: str) -> tuple[int, int]:
    """The broker's (groups written, index), from GET /messaging/diagnostics."""
    with urllib.request.urlopen(f"{url}/messaging/diagnostics", timeout=10) as resp:
        diagnostics = json.loads(resp.read())
    return int(diagnostics["groups"]), int(diagnostics["index"])


def log_stats(path: str) -> tuple[int, int]:
    """The log process's (groups written, index), asked on a connection of its own."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(path)
        sock.sendall(stats_request())
        answer = b""
        for _ in range(ANSWER.size):  # bounded: at least one byte a read
            chunk = sock.recv(ANSWER.size - len(answer))
            if not chunk:
                break
            answer += chunk
            if len(answer) == ANSWER.size:
                break
    kind, groups, index = ANSWER.unpack(answer)
    if kind != STATS_KIND:
        raise RuntimeError(f"the log process answered kind {kind} to a stats request")
    return groups, index


class Servers:
    """Every configuration's processes, started once and stopped by PID at the end."""

    def __init__(self, tmp: Path, sockets: Path) -> None:
        self.tmp, self.sockets = tmp, sockets
        self.procs: list[Proc] = []
        self.configs: list[Config] = []

    def _keep(self, started: tuple[Proc, str]) -> tuple[Proc, str]:
        self.procs.append(started[0])
        return started

    def _front_or_log(self, *args: str) -> Proc:
        proc = Proc([sys.executable, "-m", "bench.experiments.split.processes", *args], "ready",
                    log=self.tmp / "split.log")
        self.procs.append(proc)
        return proc

    def split(self, key: str, fronts: int) -> Config:
        """A log process and ``fronts`` HTTP fronts sharing one port."""
        path = str(self.sockets / f"{key}.sock")
        log = self._front_or_log("log", "--data", str(self.tmp / key), "--socket", path)
        port = free_port()
        pids = {f"front {i + 1}" if fronts > 1 else "front":
                self._front_or_log("front", "--port", str(port), "--log", path).pid
                for i in range(fronts)}
        return Config(key, f"http://127.0.0.1:{port}", SINGLE_PATH, pids | {"log": log.pid},
                      lambda: log_stats(path))

    def start(self) -> list[Config]:
        bare, bare_url = self._keep(bare_server())
        ours, url = self._keep(broker(self.tmp / "broker", "--fsync", "always",
                                      log=self.tmp / "broker.log"))
        self.configs = [Config("bare", bare_url, "/204", {"bare": bare.pid}),
                        Config("broker", url, SINGLE_PATH, {"broker": ours.pid},
                               lambda: broker_stats(url)),
                        *(self.split(key, n) for key, n in FRONTS.items())]
        return self.configs

    def stop(self) -> None:
        for proc in reversed(self.procs):  # fronts before their log process
            proc.stop()


def measure(wrk: str, config: Config, seconds: float) -> Run:
    """One wrk run, with every process's CPU and the log's groups read around it."""
    before = {p: cpu_seconds(pid) for p, pid in config.pids.items()}
    wrk_before = children_cpu()
    stats_before = config.stats() if config.stats else None
    busy, total = machine_times()
    started = time.perf_counter()
    figure = wrk_rate(wrk, config.url, config.path, seconds)
    wall = time.perf_counter() - started
    cpu = {p: cpu_seconds(pid) - before[p] for p, pid in config.pids.items()}
    cpu["wrk"] = children_cpu() - wrk_before
    busy_after, total_after = machine_times()
    machine = ((busy_after - busy) / (total_after - total) * (os.cpu_count() or 1)
               if total_after > total else 0.0)
    run = Run(figure.value, figure.seconds, wall, cpu, machine)
    if config.stats and stats_before:
        groups, index = config.stats()
        run.groups, run.commands = groups - stats_before[0], index - stats_before[1]
    return run


def run(tmp: Path, s: Settings, wrk: str) -> tuple[dict[str, Column], float]:
    """Every configuration, rounds in A B … B A order; and the disk's fsync rate."""
    fsync_rate = disk_rate(tmp / "disk", len(PAYLOAD), seconds=2.0, max_writes=200_000)
    with tempfile.TemporaryDirectory(prefix="split-") as sockets:  # short Unix socket paths
        servers = Servers(tmp, Path(sockets))
        try:
            columns = {c.key: Column(c) for c in servers.start()}
            if s.warmup:
                for column in columns.values():
                    wrk_rate(wrk, column.config.url, column.config.path, s.warmup)
            for r in range(s.rounds):
                order = list(columns.values())
                print(f"round {r + 1}", flush=True)
                for column in order if r % 2 == 0 else order[::-1]:
                    if column.error:
                        continue
                    try:
                        figure = measure(wrk, column.config, s.seconds)
                    except (RuntimeError, OSError, ValueError) as err:
                        column.error = f"{type(err).__name__}: {str(err)[:200]}"
                        print(f"  {LABELS[column.config.key]}: failed: {column.error}")
                        continue
                    column.runs.append(figure)
                    print(f"  {LABELS[column.config.key]}: {figure.rate:,.0f} req/s",
                          flush=True)
        finally:
            servers.stop()
    return columns, fsync_rate


# -- the report -----------------------------------------------------------------------------


def rows(w: dict[str, dict[str, Any]]) -> list[Row]:
    """Each configuration's median rate beside bare aiohttp's from the same run."""
    bare = w["bare"]["rate"]
    out = []
    for key in ("broker", *FRONTS):
        rate = w[key]["rate"]
        if rate is None:
            continue
        met = rate >= TARGET * bare if bare else None
        out.append(Row(f"{LABELS[key]}: single 100 B POST, fsync always, wrk -t2 -c{CONNECTIONS}",
                       rate, "req/s", LABELS["bare"], bare, f"≥ {TARGET}x bare", met))
    return out


def cpu_table(w: dict[str, dict[str, Any]]) -> str:
    """CPU µs per request and cores per process, for every configuration."""
    bare = w["bare"]["rate"]
    lines = ["| configuration | req/s | × bare | process | CPU µs / request | cores |",
             "|---|---|---|---|---|---|"]
    for c in w.values():
        if c["rate"] is None:
            lines.append(f"| {c['label']} | failed: {c['error']} | | | | |")
            continue
        ratio = f"{c['rate'] / bare:.2f}x" if bare else "-"
        first = f"| {c['label']} | {fmt(c['rate'])} | {ratio} "
        for i, (process, p) in enumerate(c["processes"].items()):
            lead = first if i == 0 else "| | | "
            lines.append(f"{lead}| {process} | {fmt(p['us_per_request'])} | "
                         f"{fmt(p['cores'])} |")
        lines.append(f"| | | | servers together | {fmt(c['server_us_per_request'])} | "
                     f"{fmt(c['all_cores'])} (with wrk) |")
    return "\n".join(lines)


def limits_table(w: dict[str, dict[str, Any]], fsync_rate: float) -> str:
    """Per configuration: the rates its CPU per request allows, how busy the machine was,
    and its log's write + fdatasync rounds."""
    bare = w["bare"]["rate"]
    cpus = os.cpu_count() or 1

    def times_bare(rate: float | None) -> str:
        return f"{fmt(rate)} ({rate / bare:.2f}x)" if rate and bare else "-"

    lines = ["| configuration | busiest process: CPU µs / request | req/s with it at one core "
             f"| req/s with all {cpus} cores on this work | machine cores busy (anyone's) "
             f"| write + fdatasync rounds/s | commands per round | writer's time in "
             f"fdatasync (at {fmt(fsync_rate)}/s) |", "|---|---|---|---|---|---|---|---|"]
    for c in w.values():
        if c["rate"] is None:
            continue
        ce = c["ceilings"]
        rounds = c["groups_per_s"]
        lines.append(
            f"| {c['label']} | {ce['busiest']}: {fmt(ce['busiest_us'])} "
            f"| {times_bare(ce['one_core'])} | {times_bare(ce['all_cores'])} "
            f"| {fmt(c['machine_cores'])} | {fmt(rounds)} | {fmt(c['commands_per_group'])} "
            f"| {f'{rounds / fsync_rate:.0%}' if rounds and fsync_rate else '-'} |")
    return "\n".join(lines)


def ceilings(processes: dict[str, dict[str, float | None]], cpus: int) -> dict[str, Any]:
    """The rates a configuration's CPU per request allows: with its busiest process at one
    core (one GIL, one loop), and with all ``cpus`` cores doing its processes' and wrk's work.
    """
    us = {name: p["us_per_request"] or 0.0 for name, p in processes.items()}
    servers = {name: v for name, v in us.items() if name != "wrk"}
    busiest = max(servers, key=servers.__getitem__)
    every = sum(us.values())
    return {"busiest": busiest, "busiest_us": servers[busiest], "every_us": every,
            "one_core": 1e6 / servers[busiest] if servers[busiest] else None,
            "all_cores": cpus * 1e6 / every if every else None}


def conclusion(w: dict[str, dict[str, Any]], fsync_rate: float) -> str:
    """What this run shows, computed from its figures: the rates against the target, what
    capped the broker in its one process, what the split changed, and what held the best
    split (the machine, one process, the disk, or the round trip of a group)."""
    bare, ours = w["bare"], w["broker"]
    splits = {k: w[k] for k in FRONTS if w[k]["rate"] is not None}
    if not bare["rate"] or ours["rate"] is None or not splits:
        return "**What this shows.** Not enough configurations ran to say."
    b = bare["rate"]
    best = max(splits.values(), key=lambda c: c["rate"])
    reached = "reaches" if best["rate"] >= TARGET * b else "does not reach"
    parts = [f"The broker as it is reached {ours['rate'] / b:.2f}x bare aiohttp; with HTTP in "
             "processes of its own the split reached "
             + " and ".join(f"{c['rate'] / b:.2f}x with {_fronts(k)}"
                            for k, c in splits.items())
             + f", so moving HTTP off the log's process {reached} the {TARGET}x target."]
    cap = ours["ceilings"]["one_core"]
    cores = ours["processes"]["broker"]["cores"] or 0.0
    if cap:
        held = ("so one process (one GIL, one loop) is what holds the broker as it is"
                if cores >= BUSY else "so its one process was not the whole limit")
        parts.append(f"The broker's one process used {cores:.2f} cores at "
                     f"{ours['server_us_per_request']:.0f} µs of CPU per request, which caps "
                     f"it at {cap / b:.2f}x bare; it ran at {ours['rate'] / cap:.0%} of that "
                     f"cap, {held}.")
    parts.append(
        "Splitting moves that cap to "
        + " and ".join(f"{c['ceilings']['one_core'] / b:.2f}x with {_fronts(k)} (its "
                       f"busiest process, {c['ceilings']['busiest']}, at "
                       f"{c['ceilings']['busiest_us']:.0f} µs per request)"
                       for k, c in splits.items() if c["ceilings"]["one_core"])
        + ", but costs more CPU per request in all: "
        + " and ".join(f"{c['server_us_per_request']:.0f} µs with {_fronts(k)}"
                       for k, c in splits.items())
        + f" against the broker's {ours['server_us_per_request']:.0f} (bare aiohttp "
        f"{bare['server_us_per_request']:.0f}).")
    ce, cpus = best["ceilings"], os.cpu_count() or 1
    if ce["all_cores"]:
        room = ("within" if min(ce["all_cores"], ce["one_core"] or 0.0) >= TARGET * b
                else "beyond")
        parts.append(f"With {_fronts(best['key'])} all processes and wrk spend "
                     f"{ce['every_us']:.0f} µs per request, which on this machine's {cpus} "
                     f"cores allows at most {ce['all_cores'] / b:.2f}x bare: at this CPU per "
                     f"request the target is {room} this machine's reach.")
    parts.append(_limit(best, fsync_rate))
    return "**What this shows.** " + " ".join(parts)


def _fronts(key: str) -> str:
    n = FRONTS[key]
    return f"{n} front{'s' if n > 1 else ''}"


def _limit(c: dict[str, Any], fsync_rate: float) -> str:
    """What held the given configuration in this run: the machine, one process, the disk, or
    none (then 50 connections wait in lock-step on each group's round trip)."""
    cpus = os.cpu_count() or 1
    rounds = c["groups_per_s"] or 0.0
    in_fsync = rounds / fsync_rate if fsync_rate else 0.0
    busiest = max(((name, p["cores"] or 0.0) for name, p in c["processes"].items()
                   if name != "wrk"), key=lambda x: x[1])
    machine = c["machine_cores"] or 0.0
    who = _fronts(c["key"]) if c["key"] in FRONTS else c["label"]
    if machine >= BUSY * cpus:
        limit = (f"With {who}, the machine was saturated ({machine:.2f} of {cpus} cores "
                 f"busy, {c['all_cores'] or 0:.2f} of them these processes and wrk).")
    elif busiest[1] >= BUSY:
        limit = (f"With {who}, {busiest[0]} was saturated ({busiest[1]:.2f} cores): one "
                 "process's GIL is the limit.")
    elif in_fsync >= DISK_BOUND:
        limit = f"With {who}, the disk was the limit: the writer was mostly in fdatasync."
    else:
        limit = (f"With {who}, nothing was saturated (the machine {machine:.2f} of {cpus} "
                 f"cores busy, the busiest process {busiest[0]} {busiest[1]:.2f}): the "
                 f"{CONNECTIONS} connections wait in lock-step for each group's round trip "
                 "(parse, hand-over, write, fdatasync, answer).")
    if rounds:
        limit += (f" Its log wrote {c['commands_per_group'] or 0:.1f} commands per write + "
                  f"fdatasync, a round every {1e6 / rounds:.0f} µs, about {in_fsync:.0%} of "
                  "the writer's time in fdatasync.")
    return limit


def cpu_plot(w: dict[str, dict[str, Any]]) -> str:
    """Stacked CPU µs per request by process in ``results/split-cpu.png``; its Markdown."""
    shown = [c for c in w.values() if c["rate"] is not None]
    colors = {"bare": "tab:grey", "broker": "tab:blue", "front": "tab:cyan", "log": "tab:orange",
              "wrk": "tab:olive"}
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(shown) + 1.8))
    seen: set[str] = set()
    for c in shown:
        left = 0.0
        for process, p in c["processes"].items():
            kind = process.split()[0]
            value = p["us_per_request"] or 0.0
            ax.barh(c["label"], value, left=left, color=colors.get(kind, "tab:red"),
                    edgecolor="white", label=None if kind in seen else kind)
            seen.add(kind)
            left += value
    ax.set_xlabel("CPU µs per request, by process (wrk included)")
    ax.invert_yaxis()
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("Split experiment: where the CPU of a single POST goes")
    fig.tight_layout()
    fig.savefig(results.RESULTS / "split-cpu.png", dpi=80)
    plt.close(fig)
    return "![split CPU](results/split-cpu.png)"


def parse_args() -> tuple[Settings, Path | None, bool]:
    p = settings.parser(__doc__, "one round of 1 s runs, no warm-up")
    p.add_argument("--seconds", type=float, help="seconds of one wrk run (default 3)")
    args = p.parse_args()
    s = settings.with_rounds(
        Settings(rounds=1, seconds=1.0, warmup=0.0) if args.quick else Settings(), args)
    s.rounds = min(s.rounds, 20)
    if args.seconds:
        s.seconds = max(1.0, min(args.seconds, 60.0))
    return s, args.out, args.quick


def main() -> None:
    s, out, quick = parse_args()
    wrk = ensure_tool("wrk", "wrk")
    if wrk is None:
        sys.exit("bench_split: wrk is not installed and could not be (apt-get install wrk)")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-split-", dir=os.environ.get("BENCH_DIR")) as t:
        try:
            columns, fsync_rate = run(Path(t), s, wrk)
        except RuntimeError as err:  # a server that did not start
            sys.exit(f"bench_split: {str(err).splitlines()[0][:300]}")
    runtime = time.perf_counter() - started
    where = results_under(out, quick=quick, bench="split")
    w = {key: column.summary() for key, column in columns.items()}
    sentence = conclusion(w, fsync_rate)
    notes = (
        f"Medians of {s.rounds} round(s) of {s.seconds:.0f} s wrk runs (A B … B A order), "
        f"100-byte bodies, {CONNECTIONS} connections, every server on the same machine's "
        f"{os.cpu_count()} cores and on uvloop. The split's fronts run the broker's own "
        "publish handler, middleware and connection class and hand each command over a Unix "
        "socket (whatever is ready goes out as one write) to a log process running the real "
        "`Broker` and `LocalLog` with fsync always: a 200 means written and fdatasynced. "
        "Cores = CPU seconds over the run's wall time.\n\n"
        + cpu_table(w) + "\n\n" + limits_table(w, fsync_rate) + "\n\n" + sentence + "\n\n"
        + cpu_plot(w))
    report("split", "Split experiment: HTTP in its own process(es), the log in another",
           rows(w), command_line(), notes=notes)
    add_to_json("split", {"settings": asdict(s), "configurations": w, "fsync_per_s": fsync_rate,
                          "conclusion": sentence, "runtime_seconds": runtime})
    print(sentence)
    print(f"runtime {runtime:.0f} s; results in {where}")


if __name__ == "__main__":
    main()
