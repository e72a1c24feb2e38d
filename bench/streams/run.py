"""Many open streams: what streaming subscribers cost the broker.

1. Single-publish latency: one client POSTs single 100-byte messages one after another at
   about 200/s, with no streams open and then with N streaming subscribers of the same topic
   that read (and discard) everything, rounds interleaved A B B A on one broker.
2. Memory per stream that never reads: the broker's RSS grown by 200 streaming GETs of a
   64 MiB backlog whose clients never read, against 200 streams waiting at the end of a topic.

The broker is a subprocess on 127.0.0.1 (``--fsync always``). The streams live in a second
child process (the harness's stream holder), so the load generator's event loop only runs
the publisher and the streams' reading is not the generator's bottleneck. Every child is
stopped by its PID; every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.harness.figures import Row, percentile
from bench.harness.loops import off_loop, run_loop
from bench.harness.payloads import FRAME, PAYLOAD
from bench.harness.procs import broker, raise_nofile
from bench.harness.results import command_line, report, results_under
from bench.harness.sampling import cpu_seconds, nofile_of, settled_rss, tcp_mem_kib
from bench.harness.settings import parser
from bench.harness.stream_holder import (
    SAMPLE_EVERY,
    Holder,
    active_streams,
    publish_one,
    wait_streams,
)
from messaging.frames import FRAMES_CONTENT_TYPE, encode_batch


async def publish_round(session: aiohttp.ClientSession, url: str, count: int,
                        rate: float) -> tuple[list[float], float, int]:
    """Sequential single-message POSTs at about ``rate``/s: latencies, elapsed s, last index."""
    latencies: list[float] = []
    last = 0
    started = time.perf_counter()
    deadline = started + max(60.0, 10 * count / rate)
    next_at = started
    for _ in range(count):
        delay = next_at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        t = time.perf_counter()
        if t > deadline:
            break
        next_at = t + 1 / rate  # no catching up: one request at a time, never a burst
        last = await publish_one(session, url, 1)
        latencies.append(time.perf_counter() - t)
    return latencies, time.perf_counter() - started, last


async def preload(session: aiohttp.ClientSession, url: str, topic: int, size: int) -> int:
    """Publish about ``size`` bytes of 100-byte messages to ``topic`` in batches of 10,000."""
    body = encode_batch(topic, [PAYLOAD] * 10_000)
    last = 0
    for _ in range(max(1, round(size / len(body)))):
        async with session.post(f"{url}/messaging/messages", data=body,
                                headers={"Content-Type": FRAMES_CONTENT_TYPE}) as resp:
            last = (await resp.json())["last"]
    return last


# -- 1. single-publish latency with N streams open --------------------------------------------

async def latency_rounds(tmp: Path, args: argparse.Namespace) -> tuple[list[Row], str]:
    proc, url = broker(tmp / "latency")
    pid = proc.pid
    if nofile_of(pid) < args.streams + 100:
        proc.stop()
        raise RuntimeError(f"broker may open only {nofile_of(pid)} files")
    rounds: dict[str, list[tuple[float, float, float, float]]] = {"idle": [], "streams": []}
    checks: list[str] = []
    try:
        async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=1),
                timeout=aiohttp.ClientTimeout(total=60)) as session:
            last = 0
            for _ in range(50):  # warm-up: topic 1 exists, connection and code paths are hot
                last = await publish_one(session, url, 1)
            for kind in ("idle", "streams", "streams", "idle"):
                holder = None
                holder_cpu = 0.0
                if kind == "streams":
                    holder = await off_loop(partial(Holder, url, 1, args.streams, index=last + 1))
                    await wait_streams(session, url, args.streams)
                    await asyncio.sleep(1.0)
                    holder_cpu = cpu_seconds(holder.pid)
                cpu = cpu_seconds(pid)
                latencies, elapsed, new_last = await publish_round(
                    session, url, args.publishes, args.rate)
                broker_cpu = cpu_seconds(pid) - cpu
                published = new_last - last
                last = new_last
                if holder is not None:
                    holder_cpu = cpu_seconds(holder.pid) - holder_cpu
                    # Every stream must have had every message before the holder goes.
                    want = published * FRAME * args.streams
                    got, closed, d50, d99, timed = 0, 0, 0.0, 0.0, 0
                    for _ in range(300):
                        got, closed, d50, d99, timed = await off_loop(holder.delivery)
                        if got >= want:
                            break
                        await asyncio.sleep(0.1)
                    received = ("every stream got them all" if got >= want else
                                f"streams got only {got / want:.0%} of their bytes")
                    checks.append(f"{published} publishes in {elapsed:.0f} s, {received}, "
                                  f"{closed} streams closed by the broker, stream holder CPU "
                                  f"{holder_cpu / elapsed:.0%} of a core, delivery to every "
                                  f"{SAMPLE_EVERY}th stream p50 {d50:.1f} ms, p99 {d99:.1f} ms "
                                  f"over {timed:,} messages")
                    await off_loop(holder.stop)
                    await wait_streams(session, url, 0)
                p50 = percentile(latencies, 50) * 1000
                p99 = percentile(latencies, 99) * 1000
                rounds[kind].append((p50, p99, len(latencies) / elapsed,
                                     broker_cpu / len(latencies) * 1000))
                print(f"  round {kind:7}: p50 {p50:.2f} ms, p99 {p99:.2f} ms, "
                      f"{len(latencies) / elapsed:.0f} publishes/s, broker CPU "
                      f"{broker_cpu / elapsed:.0%}", flush=True)
    finally:
        proc.stop()

    def med(kind: str, i: int) -> float:
        return statistics.median(r[i] for r in rounds[kind])

    n = args.streams
    idle50, idle99, loaded50, loaded99 = med("idle", 0), med("idle", 1), med("streams", 0), \
        med("streams", 1)
    rows = [
        Row(f"single publish p50 with {n:,} streams", loaded50, "ms", "idle (0 streams)",
            idle50),
        Row(f"single publish p99 with {n:,} streams", loaded99, "ms", "idle (0 streams)",
            idle99, "p99 ≤ 5× idle p99", loaded99 <= 5 * idle99),
        Row(f"broker CPU per publish with {n:,} streams", med("streams", 3), "ms",
            "idle (0 streams)", med("idle", 3)),
    ]
    note = (f"Achieved publish rate (median of rounds): {med('idle', 2):.0f}/s idle, "
            f"{med('streams', 2):.0f}/s with {n:,} streams (target {args.rate:.0f}/s). "
            f"Stream rounds: {'; '.join(checks)}.")
    return rows, note


# -- 2. memory per stream that never reads -----------------------------------------------------

async def memory_per_stream(tmp: Path, args: argparse.Namespace) -> tuple[list[Row], str]:
    data = tmp / "memory"
    proc, url = broker(data)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
            backlog = await preload(session, url, 2, args.backlog_mib << 20) * FRAME
            last3 = await publish_one(session, url, 3)
    finally:
        proc.stop()

    async def measure(topic: int, index: int) -> tuple[float, int]:
        """KiB of broker RSS per stream, and kernel TCP memory grown, on a fresh broker."""
        proc, url = broker(data)
        pid = proc.pid
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
                await publish_one(s, url, 4)  # warm: the write path, metrics, one connection
                await active_streams(s, url)
                before = await off_loop(lambda: settled_rss(pid))
                tcp_before = tcp_mem_kib()
                holder = await off_loop(lambda: Holder(url, topic, args.mem_streams,
                                                       index=index, read=False,
                                                       rcvbuf=args.rcvbuf_kib << 10))
                try:
                    await wait_streams(s, url, args.mem_streams)
                    after = await off_loop(lambda: settled_rss(pid))
                    tcp = tcp_mem_kib() - tcp_before
                finally:
                    await off_loop(holder.stop)
        finally:
            proc.stop()
        per_stream = (after - before) / args.mem_streams
        print(f"  topic {topic}: RSS {before / 1024:.1f} → {after / 1024:.1f} MiB, "
              f"{per_stream:.0f} KiB per stream; kernel TCP memory +{tcp / 1024:.1f} MiB",
              flush=True)
        return per_stream, tcp

    idle, idle_tcp = await measure(3, last3 + 1)
    stalled, stalled_tcp = await measure(2, 0)
    n = args.mem_streams
    rows = [Row(f"broker RSS per non-reading stream of a {backlog / 2**20:.0f} MiB backlog "
                f"({n} streams)", stalled, "KiB", "idle stream at the end of a topic", idle,
                "≤ 256 KiB per non-reading stream", stalled <= 256)]
    note = (f"Memory: {n} raw sockets with SO_RCVBUF {args.rcvbuf_kib} KiB (set before "
            f"connect) that never read, each on a fresh broker; RSS is VmRSS once settled. "
            f"Kernel TCP memory (both ends, /proc/net/sockstat, not in RSS) grew "
            f"{stalled_tcp / n:.0f} KiB per non-reading stream, {idle_tcp / n:.0f} KiB per "
            f"idle one.")
    return rows, note


# -- main --------------------------------------------------------------------------------------

def parse_args() -> argparse.Namespace:
    p = parser(__doc__, "smoke run: 50 streams, 50 publishes, 8 MiB backlog", rounds=False)
    p.add_argument("--streams", type=int, default=800,
                   help="reading streams open during the loaded rounds (default 800)")
    p.add_argument("--publishes", type=int, default=300,
                   help="sequential publishes per round (default 300)")
    p.add_argument("--rate", type=float, default=200.0, help="publishes/s (default 200)")
    p.add_argument("--mem-streams", type=int, default=200,
                   help="non-reading streams of the memory figure (default 200)")
    p.add_argument("--backlog-mib", type=int, default=64,
                   help="backlog the non-reading streams start at (default 64)")
    p.add_argument("--rcvbuf-kib", type=int, default=64,
                   help="SO_RCVBUF of the non-reading sockets (default 64)")
    args = p.parse_args()
    if args.quick:
        args.streams, args.publishes, args.mem_streams, args.backlog_mib = 50, 50, 50, 8
    return args


def main() -> None:
    args = parse_args()
    limit = raise_nofile()  # the broker child inherits it (checked in /proc/PID/limits)
    if limit < max(args.streams, args.mem_streams) + 100:
        sys.exit(f"RLIMIT_NOFILE hard limit {limit} is too low for {args.streams} streams")
    with tempfile.TemporaryDirectory(prefix="bench-streams-",
                                     dir=os.environ.get("BENCH_DIR")) as t:
        tmp = Path(t)
        print(f"1. single-publish latency, 0 and {args.streams} streams (A B B A)", flush=True)
        latency_rows, latency_note = run_loop(latency_rounds(tmp, args))
        print(f"2. memory of {args.mem_streams} non-reading streams", flush=True)
        memory_rows, memory_note = run_loop(memory_per_stream(tmp, args))
    results_under(args.out, quick=args.quick, bench="streams")
    report("streams", "Many open streams", latency_rows + memory_rows, command_line(), notes=(
        f"Latency: one aiohttp client POSTs 100-byte messages to topic 1 one at a time "
        f"(about {args.rate:.0f}/s, {args.publishes} per round) on one broker, rounds "
        f"interleaved idle, {args.streams} streams, {args.streams} streams, idle; figures are "
        f"medians of the per-round p50/p99. The streams are raw asyncio TCP connections "
        f"(`streaming=true` from the topic's end) in a separate child process that reads and "
        f"discards everything, so the load generator's loop runs only the publisher; broker, "
        f"generator and stream holder share the machine's cores. {latency_note}\n\n"
        f"{memory_note}"))


if __name__ == "__main__":
    main()
