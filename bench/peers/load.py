"""Load generators of the peer benchmark (workloads 1, 2, 3 and 6; 4 and 5 are in live.py and
the harness's lean clients): one function per workload and server kind.

Each returns a ``Figure`` (its value, how long its measured phase took, and extra figures)
and bounds every loop in count and time. The caller measures CPU around each call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import nats
import redis.asyncio as aredis
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from bench.harness.disk import disk_rate
from bench.harness.figures import Figure
from bench.harness.http_load import CONNECTIONS
from bench.harness.loops import loops
from bench.harness.payloads import PAYLOAD
from bench.harness.v1_stream import json_messages, preload_stream, read_stream
from messaging.frames import FRAMES_CONTENT_TYPE, encode_batch

SENDERS = 4
BATCH = 1000


# -- 1. single 100 B publishes, 50 connections (wrk and aiohttp: bench.harness.http_load) -----

_redis_rates: dict[tuple[int, int, int], float] = {}


def redis_xadd_rate(binary: str, port: int, clients: int, pipeline: int, seconds: float,
                    ) -> Figure:
    """XADDs/s by ``redis-benchmark`` (C) with ``clients`` connections, ``pipeline`` commands
    per round trip; the count is sized from a first short run to take about ``seconds``."""
    def run(n: int) -> float:
        out = subprocess.run([binary, "-h", "127.0.0.1", "-p", str(port), "-c", str(clients),
                              "-P", str(pipeline), "-n", str(n), "--csv", "XADD",
                              f"bench-{clients}-{pipeline}", "*", "f", PAYLOAD.decode()],
                             capture_output=True, text=True, timeout=120).stdout
        match = re.search(r'^"XADD[^"]*","([\d.]+)"', out, re.M)
        if not match:
            raise RuntimeError(f"redis-benchmark failed: {out[-300:]}")
        return float(match.group(1))

    key = (port, clients, pipeline)
    if key not in _redis_rates:
        _redis_rates[key] = run(max(2000, clients * pipeline * 4))
    n = int(min(max(_redis_rates[key] * seconds, 2000), 20_000_000))
    started = time.perf_counter()
    rate = run(n)
    _redis_rates[key] = rate
    return Figure(rate, time.perf_counter() - started, {"commands": n})


async def nats_sync_rate(port: int, subject: str, seconds: float) -> Figure:
    """JetStream publishes/s, each awaiting its ack, from 50 concurrent nats-py tasks."""
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    try:
        js = nc.jetstream()

        async def publish() -> int:
            await js.publish(subject, PAYLOAD)
            return 1

        return await loops(CONNECTIONS, seconds, publish)
    finally:
        await nc.close()


# -- 2. batch publish, 1000 × 100 B, 4 senders --------------------------------------------------

async def ours_batch_rate(url: str, topic: int, seconds: float) -> Figure:
    """Messages/s of 4 senders each POSTing 1000 frames of 100 B per request (native)."""
    body = encode_batch(topic, [PAYLOAD] * BATCH)
    async with aiohttp.ClientSession() as session:
        async def post() -> int:
            async with session.post(f"{url}/messaging/messages", data=body,
                                    headers={"Content-Type": FRAMES_CONTENT_TYPE}) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"batch POST: HTTP {resp.status}")
            return BATCH

        return await loops(SENDERS, seconds, post)


async def json_batch_rate(url: str, name: str, seconds: float) -> Figure:
    """Messages/s of 4 senders each appending a JSON array of 1000 strings of 100 B to
    ``/v1/stream/<name>`` (one message per element)."""
    body = b"[" + b",".join(json_messages(BATCH)) + b"]"
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession() as session:
        async with session.put(f"{url}/v1/stream/{name}", headers=headers) as resp:
            await resp.read()

        async def post() -> int:
            async with session.post(f"{url}/v1/stream/{name}", data=body,
                                    headers=headers) as resp:
                await resp.read()
                if resp.status not in (200, 204):
                    raise RuntimeError(f"JSON append: HTTP {resp.status}")
            return BATCH

        return await loops(SENDERS, seconds, post)


async def nats_async_rate(port: int, subject: str, seconds: float) -> Figure:
    """JetStream messages/s of 4 senders, each publishing 1000 messages asynchronously and
    then awaiting their 1000 acks."""
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    try:
        js = nc.jetstream(publish_async_max_pending=SENDERS * BATCH)

        async def batch() -> int:
            futures = [await js.publish_async(subject, PAYLOAD) for _ in range(BATCH)]
            await asyncio.wait_for(asyncio.gather(*futures), 60)
            return BATCH

        return await loops(SENDERS, seconds, batch)
    finally:
        await nc.close()


def disk_ceiling(directory: Path, seconds: float) -> Figure:
    """Messages/s of a write + fdatasync loop of 1000 × 100 B per write (one writer)."""
    writes = disk_rate(directory / "fsync-ceiling", len(PAYLOAD) * BATCH, seconds=seconds,
                       max_writes=1_000_000)
    return Figure(writes * BATCH, seconds)


# -- 3. consume stored messages -----------------------------------------------------------------

async def redis_preload(port: int, key: str, count: int) -> None:
    r = aredis.Redis(port=port)
    try:
        await r.delete(key)
        for start in range(0, count, 10_000):
            pipe = r.pipeline(transaction=False)
            for _ in range(min(10_000, count - start)):
                pipe.xadd(key, {"f": PAYLOAD})
            await pipe.execute()
    finally:
        await r.aclose()


async def redis_consume(port: int, key: str, count: int) -> Figure:
    """Entries/s of XREAD COUNT 1000 from the start (redis-py with hiredis: an id and a
    field dict per entry)."""
    r = aredis.Redis(port=port)
    try:
        last = b"0-0"
        got = 0
        started = time.perf_counter()
        for _ in range(count // BATCH + 10):
            reply: Any = await r.xread({key: last}, count=BATCH)
            if not reply:
                break
            entries = reply[0][1]
            got += len(entries)
            last = entries[-1][0]
            if got >= count:
                break
        elapsed = time.perf_counter() - started
    finally:
        await r.aclose()
    if got != count:
        raise RuntimeError(f"XREAD read {got} entries, not {count}")
    return Figure(count / elapsed, elapsed)


async def json_preload(url: str, name: str, count: int) -> None:
    """A JSON stream of ``count`` 100-byte strings, in appends of 1000."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        await preload_stream(session, url, name, json_messages(count))


