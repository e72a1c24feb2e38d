"""Load generators of the peer benchmark (workloads 1, 2, 3 and 6; 4 and 5 are in
peers_live.py): one function per workload and server kind.

Each returns a ``Figure`` (its value, how long its measured phase took, and extra figures)
and bounds every loop in count and time. The caller measures CPU around each call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import nats
import redis.asyncio as aredis
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from bench.bench_durable_streams import json_messages, read_stream
from bench.common import percentile
from messaging.client.client import Client
from messaging.frames import FRAMES_CONTENT_TYPE, encode_batch

PAYLOAD = b"x" * 100
CONNECTIONS = 50
SENDERS = 4
BATCH = 1000
#: Upper bounds of the loops: publishes per connection, read rounds, seconds to wait.
MAX_OPS = 10_000_000
DRAIN_SECONDS = 15.0


@dataclass
class Figure:
    """One measured run: ``value`` (a rate or a latency), the seconds its measured phase
    took, and whatever else it found (p99, delivered-to-all)."""

    value: float
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)


def stamped(k: int) -> bytes:
    """A 100-byte payload carrying its number and its send time (``time.perf_counter``)."""
    return (b"%d %.6f " % (k, time.perf_counter())).ljust(len(PAYLOAD), b"x")


def latency_of(data: bytes, now: float) -> float:
    """Seconds since the send time ``stamped`` put into ``data``."""
    return now - float(data.split(b" ", 2)[1])


def latencies(values: list[float], sent: int, received: int) -> Figure:
    """A latency figure: p50 (the value) and p99 in ms, and how much arrived."""
    if not values:
        raise RuntimeError(f"no message arrived ({received} of {sent})")
    return Figure(percentile(values, 50) * 1000, 0.0,
                  {"p99": percentile(values, 99) * 1000, "sent": sent, "received": received})


async def paced(rate: int, seconds: float, publish: Callable[[int], Awaitable[None]],
                ) -> int:
    """Open-loop publishing: ``publish(k)`` started ``rate`` times a second for ``seconds``;
    waits (bounded) for the answers; returns how many were sent."""
    total = int(rate * seconds)
    started = time.perf_counter()
    tasks = []
    for k in range(total):
        delay = started + k / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(publish(k)))
    done, pending = await asyncio.wait(tasks, timeout=seconds + DRAIN_SECONDS)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    failed = [task.exception() for task in done if task.exception() is not None]
    if failed:  # every exception retrieved: the first one fails the run
        raise RuntimeError(f"{len(failed)} of {total} publishes failed") from failed[0]
    return total


async def until(seconds: float, check: Callable[[], bool]) -> None:
    """Wait until ``check()`` or ``seconds`` passed."""
    deadline = time.perf_counter() + seconds
    while not check() and time.perf_counter() < deadline:
        await asyncio.sleep(0.02)


async def loops(count: int, seconds: float, body: Callable[[], Awaitable[int]]) -> Figure:
    """``count`` concurrent loops running ``body`` (which returns items handled) for
    ``seconds``: items per second."""
    items = 0
    deadline = time.perf_counter() + seconds

    async def loop() -> None:
        nonlocal items
        for _ in range(MAX_OPS):
            if time.perf_counter() >= deadline:
                return
            handled = await body()  # not ``items += await``: that reads items before awaiting
            items += handled

    started = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(count)))
    elapsed = time.perf_counter() - started
    return Figure(items / elapsed, elapsed)


# -- 1. single 100 B publishes, 50 connections --------------------------------------------------

def wrk_rate(wrk: str, url: str, path: str, seconds: float) -> Figure:
    """Requests/s of one wrk run POSTing a 100-byte body with 50 connections (as
    bench_http.py drives it)."""
    script = Path(tempfile.mkstemp(suffix=".lua")[1])
    script.write_text(f'wrk.method = "POST"\nwrk.body = string.rep("x", 100)\n'
                      f'wrk.headers["Content-Type"] = "application/octet-stream"\n'
                      f'wrk.path = "{path}"\n')
    try:
        out = subprocess.run([wrk, "-t2", f"-c{CONNECTIONS}", f"-d{max(1, round(seconds))}s",
                              "-s", str(script), url], capture_output=True, text=True,
                             timeout=seconds + 60).stdout
    finally:
        script.unlink()
    match = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if not match or re.search(r"Non-2xx or 3xx responses: (\d+)", out):
        raise RuntimeError(f"wrk failed against {url}{path}: {out[-300:]}")
    return Figure(float(match.group(1)), max(1, round(seconds)))


async def aiohttp_rate(url: str, seconds: float) -> Figure:
    """Requests/s of 50 aiohttp POST loops (when wrk is missing)."""
    async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=CONNECTIONS)) as session:
        async def post() -> int:
            async with session.post(url, data=PAYLOAD) as resp:
                await resp.read()
                if resp.status >= 300:
                    raise RuntimeError(f"POST {url}: HTTP {resp.status}")
            return 1

        return await loops(CONNECTIONS, seconds, post)


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
    block = PAYLOAD * BATCH
    path = directory / "fsync-ceiling"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    count = 0
    started = time.perf_counter()
    try:
        while time.perf_counter() - started < seconds and count < 1_000_000:
            os.write(fd, block)
            os.fdatasync(fd)
            count += 1
    finally:
        os.close(fd)
        path.unlink()
    elapsed = time.perf_counter() - started
    return Figure(count * BATCH / elapsed, elapsed)


# -- 3. consume stored messages -----------------------------------------------------------------

async def ours_preload(url: str, topic: int, count: int) -> None:
    async with Client(url) as client:
        for start in range(0, count, 10_000):
            await client.publish_batch(topic, [PAYLOAD] * min(10_000, count - start))


async def ours_consume(url: str, topic: int, count: int, *, batches: bool) -> Figure:
    """Messages/s a ``Conn`` delivers from index 0 to the end, as Message objects or in
    batches (as bench_client.py reads)."""
    async with Client(url) as client:
        conn = client.conn(topic)
        started = time.perf_counter()
        await conn.open(index=0, streaming=False)
        got = 0
        if batches:
            async for batch in conn.batches():
                got += batch.count
        else:
            async for _message in conn:
                got += 1
        elapsed = time.perf_counter() - started
        await conn.close()
    if got != count:
        raise RuntimeError(f"Conn read {got} messages, not {count}")
    return Figure(count / elapsed, elapsed)


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
    from bench.bench_durable_streams import preload_stream

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
