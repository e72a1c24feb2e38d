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
    ("stage the group, write(2)", "writing", "synced"),  # less the time in fdatasync
    ("fdatasync", "sync", "synced"),  # every fdatasync of the group, added up
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
        if "sync" in seen and "written" in seen:
            _add_syncs(seen, by_kind.get("sync", []), by_kind.get("synced", []))
        out.append(seen)
    return out


def _add_syncs(seen: dict[str, float], syncs: list[float], synceds: list[float]) -> None:
    """``synced``: the last fdatasync's end before ``written``; ``syncing``: the time every
    fdatasync between ``sync`` and it took (a group may fdatasync a time index before it
    writes its frames, and its segment after)."""
    first = bisect.bisect_left(syncs, seen["sync"])
    last = bisect.bisect_right(synceds, seen["written"]) - 1
    if last < 0 or synceds[last] < seen["sync"]:
        return
    seen["synced"] = synceds[last]
    ends = synceds[bisect.bisect_left(synceds, seen["sync"]):last + 1]
    starts = syncs[first:first + len(ends)]
    seen["syncing"] = sum(end - start for start, end in zip(starts, ends, strict=True))


def _span(message: dict[str, float], name: str, start: str, end: str) -> float | None:
    """One phase of one message (None: a reading it needs is missing)."""
    if start not in message or end not in message:
        return None
    span = message[end] - message[start]
    if name == "fdatasync":
        return message.get("syncing")
    if start == "writing" and "syncing" in message:  # the write path less its fdatasyncs
        span -= message["syncing"]
    return span


def breakdown(times: dict[str, list[float]], events: list[list[Any]]) -> dict[str, Any]:
    """Each phase's p50, p99 and mean over the messages taken apart, and the totals."""
    taken = readings(times, events)
    phases = []
    for name, start, end in (*PHASES, ACK):
        spans = [span for m in taken
                 if (span := _span(m, name, start, end)) is not None]
        if spans:
            phases.append(_phase(name, spans))
    if not taken:
        raise RuntimeError(f"none of {len(times['sent'])} messages was alone in flight: "
                           "nothing to take apart")
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


#: The phases grouped by what they spend the time on (for the summary sentence).
KINDS = (
    ("the disk (fdatasync)", ("fdatasync",)),
    ("the two thread hand-offs", ("hand-off to the writer thread", "hand-off back to the loop")),
    ("HTTP and the handler", ("HTTP: parse, route, the handler, to the log",)),
    ("staging, write(2) and the commit", ("stage the group, write(2)",
                                          "commit: the group made visible")),
    ("the fan-out", ("to the fan-out", "the fan-out writes the socket")),
    ("the sockets and the client", ("the request reaches the broker's loop",
                                    "socket → the Conn yields it")),
)


def summary(side: dict[str, Any]) -> str:
    """Where one side's mean publish → Conn time goes, by kind of work (means add up)."""
    means = {p["name"]: p["mean"] for p in side["phases"]}
    total = next(t["mean"] for t in side["totals"] if t["name"].startswith("publish sent → the"))
    if total <= 0:
        return "no time to take apart"
    parts = []
    for kind, names in KINDS:
        spent = sum(means.get(name, 0.0) for name in names)
        parts.append(f"{kind} {spent:.0f} µs ({spent / total:.0%})")
    return f"of a mean {total:.0f} µs: " + ", ".join(parts)
