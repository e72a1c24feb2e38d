"""The scaling benchmark's report: a plot per curve, the sentence under it (the measured bend
and the measured cause), a table per curve, the summary rows, and ``results/scaling.json``."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

from bench.harness import results
from bench.harness.figures import Row, fmt
from bench.harness.payloads import FRAME
from bench.harness.plots import plt
from bench.harness.results import add_to_json, command_line, report
from bench.harness.stream_holder import SAMPLE_EVERY
from bench.scaling.load import Settings

Point = dict[str, Any]
T = TypeVar("T")
SUBSCRIBER_TARGET_KIB = 64
TOPIC_TARGET_KIB = 32


def bend(xs: list[float], ys: list[float], factor: float) -> int | None:
    """The first index whose step from the previous point gained less than ``factor``×."""
    for i in range(1, len(xs)):
        if ys[i - 1] > 0 and ys[i] / ys[i - 1] < factor:
            return i
    return None


def lasting(values: list[T], bent: Callable[[T], bool]) -> int | None:
    """The first index (past 0) from which every value is ``bent``: a dip of one noisy point
    followed by a recovery is not a bend."""
    for i in range(1, len(values)):
        if all(bent(v) for v in values[i:]):
            return i
    return None


def n(x: float) -> str:
    return f"{x:,.0f}"


def size_name(size: float) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size:g} B"


def limit_of(p: Point, disk: float, rate: float) -> str:
    """What holds a point back: the disk, the broker's event loop, or neither."""
    if rate >= 0.7 * disk:
        return f"the disk ({rate / disk:.0%} of its write+fdatasync ceiling for the same bytes)"
    if p["cpu_share"] >= 0.85:
        return (f"the broker's CPU ({p['cpu_share']:.0%} of a core busy, "
                f"{p['cpu_us_per_msg']:,.1f} µs per message; the disk could take "
                f"{disk / rate:.1f}× more)")
    return (f"neither the broker's core ({p['cpu_share']:.0%} busy) nor the disk (it could "
            f"take {disk / rate:.1f}× more) alone: four closed-loop senders wait on each POST's "
            f"round trip (p99 {p['p99_ms']:.1f} ms), receive, checksum, write and fdatasync "
            f"in turn")


def batch_sentence(points: list[Point]) -> str:
    xs = [p["x"] for p in points]
    ys = [p["msg_per_s"] for p in points]
    k = bend(xs, ys, 5.0)  # under half of the ideal 10× per 10× larger batch
    first, last = points[0], points[-1]
    if k is None:
        return (f"No bend up to {n(xs[-1])} messages per POST: throughput rises "
                f"{ys[-1] / ys[0]:.0f}× as the per-request costs (one HTTP request, one fsync "
                f"round) are spread over more messages, broker CPU per message falling from "
                f"{first['cpu_us_per_msg']:.0f} to {last['cpu_us_per_msg']:.1f} µs.")
    p = points[k]
    return (f"Throughput still gains {ys[k - 1] / ys[max(0, k - 2)]:.1f}× from "
            f"{n(xs[max(0, k - 2)])} to {n(xs[k - 1])} messages per POST but only "
            f"{ys[k] / ys[k - 1]:.1f}× from there to "
            f"{n(xs[k])}: the per-request costs (one HTTP request, one fsync round) are "
            f"already spread thin (broker CPU {points[k - 1]['cpu_us_per_msg']:.1f} → "
            f"{p['cpu_us_per_msg']:.1f} µs per message, "
            f"{size_name(points[k - 1]['bytes_per_fsync'])} → "
            f"{size_name(p['bytes_per_fsync'])} per fsync round), so the per-message cost "
            f"now sets the rate, held by {limit_of(last, last['disk_msg_per_s'], ys[-1])} "
            f"at {n(xs[-1])}.")


