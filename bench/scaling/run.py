"""Cost as work grows: throughput and p99 latency against batch size, message size, topic
count and subscriber count, and the broker's memory per idle subscriber and per idle topic.

Every point is measured beside a baseline from the same run: the disk's write+fdatasync
ceiling for the same bytes, bare aiohttp answering the same requests, the broker's own
smallest point, an empty broker's RSS. Beside each point sits the figure that explains the
curve's bend: broker CPU seconds per message, bytes per fsync round, descriptors open.

The broker is a subprocess on 127.0.0.1 (``--fsync always``); streaming subscribers live in a
child process (the harness's stream holder). Every loop is bounded in count and
time; the full run takes under 12 minutes on 2 cores, ``--quick`` well under a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.harness import settings
from bench.harness.disk import disk_rate
from bench.harness.figures import ms
from bench.harness.loops import off_loop, run_loop
from bench.harness.payloads import FRAME, PAYLOAD
from bench.harness.procs import bare_server, broker, raise_nofile
from bench.harness.results import results_under
from bench.harness.sampling import cpu_seconds, descriptors, machine_times
from bench.harness.stream_holder import Holder, publish_one, wait_streams
from bench.scaling.load import (
    Counters,
    Load,
    Request,
    Settings,
    counters,
    create_topics,
    paced_publish,
    post_load,
    same,
)
from bench.scaling.memory import memory_subscribers, memory_topics
from bench.scaling.report import write_results
from messaging.frames import FRAMES_CONTENT_TYPE, encode_batch

SENDERS = 4
Point = dict[str, Any]


def causes(delta: Counters, load: Load, pid: int) -> Point:
    """The broker-side figures of one measured load."""
    return {"cpu_us_per_msg": delta.cpu / max(1, load.messages) * 1e6,
            "cpu_share": delta.cpu / load.elapsed,
            "bytes_per_fsync": delta.bytes / max(1.0, delta.fsyncs),
            "fsyncs_per_s": delta.fsyncs / load.elapsed,
            "descriptors": descriptors(pid)}


async def measured(url: str, pid: int, request: Callable[[int], Request], s: Settings,
                   content_type: str = FRAMES_CONTENT_TYPE) -> tuple[Load, Point]:
    """Run a ``SENDERS``-wide load against the broker; the load and the broker's figures."""
    start = await counters(url, pid, end=False)
    machine = machine_times()
    load = await post_load(url, request, senders=SENDERS, seconds=s.seconds,
                           max_requests=200_000, content_type=content_type)
    busy, total = (b - a for a, b in zip(machine, machine_times(), strict=True))
    fds = descriptors(pid)
    delta = await counters(url, pid, end=True) - start
    return load, causes(delta, load, pid) | {
        "descriptors": fds, "machine_cores_busy": busy / total * (os.cpu_count() or 1)}


def summary(load: Load) -> Point:
    return {"msg_per_s": load.msg_rate, "mib_per_s": load.byte_rate / 2**20,
            "p50_ms": ms(load.latencies, 50), "p99_ms": ms(load.latencies, 99),
            "requests": load.requests}


# -- batch size and message size: one broker, one bare aiohttp -----------------------------

