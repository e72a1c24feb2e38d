"""A single publish taken apart: the load process's readings (sent, acknowledged, yielded by
the ``Conn``) and a traced broker's (:mod:`bench.experiments.publish_path.traced`) put on
one time line, message by message.

Only messages alone in flight are taken apart (sent after the one before was both
acknowledged and yielded, and both done before the next was sent), so each reading of the
broker belongs to one message without guessing; the others are counted and left out.
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass
from typing import Any

#: (phase, reading that starts it, reading that ends it), in the order a message meets them.
PHASES = (
    ("the request reaches the broker's loop", "sent", "received"),
    ("HTTP: parse, route, the handler, to the log", "received", "queued"),
    ("hand-off to the writer thread", "queued", "writing"),
    ("stage the group, write(2)", "writing", "sync"),
    ("fdatasync", "sync", "synced"),
    ("commit: the group made visible", "synced", "written"),
    ("hand-off back to the loop", "written", "settling"),
    ("to the fan-out", "settling", "fanning"),
    ("the fan-out writes the socket", "fanning", "fanned"),
    ("socket → the Conn yields it", "fanned", "yielded"),
)
#: The acknowledgement's own path, from the same point the fan-out starts from.
ACK = ("back on the loop → the publisher reads its answer", "settling", "acked")


@dataclass
class Phase:
    """One phase's figures over the messages taken apart (µs)."""

    name: str
    p50: float
    p99: float
    mean: float
    count: int


def _percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def _phase(name: str, spans: list[float]) -> Phase:
    ordered = sorted(spans)
    return Phase(name, _percentile(ordered, 0.5) * 1e6, _percentile(ordered, 0.99) * 1e6,
                 statistics.fmean(ordered) * 1e6, len(ordered))


#: The broker's readings in the order one message meets them (``synced`` is found apart).
ORDER = ("received", "queued", "writing", "sync", "written", "settling", "fanning", "fanned")


def readings(times: dict[str, list[float]], events: list[list[Any]]) -> list[dict[str, float]]:
    """Every message alone in flight with its broker readings: each the first of its kind
    after the reading before it (in :data:`ORDER`) and before the message's last client
    reading, except ``synced``: the last one between ``sync`` and ``written`` (a group may
    fdatasync its segment and its time index). A kind not found is skipped."""
    by_kind: dict[str, list[float]] = {}
    for kind, at in events:
        by_kind.setdefault(kind, []).append(at)
    for stamps in by_kind.values():
        stamps.sort()
    sent, acked, yielded = times["sent"], times["acked"], times["received"]
    out = []
    for k, start in enumerate(sent):
        end = max(acked[k], yielded[k])
        if k and start < max(acked[k - 1], yielded[k - 1]):
            continue
        if k + 1 < len(sent) and sent[k + 1] < end:
            continue
        seen = {"sent": start, "acked": acked[k], "yielded": yielded[k]}
        after = start
        for kind in ORDER:
            stamps = by_kind.get(kind, [])
            at = bisect.bisect_left(stamps, after)
            if at < len(stamps) and stamps[at] <= end:
                seen[kind] = after = stamps[at]
        synced = by_kind.get("synced", [])
        if "sync" in seen and "written" in seen:
            last = bisect.bisect_right(synced, seen["written"]) - 1
            if last >= 0 and synced[last] >= seen["sync"]:
                seen["synced"] = synced[last]
        out.append(seen)
    return out


def breakdown(times: dict[str, list[float]], events: list[list[Any]]) -> dict[str, Any]:
    """Each phase's p50, p99 and mean over the messages taken apart, and the totals."""
    taken = readings(times, events)
    phases = []
    for name, start, end in (*PHASES, ACK):
        spans = [m[end] - m[start] for m in taken if start in m and end in m]
        if spans:
            phases.append(_phase(name, spans))
    totals = [_phase("publish sent → the Conn yields it",
                     [m["yielded"] - m["sent"] for m in taken]),
              _phase("publish sent → acknowledged", [m["acked"] - m["sent"] for m in taken])]
    return {"phases": [p.__dict__ for p in phases], "totals": [t.__dict__ for t in totals],
            "messages": len(times["sent"]), "taken_apart": len(taken)}


def table(sides: dict[str, dict[str, Any]]) -> str:
    """A markdown table of the phases, the sides side by side (p50 / p99 / mean, µs)."""
    names = list(sides)
    header = "| phase | " + " | ".join(f"{n}: p50 / p99 / mean µs" for n in names) + " |"
    lines = [header, "|---|" + "---|" * len(names)]
    order = [name for name, _s, _e in (*PHASES, ACK)] + [
        "publish sent → the Conn yields it", "publish sent → acknowledged"]
    found = {n: {p["name"]: p for p in s["phases"] + s["totals"]} for n, s in sides.items()}
    for phase in order:
        cells = []
        for n in names:
            p = found[n].get(phase)
            cells.append("-" if p is None else f"{p['p50']:.0f} / {p['p99']:.0f} / "
                                                f"{p['mean']:.0f}")
        if any(c != "-" for c in cells):
            bold = phase.startswith("publish sent")
            lines.append(f"| {'**' + phase + '**' if bold else phase} | " + " | ".join(cells)
                         + " |")
    return "\n".join(lines)