def size_sentence(points: list[Point]) -> str:
    xs = [p["x"] for p in points]
    mib = [p["mib_per_s"] for p in points]
    k = bend(xs, mib, 2.0)
    first, last = points[0], points[-1]
    per_mib = last["cpu_us_per_msg"] / (last["message_bytes"] / 2**20) / 1000
    end = (f"ending at {last['mib_per_s']:.0f} MiB/s for {size_name(xs[-1])} messages, where a "
           f"message costs in proportion to its bytes ({per_mib:.1f} ms of broker CPU per MiB: "
           f"checksum and copies; {size_name(last['bytes_per_fsync'])} per fsync round) and "
           f"the limit is {limit_of(last, last['disk_msg_per_s'], last['msg_per_s'])}.")
    if k is None:
        return f"MiB/s grows at every step up to {size_name(xs[-1])}, {end}"
    before = points[k - 1]
    return (f"MiB/s grows {mib[k - 1] / mib[0]:.1f}× from {size_name(xs[0])} to "
            f"{size_name(xs[k - 1])} messages because broker CPU per message grows far slower "
            f"than the size ({first['cpu_us_per_msg']:.2f} → {before['cpu_us_per_msg']:.2f} µs "
            f"for {xs[k - 1] / xs[0]:,.0f}× the bytes); to {size_name(xs[k])} it gains only "
            f"{mib[k] / mib[k - 1]:.1f}× ({mib[k - 1]:.0f} → {mib[k]:.0f} MiB/s) and stays "
            f"between {min(mib[k:]):.0f} and {max(mib[k:]):.0f} MiB/s from there, {end}")


def topic_sentence(points: list[Point], small: int) -> str:
    xs = [p["x"] for p in points]
    ys = [p["msg_per_s"] for p in points]
    base = points[0]
    low = min(range(len(points)), key=lambda i: ys[i])
    k = lasting(ys, lambda y: y < 0.8 * ys[0])
    p = points[k if k is not None else low]
    fds = max(q["descriptors"] for q in points)
    head = (f"Single-message throughput stays below 80% of the one-topic rate from "
            f"{n(xs[k])} topics on ({n(ys[k])} vs {n(ys[0])} msg/s, lowest {n(ys[low])} at "
            f"{n(xs[low])}; {small}-message batches {n(base['batch_msg_per_s'])} → "
            f"{n(p['batch_msg_per_s'])})" if k is not None else
            f"No lasting bend: single-message POSTs over up to {n(xs[-1])} topics keep at least "
            f"{ys[low] / ys[0]:.0%} of the one-topic rate (lowest {n(ys[low])} msg/s at "
            f"{n(xs[low])} topics)")
    per_round = p["bytes_per_fsync"] / FRAME
    return (f"{head}: fsync rounds carry about the same {p['bytes_per_fsync']:,.0f} B "
            f"({per_round:.1f} messages, {base['bytes_per_fsync']:,.0f} B for one topic) but a "
            f"round fdatasyncs every topic it touched (side by side, up to 8 at a time), so one "
            f"topic shares one fdatasync per round while "
            f"{n(xs[k if k is not None else low])} topics need about {per_round:.1f}, and "
            f"rounds/s fall {base['fsyncs_per_s']:,.0f} → "
            f"{p['fsyncs_per_s']:,.0f} while the broker's core is {base['cpu_share']:.0%} → "
            f"{p['cpu_share']:.0%} busy (CPU per message {base['cpu_us_per_msg']:.0f} → "
            f"{p['cpu_us_per_msg']:.0f} µs: it waits rather than computes); the serial "
            f"write+fdatasync loop over {n(p['disk_files'])} files ran "
            f"{n(p['disk_msg_per_s'])}/s against {n(base['disk_msg_per_s'])}/s on one file, "
            f"and descriptors level off at {fds:,} (topics keep at most min(RLIMIT_NOFILE / 4,"
            f" 4,096) write files open).")