async def json_catch_up(url: str, name: str, count: int) -> Figure:
    """Messages/s of a catch-up read of a JSON stream from offset -1, parsed into objects."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        started = time.perf_counter()
        _, bodies = await read_stream(session, url, name)
        values = [value for body in bodies for value in json.loads(body)]
        elapsed = time.perf_counter() - started
    if len(values) != count:
        raise RuntimeError(f"catch-up of {url}/v1/stream/{name}: {len(values)} messages, "
                           f"not {count}")
    return Figure(count / elapsed, elapsed, {"requests": len(bodies)})


async def nats_preload(port: int, stream: str, subject: str, count: int) -> None:
    """``count`` messages into ``stream`` (core publishes, then waits until all are stored)."""
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    try:
        js = nc.jetstream()
        with contextlib.suppress(Exception):
            await js.delete_stream(stream)
        await js.add_stream(name=stream, subjects=[subject])
        for start in range(0, count, 10_000):
            for _ in range(min(10_000, count - start)):
                await nc.publish(subject, PAYLOAD)
            await nc.flush()
        stored = 0
        for _ in range(600):
            stored = (await js.stream_info(stream)).state.messages
            if stored >= count:
                return
            await asyncio.sleep(0.1)
        raise RuntimeError(f"NATS stored {stored} of {count} messages")
    finally:
        await nc.close()


async def nats_consume(port: int, subject: str, count: int) -> Figure:
    """Messages/s of a pull consumer fetching batches of 1000 from the start (Msg objects)."""
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    try:
        js = nc.jetstream()
        sub = await js.pull_subscribe(subject, config=ConsumerConfig(
            ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL))
        got = 0
        started = time.perf_counter()
        for _ in range(count // BATCH + 10):
            got += len(await sub.fetch(BATCH, timeout=5))
            if got >= count:
                break
        elapsed = time.perf_counter() - started
        await sub.unsubscribe()
    finally:
        await nc.close()
    if got != count:
        raise RuntimeError(f"NATS fetched {got} messages, not {count}")
    return Figure(count / elapsed, elapsed)
