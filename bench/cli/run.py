"""CLI benchmarks: how long ``messaging`` takes to start (before and after the lazy CLI, in
the same run: :mod:`bench.cli.startup`), and ``messaging publish URL TOPIC < lines`` batching
standard input against one request (and one fsync) per line, the CLI's behaviour before
batching, measured as ``--batch-size 1`` in the same run.

Startup: ``messaging --version`` and ``messaging publish URL 1 x`` against a running broker,
whole commands, medians, beside the same commands of the commit before (a git worktree); the
target is issue 42's, at most 250 ms each. Written to results/cli.json and its section of
RESULTS.md.

Standard input: each run is the whole command as a user times it (interpreter start included)
against one broker (``--fsync always``, the default) on 127.0.0.1: per line with
``lines_per_line`` 100-byte lines, batched with ``lines_batched``. Runs are interleaved (A B …
B A); the rates are medians. The target is the issue's: batched at least 50 times the
per-line rate. Written to results/cli_publish.json and its section.

``--only startup`` or ``--only stdin`` runs one of them.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.cli.startup import BEFORE_REV
from bench.cli.startup import measure as measure_startup
from bench.harness import settings
from bench.harness.figures import Row
from bench.harness.procs import broker, child_env
from bench.harness.results import add_to_json, command_line, report, results_under

BENCH = "cli_publish"
STARTUP_BENCH = "cli"
PARTS = ("startup", "stdin")
#: Bound of one command (a stuck broker must not hang the benchmark).
COMMAND_TIMEOUT = 300.0


@dataclass
class Settings(settings.Settings):
    """Rounds of each mode and the lines each run publishes."""

    rounds: int = 3
    lines_per_line: int = 2_000
    lines_batched: int = 200_000
    #: Rounds of the startup commands (each arm once per round), after warm-up rounds.
    startup_rounds: int = 21
    startup_warmup: int = 2


QUICK = Settings(rounds=1, lines_per_line=200, lines_batched=10_000, startup_rounds=3,
                 startup_warmup=1)


def publish(url: str, topic: int, count: int, *extra: str) -> float:
    """Publish ``count`` 100-byte lines through the CLI; the messages per second."""
    body = b"".join(b"%06d " % n + b"x" * 92 + b"\n" for n in range(count))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "messaging.cli", "publish", url, str(topic),
                           "--quiet", *extra], input=body, capture_output=True,
                          timeout=COMMAND_TIMEOUT, env=child_env(), check=False)
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"messaging publish failed: {done.stderr.decode().strip()}")
    return count / took


def main() -> None:
    p = settings.parser(__doc__ or "", "one round of a few thousand lines, three of startup")
    p.add_argument("--only", default=",".join(PARTS), help=f"run only these, comma-separated "
                   f"({', '.join(PARTS)})")
    p.add_argument("--before", default=BEFORE_REV,
                   help=f"the commit startup is compared with (default {BEFORE_REV})")
    args = p.parse_args()
    chosen = QUICK if args.quick else Settings()
    if args.rounds:
        chosen.rounds = chosen.startup_rounds = args.rounds
    parts = settings.only(p, args.only, PARTS, "part")
    results_under(args.out, quick=args.quick, bench=BENCH)
    if "startup" in parts:
        startup(chosen, args.before)
    if "stdin" in parts:
        stdin_batching(chosen)


def startup(chosen: Settings, before: str) -> None:
    """``--version`` and one publish, before and after (the table of results/cli.json)."""
    found = measure_startup(chosen.startup_rounds, chosen.startup_warmup, before)
    report(STARTUP_BENCH, "CLI startup (whole commands, before and after lazy imports)",
           found.rows, command_line(), notes=found.notes)
    add_to_json(STARTUP_BENCH, {"runs_s": found.runs})


def stdin_batching(chosen: Settings) -> None:
    """Standard input in batches against one request per line (results/cli_publish.json)."""
    per_line: list[float] = []
    batched: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
        proc, url = broker(Path(tmp) / "data")
        try:
            for round_ in range(chosen.rounds):
                order = [0, 1] if round_ % 2 == 0 else [1, 0]
                for mode in order:
                    if mode == 0:
                        per_line.append(publish(url, 1, chosen.lines_per_line,
                                                "--batch-size", "1"))
                    else:
                        batched.append(publish(url, 2, chosen.lines_batched))
                print(f"round {round_ + 1}: per line {per_line[-1]:,.0f} msg/s, batched "
                      f"{batched[-1]:,.0f} msg/s", flush=True)
        finally:
            proc.stop()
    line_rate, batch_rate = statistics.median(per_line), statistics.median(batched)
    ratio = batch_rate / line_rate
    rows = [
        Row("publish of standard input, one request per line (--batch-size 1)", line_rate,
            "msg/s"),
        Row("publish of standard input, batched (default)", batch_rate, "msg/s",
            "one request per line", line_rate, ">= 50x", ratio >= 50),
    ]
    report(BENCH, "CLI publish of standard input", rows, command_line(),
           notes=f"Whole commands, interpreter start included; {chosen.lines_per_line:,} "
                 f"lines per line-at-a-time run, {chosen.lines_batched:,} per batched run, "
                 f"{chosen.rounds} rounds interleaved, medians; --fsync always, "
                 f"{os.cpu_count()} cores shared by the broker and the CLI.")
    add_to_json(BENCH, {"per_line": per_line, "batched": batched})


if __name__ == "__main__":
    main()
