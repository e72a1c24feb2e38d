"""Storage engine benchmark: durable appends, decoding, seeking, recovery and start-up.

Every figure is printed beside a baseline measured in the same run: raw os.write + fdatasync
of the same bytes, raw reads of the same bytes, start-up with one topic of the same bytes; and
durable appends with append times beside the same appends without them (the time index's
cost: interleaved rounds, medians, see bench/storage/append_ab.py).
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.harness import settings
from bench.harness.figures import Row, percentile
from bench.harness.loops import rate
from bench.harness.results import add_to_json, command_line, report, results_under, source_state
from bench.harness.sampling import load_average
from bench.storage.append_ab import ARM_NAMES, ARMS, append_ab
from messaging.broker.broker import Broker
from messaging.frames import Message, decode, encode_batch, encode_many, scan
from messaging.topic.segment import segment_name
from messaging.topic.times import TIME_RESOLUTION_MS
from messaging.topic.topic import Topic

#: Per (message size, batch): the most ops one arm's round may take (it stops after
#: ``APPEND_SECONDS`` of op time first, when sooner); bounds the bytes a round writes.
MAX_OPS = {(100, 1): 5000, (100, 100): 3000, (100, 1000): 1000,
           (10240, 1): 5000, (10240, 100): 300, (10240, 1000): 20}
APPEND_SECONDS = 0.4
AB_ROUNDS = 9
#: The time index may cost at most this share of batch throughput, and this much of a single
#: append's p50 (s).
BATCH_COST, P50_COST = 0.05, 50e-6


def size_label(size: int) -> str:
    return f"{size} B" if size < 1024 else f"{size // 1024} KiB"


def bench_appends(tmp: Path, rounds: int, seconds: float) -> tuple[list[Row], dict[str, Any]]:
    """Durable appends before and after append times (and raw writes), interleaved: the rows
    and every round's figures."""
    rows: list[Row] = []
    ab_rows: list[Row] = []
    latency: list[Row] = []
    record: dict[str, Any] = {}
    for size in (100, 10 * 1024):
        for batch in (1, 100, 1000):
            label = f"{size_label(size)} × batch {batch}"
            print(f"durable append, {label}: {rounds} rounds of before/after/raw", flush=True)
            directory = tmp / f"append-{size}-{batch}"
            measured = append_ab(directory, size, batch, rounds=rounds, seconds=seconds,
                                 max_ops=MAX_OPS[size, batch])
            shutil.rmtree(directory, ignore_errors=True)
            before, after, raw = (measured[k].median() for k in ARMS)
            print(f"  before {before:,.0f}, after {after:,.0f} ({after / before:.3f}x), "
                  f"raw {raw:,.0f} msg/s", flush=True)
            record[label] = {k: asdict(m) for k, m in measured.items()}
            target, met = "", None
            if size == 100 and batch == 1000:
                target, met = "≥ 70% of raw", after >= 0.7 * raw
            rows.append(Row(f"durable append, {label}", after, "msg/s", ARM_NAMES["raw"], raw,
                            target, met))
            target, met = "", None
            if batch > 1:
                target, met = f"≥ {1 - BATCH_COST:.2f}x before", after >= (1 - BATCH_COST) * before
            ab_rows.append(Row(f"time index A/B: durable append, {label}, with times",
                               after, "msg/s", ARM_NAMES["before"], before, target, met))
            if size == 100 and batch == 1:
                p50b, p50a = measured["before"].median("p50"), measured["after"].median("p50")
                p99b, p99a = measured["before"].median("p99"), measured["after"].median("p99")
                print(f"  single append p50 before {p50b * 1e3:.3f} ms, after "
                      f"{p50a * 1e3:.3f} ms; p99 {p99b * 1e3:.3f} / {p99a * 1e3:.3f} ms",
                      flush=True)
                latency = [
                    Row("time index A/B: single durable append (100 B) latency p50, with "
                        "times", p50a * 1e3, "ms", ARM_NAMES["before"], p50b * 1e3,
                        f"≤ before + {P50_COST * 1e6:.0f} µs", p50a <= p50b + P50_COST),
                    Row("time index A/B: single durable append (100 B) latency p99, with "
                        "times", p99a * 1e3, "ms", ARM_NAMES["before"], p99b * 1e3,
                        "", None),
                ]
    return ab_rows + latency + rows, record


