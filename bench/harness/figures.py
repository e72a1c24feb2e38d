"""What a measurement yields: one run's :class:`Figure`, the :class:`Runs` of one case, a
:class:`Row` of the results table (a figure beside its baseline from the same run, and their
ratio), and the percentiles and number formats they are reported in."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any


def percentile(values: list[float], p: float) -> float:
    """The ``p``-th percentile (0..100) of ``values``."""
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def ms(values: list[float], p: float) -> float:
    """The ``p``-th percentile of ``values`` (seconds) in milliseconds; 0 when empty."""
    return percentile(values, p) * 1000 if values else 0.0


def fmt(value: float | None) -> str:
    """A human-sized number."""
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


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


@dataclass
class Figure:
    """One measured run: ``value`` (a rate or a latency), the seconds its measured phase
    took, and whatever else it found (p99, delivered-to-all)."""

    value: float
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)


def latencies(values: list[float], sent: int, received: int) -> Figure:
    """A latency figure: p50 (the value) and p99 in ms, and how much arrived."""
    if not values:
        raise RuntimeError(f"no message arrived ({received} of {sent})")
    return Figure(percentile(values, 50) * 1000, 0.0,
                  {"p99": percentile(values, 99) * 1000, "sent": sent, "received": received})


@dataclass
class Runs:
    """The runs of one case: each run's figure, and the CPU seconds the server and the load
    generator used during it."""

    figures: list[Figure] = field(default_factory=list)
    server_cpu: list[float] = field(default_factory=list)
    client_cpu: list[float] = field(default_factory=list)

    def median(self, key: str = "value") -> float | None:
        """The median over the runs of each figure's value (``key`` "value") or of one of its
        extras; None when no run has it."""
        values = [f.value if key == "value" else f.extra.get(key) for f in self.figures]
        numbers = [float(v) for v in values if isinstance(v, int | float)]
        return statistics.median(numbers) if numbers else None


def doubled_p50(after: float | None, before: float | None, limit: float = 2.0,
                what: str = "single publish") -> str | None:
    """Why an A/B run must fail: the p50 (ms) of ``what`` after is at least ``limit`` times
    before's (None: it is not, or a side has no figure)."""
    if after is None or not before or after < limit * before:
        return None
    return (f"REGRESSION: {what} p50 {after:.3f} ms is {after / before:.1f}x the "
            f"before side's {before:.3f} ms (the limit is {limit:g}x)")
