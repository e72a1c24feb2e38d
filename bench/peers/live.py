"""Live delivery in the peer benchmark (workloads 4 and 5) through the library clients
(aiohttp, redis-py, nats-py): one paced publisher, one or many subscribers of one topic
(ours), stream (Redis) or subject (NATS); sampled subscribers time each message from its send
time to its arrival. (Ours and Redis are timed with the harness's lean clients as well.)"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from typing import Any

import aiohttp
import nats
import redis.asyncio as aredis
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from bench.harness.figures import Figure, latencies
from bench.harness.loops import DRAIN_SECONDS, paced, until
from bench.harness.payloads import PAYLOAD, latency_of, stamped
from bench.peers.load import BATCH
from messaging.frames import HEADER_SIZE, BatchDecoder


async def ours_fanout(url: str, topic: int, subscribers: int, rate: int, seconds: float,
                      sample_every: int) -> Figure:
    """Delivery latency from one publisher (one POST per message at ``rate``/s) to
    ``subscribers`` streaming GETs of one topic; every ``sample_every``-th subscriber times
    each message, the others count bytes."""
    total = int(rate * seconds)
    want = total * (HEADER_SIZE + len(PAYLOAD))
    delays: list[float] = []
    sizes = [0] * subscribers
    connected = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=None)) as session:
        async def subscribe(i: int) -> None:
            nonlocal connected
            sampled = i % sample_every == 0
            decoder = BatchDecoder(after=0)
            async with session.get(f"{url}/messaging/messages", params={
                    "topicID": str(topic), "streaming": "true"}) as resp:
                connected += 1
                async for data in resp.content.iter_any():
                    sizes[i] += len(data)
                    if sampled:
                        now = time.perf_counter()
                        delays.extend(latency_of(m.data, now) for batch in decoder.feed(data)
                                      for m in batch.messages())
                    if sizes[i] >= want:
                        return

        readers = [asyncio.ensure_future(subscribe(i)) for i in range(subscribers)]
        await until(30, lambda: connected >= subscribers)
        await asyncio.sleep(0.2)

        async def publish(k: int) -> None:
            async with session.post(f"{url}/messaging/messages", params={"topicID": str(topic)},
                                    data=stamped(k)) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"publish: HTTP {resp.status}")

        try:
            sent = await paced(rate, int(rate * seconds), publish)
            await until(DRAIN_SECONDS, lambda: all(size >= want for size in sizes))
        finally:
            for reader in readers:
                reader.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
    figure = latencies(delays, sent, min(sizes) // (HEADER_SIZE + len(PAYLOAD)))
    figure.extra["all_delivered"] = all(size == want for size in sizes)
    return figure


async def redis_fanout(port: int, key: str, subscribers: int, rate: int, seconds: float,
                       sample_every: int) -> Figure:
    """The same with XADD per message and XREAD BLOCK readers, one connection each."""
    total = int(rate * seconds)
    delays: list[float] = []
    counts = [0] * subscribers
    publisher = aredis.Redis(port=port, max_connections=200)
    readers_conns = [aredis.Redis(port=port, single_connection_client=True)
                     for _ in range(subscribers)]
    try:
        await publisher.delete(key)
        start_id = (await publisher.xadd(key, {"f": b"start"})).decode()

        async def read(i: int) -> None:
            r = readers_conns[i]
            last = start_id
            sampled = i % sample_every == 0
            for _ in range(total + 10):
                reply: Any = await r.xread({key: last}, count=BATCH, block=1000)
                now = time.perf_counter()
                if not reply:
                    continue
                entries = reply[0][1]
                last = entries[-1][0]
                counts[i] += len(entries)
                if sampled:
                    delays.extend(latency_of(fields[b"f"], now) for _, fields in entries)
                if counts[i] >= total:
                    return

        readers = [asyncio.ensure_future(read(i)) for i in range(subscribers)]
        await asyncio.sleep(0.3 + subscribers / 2000)

        async def publish(k: int) -> None:
            await publisher.xadd(key, {"f": stamped(k)})

        try:
            sent = await paced(rate, int(rate * seconds), publish)
            await until(DRAIN_SECONDS, lambda: all(c >= total for c in counts))
        finally:
            for reader in readers:
                reader.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
    finally:
        await publisher.aclose()
        await asyncio.gather(*(r.aclose() for r in readers_conns), return_exceptions=True)
    figure = latencies(delays, sent, min(counts))
    figure.extra["all_delivered"] = all(c == total for c in counts)
    return figure


async def nats_fanout(port: int, subject: str, subscribers: int, rate: int, seconds: float,
                      sample_every: int) -> Figure:
    """The same with JetStream publishes (each awaiting its ack) and push consumers
    (deliver new, no acks), ``subject`` on a stream of its own."""
    total = int(rate * seconds)
    delays: list[float] = []
    counts = [0] * subscribers
    nc = await nats.connect(f"nats://127.0.0.1:{port}", pending_size=64 * 2**20)
    try:
        js = nc.jetstream()
        stream = "FAN" + re.sub(r"\W", "", subject)
        with contextlib.suppress(Exception):
            await js.delete_stream(stream)
        await js.add_stream(name=stream, subjects=[subject])
        subs = []
        for i in range(subscribers):
            sampled = i % sample_every == 0

            async def on_message(msg: Any, i: int = i, sampled: bool = sampled) -> None:
                counts[i] += 1
                if sampled:
                    delays.append(latency_of(msg.data, time.perf_counter()))

            subs.append(await js.subscribe(subject, cb=on_message, manual_ack=True, config=(
                ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.NEW))))
        await asyncio.sleep(0.3)

        async def publish(k: int) -> None:
            await js.publish(subject, stamped(k))

        try:
            sent = await paced(rate, int(rate * seconds), publish)
            await until(DRAIN_SECONDS, lambda: all(c >= total for c in counts))
        finally:
            for sub in subs:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
            with contextlib.suppress(Exception):
                await js.delete_stream(stream)
    finally:
        await nc.close()
    figure = latencies(delays, sent, min(counts))
    figure.extra["all_delivered"] = all(c == total for c in counts)
    return figure
