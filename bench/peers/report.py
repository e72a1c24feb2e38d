"""The peer benchmark's table rows, notes and one PNG per workload."""

from __future__ import annotations

import statistics
from typing import Any

from bench.harness import results
from bench.harness.figures import Row, fmt
from bench.harness.plots import plt

WORKLOADS = {
    "single": "1. single 100 B POST, 50 connections",
    "batch": "2. batch publish, 1000 × 100 B per request, 4 senders",
    "consume": "3. consume stored 100 B messages into objects",
    "latency": "4. publish → subscriber latency at 1,000 msg/s",
    "fanout": "5. fan-out at 1,000 msg/s",
    "durable-streams": "6. Durable Streams surface: /v1/stream vs the reference server",
}
#: A Python load generator is the bottleneck once it keeps this much of its one core busy.
CLIENT_BOUND_CORES = 0.85

Summary = dict[str, Any]


def best_peer(cases: dict[str, Summary], lower: bool, keys: list[str] | None = None,
              attribute: str = "median") -> Summary | None:
    """The best durable peer (fsync per acknowledged write, no side column) with a figure."""
    peers = [c for k, c in cases.items() if c["role"] == "peer" and c["durable"]
             and not c["side"] and c.get(attribute) is not None and (keys is None or k in keys)]
    if not peers:
        return None
    pick = min if lower else max
    return pick(peers, key=lambda c: float(c[attribute]))


def _row(name: str, ours: Summary | None, peer: Summary | None, unit: str, target: str,
         want: float | None, lower: bool = False, attribute: str = "median",
         peer_name: str = "") -> Row | None:
    if ours is None or ours.get(attribute) is None:
        return None
    value = float(ours[attribute])
    base = float(peer[attribute]) if peer is not None and peer.get(attribute) is not None \
        else None
    met: bool | None = None
    if want is not None and base is not None:
        met = value <= want * base if lower else value >= want * base
    label = peer_name or (peer["label"] if peer is not None else "no durable peer ran")
    return Row(name, value, unit, label, base, target if base is not None else "", met)