async def body_curves(tmp: Path, s: Settings) -> tuple[list[Point], list[Point]]:
    """Throughput and p99 of batch POSTs by messages per POST, then by message size."""
    proc, url = broker(tmp / "bodies", "--fsync", "always")
    bare_proc, bare = bare_server()
    batch_points: list[Point] = []
    size_points: list[Point] = []
    try:
        await post_load(url, same("/messaging/messages", encode_batch(1, [PAYLOAD]), 1),
                        senders=SENDERS, seconds=0.3, max_requests=200,
                        content_type=FRAMES_CONTENT_TYPE)  # warm-up
        shapes = [("batch", 1, n, len(PAYLOAD)) for n in s.batches] + [
            ("size", 2, max(1, 2**20 // size), size) for size in s.sizes]
        for curve, topic, count, size in shapes:
            body = encode_batch(topic, [b"x" * size] * count)
            ours, why = await measured(url, proc.pid, same("/messaging/messages", body, count), s)
            base = await post_load(bare, same("/204", body, count),
                                   senders=SENDERS, seconds=s.seconds, max_requests=200_000,
                                   content_type=FRAMES_CONTENT_TYPE)
            disk = await off_loop(partial(disk_rate, tmp / "disk", len(body),
                                          seconds=min(1.0, s.seconds)))
            point = {"x": count if curve == "batch" else size, "messages_per_post": count,
                     "message_bytes": size, "post_bytes": len(body)} | summary(ours) | why | {
                "bare_msg_per_s": base.msg_rate, "bare_p99_ms": ms(base.latencies, 99),
                "disk_msg_per_s": disk * count, "disk_mib_per_s": disk * len(body) / 2**20}
            (batch_points if curve == "batch" else size_points).append(point)
            print(f"  {curve} {point['x']:>8,}: {point['msg_per_s']:>11,.0f} msg/s "
                  f"{point['mib_per_s']:7.1f} MiB/s p99 {point['p99_ms']:7.2f} ms | bare "
                  f"{point['bare_msg_per_s']:>11,.0f} | disk {point['disk_msg_per_s']:>11,.0f}"
                  f" | CPU {point['cpu_us_per_msg']:.1f} µs/msg, "
                  f"{point['bytes_per_fsync'] / 1024:,.0f} KiB/fsync", flush=True)
    finally:
        proc.stop()
        bare_proc.stop()
    return batch_points, size_points


# -- topic count: publishes spread round-robin -----------------------------------------------

async def topic_curve(tmp: Path, s: Settings) -> list[Point]:
    """Single-message and small-batch POSTs round-robin over 1..N topics (one broker whose
    topic count grows from point to point)."""
    proc, url = broker(tmp / "topics", "--fsync", "always")
    points: list[Point] = []
    made = 0
    small = s.small_batch
    try:
        for count in s.topics:
            await create_topics(url, made + 1, count)
            made = count

            def single(i: int, n: int = count) -> Request:
                return f"/messaging/messages?topicID={1 + i % n}", PAYLOAD, 1

            def batch(i: int, n: int = count) -> Request:
                return "/messaging/messages", encode_batch(1 + i % n, [PAYLOAD] * small), small

            one, why_one = await measured(url, proc.pid, single, s, "application/octet-stream")
            many, why_many = await measured(url, proc.pid, batch, s)
            files = min(count, max(1, one.requests))  # files the broker's load touched
            disk = await off_loop(partial(disk_rate, tmp / "disk", FRAME, files=files,
                                          seconds=min(1.0, s.seconds)))
            point = {"x": count} | summary(one) | why_one | {
                f"batch_{k}": v for k, v in (summary(many) | why_many).items()} | {
                "disk_msg_per_s": disk, "disk_files": files}
            points.append(point)
            print(f"  topics {count:>6,}: single {point['msg_per_s']:>7,.0f} msg/s p99 "
                  f"{point['p99_ms']:6.2f} ms, {small}-batches "
                  f"{point['batch_msg_per_s']:>8,.0f} msg/s p99 {point['batch_p99_ms']:6.2f} ms"
                  f" | disk {disk:,.0f}/s over {files:,} files | CPU "
                  f"{point['cpu_us_per_msg']:.0f} µs/msg, {point['descriptors']:,} fds, "
                  f"{point['bytes_per_fsync']:,.0f} B/fsync", flush=True)
    finally:
        proc.stop()
    return points


# -- subscriber count: one paced publisher, N streaming readers ----------------------------

async def subscriber_curve(tmp: Path, s: Settings) -> tuple[list[Point], Point]:
    """Delivery latency and completeness with N streams of one topic at ``s.rate`` msg/s;
    also bare aiohttp's POST round trip as the baseline."""
    proc, url = broker(tmp / "subscribers", "--fsync", "always")
    bare_proc, bare = bare_server()
    points: list[Point] = []
    try:
        rtts = await post_load(bare, same("/204", PAYLOAD, 1), senders=1,
                               seconds=min(2.0, s.seconds), max_requests=2000,
                               content_type="application/octet-stream")
        baseline = {"bare_p50_ms": ms(rtts.latencies, 50), "bare_p99_ms": ms(rtts.latencies, 99)}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            last = 0
            for _ in range(50):
                last = await publish_one(session, url, 1)
            for count in s.subscribers:
                holder = await off_loop(partial(Holder, url, 1, count, index=last + 1))
                try:
                    await wait_streams(session, url, count)
                    await asyncio.sleep(0.5)
                    start = await counters(url, proc.pid, end=False)
                    holder_cpu, machine = cpu_seconds(holder.pid), machine_times()
                    began = time.perf_counter()
                    load = await paced_publish(url, 1, s.rate, s.publishes)
                    want = load.messages * FRAME * count
                    got = closed = timed = 0
                    d50 = d99 = 0.0
                    for _ in range(300):  # until every stream has every message, ≤ 30 s
                        got, closed, d50, d99, timed = await off_loop(holder.delivery)
                        if got >= want:
                            break
                        await asyncio.sleep(0.1)
                    drained = time.perf_counter()
                    delta = await counters(url, proc.pid, end=True) - start
                    holder_cpu = cpu_seconds(holder.pid) - holder_cpu
                    busy, total = (b - a for a, b in zip(machine, machine_times(), strict=True))
                finally:
                    await off_loop(holder.stop)
                await wait_streams(session, url, 0)
                last += load.messages
                deliveries = load.messages * count
                point = {"x": count, "publish_rate": load.msg_rate,
                         "publish_p99_ms": ms(load.latencies, 99),
                         "delivery_p50_ms": d50, "delivery_p99_ms": d99, "timed": timed,
                         "complete": got >= want, "received_share": got / want if want else 0,
                         "closed": closed, "deliveries_per_s": deliveries / load.elapsed,
                         "cpu_share": delta.cpu / (drained - began),
                         "holder_cpu_share": holder_cpu / (drained - began),
                         "machine_cores_busy": busy / total * (os.cpu_count() or 1),
                         "cpu_us_per_delivery": delta.cpu / max(1, deliveries) * 1e6,
                         "drain_s": drained - began - load.elapsed}
                points.append(point)
                print(f"  subscribers {count:>5,}: published {load.msg_rate:,.0f}/s, delivery "
                      f"p50 {d50:.1f} ms p99 {d99:.1f} ms ({timed:,} timed), "
                      f"{'complete' if point['complete'] else 'INCOMPLETE'}, broker CPU "
                      f"{point['cpu_share']:.0%} of a core, holder "
                      f"{point['holder_cpu_share']:.0%}, machine "
                      f"{point['machine_cores_busy']:.1f} cores busy, "
                      f"{point['cpu_us_per_delivery']:.1f} µs/delivery", flush=True)
    finally:
        proc.stop()
        bare_proc.stop()
    return points, baseline


# -- main --------------------------------------------------------------------------------------

def parse_args() -> tuple[Settings, argparse.Namespace]:
    p = settings.parser(__doc__, "tiny run (two points per curve, short loads)", rounds=False)
    args = p.parse_args()
    if not args.quick:
        return Settings(), args
    return Settings(seconds=0.5, rate=200.0, publishes=100, batches=(1, 100),
                    sizes=(100, 100 * 1024), topics=(1, 100), subscribers=(1, 10),
                    idle_subscribers=50, idle_topics=500), args


def main() -> None:
    s, args = parse_args()
    limit = raise_nofile()  # the broker and the stream holder inherit it
    if limit < max([*s.subscribers, s.idle_subscribers]) + 200:
        sys.exit(f"RLIMIT_NOFILE hard limit {limit} is too low for the subscriber curve")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-scaling-",
                                     dir=os.environ.get("BENCH_DIR")) as t:
        tmp = Path(t)
        print("1. batch size and message size (4 senders)", flush=True)
        batch, size = run_loop(body_curves(tmp, s))
        print("2. topic count (round-robin publishes)", flush=True)
        topics = run_loop(topic_curve(tmp, s))
        print(f"3. subscriber count ({s.rate:.0f} msg/s)", flush=True)
        subscribers, bare = run_loop(subscriber_curve(tmp, s))
        print("4. memory per idle subscriber and per idle topic", flush=True)
        idle_subscriber = run_loop(memory_subscribers(tmp, s.idle_subscribers))
        idle_topic = run_loop(memory_topics(tmp, s.idle_topics))
        results_under(args.out, quick=args.quick, bench="scaling")
        write_results({"batch": batch, "size": size, "topics": topics,
                       "subscribers": subscribers}, bare, idle_subscriber, idle_topic, s,
                      limit, time.perf_counter() - started)
        print("removing the data directories", flush=True)


if __name__ == "__main__":
    main()
