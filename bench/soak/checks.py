"""The soak test's verdicts and its report: data checks, levelling off, JSON, PNG, RESULTS.md.

The data checks compare what readers got with what publishers were acknowledged (the
:mod:`bench.soak.ledger`); the resource checks compare the mean of the last third of the
samples with the mean of the middle third (the first third is warm-up: caches, pools, topics
filling up to the retention size).
"""

from __future__ import annotations

import argparse
import datetime
import re
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bench.harness import results
from bench.harness.figures import fmt
from bench.harness.plots import plt
from bench.harness.results import command_line, machine, write_json, write_section
from bench.soak.ledger import Ledger, RangeRead, Session

_LOG_ERROR = re.compile(r"^\S+ \S+ (ERROR|CRITICAL) ")
_SHOWN = 5  # problems quoted per check


@dataclass
class Check:
    """One pass/fail criterion and why."""

    name: str
    passed: bool
    detail: str


# -- data ---------------------------------------------------------------------------------


def _received(ledger: Ledger, topic: int, indexes: Sequence[int], tags: Sequence[int],
              problems: list[str], where: str) -> list[int]:
    """The received indexes that were acknowledged, after checking order and content.

    Indexes whose publish had an unknown outcome are left out (they may or may not exist).
    """
    acked = ledger.acked[topic]
    known = []
    for k, (index, tag) in enumerate(zip(indexes, tags, strict=True)):
        if k and index <= indexes[k - 1]:
            problems.append(f"{where}: index {index} after {indexes[k - 1]} (not increasing)")
        want = acked.get(index)
        if want is None:
            if tag not in ledger.unknown:
                problems.append(f"{where}: index {index} was delivered but never acknowledged")
        elif want != tag:
            problems.append(f"{where}: index {index} carries publish {tag}, acknowledged as "
                            f"{want}")
        else:
            known.append(index)
    return known


def _first_difference(got: list[int], want: list[int]) -> str:
    for k, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            return f"message {k}: got index {a}, expected {b} (acknowledged)"
    return f"got {len(got)} messages, expected {len(want)}"


def check_streams(ledger: Ledger, ordered: dict[int, list[int]],
                  subscriber_timeout: float) -> Check:
    """Every subscription: increasing, no gaps against the acknowledged indexes in its range,
    the right data; a 410 only after its registration lapsed and only if data was deleted."""
    problems: list[str] = []
    counts: Counter[str] = Counter()
    for s in ledger.sessions:
        counts[s.kind] += 1
        counts["resumed"] += s.resumed
        where = f"{s.kind} {s.url} (topic {s.topic}, from {s.start})"
        known = _received(ledger, s.topic, s.indexes, s.tags, problems, where)
        order = ordered[s.topic]
        last = s.indexes[-1] if s.indexes else s.start - 1
        want = order[bisect_left(order, s.start):bisect_right(order, last)]
        if known != want:
            problems.append(f"{where}: gap: {_first_difference(known, want)}")
        if s.error != "410":
            continue
        counts["410"] += 1
        following = order[bisect_right(order, last):bisect_left(order, s.truncated_first)]
        if not following:
            problems.append(
                f"{where}: 410 (first index {s.truncated_first}) when resuming from index "
                f"{last + 1}, although no acknowledged message of topic {s.topic} lies in "
                f"[{last + 1}, {s.truncated_first}): nothing it needed was deleted")
        elif s.kind != "laggard":
            problems.append(f"{where}: 410 while heartbeating: retention deleted "
                            f"{len(following)} acknowledged messages from {following[0]} on")
        elif s.error_at - s.opened_at < subscriber_timeout:
            problems.append(f"{where}: 410 {s.error_at - s.opened_at:.1f} s after it opened, "
                            f"before its registration could lapse ({subscriber_timeout:.0f} s)")
    received = sum(len(s.indexes) for s in ledger.sessions)
    detail = (f"{len(ledger.sessions)} subscriptions ({counts['follower']} followers of which "
              f"{counts['resumed']} resumed, {counts['laggard']} laggards, {counts['slow']} "
              f"never reading), {received:,} messages received, {counts['410']} ended by 410")
    return _verdict("streaming subscribers: order, gaps, data, 410s", problems, detail)


