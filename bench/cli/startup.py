"""How long ``messaging`` takes to start and finish a short command, before and after the
lazy CLI (issue 42), measured in the same run (``bench/cli/run.py``; ``--only startup``).

"Before" is the code of another commit (by default :data:`BEFORE_REV`, the last one before
the CLI imported each command's modules only when it runs): a detached git worktree of it in a
temporary directory, run with this venv's Python, that worktree first on ``PYTHONPATH`` and as
the working directory (``python -m`` puts the working directory first on ``sys.path``).
"After" is this checkout as it is. Which ``messaging`` each imports is checked before any run.

Each run is a whole command as a user times it, interpreter start included: ``python -m
messaging --version``, and ``python -m messaging publish URL 1 x`` against one broker (this
checkout's, ``--fsync always``) on 127.0.0.1. Runs alternate between the two arms (before,
after; then after, before; ...) after warm-up runs, with bytecode cached as an installed
package has it (the warm-up writes it); the figures are medians of wall time, and of the CPU
time the command used. Two floors are measured in the same rounds:
the interpreter alone (``python -c pass``) and importing the package (``python -c "import
messaging"``: its ``__version__`` comes from ``importlib.metadata``).
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness.checkouts import git, worktree
from bench.harness.figures import Row
from bench.harness.procs import ROOT, broker, child_env

#: The last commit whose CLI imported every command's modules (and aiohttp) to start.
BEFORE_REV = "df5b66c"
#: The target of issue 42 for both commands (whole command, median).
TARGET_MS = 250.0
#: Bound of one command.
COMMAND_TIMEOUT = 60.0


@dataclass
class Arm:
    """Where one arm's code comes from and how Python is started on it."""

    name: str
    rev: str
    tree: Path
    env: dict[str, str]
    #: Wall seconds of each run, per command label ...
    runs: dict[str, list[float]] = field(default_factory=dict)
    #: ... and the CPU seconds (user + system) the command's process used.
    cpu: dict[str, list[float]] = field(default_factory=dict)

    def check_import(self) -> str:
        """Which ``messaging`` this arm imports (raises unless it is its tree's)."""
        done = subprocess.run([sys.executable, "-c", "import messaging; print(messaging.__file__)"],
                              capture_output=True, text=True, env=self.env, cwd=self.tree,
                              timeout=COMMAND_TIMEOUT, check=False)
        imported = done.stdout.strip()
        want = self.tree / "messaging" / "__init__.py"
        if not imported or Path(imported).resolve() != want.resolve():
            raise RuntimeError(f"the {self.name} arm would import {imported!r}, not {want} "
                               f"({done.stderr.strip()[-300:]})")
        return imported

    def time(self, label: str, args: list[str], expect: str) -> float:
        """Run ``python ARGS`` once; its wall seconds (recorded under ``label``, with its
        CPU seconds: the only child reaped meanwhile is this one)."""
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                              env=self.env, cwd=self.tree, timeout=COMMAND_TIMEOUT, check=False)
        took = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0 or not done.stdout.startswith(expect):
            raise SystemExit(f"{self.name}: python {' '.join(args)} failed "
                             f"({done.returncode}): {done.stdout.strip()[:200]} "
                             f"{done.stderr.strip()[-300:]}")
        self.runs.setdefault(label, []).append(took)
        self.cpu.setdefault(label, []).append(after.ru_utime + after.ru_stime
                                              - before.ru_utime - before.ru_stime)
        return took

    def median_ms(self, label: str) -> float:
        """The median wall time of ``label``'s runs, in ms."""
        return statistics.median(self.runs[label]) * 1000

    def cpu_ms(self, label: str) -> float:
        """The median CPU time of ``label``'s runs, in ms."""
        return statistics.median(self.cpu[label]) * 1000


def with_bytecode(env: dict[str, str]) -> dict[str, str]:
    """``env`` in which Python caches bytecode (``__pycache__``), as an installed package
    has it: a command compiles its modules once, in the warm-up rounds, not at every run."""
    return {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}


def load_average() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


@dataclass
class Startup:
    """What :func:`measure` found: the rows of the table, the runs, and the notes."""

    rows: list[Row]
    runs: dict[str, dict[str, dict[str, list[float]]]]
    notes: str


