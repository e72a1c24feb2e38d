"""Where a run's results go and how they are recorded: ``results/<bench>.json``, its PNG, and
its section of RESULTS.md (the table of figures beside their baselines), with the machine,
the date and the command that produced them.

Results go under bench/ unless :func:`results_under` moved them (``--out``, or a quick run's
temporary directory); read :data:`RESULTS` through this module, not by value.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.harness.figures import Row, fmt
from bench.harness.plots import rows_plot

BENCH = Path(__file__).resolve().parents[1]
ROOT = BENCH.parent
RESULTS = BENCH / "results"
RESULTS_MD = BENCH / "RESULTS.md"


def results_under(out: Path | None, *, quick: bool = False, bench: str = "") -> Path:
    """Write results/ and RESULTS.md under ``out``; a quick run without ``out`` under a new
    temporary directory (a smoke run never overwrites the recorded results); else under
    bench/. Returns the results/ directory, created."""
    global RESULTS, RESULTS_MD
    if out is None and quick:
        out = Path(tempfile.mkdtemp(prefix=f"bench-{bench}-quick-"))
        print(f"(--quick: results written under {out})")
    if out is not None:
        RESULTS, RESULTS_MD = out / "results", out / "RESULTS.md"
    RESULTS.mkdir(parents=True, exist_ok=True)
    return RESULTS


def machine() -> str:
    """A one-line description of this machine."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB, Python "
            f"{platform.python_version()}, {platform.system()} {platform.release()}")


def command_line() -> str:
    """How this script was run, for the record."""
    return "python " + " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]])


def source_state() -> str:
    """The commit measured, and whether messaging/ had uncommitted changes then."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                              timeout=30, check=False)
        return done.stdout

    commit = git("rev-parse", "--short", "HEAD").strip() or "unknown"
    changed = git("status", "--porcelain", "--", "messaging").splitlines()
    return f"commit {commit}" + (f" plus uncommitted changes to {len(changed)} files under "
                                 f"messaging/" if changed else ", messaging/ unmodified")


def report(bench: str, title: str, rows: list[Row], command: str,
           notes: str = "") -> None:
    """Print the table, write ``results/<bench>.json`` and ``.png``, update RESULTS.md."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    date = datetime.date.today().isoformat()
    header = "| figure | value | baseline (same run) | ratio | target | met |"
    lines = [header, "|---|---|---|---|---|---|"]
    for r in rows:
        baseline = f"{fmt(r.baseline)} {r.unit} ({r.baseline_name})" if r.baseline_name else "-"
        ratio = f"{r.ratio:.2f}x" if r.ratio is not None else "-"
        met = {True: "yes", False: "**no**", None: "-"}[r.met]
        lines.append(f"| {r.name} | {fmt(r.value)} {r.unit} | {baseline} | {ratio} | "
                     f"{r.target or '-'} | {met} |")
    table = "\n".join(lines)
    print(f"\n{title}\n{table}\n")
    payload = {"bench": bench, "date": date, "machine": machine(), "command": command,
               "rows": [asdict(r) | {"ratio": r.ratio} for r in rows]}
    write_json(bench, payload)
    rows_plot(RESULTS / f"{bench}.png", title, rows)
    write_section(bench, title, f"{date} on {machine()}.\nCommand: `{command}`\n\n{table}\n"
                  + (f"\n{notes.strip()}\n" if notes else "")
                  + f"\n![{bench}](results/{bench}.png)")


def write_json(bench: str, payload: dict[str, Any], indent: int = 2) -> None:
    """``results/<bench>.json``."""
    (RESULTS / f"{bench}.json").write_text(json.dumps(payload, indent=indent) + "\n")


def add_to_json(bench: str, fields: dict[str, Any]) -> None:
    """Add ``fields`` to the ``results/<bench>.json`` that :func:`report` wrote."""
    payload = json.loads((RESULTS / f"{bench}.json").read_text()) | fields
    write_json(bench, payload)


def write_section(bench: str, title: str, body: str) -> None:
    """Replace (or append) the ``<!-- bench:start -->`` section of RESULTS.md."""
    section = f"<!-- {bench}:start -->\n## {title}\n\n{body}\n<!-- {bench}:end -->"
    text = RESULTS_MD.read_text() if RESULTS_MD.exists() else (
        "# Benchmark results\n\nEach section is rewritten by its benchmark script; figures are "
        "medians, each beside a baseline measured in the same run.\n")
    pattern = re.compile(rf"<!-- {bench}:start -->.*?<!-- {bench}:end -->", re.S)
    text = pattern.sub(lambda _: section, text) if pattern.search(text) else (
        text.rstrip() + "\n\n" + section + "\n")
    RESULTS_MD.write_text(text)