def ab_notes(record: dict[str, Any]) -> str:
    """Each A/B case's rounds, and the median of the rounds' after/before ratios (each round
    runs the two arms back to back), for the notes."""
    parts = []
    for label, arms in record.items():
        before, after = arms["before"]["rates"], arms["after"]["rates"]
        paired = statistics.median(a / b for a, b in zip(after, before, strict=True))
        timed = arms["after"]
        share = sum(timed["timed_ops"]) / sum(timed["ops"])
        cost = ""
        if timed["record_cost"]:
            extra = statistics.median(timed["record_cost"]) * 1e3
            cost = (f"; {share:.0%} of the appends with times wrote a time record, each "
                    f"{extra:.2f} ms more than the others at the median")
        parts.append(f"{label}: before " + ", ".join(f"{v:,.0f}" for v in before)
                     + "; after " + ", ".join(f"{v:,.0f}" for v in after)
                     + f" (median of the rounds' ratios {paired:.2f}x{cost})")
    return "; ".join(parts)


def bench_decode() -> list[Row]:
    count = 200_000
    buffer = encode_batch(1, [b"x" * 100] * count)
    view = memoryview(buffer)
    stamped_buffer = encode_many(Message(1 + i, 1, 1, b"x" * 100) for i in range(count))
    raw = rate(lambda: len(bytes(view)) // 126, min_time=0.3, repeats=3)
    objects = rate(lambda: len(decode(stamped_buffer)[0]), min_time=0.5, repeats=3)
    indexed = rate(lambda: scan(stamped_buffer, after=0, mark_every=4096).count,
                   min_time=0.5, repeats=3)
    return [
        Row("decode 100 B into Message objects (CRC verified)", objects, "msg/s",
            "copy of the raw bytes", raw, "≥ 500,000 msg/s", objects >= 500_000),
        Row("verify-and-index scan, no per-message objects", indexed, "msg/s",
            "copy of the raw bytes", raw, "≥ 2,000,000 msg/s", indexed >= 2_000_000),
    ]


def build_big_topic(path: Path, total: int, size: int) -> int:
    topic = Topic.open(path, 1)
    payload = os.urandom(size)
    per_batch = 4096
    index = 1
    written = 0
    # Keep writing until the last segment is full: recovery reads all of it (the worst case).
    while written < total or topic.segments()[-1].size < topic.max_segment_size - 2 * size:
        count = per_batch if written < total else 1
        buf = encode_many(Message(index + i, 1, 1, payload) for i in range(count))
        topic.append(buf)
        index += count
        written += len(buf)
    topic.sync()
    topic.commit()
    topic.close()
    return index - 1


def bench_big_topic(tmp: Path, total: int) -> list[Row]:
    path = tmp / "big"
    last = build_big_topic(path, total, 1000)
    os.sync()
    started = time.perf_counter()
    topic = Topic.open(path, 1)
    open_time = time.perf_counter() - started
    rng = random.Random(7)
    cold = []
    for _ in range(200):
        target = rng.randrange(1, last + 1)
        t = time.perf_counter()
        with topic.reader(target, limit=1) as reader:
            reader.read()
        cold.append(time.perf_counter() - t)
    warm = []
    for _ in range(2000):
        target = rng.randrange(1, last + 1)
        t = time.perf_counter()
        with topic.reader(target, limit=1) as reader:
            chunk = reader.read()
        warm.append(time.perf_counter() - t)
        assert chunk
    counts = []
    for _ in range(500):
        after = rng.randrange(1, last + 1)
        t = time.perf_counter()
        topic.index_after(after, 5000)
        counts.append(time.perf_counter() - t)
    topic.close()
    fd = os.open(next(path.glob("*.seg")), os.O_RDONLY)
    raw = []
    for _ in range(2000):
        t = time.perf_counter()
        os.pread(fd, 4096, rng.randrange(0, 10 << 20))
        raw.append(time.perf_counter() - t)
    os.close(fd)
    size_gib = total / 2**30
    p99 = percentile(warm, 99) * 1000
    return [
        Row(f"open (recovery) of a {size_gib:.1f} GiB topic, last 10 MiB segment full",
            open_time, "s", "", None,
            "≤ 0.5 s", open_time <= 0.5),
        Row("seek to a random index, p99 (segment indexes built)", p99, "ms",
            "raw 4 KiB pread p99", percentile(raw, 99) * 1000, "≤ 1 ms", p99 <= 1.0),
        Row("seek p99 including first-touch segment indexing", percentile(cold, 99) * 1000,
            "ms", "", None, "", None),
        Row("index of the 5000th message after a random index, p99",
            percentile(counts, 99) * 1000, "ms", "", None, "", None),
    ]


def build_many_topics(path: Path, topics: int, per_topic: int, size: int) -> int:
    """A data directory of ``topics`` topics, each one segment of ``per_topic`` messages.

    Indexes are assigned as a broker would (one index space, topic after topic). Returns the
    number of bytes written.
    """
    payload = os.urandom(size)
    index = 1
    total = 0
    for topic in range(1, topics + 1):
        directory = path / "topics" / str(topic)
        directory.mkdir(parents=True)
        frames = encode_many(Message(index + i, 1, topic, payload) for i in range(per_topic))
        (directory / segment_name(index)).write_bytes(frames)
        index += per_topic
        total += len(frames)
    return total


def time_broker_open(path: Path, repeats: int = 3) -> float:
    """Median seconds of ``Broker.open`` (recovery of every topic) over ``repeats`` opens."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        broker = Broker.open(path)
        times.append(time.perf_counter() - started)
        broker.close()
    return statistics.median(times)


def bench_many_topics(tmp: Path, topics: int = 20_000) -> list[Row]:
    """Start-up with ``topics`` small topics beside one topic holding the same bytes."""
    per_topic, size = 10, 100
    many = tmp / "many-topics"
    total = build_many_topics(many, topics, per_topic, size)
    one = tmp / "one-topic"
    topic = Topic.open(one / "topics" / "1", 1)
    messages = topics * per_topic
    for start in range(1, messages + 1, 10_000):
        count = min(10_000, messages + 1 - start)
        topic.append(encode_many(Message(start + i, 1, 1, b"x" * size) for i in range(count)))
    topic.sync()
    topic.commit()
    assert topic.size == total
    topic.close()
    os.sync()
    many_time = time_broker_open(many)
    one_time = time_broker_open(one)
    shutil.rmtree(many, ignore_errors=True)
    shutil.rmtree(one, ignore_errors=True)
    return [
        Row(f"broker start-up (Broker.open) with {topics:,} topics, one "
            f"{total // topics:,} B segment each", many_time, "s",
            f"1 topic of the same {total / 2**20:.0f} MiB", one_time, "", None),
    ]


def main() -> None:
    p = settings.parser(__doc__, "one A/B round of 0.2 s, a 64 MiB topic, 2,000 topics")
    args = p.parse_args()
    rounds, seconds = (1, 0.2) if args.quick else (AB_ROUNDS, APPEND_SECONDS)
    rounds = max(1, args.rounds) if args.rounds else rounds
    total = int(float(os.environ.get("BENCH_TOPIC_GIB", "1")) * 2**30)
    topics = 20_000
    if args.quick:
        total, topics = 64 << 20, 2000
    results_under(args.out, quick=args.quick, bench="storage")
    tmp = Path(tempfile.mkdtemp(prefix="bench-storage-", dir=os.environ.get("BENCH_DIR")))
    started = time.perf_counter()
    load_before = load_average()
    try:
        rows, record = bench_appends(tmp, rounds, seconds)
        load_after = load_average()
        rows.extend(bench_decode())
        rows.extend(bench_big_topic(tmp, total))
        rows.extend(bench_many_topics(tmp, topics))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    runtime = time.perf_counter() - started
    report("storage", "Storage engine", rows, command_line(), notes=(
        "Append figures include `Topic.append` given the frame offsets a validated publish "
        "carries (stale check, sparse-index marks found by bisection, no header read), one "
        "`fdatasync` per batch and the reader-visibility commit; each append is timed alone. "
        "**Time index A/B** (before and after append times, same run): three arms into files "
        "of their own, run interleaved round by round (before, after, raw; then raw, after, "
        f"before; ...), {rounds} rounds of {seconds:g} s of appends each (bounded in count), "
        "medians of the rounds. *Before*: `Topic.append(..., time_ms=None)`, which writes no "
        "time index: the path of the code before append times. *After*: each append given a "
        "time as the broker gives it (a ms clock read per append that moves only in steps of "
        f"at least {TIME_RESOLUTION_MS} ms, as `Broker.advance_time`), so the topic writes and "
        "fsyncs a time record before the frames it covers once per step, and a time index "
        "file per segment. Targets: batch throughput after ≥ "
        f"{1 - BATCH_COST:.2f}x before; a single append's p50 after ≤ before + "
        f"{P50_COST * 1e6:.0f} µs. Rounds (msg/s): {ab_notes(record)}. "
        f"Load average before the A/B: {load_before}; after it: {load_after} (other work on "
        f"this shared machine makes rounds noisy; the arms alternate so that both see it). "
        f"{source_state()}. Runtime {runtime:.0f} s.\n\n"
        "Seek figures read one frame "
        "through a fresh `TopicReader`. Older segments are indexed lazily on first touch, so "
        "opening a topic reads only its last segment. Start-up figures are the median of 3 "
        "`Broker.open` calls on a warm page cache; each topic's directory is listed and its "
        "last segment read and verified, and no file stays open afterwards."))
    add_to_json("storage", {"time_index_ab": {"rounds": rounds, "seconds": seconds,
                                              "cases": record},
                            "runtime_seconds": runtime})


if __name__ == "__main__":
    main()