def subscriber_sentence(points: list[Point], rate: float) -> str:
    xs = [p["x"] for p in points]
    base = points[0]
    k = lasting(points, lambda p: p["delivery_p50_ms"] > 3 * base["delivery_p50_ms"]
                or not p["complete"])
    p = points[k] if k is not None else points[-1]
    tail = ("every subscriber got every message at every point"
            if all(q["complete"] for q in points) else
            "not every subscriber got every message at " + ", ".join(
                n(q["x"]) for q in points if not q["complete"]) + " subscribers")
    head = (f"Delivery p50 passes three times the one-subscriber figure at {n(xs[k])} "
            f"subscribers ({p['delivery_p50_ms']:.1f} vs {base['delivery_p50_ms']:.1f} ms, p99 "
            f"{p['delivery_p99_ms']:.1f} vs {base['delivery_p99_ms']:.1f} ms, of which the "
            f"publish's own round trip, fsync included, p99 {p['publish_p99_ms']:.1f} ms)"
            if k is not None else
            f"No bend up to {n(xs[-1])} subscribers (delivery p50 "
            f"{base['delivery_p50_ms']:.1f} → {p['delivery_p50_ms']:.1f} ms, p99 "
            f"{base['delivery_p99_ms']:.1f} → {p['delivery_p99_ms']:.1f} ms)")
    return (f"{head}: there {n(p['deliveries_per_s'])} deliveries/s cost the broker "
            f"{p['cpu_us_per_delivery']:.1f} µs of CPU each ({p['cpu_share']:.0%} of a core, "
            f"against {base['cpu_share']:.0%} for one subscriber), the stream holder reading "
            f"them {p['holder_cpu_share']:.0%} of a core, and {p['machine_cores_busy']:.1f} "
            f"of the machine's {os.cpu_count()} cores were busy; the publisher kept "
            f"{p['publish_rate']:.0f} of {rate:.0f} msg/s; {tail}.")