def rows_and_notes(w: dict[str, dict[str, Summary]], notes: list[str], settings: dict[str, Any],
                   runtime: float) -> tuple[list[Row], str]:
    """The RESULTS.md rows (each of our figures beside the best durable peer's) and the
    notes: every server's figures, the CPU each used, which figures are client-bound."""
    rows: list[Row | None] = []
    single, batch = w.get("single", {}), w.get("batch", {})
    rows.append(_row("1. single POST, 50 connections: ours vs bare aiohttp", single.get("ours"),
                     single.get("bare"), "req/s", "≥ 0.9x bare", 0.9))
    rows.append(_row("1. single POST: ours vs best durable peer", single.get("ours"),
                     best_peer(single, False), "req/s", "", None))
    rows.append(_row("1. single POST: ours with --fsync never vs bare aiohttp (the HTTP path "
                     "alone)", single.get("ours-nofsync"), single.get("bare"), "req/s", "",
                     None))
    rows.append(_row("2. batch 1000 × 100 B, 4 senders: ours vs best durable peer",
                     batch.get("ours"), best_peer(batch, False), "msg/s", "≥ 2x", 2.0))
    rows.append(_row("2. batch: ours vs disk write+fdatasync ceiling, same bytes",
                     batch.get("ours"), batch.get("ceiling"), "msg/s", "≥ 0.4x", 0.4))
    consume = w.get("consume", {})
    n = settings["messages"]
    rows.append(_row(f"3. consume {n:,}: Conn async for vs best peer", consume.get("ours"),
                     best_peer(consume, False), "msg/s", "≥ 1.5x", 1.5))
    rows.append(_row(f"3. consume {n:,}: Conn.batches() vs best peer", consume.get("batches"),
                     best_peer(consume, False), "msg/s", "≥ 3x", 3.0))
    lat = w.get("latency", {})
    rows.append(_row("4. latency p50 at 1,000 msg/s: ours vs best durable peer",
                     lat.get("ours"), best_peer(lat, True), "ms", "≤ 1.5x", 1.5, lower=True))
    p99 = _row("4. latency p99 at 1,000 msg/s: ours vs best durable peer", lat.get("ours"),
               best_peer(lat, True, attribute="p99"), "ms", "≤ 5 ms", None, lower=True,
               attribute="p99")
    if p99 is not None:
        p99.target, p99.met = "≤ 5 ms", p99.value <= 5
    rows.append(p99)
    fan = w.get("fanout", {})
    for level in settings["fanout"]:
        keys = [f"redis-{level}", f"nats-{level}"]
        ours = fan.get(f"ours-{level}")
        row = _row(f"5. fan-out p99, {level} subscribers: ours vs best durable peer", ours,
                   best_peer(fan, True, keys, attribute="p99"), "ms", "", None, lower=True,
                   attribute="p99")
        if row is not None and ours is not None:
            every = "every message to every subscriber" if ours["all_delivered"] else \
                "**some messages missing**"
            row.name += f" ({every})"
            if level == 1000:
                row.target = "≤ 20 ms, all delivered"
                row.met = row.value <= 20 and bool(ours["all_delivered"])
        rows.append(row)
    dstreams = w.get("durable-streams", {})
    rows.append(_row("6. /v1/stream batch append (JSON, 4 senders) vs reference",
                     dstreams.get("append"), dstreams.get("ref-append"), "msg/s", "", None))
    rows.append(_row(f"6. /v1/stream catch-up of {n:,} into objects vs reference",
                     dstreams.get("catchup"), dstreams.get("ref-catchup"), "msg/s", "", None))
    table = ["| workload | server | figure | p99 | server CPU s | load generator CPU s | "
             "generator cores | note |", "|---|---|---|---|---|---|---|---|"]
    bound: list[str] = []
    for workload, cases in w.items():
        for case in cases.values():
            note = case["error"] or ("side column, not compared" if case["side"] else "")
            if case["all_delivered"] is False:
                note = (note + "; " if note else "") + "some messages missing"
            cores = (case["client_cpu"] / case["seconds"]
                     if case["client_cpu"] is not None and case["seconds"] else None)
            if cores is not None and cores >= CLIENT_BOUND_CORES and not case["error"]:
                bound.append(f"{workload}: {case['label']} ({cores:.2f} cores)")
            table.append(f"| {workload} | {case['label']} | {fmt(case['median'])} "
                         f"{case['unit']} | {fmt(case['p99'])} | {fmt(case['server_cpu'])} | "
                         f"{fmt(case['client_cpu'])} | {fmt(cores)} | {note or '-'} |")
    text = [
        "Every server on 127.0.0.1, stopped by its PID: our broker (`--fsync always`), bare "
        "aiohttp, Redis 7 (`appendonly yes`, `appendfsync always`; `everysec` as a side column), "
        "NATS JetStream (file storage, `sync_interval: always`; its default sync as a side "
        "column) and the Durable Streams Node reference server (file-backed, an fdatasync per "
        f"append). {settings['rounds']} round(s) per workload in A B … B A order, medians; "
        f"throughput runs of {settings['seconds']:.0f} s, latency runs of "
        f"{settings['latency_seconds']:.0f} s, fan-out runs of "
        f"{settings['fanout_seconds']:.0f} s at {settings['rate']:,} msg/s (every 10th "
        "subscriber times its messages). The best durable peer is the best of Redis "
        "(always), NATS (sync always) and the reference server. Runtime "
        f"{runtime:.0f} s.",
        "**Client-bound figures.** NATS JetStream sync publish (workload 1) is bound by nats-py: "
        "each publish awaits its ack in Python, so 50 tasks measure the client more than the "
        "server. Every consume figure (workload 3) is the Python client building objects: the "
        "servers idle meanwhile. Workloads 4 and 5 time ours and Redis with the same lean socket "
        "clients (bench/harness/lean_clients.py: prepared requests, a chunked-stream parser, "
        "hiredis for RESP), because the library clients cost more CPU per message than either "
        "server (aiohttp's and redis-py's latency figures are side columns); NATS keeps nats-py. "
        "All subscribers run in one Python process, so at 100 and 1,000 subscribers every p99 "
        "still includes that process's queueing; the process takes its import-time objects out of "
        "the garbage collector's view (`gc.freeze`) before the first workload, so its full "
        "collections do not pause every server's subscribers for 40-70 ms. Figures whose load "
        "generator kept "
        f"≥ {CLIENT_BOUND_CORES} of a core busy in this run: "
        + ("; ".join(bound) if bound else "none") + ".",
        "Workload 3 reads NATS from the default-sync server (sync_interval: always stores "
        "about 4,000 messages/s one fsync each, too slow to preload; reads do not fsync). "
        "The reference server's SSE latency run is the Durable Streams benchmark's.",
    ]
    limit = where_the_limit_is(single, batch)
    if limit:
        text.append(limit)
    lag = fanout_lag_text(fan, settings["fanout"])
    if lag:
        text.append(lag)
    if notes:
        text.append("Notes: " + "; ".join(notes) + ".")
    text.append("\n".join(table))
    return [r for r in rows if r is not None], "\n\n".join(text)


