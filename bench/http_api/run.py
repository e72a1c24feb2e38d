"""HTTP benchmark: publish rates, group commit, publish-to-subscriber latency, streaming.

The broker and a bare aiohttp baseline each run in their own process on 127.0.0.1; the load
comes from wrk (installed from Debian's packages when possible) or, failing that, a Python
load generator. Every figure sits beside a baseline measured in the same run.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.harness.disk import disk_rate
from bench.harness.figures import Row, percentile
from bench.harness.http_load import aiohttp_rate, wrk_rate
from bench.harness.loops import paced
from bench.harness.payloads import PAYLOAD
from bench.harness.procs import bare_server, broker, ensure_tool
from bench.harness.results import command_line, report
from messaging.frames import FRAMES_CONTENT_TYPE, BatchDecoder, encode_batch

DURATION = float(os.environ.get("BENCH_SECONDS", "5"))
POST_RUNS = 5


async def batch_rate(url: str, path: str, topic: int, senders: int = 4) -> float:
    """Messages/s of ``senders`` loops each POSTing 1000 × 100 B frames per request."""
    body = encode_batch(topic, [PAYLOAD] * 1000)
    count = 0
    async with aiohttp.ClientSession() as session:
        deadline = time.perf_counter() + DURATION

        async def sender() -> None:
            nonlocal count
            while time.perf_counter() < deadline:
                async with session.post(url + path, data=body,
                                        headers={"Content-Type": FRAMES_CONTENT_TYPE}) as resp:
                    await resp.read()
                    assert resp.status < 300, resp.status
                count += 1000

        started = time.perf_counter()
        await asyncio.gather(*(sender() for _ in range(senders)))
        return count / (time.perf_counter() - started)


async def latency(url: str, bare: str, rate: int = 1000) -> tuple[list[float], list[float]]:
    """Publish-to-subscriber latencies at ``rate`` msg/s, and bare request round trips."""
    sent: dict[int, float] = {}
    received: list[float] = []
    total = int(rate * DURATION)
    async with aiohttp.ClientSession() as session:
        async def subscribe() -> None:
            decoder = BatchDecoder(after=0)
            async with session.get(f"{url}/messaging/messages",
                                   params={"topicID": "77", "streaming": "true"}) as resp:
                async for data in resp.content.iter_any():
                    now = time.perf_counter()
                    for batch in decoder.feed(data):
                        received.extend(now - sent[int(m.data)] for m in batch.messages())
                    if len(received) >= total:
                        return

        subscriber = asyncio.ensure_future(subscribe())
        await asyncio.sleep(0.2)

        async def publish(k: int) -> None:
            sent[k] = time.perf_counter()
            async with session.post(f"{url}/messaging/messages", params={"topicID": "77"},
                                    data=str(k).encode()) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"publish: HTTP {resp.status}")

        await paced(rate, total, publish)
        await asyncio.wait_for(subscriber, 30)
        bare_rtts = []
        for _ in range(2000):
            t = time.perf_counter()
            async with session.post(f"{bare}/204", data=PAYLOAD) as resp:
                await resp.read()
            bare_rtts.append(time.perf_counter() - t)
    return received, bare_rtts


async def preload(url: str, topic: int, messages: int) -> int:
    async with aiohttp.ClientSession() as session:
        body = encode_batch(topic, [PAYLOAD] * 10_000)
        last = 0
        for _ in range(messages // 10_000):
            async with session.post(f"{url}/messaging/messages", data=body,
                                    headers={"Content-Type": FRAMES_CONTENT_TYPE}) as resp:
                last = (await resp.json())["last"]
        return last


def curl_speed(url: str, runs: int = 3) -> float:
    """Median bytes/s curl reads from ``url``."""
    speeds = []
    for _ in range(runs):
        out = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{speed_download}", url],
                             capture_output=True, text=True, timeout=300).stdout
        speeds.append(float(out))
    return statistics.median(speeds)


async def run(tmp: Path) -> list[Row]:
    rows: list[Row] = []
    wrk = ensure_tool("wrk", "wrk")
    data = tmp / "data"
    broker_proc, url = broker(data)
    bare_proc, bare = bare_server()
    try:
        path = "/messaging/messages?topicID=1"
        ours_runs, bare_runs = [], []
        for _ in range(POST_RUNS):  # interleaved, so drift of the machine hits both alike
            if wrk:
                ours_runs.append(wrk_rate(wrk, url, path, DURATION).value)
                bare_runs.append(wrk_rate(wrk, bare, "/204", DURATION).value)
            else:
                ours_runs.append((await aiohttp_rate(url + path, DURATION)).value)
                bare_runs.append((await aiohttp_rate(bare + "/204", DURATION)).value)
        ours, baseline = statistics.median(ours_runs), statistics.median(bare_runs)
        tool = "wrk -t2 -c50" if wrk else "aiohttp load generator, 50 connections"
        fsync_rate = disk_rate(tmp / "disk", len(PAYLOAD), seconds=2.0, max_writes=200_000)
        rows.append(Row(f"single-message POST, fsync always ({tool})", ours, "req/s",
                        "bare aiohttp 204", baseline, "≥ 60% of bare", ours >= 0.6 * baseline))
        rows.append(Row("same, against the disk's fsync-per-write rate", ours, "req/s",
                        "write+fdatasync per message", fsync_rate, "≥ 3x",
                        ours >= 3 * fsync_rate))
        ours_batch = await batch_rate(url, "/messaging/messages", 2)
        bare_batch = await batch_rate(bare, "/204", 2)
        rows.append(Row("batch publish 1000 × 100 B per request, durable", ours_batch, "msg/s",
                        "same bodies to bare aiohttp", bare_batch, "≥ 300,000 msg/s",
                        ours_batch >= 300_000))
        lat, rtts = await latency(url, bare)
        p50, p99 = percentile(lat, 50) * 1000, percentile(lat, 99) * 1000
        bare50 = percentile(rtts, 50) * 1000
        rows.append(Row("publish → subscriber latency p50 at 1,000 msg/s", p50, "ms",
                        "bare aiohttp POST round trip p50", bare50, "≤ 2 ms", p50 <= 2))
        rows.append(Row("publish → subscriber latency p99 at 1,000 msg/s", p99, "ms",
                        "bare aiohttp POST round trip p99", percentile(rtts, 99) * 1000,
                        "≤ 10 ms", p99 <= 10))
        messages = int(os.environ.get("BENCH_STREAM_MESSAGES", "1000000"))
        last = await preload(url, 3, messages)
        size = messages * (26 + len(PAYLOAD))
        ours_stream = curl_speed(f"{url}/messaging/messages?topicID=3&streaming=true"
                                 f"&end={last + 1}")
        bare_stream = curl_speed(f"{bare}/stream?bytes={size}")
        rows.append(Row("streaming GET to curl (100 B messages)", ours_stream / 2**20, "MiB/s",
                        "bare aiohttp streaming from memory", bare_stream / 2**20, "≥ 50%",
                        ours_stream >= 0.5 * bare_stream))
    finally:
        broker_proc.stop()
        bare_proc.stop()
    return rows


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-http-", dir=os.environ.get("BENCH_DIR")) as t:
        rows = asyncio.run(run(Path(t)))
    report("http", "HTTP API (single node)", rows, command_line(), notes=(
        "Load generator, broker and baseline share the machine's 2 cores; both servers run "
        "the same event loop (uvloop). Single-message rates are medians of 5 wrk runs of "
        f"{DURATION:.0f} s, alternating broker and baseline. `fsync always` "
        "throughout: the single-message rate above the fsync-per-write rate is group commit "
        "at work (concurrent publishes share one write and one fdatasync)."))


if __name__ == "__main__":
    main()