def _check_read(ledger: Ledger, order: list[int], r: RangeRead, problems: list[str]) -> None:
    where = (f"read topic {r.topic} index={r.index} end={r.end} limit={r.limit} "
             f"(last index {r.last_index})")
    if r.truncated_first:
        if r.truncated_first <= r.index:
            problems.append(f"{where}: 410 naming first index {r.truncated_first}")
        return
    known = _received(ledger, r.topic, r.indexes, r.tags, problems, where)
    if r.indexes and (r.indexes[0] < r.index or (r.end is not None and r.indexes[-1] >= r.end)):
        problems.append(f"{where}: got indexes {r.indexes[0]}..{r.indexes[-1]} outside it")
    if r.limit is not None and len(r.indexes) > r.limit:
        problems.append(f"{where}: {len(r.indexes)} messages, over the limit")
    start = bisect_left(order, r.index)
    stop = bisect_left(order, r.end) if r.end is not None else len(order)
    want = order[start:stop]
    committed = bisect_right(want, r.last_index)  # existed when the read was made
    least = committed if r.limit is None else min(r.limit, committed)
    if known != want[:len(known)] or len(known) < least:
        problems.append(f"{where}: {_first_difference(known, want[:max(least, len(known))])}")


def check_reads(ledger: Ledger, ordered: dict[int, list[int]]) -> Check:
    """Every non-streaming read: exactly the acknowledged messages of the range asked for."""
    problems: list[str] = []
    for r in ledger.reads:
        _check_read(ledger, ordered[r.topic], r, problems)
    gone = sum(1 for r in ledger.reads if r.truncated_first)
    detail = (f"{len(ledger.reads)} reads ({gone} below retention, answered 410), "
              f"{ledger.range_messages:,} messages")
    return _verdict("non-streaming range reads: exactly the range", problems, detail)


def check_times(ledger: Ledger) -> Check:
    """Every message read with its time had one, times never went back along a topic, and
    every read ``since=`` a time started at the first message at or after it."""
    detail = f"{ledger.time_reads} reads of times and since= reads"
    problems = list(ledger.time_problems)
    if not ledger.time_reads:
        problems.append("no read of times was made")
    return _verdict("append times: present, non-decreasing, since= exact", problems, detail)


def _verdict(name: str, problems: list[str], detail: str) -> Check:
    if problems:
        shown = "; ".join(problems[:_SHOWN])
        more = f" (and {len(problems) - _SHOWN} more)" if len(problems) > _SHOWN else ""
        return Check(name, False, f"{detail}; {len(problems)} problems: {shown}{more}")
    return Check(name, True, detail)


def check_log(log_text: str, exit_code: int) -> Check:
    """No Traceback, no ERROR line, a clean exit on SIGTERM."""
    lines = log_text.splitlines()
    bad = [line for line in lines if "Traceback" in line or _LOG_ERROR.match(line)]
    warnings = sum(1 for line in lines if " WARNING " in line)
    detail = (f"{len(lines)} lines, {warnings} warnings, {len(bad)} errors/tracebacks, "
              f"exit code {exit_code}")
    problems = [f"exit code {exit_code}"] if exit_code != 0 else []
    return _verdict("broker log: no Traceback, no ERROR; clean exit", problems + bad, detail)


def check_client_errors(ledger: Ledger, hung: int) -> Check:
    """Nothing the load generator saw went wrong, beyond the 410s the design allows."""
    problems = [f"{key}: {n}" for key, n in sorted(ledger.errors.items())]
    problems += ledger.anomalies
    if hung:
        problems.append(f"{hung} load tasks did not finish in time")
    detail = (f"unexpected: {dict(ledger.errors) or 'none'}; allowed 410s: "
              f"{dict(ledger.expected) or 'none'}; unknown publish outcomes: "
              f"{len(ledger.unknown)}")
    return _verdict("client errors: none unexpected", problems, detail)


# -- levelling off ------------------------------------------------------------------------


def thirds(samples: list[dict[str, Any]], key: str) -> tuple[float, float, float]:
    """The first sample's value and the means of the middle and the last third."""
    n = len(samples) // 3
    values = [float(s.get(key, 0.0)) for s in samples]
    middle, last = values[n:2 * n], values[len(values) - n:]
    return values[0], sum(middle) / len(middle), sum(last) / len(last)