def plots(w: dict[str, dict[str, Summary]]) -> str:
    """One bar chart per workload (every server's median, p99 beside latencies) in
    ``results/peers-<workload>.png``; returns the Markdown that shows them."""
    links = []
    for workload, cases in w.items():
        shown = [c for c in cases.values() if c["median"] is not None]
        if not shown:
            continue
        fig, ax = plt.subplots(figsize=(10, 0.45 * len(shown) + 1.5))
        names = [c["label"] for c in shown]
        colors = ["tab:blue" if c["role"] in ("ours", "batches") else
                  "tab:grey" if c["side"] or c["role"] in ("bare", "ceiling") else
                  "tab:orange" for c in shown]
        values = [float(c["median"]) for c in shown]
        ax.barh(names, values, color=colors)
        if any(c["p99"] is not None for c in shown):
            ax.scatter([c["p99"] or 0 for c in shown], names, color="black", marker="|",
                       s=200, label="p99", zorder=3)
            ax.legend()
        if values and min(values) > 0 and max(values) / min(values) > 30:
            ax.set_xscale("log")
        ax.set_xlabel(shown[0]["unit"] + (" (bar: p50)" if shown[0]["unit"] == "ms" else ""))
        ax.invert_yaxis()
        ax.set_title(WORKLOADS[workload] + " (blue: ours, orange: durable peers)")
        fig.tight_layout()
        fig.savefig(results.RESULTS / f"peers-{workload}.png", dpi=80)
        plt.close(fig)
        links.append(f"![{workload}](results/peers-{workload}.png)")
    return "\n".join(links)


def _cpu_per_op(case: Summary | None) -> float | None:
    """Server CPU microseconds per request or message of a run (None when not measured)."""
    if case is None or not case["median"] or case["server_cpu"] is None or not case["seconds"]:
        return None
    return float(case["server_cpu"]) / (float(case["median"]) * float(case["seconds"])) * 1e6


def where_the_limit_is(single: dict[str, Summary], batch: dict[str, Summary]) -> str:
    """A paragraph, from this run's figures, on what holds our single and batch publishes:
    CPU per request beside bare aiohttp's, and the broker's cores during the batch load."""
    ours, nofsync, bare = (single.get(k) for k in ("ours", "ours-nofsync", "bare"))
    cost = {k: _cpu_per_op(c) for k, c in (("ours", ours), ("nofsync", nofsync),
                                           ("bare", bare))}
    parts: list[str] = []
    if ours and bare and nofsync and None not in cost.values():
        parts.append(
            f"Single POSTs: bare aiohttp spent {cost['bare']:.0f} µs of CPU per request, our "
            f"broker {cost['ours']:.0f} µs with `--fsync always` and {cost['nofsync']:.0f} µs "
            f"with `--fsync never`, which reached {nofsync['median'] / bare['median']:.2f}x "
            f"bare's rate (`always`: {ours['median'] / bare['median']:.2f}x). The HTTP path "
            "alone (parse, route, the publish handler, the answer) is what separates "
            "`never` from bare; the rest of the gap is the durable round trip: 50 "
            "connections each wait for a group's write and fdatasync and two thread "
            "hand-offs, so the rate is the number of connections over that round trip "
            "rather than the CPU.")
    ob = batch.get("ours")
    per_message = _cpu_per_op(ob)
    if ob is not None and per_message is not None and ob["server_cpu"] and ob["seconds"]:
        cores = float(ob["server_cpu"]) / float(ob["seconds"])
        parts.append(
            f"Batch publish: the broker process used {cores:.2f} cores ({per_message:.2f} µs "
            "per message: receive, validate with one crc32c call per frame, stamp, write, "
            "fdatasync, answer). The event loop and the writer thread share one GIL, so one "
            "process does about one core's work; the curve of batch size in 'Cost as work "
            "grows' shows the rate stop growing where that core is busy.")
    return ("**Where the limit is.** " + " ".join(parts)) if parts else ""


def fanout_lag_text(fan: dict[str, Summary], levels: list[int]) -> str:
    """A paragraph splitting our fan-out p99 into the broker's part (its own lag histogram,
    ``messaging_fanout_lag_seconds``) and the subscribers' process, per subscriber count."""
    parts: list[str] = []
    for level in levels:
        case = fan.get(f"ours-{level}")
        if case is None or case["p99"] is None:
            continue
        lags = [e["broker_lag_p99"] for e in case["extra"]
                if isinstance(e.get("broker_lag_p99"), int | float)]
        if not lags:
            continue
        lag = statistics.median(lags)
        parts.append(f"{level} subscribers: broker ≤ {lag:g} ms, subscribers saw "
                     f"{case['p99']:.1f} ms")
    if not parts:
        return ""
    return ("**Fan-out: the broker's part of the p99.** The broker observes, once per slice "
            "of followers it writes, the age of the oldest commit the slice carried (from "
            "the commit becoming visible to the socket write; the "
            "`messaging_fanout_lag_seconds` histogram, read from `/metrics` before and after "
            "each run, so each figure is a bucket's upper bound and bounds every delivery of "
            "the slice from above). Its p99 beside the p99 the subscribers measured (which "
            "adds the publish's own write and fdatasync, and the subscribers' one Python "
            "process reading every socket): " + "; ".join(parts) + ".")
