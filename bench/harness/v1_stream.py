"""The Durable Streams surface (``/v1/stream``), ours and the Node reference server's, as the
benchmarks drive it: creating a stream, JSON messages of 100 bytes, appending them in
batches, a catch-up read from offset -1, and the delivery latency to one live reader (SSE, or
for comparison a native streaming GET of our broker) under a paced publisher."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import aiohttp

from bench.harness.figures import percentile
from bench.harness.loops import paced
from bench.harness.payloads import PAYLOAD
from messaging.frames import BatchDecoder

#: Bound of a catch-up read's pages.
MAX_PAGES = 10_000
#: The native topic a "native" live reader follows.
LATENCY_TOPIC = 3


async def create(session: aiohttp.ClientSession, url: str, name: str, content_type: str,
                 ) -> None:
    """PUT ``/v1/stream/<name>`` with ``content_type``."""
    async with session.put(f"{url}/v1/stream/{name}",
                           headers={"Content-Type": content_type}) as resp:
        await resp.read()
        if resp.status not in (200, 201):
            raise RuntimeError(f"PUT {url}/v1/stream/{name}: HTTP {resp.status}")


def json_messages(count: int) -> list[bytes]:
    """``count`` distinct JSON strings of exactly 100 bytes each."""
    return [b'"m%07d-' % k + b"x" * 89 + b'"' for k in range(count)]


async def preload_stream(session: aiohttp.ClientSession, url: str, name: str,
                         messages: list[bytes], per_append: int = 1000) -> None:
    """A JSON stream of ``messages``: appends of ``per_append`` messages each (JSON arrays
    are flattened one level, so every element is a message of its own)."""
    await create(session, url, name, "application/json")
    for start in range(0, len(messages), per_append):
        body = b"[" + b",".join(messages[start:start + per_append]) + b"]"
        async with session.post(f"{url}/v1/stream/{name}", data=body,
                                headers={"Content-Type": "application/json"}) as resp:
            await resp.read()
            if resp.status not in (200, 204):
                raise RuntimeError(f"append to {url}/v1/stream/{name}: HTTP {resp.status}")


async def read_stream(session: aiohttp.ClientSession, url: str, name: str,
                      ) -> tuple[float, list[bytes]]:
    """Seconds to read the whole stream from offset -1, and the pages' bodies."""
    bodies: list[bytes] = []
    offset = "-1"
    started = time.perf_counter()
    for _ in range(MAX_PAGES):
        async with session.get(f"{url}/v1/stream/{name}", params={"offset": offset}) as resp:
            body = await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"GET {url}/v1/stream/{name}?offset={offset}: "
                                   f"HTTP {resp.status}")
            bodies.append(body)
            offset = resp.headers["Stream-Next-Offset"]
            if resp.headers.get("Stream-Up-To-Date") == "true":
                break
    else:
        raise RuntimeError(f"{url}/v1/stream/{name}: not up to date after {MAX_PAGES} pages")
    return time.perf_counter() - started, bodies


async def group_commits(url: str) -> int:
    """How many groups our broker's writer has committed so far (its diagnostics)."""
    async with aiohttp.ClientSession() as session, session.get(
            f"{url}/messaging/diagnostics") as resp:
        return int((await resp.json())["groups"])


def sse_events(buffer: bytes) -> tuple[list[bytes], bytes]:
    """The data of the complete ``event: data`` events in ``buffer``, and what is left."""
    *events, rest = buffer.split(b"\n\n")
    datas = []
    for event in events:
        lines = event.split(b"\n")
        if b"event: data" in lines:
            datas.append(b"\n".join(line[5:].removeprefix(b" ") for line in lines
                                    if line.startswith(b"data:")))
    return datas, rest


async def delivery_latency(url: str, kind: str, rate: int, seconds: float, *, ours: bool,
                           grace: float) -> dict[str, Any]:
    """Delivery latencies to one live reader while appends arrive at ``rate``/s for
    ``seconds``; the publisher waits up to ``grace`` s past its last append for answers.

    ``kind`` "sse": a ``live=sse`` reader of a new text/plain stream (offset=now); "native":
    a ``streaming=true`` GET of a new native topic. Every message carries its send time.
    ``ours``: the server is our broker (its group commits are counted).
    """
    total = int(rate * seconds)
    sent_at: dict[int, float] = {}
    arrived: dict[int, float] = {}  # message -> when the reader got it
    acked: dict[int, float] = {}  # message -> when its append was answered
    if kind == "sse":
        post_url, read_url = f"{url}/v1/stream/sse", f"{url}/v1/stream/sse"
        params = {"offset": "now", "live": "sse"}
    else:
        post_url = f"{url}/messaging/messages?topicID={LATENCY_TOPIC}"
        read_url = f"{url}/messaging/messages"
        params = {"topicID": str(LATENCY_TOPIC), "streaming": "true"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100)) as session:
        if kind == "sse":
            await create(session, url, "sse", "text/plain")
        connected = asyncio.Event()

        async def read() -> None:
            async with session.get(read_url, params=params,
                                   timeout=aiohttp.ClientTimeout(total=None, sock_read=60),
                                   ) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"live read of {read_url}: HTTP {resp.status}")
                connected.set()
                buffer = b""
                decoder = BatchDecoder(after=0)
                async for chunk in resp.content.iter_any():
                    now = time.perf_counter()
                    if kind == "sse":
                        datas, buffer = sse_events(buffer + chunk)
                    else:
                        datas = [m.data for batch in decoder.feed(chunk)
                                 for m in batch.messages()]
                    for data in datas:
                        arrived[int(data.split()[0])] = now
                    if len(arrived) >= total:
                        return

        reader = asyncio.ensure_future(read())
        await asyncio.wait_for(connected.wait(), 10)
        await asyncio.sleep(0.3)  # the reader is parked at the tail

        async def publish(k: int) -> None:
            sent = sent_at[k] = time.perf_counter()
            body = (b"%06d %.6f " % (k, sent)).ljust(len(PAYLOAD), b"x")
            async with session.post(post_url, data=body,
                                    headers={"Content-Type": "text/plain"}) as resp:
                await resp.read()
                if resp.status not in (200, 204):
                    raise RuntimeError(f"publish to {post_url}: HTTP {resp.status}")
            acked[k] = time.perf_counter()

        groups = await group_commits(url) if ours else 0
        started = time.perf_counter()
        # Open loop: a slow server does not slow the publisher; what is still unanswered
        # after the grace counts as missing.
        await paced(rate, total, publish, drain=grace)
        published = time.perf_counter() - started
        groups = await group_commits(url) - groups if ours else 0
        with contextlib.suppress(TimeoutError):  # what did not arrive counts as missing
            await asyncio.wait_for(reader, 30)
    latencies = [arrived[k] - sent_at[k] for k in arrived]
    acks = [acked[k] - sent_at[k] for k in acked]
    # Delivery counted from the append's answer: the live path alone, without the time the
    # append waited (negative when the event came before the answer).
    after_ack = [arrived[k] - acked[k] for k in arrived if k in acked]
    return {"p50": percentile(latencies, 50) * 1000, "p99": percentile(latencies, 99) * 1000,
            "max": max(latencies) * 1000, "received": len(arrived), "sent": total,
            "answered": len(acked), "publish_seconds": published,
            "per_group": len(acked) / groups if groups else 0.0,
            "ack_p50": percentile(acks, 50) * 1000, "ack_p99": percentile(acks, 99) * 1000,
            "after_ack_p50": percentile(after_ack, 50) * 1000,
            "after_ack_p99": percentile(after_ack, 99) * 1000}