def level_checks(samples: list[dict[str, Any]]) -> list[Check]:
    if len(samples) < 3:
        return [Check("resources level off", False, f"only {len(samples)} samples")]
    _, rss_mid, rss_last = thirds(samples, "rss_mib")
    _, fds_mid, fds_last = thirds(samples, "fds")
    _, p99_mid, p99_last = thirds(samples, "p99_ms")
    rss_growth = rss_last / rss_mid - 1
    fds_growth = fds_last - fds_mid
    return [
        Check("RSS levels off (last third < middle third + 20 %)", rss_growth < 0.2,
              f"{rss_mid:.1f} → {rss_last:.1f} MiB ({rss_growth:+.1%})"),
        Check("descriptors level off (growth < 20 or < 20 %)",
              fds_growth < 20 or fds_last < 1.2 * fds_mid,
              f"{fds_mid:.1f} → {fds_last:.1f} ({fds_growth:+.1f})"),
        Check("publish p99 levels off (last third ≤ 2 × middle third)",
              p99_last <= 2 * p99_mid, f"{p99_mid:.2f} → {p99_last:.2f} ms "
              f"({p99_last / p99_mid if p99_mid else float('inf'):.2f}x)"),
    ]


def evaluate(ledger: Ledger, samples: list[dict[str, Any]], log_text: str, exit_code: int,
             hung: int, subscriber_timeout: float) -> tuple[list[Check], list[dict[str, str]]]:
    """Every criterion, and the summary table's rows."""
    ordered = {topic: sorted(acked) for topic, acked in ledger.acked.items()}
    checks = [check_streams(ledger, ordered, subscriber_timeout), check_reads(ledger, ordered),
              check_times(ledger),
              check_log(log_text, exit_code), check_client_errors(ledger, hung),
              *level_checks(samples)]
    rows = []
    if len(samples) >= 3:
        for key, name, unit in (
                ("rss_mib", "broker RSS", "MiB"), ("fds", "broker open descriptors", ""),
                ("threads", "broker threads", ""), ("cpu_pct", "broker CPU", "%"),
                ("p50_ms", "single publish latency p50", "ms"),
                ("p99_ms", "single publish latency p99", "ms"),
                ("batch_p99_ms", "batch publish latency p99", "ms"),
                ("published_per_s", "messages published", "msg/s"),
                ("delivered_per_s", "messages delivered to subscribers", "msg/s"),
                ("topic_bytes", "bytes in all topics", "B"),
                ("registered_subscribers", "registered subscribers", "")):
            first, middle, last = thirds(samples, key)
            rows.append({"figure": name, "unit": unit, "start": fmt(first),
                         "middle": fmt(middle), "last": fmt(last),
                         "change": f"{last / middle - 1:+.1%}" if middle else "-"})
    return checks, rows


# -- the report ---------------------------------------------------------------------------


def _table(rows: list[dict[str, str]], checks: list[Check]) -> str:
    lines = ["| figure | first sample | middle third (mean) | last third (mean) | change |",
             "|---|---|---|---|---|"]
    for r in rows:
        unit = f" {r['unit']}" if r["unit"] else ""
        lines.append(f"| {r['figure']} | {r['start']}{unit} | {r['middle']}{unit} | "
                     f"{r['last']}{unit} | {r['change']} |")
    lines += ["", "| criterion | result | detail |", "|---|---|---|"]
    for c in checks:
        detail = c.detail.replace("|", "\\|")
        lines.append(f"| {c.name} | {'PASS' if c.passed else '**FAIL**'} | {detail} |")
    return "\n".join(lines)


def _plot(samples: list[dict[str, Any]], bench: str) -> None:
    t = [s["t"] for s in samples]
    fig, axes = plt.subplots(4, 1, figsize=(10, 11), sharex=True)
    panels: list[tuple[str, list[tuple[str, str]]]] = [
        ("broker RSS (MiB)", [("rss_mib", "RSS")]),
        ("broker descriptors / threads", [("fds", "open descriptors"), ("threads", "threads")]),
        ("publish latency (ms)", [("p50_ms", "single p50"), ("p99_ms", "single p99"),
                                  ("batch_p99_ms", "batch p99")]),
        ("messages/s", [("published_per_s", "published"), ("delivered_per_s", "delivered")]),
    ]
    n = len(samples) // 3
    for ax, (label, series) in zip(axes, panels, strict=True):
        for key, name in series:
            ax.plot(t, [s.get(key, 0) for s in samples], marker=".", label=name)
        if n:
            ax.axvspan(t[n], t[2 * n - 1], color="tab:blue", alpha=0.06)
            ax.axvspan(t[len(t) - n], t[-1], color="tab:green", alpha=0.06)
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.legend(loc="upper left", fontsize="small")
    axes[-1].set_xlabel("seconds (shaded: middle and last third, compared)")
    fig.suptitle("Soak: one broker under mixed load")
    fig.tight_layout()
    fig.savefig(results.RESULTS / f"{bench}.png", dpi=90)
    plt.close(fig)


