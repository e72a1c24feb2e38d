"""Shared plumbing of the benchmarks: timing, JSON, a PNG plot and the RESULTS.md table."""

from __future__ import annotations

import datetime
import gc
import json
import os
import platform
import re
import statistics
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
RESULTS_MD = HERE / "RESULTS.md"


@dataclass
class Row:
    """One measured figure beside its baseline from the same run."""

    name: str
    value: float
    unit: str
    baseline_name: str = ""
    baseline: float | None = None
    target: str = ""
    met: bool | None = None

    @property
    def ratio(self) -> float | None:
        if self.baseline in (None, 0):
            return None
        assert self.baseline is not None
        return self.value / self.baseline


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


def rate(fn: Callable[[], int], *, min_time: float = 0.5, max_rounds: int = 50,
         repeats: int = 3) -> float:
    """Median over ``repeats`` of items/second, each repeat running ``fn`` (which returns how
    many items it handled) until ``min_time`` passed or ``max_rounds`` calls were made."""
    figures = []
    for _ in range(repeats):
        items = 0
        rounds = 0
        started = time.perf_counter()
        while rounds < max_rounds:
            items += fn()
            rounds += 1
            if time.perf_counter() - started >= min_time:
                break
        figures.append(items / (time.perf_counter() - started))
    return statistics.median(figures)


def percentile(values: list[float], p: float) -> float:
    """The ``p``-th percentile (0..100) of ``values``."""
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def fmt(value: float | None) -> str:
    """A human-sized number."""
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def report(bench: str, title: str, rows: list[Row], command: str,
           notes: str = "") -> None:
    """Print the table, write ``results/<bench>.json`` and ``.png``, update RESULTS.md."""
    RESULTS.mkdir(exist_ok=True)
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
    (RESULTS / f"{bench}.json").write_text(json.dumps(payload, indent=2) + "\n")
    _plot(bench, title, rows)
    write_section(bench, title, f"{date} on {machine()}.\nCommand: `{command}`\n\n{table}\n"
                  + (f"\n{notes.strip()}\n" if notes else "")
                  + f"\n![{bench}](results/{bench}.png)")


def results_under(out: Path | None) -> None:
    """Write results/ and RESULTS.md under ``out`` instead of bench/ (``None``: bench/)."""
    global RESULTS, RESULTS_MD
    if out is not None:
        RESULTS, RESULTS_MD = out / "results", out / "RESULTS.md"
    RESULTS.mkdir(parents=True, exist_ok=True)


def add_to_json(bench: str, fields: dict[str, Any]) -> None:
    """Add ``fields`` to the ``results/<bench>.json`` that :func:`report` wrote."""
    path = RESULTS / f"{bench}.json"
    payload = json.loads(path.read_text()) | fields
    path.write_text(json.dumps(payload, indent=2) + "\n")


def freeze_startup_objects() -> None:
    """Take the load generator's import-time objects out of the collector's view.

    Its imports (matplotlib, the client libraries) made each of its full collections 40-70 ms,
    pauses that landed in every server's live-delivery p99 alike. Those objects live as long
    as the process; every object made later is collected as usual.
    """
    gc.collect()
    gc.freeze()


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


def _plot(bench: str, title: str, rows: list[Row]) -> None:
    with_baseline = [r for r in rows if r.ratio is not None]
    shown = with_baseline or rows
    fig, ax = plt.subplots(figsize=(11, 0.6 * len(shown) + 1.5))
    names = [textwrap.fill(r.name, 42) for r in shown]
    if with_baseline:
        ratios = [r.ratio or 0.0 for r in shown]
        ax.barh(names, ratios, color="tab:blue")
        ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)
        positive = [x for x in ratios if x > 0]
        if positive and max(positive) / min(positive) > 20:
            ax.set_xscale("log")  # latencies and rates side by side span orders of magnitude
        ax.set_xlabel("ratio to the baseline measured in the same run")
    else:
        ax.barh(names, [r.value for r in shown], color="tab:blue")
        ax.set_xlabel(shown[0].unit if shown else "")
    ax.invert_yaxis()
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{bench}.png", dpi=90)
    plt.close(fig)


def command_line() -> str:
    """How this script was run, for the record."""
    return "python " + " ".join([os.path.relpath(sys.argv[0], HERE.parent), *sys.argv[1:]])
