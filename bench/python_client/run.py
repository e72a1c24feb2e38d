"""Client benchmark: Conn consumption (messages and batches) and publish_batch throughput.

A broker process (fsync always) on 127.0.0.1; the raw-HTTP baselines read and post the same
bytes with plain aiohttp in the same run.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.harness import client_load
from bench.harness.figures import Row
from bench.harness.payloads import FRAME, PAYLOAD
from bench.harness.procs import broker
from bench.harness.results import command_line, report
from messaging.client.client import Client
from messaging.frames import FRAMES_CONTENT_TYPE, encode_batch

MESSAGES = int(os.environ.get("BENCH_MESSAGES", "1000000"))
RUNS = 3


async def publish_rate(url: str, topic: int, total: int) -> float:
    datas = [PAYLOAD] * 1000
    async with Client(url) as client:
        started = time.perf_counter()
        for _ in range(total // 1000):
            await client.publish_batch(topic, datas)
        return total / (time.perf_counter() - started)


async def raw_publish_rate(url: str, topic: int, total: int) -> float:
    body = encode_batch(topic, [PAYLOAD] * 1000)
    async with aiohttp.ClientSession() as session:
        started = time.perf_counter()
        for _ in range(total // 1000):
            async with session.post(f"{url}/messaging/messages", data=body,
                                    headers={"Content-Type": FRAMES_CONTENT_TYPE}) as resp:
                await resp.read()
        return total / (time.perf_counter() - started)


async def consume(url: str, topic: int, *, batches: bool) -> float:
    """Messages/s a Conn delivers from index 0 to the end, one by one or in batches."""
    return (await client_load.consume(url, topic, MESSAGES, batches=batches)).value


async def raw_read(url: str, topic: int) -> float:
    async with aiohttp.ClientSession() as session:
        started = time.perf_counter()
        size = 0
        async with session.get(f"{url}/messaging/messages", params={"topicID": str(topic)}) as r:
            async for data in r.content.iter_any():
                size += len(data)
        elapsed = time.perf_counter() - started
    assert size == MESSAGES * FRAME
    return MESSAGES / elapsed


async def run(tmp: Path) -> list[Row]:
    proc, url = broker(tmp / "data")
    try:
        publish = statistics.median([await publish_rate(url, 1, 200_000) for _ in range(RUNS)])
        raw_publish = statistics.median([await raw_publish_rate(url, 2, 200_000)
                                         for _ in range(RUNS)])
        await client_load.preload(url, 3, MESSAGES)
        raw = statistics.median([await raw_read(url, 3) for _ in range(RUNS)])
        messages = statistics.median([await consume(url, 3, batches=False)
                                      for _ in range(RUNS)])
        batches = statistics.median([await consume(url, 3, batches=True) for _ in range(RUNS)])
    finally:
        proc.stop()
    return [
        Row("Conn: async for message (Message objects, CRC verified)", messages, "msg/s",
            "raw aiohttp read of the same bytes", raw, "≥ 400,000 msg/s", messages >= 400_000),
        Row("Conn.batches() (CRC verified, one buffer per batch)", batches, "msg/s",
            "raw aiohttp read of the same bytes", raw, "≥ 1,500,000 msg/s", batches >= 1_500_000),
        Row("publish_batch, 1000 × 100 B, durable, one client", publish, "msg/s",
            "aiohttp POST of pre-encoded frames", raw_publish, "≥ 300,000 msg/s",
            publish >= 300_000),
    ]


def main() -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    with tempfile.TemporaryDirectory(prefix="bench-client-", dir=os.environ.get("BENCH_DIR")) as t:
        rows = asyncio.run(run(Path(t)))
    report("client", "Python client", rows, command_line(), notes=(
        f"{MESSAGES:,} messages of 100 B, read from index 0 to the end (non-streaming Conn), "
        "median of 3 runs; uvloop for client and baselines alike. The redis-py + hiredis "
        "Redis Streams comparison named in the target was not run here (no Redis server is "
        "part of this project's set-up); the 1.5M msg/s target is the figure."))


if __name__ == "__main__":
    main()