def publish_results(samples: list[dict[str, Any]], checks: list[Check],
                    rows: list[dict[str, str]], ledger: Ledger, client_events: Counter[str],
                    args: argparse.Namespace, broker_command: list[str],
                    broker_options: list[str], cluster: str = "", kafka: str = "") -> None:
    """Print the table and verdicts; write soak.json, soak.png and the RESULTS.md section
    (soak_cluster.* and its own section when ``cluster`` describes the cluster run,
    soak_cluster_intake.* when it also has the object store and the intake lane,
    soak_tiered.* for one broker with an object store, soak_kafka.* when ``kafka``
    describes the Kafka clients' load beside it)."""
    tiered = bool(getattr(args, "tiered", False))
    bench = ("soak_kafka" if kafka else "soak_cluster_intake" if cluster and tiered
             else "soak_cluster" if cluster else "soak_tiered" if tiered else "soak")
    date = datetime.date.today().isoformat()
    command = command_line()
    table = _table(rows, checks)
    print(f"\n{table}\n")
    for c in checks:
        print(f"{'PASS' if c.passed else 'FAIL'}: {c.name}: {c.detail}")
    payload = {
        "bench": bench, "date": date, "machine": machine(), "command": command,
        "seconds": args.seconds, "sample_interval": args.sample_interval, "seed": args.seed,
        "broker": " ".join(["messaging", *broker_command]),
        "checks": [asdict(c) for c in checks], "summary": rows, "samples": samples,
        "errors": dict(ledger.errors), "expected_410s": dict(ledger.expected),
        "client_events": dict(client_events), "anomalies": ledger.anomalies,
        "sessions": [_session_row(s) for s in ledger.sessions],
    }
    write_json(bench, payload, indent=1)
    if samples:
        _plot(samples, bench)
    verdict = "PASS" if all(c.passed for c in checks) else "FAIL"
    title = ("Soak (one broker, Kafka clients beside the HTTP load)" if kafka
             else "Soak (a cluster with the intake lane, mixed load)" if cluster and tiered
             else "Soak (a cluster, mixed load)" if cluster
             else "Soak (one broker with a file:// object store, mixed load)" if tiered
             else "Soak (one broker, mixed load)")
    write_section(bench, title, (
        f"{date} on {machine()}.\nCommand: `{command}`\n\n"
        + (f"{cluster} " if cluster else "")
        + ("Rolled segments go to a file:// object store in the run's directory, and the "
           "disk keeps 1M of each topic (`--local-retention-size 1M`): laggards and range "
           "readers read the store. " if tiered and not cluster else "")
        + f"Broker: `messaging broker {' '.join(broker_options)}` (fsync always), "
        f"{args.seconds:.0f} s, a sample every {args.sample_interval:.0f} s. "
        "Load (same machine): 4 publishers of single POSTs at 40 req/s each and 2 of "
        "20–200-message frame batches at 5 req/s each over 4 topics; 4 heartbeating "
        "followers (half of their sessions resume where the previous one stopped), 2 slow "
        "laggards whose registration lapses, 2 subscribers that never read; 2 range readers. "
        "Latencies are measured by the load generator. Levelling off compares the last "
        f"third of the samples with the middle third. "
        + (f"{kafka} " if kafka else "")
        + f"Overall: **{verdict}**.\n\n"
        f"{table}\n\n![{bench}](results/{bench}.png)"))


def _session_row(s: Session) -> dict[str, Any]:
    return {"kind": s.kind, "url": s.url, "topic": s.topic, "start": s.start,
            "resumed": s.resumed, "received": len(s.indexes),
            "last": s.indexes[-1] if s.indexes else None,
            "seconds": round(s.closed_at - s.opened_at, 1), "error": s.error,
            "truncated_first": s.truncated_first, "reconnects": s.reconnects}
