"""Drawing the results: matplotlib's pyplot on the Agg backend (files only, no display), and
the bar chart of a results table that every benchmark writes beside its JSON.

Import ``plt`` from here, so the backend is chosen before pyplot loads.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

from bench.harness.figures import Row

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after the backend is chosen

__all__ = ["plt", "rows_plot"]


def rows_plot(path: Path, title: str, rows: list[Row]) -> None:
    """Each row's ratio to its baseline as a bar (log scale when they span orders of
    magnitude); rows without a baseline as their values when none has one."""
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
    fig.savefig(path, dpi=90)
    plt.close(fig)
