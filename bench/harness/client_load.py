"""Load through our Python client: a topic filled with 100-byte messages by
``publish_batch``, and read back from index 0 by a non-streaming ``Conn``, as Message
objects or in batches."""

from __future__ import annotations

import time

from bench.harness.figures import Figure
from bench.harness.payloads import PAYLOAD
from messaging.client.client import Client


async def preload(url: str, topic: int, count: int, per_batch: int = 10_000) -> None:
    """``count`` 100-byte messages into ``topic``, ``per_batch`` per publish."""
    async with Client(url) as client:
        for start in range(0, count, per_batch):
            await client.publish_batch(topic, [PAYLOAD] * min(per_batch, count - start))


async def consume(url: str, topic: int, count: int, *, batches: bool) -> Figure:
    """Messages/s a ``Conn`` delivers from index 0 to the end, as Message objects or in
    batches; the topic must hold ``count`` messages."""
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