def measure(rounds: int, warmup: int, before_rev: str = BEFORE_REV) -> Startup:
    """Both arms, ``rounds`` alternating rounds of every command after ``warmup`` rounds."""
    changed = git("status", "--porcelain", "--", "messaging").splitlines()
    after_rev = git("rev-parse", "--short", "HEAD") + (
        f" plus uncommitted changes to {len(changed)} files under messaging/" if changed else "")
    with tempfile.TemporaryDirectory(prefix="bench-cli-startup-") as tmp_name:
        tmp = Path(tmp_name)
        with worktree(before_rev, tmp) as tree:
            before = Arm("before", git("rev-parse", "--short", before_rev), tree,
                         with_bytecode({**os.environ, "PYTHONPATH": str(tree)}))
            after = Arm("after", after_rev, ROOT, with_bytecode(child_env()))
            imported = {arm.name: arm.check_import() for arm in (before, after)}
            proc, url = broker(tmp / "data")
            try:
                commands = {
                    "version": (["-m", "messaging", "--version"], "messaging "),
                    "publish": (["-m", "messaging", "publish", url, "1", "x"], ""),
                    "pass": (["-c", "pass"], ""),
                    "import": (["-c", "import messaging"], ""),
                }
                started_load = load_average()
                for round_ in range(warmup + rounds):
                    arms = [before, after] if round_ % 2 == 0 else [after, before]
                    for label, (args, expect) in commands.items():
                        for arm in arms:
                            arm.time(label, args, expect)
                    if round_ + 1 == warmup:
                        for arm in arms:  # warm-up: caches, the worktree's bytecode
                            arm.runs.clear()
                            arm.cpu.clear()
                    if round_ >= warmup:
                        print(f"round {round_ - warmup + 1}: --version "
                              f"{before.runs['version'][-1] * 1000:.0f} → "
                              f"{after.runs['version'][-1] * 1000:.0f} ms, publish "
                              f"{before.runs['publish'][-1] * 1000:.0f} → "
                              f"{after.runs['publish'][-1] * 1000:.0f} ms", flush=True)
            finally:
                proc.stop()
    before_name = f"before: {before.rev}"
    rows = []
    for label, name in (("version", "messaging --version"),
                        ("publish", "messaging publish URL 1 x (a running broker)")):
        value = after.median_ms(label)
        rows.append(Row(name, value, "ms", before_name, before.median_ms(label),
                        f"≤ {TARGET_MS:.0f} ms", value <= TARGET_MS))
    for label, name in (("version", "messaging --version, CPU time"),
                        ("publish", "messaging publish URL 1 x, CPU time")):
        rows.append(Row(name, after.cpu_ms(label), "ms", before_name, before.cpu_ms(label)))
    rows.append(Row("floor: python -c pass (the interpreter alone)",
                    after.median_ms("pass"), "ms"))
    rows.append(Row("floor: python -c 'import messaging' (its version from importlib.metadata)",
                    after.median_ms("import"), "ms"))
    notes = " ".join([
        f"**Before**: commit {before.rev} from a git worktree (`git worktree add --detach",
        f"<tmp> {before_rev}`), run with this venv's Python, the worktree as working",
        f"directory and first on `PYTHONPATH` (it imported `{imported['before']}`).",
        f"**After**: {after.rev} (it imported `{imported['after']}`).",
        "Both with bytecode cached in `__pycache__`, as an installed package has it",
        "(`PYTHONDONTWRITEBYTECODE` is removed from the commands' environment; the warm-up",
        "rounds write it). Whole commands (`python -m messaging ...`, interpreter start",
        f"included), wall time from start to exit, {rounds} rounds after {warmup} warm-up",
        "rounds, the two arms alternating (before, after; then after, before), medians; CPU",
        "time is the command's user + system time (less moved by other work on the machine",
        "than wall time); `publish` against one broker of this checkout (`--fsync always`)",
        "on 127.0.0.1. The floors are the after arm's.",
        f"Load average at the start {started_load}, at the end {load_average()}",
        f"({os.cpu_count()} cores shared with other work: runs are noisy, the arms",
        "alternate so that both see it)."])
    runs = {arm.name: {"wall": arm.runs, "cpu": arm.cpu} for arm in (before, after)}
    return Startup(rows, runs, notes)