def table(points: list[Point], columns: list[tuple[str, str, str]]) -> str:
    """A markdown table: (header, key, format) per column."""
    lines = ["| " + " | ".join(h for h, _, _ in columns) + " |",
             "|" + "---|" * len(columns)]
    for p in points:
        cells = []
        for _, key, spec in columns:
            value = p.get(key)
            cells.append("-" if value is None else
                         ("yes" if value else "**no**") if isinstance(value, bool) else
                         format(value, spec) if spec else fmt(value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(name: str, title: str, xlabel: str, points: list[Point],
         rates: list[tuple[str, str, str]], latencies: list[tuple[str, str]],
         rate_unit: str) -> str:
    """``results/scaling-<name>.png``: rates (left axis, log) and latencies (right axis)
    against the curve's x (log); its file name."""
    xs = [p["x"] for p in points]
    fig, left = plt.subplots(figsize=(8, 4.2))
    for label, key, style in rates:
        left.plot(xs, [p[key] for p in points], style, label=label)
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel(xlabel)
    left.set_ylabel(rate_unit)
    right = left.twinx()
    for (label, key), color, marker in zip(latencies, ("tab:red", "tab:purple", "tab:brown"),
                                           "oDv", strict=False):
        right.plot(xs, [p[key] for p in points], f"{marker}:", color=color, label=label)
    right.set_ylabel("ms")
    right.set_ylim(bottom=0)
    handles = left.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    left.legend(handles[0] + more[0], handles[1] + more[1], fontsize=8, loc="best")
    left.set_title(title)
    fig.tight_layout()
    file = f"scaling-{name}.png"
    fig.savefig(results.RESULTS / file, dpi=90)
    plt.close(fig)
    return file


def write_results(curves: dict[str, list[Point]], bare: Point, idle_subscriber: Point,
                  idle_topic: Point, s: Settings, nofile: int, elapsed: float) -> None:
    """Plots, sentences, tables and rows of one run: bench/results/scaling*, RESULTS.md."""
    results.RESULTS.mkdir(parents=True, exist_ok=True)
    batch, size, topics, subs = (curves[k] for k in ("batch", "size", "topics", "subscribers"))
    sections = []
    file = plot("batch", "Batch size (100 B messages, 4 senders)", "messages per POST", batch,
                [("broker msg/s", "msg_per_s", "o-"),
                 ("bare aiohttp, same bodies", "bare_msg_per_s", "s--"),
                 ("disk: write+fdatasync of each body", "disk_msg_per_s", "^--")],
                [("POST p99", "p99_ms")], "messages/s")
    sections.append((file, batch_sentence(batch), table(batch, [
        ("messages per POST", "x", ",.0f"), ("msg/s", "msg_per_s", ",.0f"),
        ("p99 ms", "p99_ms", ".2f"), ("bare aiohttp msg/s", "bare_msg_per_s", ",.0f"),
        ("disk ceiling msg/s", "disk_msg_per_s", ",.0f"),
        ("broker CPU µs/msg", "cpu_us_per_msg", ".2f"), ("CPU share", "cpu_share", ".0%"),
        ("bytes per fsync round", "bytes_per_fsync", ",.0f"),
        ("machine cores busy", "machine_cores_busy", ".1f")])))
    file = plot("size", "Message size (~1 MiB per POST, 4 senders)", "message bytes", size,
                [("broker MiB/s", "mib_per_s", "o-"),
                 ("disk: write+fdatasync of each body", "disk_mib_per_s", "^--")],
                [("POST p99", "p99_ms")], "MiB/s")
    sections.append((file, size_sentence(size), table(size, [
        ("message bytes", "x", ",.0f"), ("per POST", "messages_per_post", ",.0f"),
        ("msg/s", "msg_per_s", ",.0f"), ("MiB/s", "mib_per_s", ",.1f"),
        ("p99 ms", "p99_ms", ".2f"), ("disk MiB/s", "disk_mib_per_s", ",.1f"),
        ("bare aiohttp msg/s", "bare_msg_per_s", ",.0f"),
        ("broker CPU µs/msg", "cpu_us_per_msg", ".2f"), ("CPU share", "cpu_share", ".0%"),
        ("bytes per fsync round", "bytes_per_fsync", ",.0f"),
        ("machine cores busy", "machine_cores_busy", ".1f")])))
    file = plot("topics", "Topic count (round-robin, 4 senders)", "topics", topics,
                [("single-message msg/s", "msg_per_s", "o-"),
                 (f"{s.small_batch}-message batches msg/s", "batch_msg_per_s", "s-"),
                 ("disk: write+fdatasync round-robin over the files", "disk_msg_per_s",
                  "^--")],
                [("single p99", "p99_ms"), ("batch p99", "batch_p99_ms")], "messages/s")
    sections.append((file, topic_sentence(topics, s.small_batch), table(topics, [
        ("topics", "x", ",.0f"), ("single msg/s", "msg_per_s", ",.0f"),
        ("single p99 ms", "p99_ms", ".2f"), ("batch msg/s", "batch_msg_per_s", ",.0f"),
        ("batch p99 ms", "batch_p99_ms", ".2f"), ("disk msg/s", "disk_msg_per_s", ",.0f"),
        ("CPU µs/msg (single)", "cpu_us_per_msg", ".0f"), ("CPU share", "cpu_share", ".0%"),
        ("bytes per fsync round (single)", "bytes_per_fsync", ",.0f"),
        ("fsync rounds/s", "fsyncs_per_s", ",.0f"), ("descriptors", "descriptors", ",.0f"),
        ("descriptors (batch)", "batch_descriptors", ",.0f")])))
    for p in subs:
        p["bare_p99_ms"] = bare["bare_p99_ms"]
    file = plot("subscribers", f"Subscriber count (one publisher, {s.rate:.0f} msg/s)",
                "streaming subscribers of one topic", subs,
                [("deliveries/s", "deliveries_per_s", "o-")],
                [("delivery p50", "delivery_p50_ms"), ("delivery p99", "delivery_p99_ms"),
                 ("bare aiohttp POST p99", "bare_p99_ms")], "deliveries/s")
    sections.append((file, subscriber_sentence(subs, s.rate), table(subs, [
        ("subscribers", "x", ",.0f"), ("published/s", "publish_rate", ",.0f"),
        ("publish p99 ms", "publish_p99_ms", ".2f"),
        ("delivery p50 ms", "delivery_p50_ms", ".1f"),
        ("delivery p99 ms", "delivery_p99_ms", ".1f"), ("timed", "timed", ",.0f"),
        ("all got all", "complete", ""), ("deliveries/s", "deliveries_per_s", ",.0f"),
        ("broker CPU share", "cpu_share", ".0%"),
        ("CPU µs/delivery", "cpu_us_per_delivery", ".1f"),
        ("holder CPU share", "holder_cpu_share", ".0%"),
        ("machine cores busy", "machine_cores_busy", ".1f")])))

    isub, itop = idle_subscriber, idle_topic
    empty = isub["empty_rss_kib"] / 1024
    rows = [
        Row(f"broker RSS with {isub['subscribers']:,} idle streaming subscribers (caught-up "
            f"GETs reading)", isub["rss_kib"] / 1024, "MiB", "the same broker before them",
            empty),
        Row("broker RSS per idle streaming subscriber", isub["per_subscriber_kib"], "KiB",
            target=f"≤ {SUBSCRIBER_TARGET_KIB} KiB",
            met=isub["per_subscriber_kib"] <= SUBSCRIBER_TARGET_KIB),
        Row(f"broker RSS with {itop['topics']:,} idle topics (one message each), grown live",
            itop["after_kib"] / 1024, "MiB", "the same broker with 1 topic",
            itop["before_kib"] / 1024),
        Row("broker RSS per idle topic, grown live", itop["per_topic_kib"], "KiB",
            target=f"≤ {TOPIC_TARGET_KIB} KiB", met=itop["per_topic_kib"] <= TOPIC_TARGET_KIB),
        Row(f"broker RSS restarted on the {itop['topics']:,} topics", itop["restart_rss_kib"]
            / 1024, "MiB", "a broker started on an empty directory",
            itop["empty_rss_kib"] / 1024),
        Row("broker RSS per idle topic after a restart", itop["per_topic_restart_kib"], "KiB",
            target=f"≤ {TOPIC_TARGET_KIB} KiB",
            met=itop["per_topic_restart_kib"] <= TOPIC_TARGET_KIB),
        Row(f"broker start-up with {itop['topics']:,} topics", itop["start_s"], "s",
            "empty data directory", itop["empty_start_s"]),
        Row(f"batch publish, {n(batch[-1]['x'])} × 100 B per POST", batch[-1]["msg_per_s"],
            "msg/s", "write+fdatasync of the same bodies", batch[-1]["disk_msg_per_s"]),
        Row(f"{size_name(size[-1]['x'])} messages", size[-1]["mib_per_s"], "MiB/s",
            "write+fdatasync of the same bodies", size[-1]["disk_mib_per_s"]),
        Row(f"single-message POSTs over {n(topics[-1]['x'])} topics", topics[-1]["msg_per_s"],
            "msg/s", "the same over 1 topic", topics[0]["msg_per_s"]),
        Row(f"delivery p99 with {n(subs[-1]['x'])} subscribers at {s.rate:.0f} msg/s",
            subs[-1]["delivery_p99_ms"], "ms", "1 subscriber", subs[0]["delivery_p99_ms"]),
    ]
    body = []
    for file, sentence, tab in sections:
        body.append(f"![{file}](results/{file})\n\n{sentence}\n\n{tab}")
    notes = (
        f"Broker `--fsync always`, one process on 127.0.0.1 under RLIMIT_NOFILE {nofile:,} "
        f"(so it keeps up to {min(nofile // 4, 4096):,} topics' write files open); the load "
        f"generator, bare aiohttp and the stream holder share the machine's {os.cpu_count()} "
        f"cores with it, so every figure is noisy. Closed-loop loads run {s.seconds:g} s per "
        f"point with 4 senders; "
        f"p99 is of POST round trips. Broker CPU is /proc/PID/stat user+system over the load; "
        f"bytes per fsync round is frame bytes applied over `messaging_fsyncs_total` (one "
        f"round fdatasyncs every file it wrote); descriptors are /proc/PID/fd at the end of "
        f"the load. Subscribers: one open-loop publisher of single 100 B messages at "
        f"{s.rate:.0f}/s ({s.publishes:,} messages), the streams in a child process reading "
        f"everything, every {SAMPLE_EVERY}th stream timing each message from the "
        f"publisher's send; bare aiohttp POST round trip p50 {bare['bare_p50_ms']:.2f} ms, "
        f"p99 {bare['bare_p99_ms']:.2f} ms. Memory: VmRSS once settled; idle subscribers "
        f"added {isub['fds_per_subscriber']:.1f} descriptors each; the {itop['topics']:,} "
        f"topics took {itop['create_s']:.1f} s to create (multi-topic POSTs of 5,000 frames) "
        f"and the restarted broker held {itop['restart_fds']} descriptors. Whole run "
        f"{elapsed / 60:.1f} min.\n\n" + "\n\n".join(body))
    report("scaling", "Cost as work grows", rows, command_line(), notes=notes)
    add_to_json("scaling", {
        "curves": curves, "baselines": bare,
        "memory": {"idle_subscriber": idle_subscriber, "idle_topic": idle_topic},
        "sentences": {name: sentence for name, (_, sentence, _) in
                      zip(("batch", "size", "topics", "subscribers"), sections, strict=True)}})

