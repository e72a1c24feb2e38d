"""The scaling benchmark's settings, load and probes: closed-loop POST senders, an open-loop
single-message publisher, and a broker's counters (CPU seconds; fsync rounds, bytes and
messages from ``/metrics``)."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from bench.harness import settings
from bench.harness.loops import paced
from bench.harness.payloads import PAYLOAD
from bench.harness.sampling import cpu_seconds
from bench.harness.stream_holder import publish_one
from messaging.frames import FRAMES_CONTENT_TYPE, Message, encode_many


@dataclass
class Settings(settings.Settings):
    """The run's sizes (full or ``--quick``): each curve's points, measured once each
    (``rounds`` 1) for ``seconds`` of closed-loop load; the subscriber curve's paced
    publisher; the memory figures' idle subscribers and topics."""

    rounds: int = 1
    seconds: float = 4.0
    batches: tuple[int, ...] = (1, 10, 100, 1000, 10_000)
    sizes: tuple[int, ...] = (10, 100, 1024, 10 * 1024, 100 * 1024, 1024 * 1024)
    topics: tuple[int, ...] = (1, 10, 100, 1000, 10_000, 20_000)
    subscribers: tuple[int, ...] = (1, 10, 100, 1000)
    rate: float = 500.0
    publishes: int = 2500
    small_batch: int = 10
    idle_subscribers: int = 1000
    idle_topics: int = 20_000


#: The path, body and message count of the ``i``-th request of a load.
Request = tuple[str, bytes, int]


def same(path: str, body: bytes, count: int) -> Callable[[int], Request]:
    """Requests that are all alike: ``body`` (``count`` messages) POSTed to ``path``."""
    return lambda _i: (path, body, count)


@dataclass
class Load:
    """What a load achieved: requests, messages and body bytes sent in ``elapsed`` seconds,
    and each request's round trip (seconds)."""

    requests: int
    messages: int
    bytes: int
    elapsed: float
    latencies: list[float]

    @property
    def msg_rate(self) -> float:
        """Messages per second."""
        return self.messages / self.elapsed if self.elapsed else 0.0

    @property
    def byte_rate(self) -> float:
        """Body bytes per second."""
        return self.bytes / self.elapsed if self.elapsed else 0.0


async def post_load(url: str, request: Callable[[int], Request], *, senders: int,
                    seconds: float, max_requests: int, content_type: str) -> Load:
    """``senders`` closed loops POSTing ``request(i)`` for ``i = 0, 1, ...`` until ``seconds``
    passed or ``max_requests`` were sent; every answer must be 2xx."""
    counter = 0
    messages = 0
    sent = 0
    latencies: list[float] = []
    headers = {"Content-Type": content_type}
    timeout = aiohttp.ClientTimeout(total=max(60.0, 4 * seconds))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=senders),
                                     timeout=timeout) as session:
        started = time.perf_counter()
        deadline = started + seconds

        async def sender() -> None:
            nonlocal counter, messages, sent
            while time.perf_counter() < deadline and counter < max_requests:
                path, body, count = request(counter)
                counter += 1
                t = time.perf_counter()
                async with session.post(url + path, data=body, headers=headers) as resp:
                    await resp.read()
                    if resp.status >= 300:
                        raise RuntimeError(f"POST {path} answered {resp.status}")
                latencies.append(time.perf_counter() - t)
                messages += count
                sent += len(body)

        await asyncio.gather(*(sender() for _ in range(senders)))
        elapsed = time.perf_counter() - started
    return Load(len(latencies), messages, sent, elapsed, latencies)


async def paced_publish(url: str, topic: int, rate: float, count: int,
                        connections: int = 16) -> Load:
    """Open loop: single timestamped 100-byte messages to ``topic`` at ``rate``/s (each send
    starts on schedule however long earlier ones take, up to ``connections`` in flight)."""
    latencies: list[float] = []
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections),
                                     timeout=timeout) as session:
        async def one(_k: int) -> None:
            t = time.perf_counter()
            await publish_one(session, url, topic)
            latencies.append(time.perf_counter() - t)

        started = time.perf_counter()
        await paced(rate, count, one, drain=120)
        elapsed = time.perf_counter() - started
    return Load(len(latencies), len(latencies), 100 * len(latencies), elapsed, latencies)


_COUNTER = re.compile(rb"^messaging_(fsyncs|bytes_published|messages_published)_total (\S+)",
                      re.M)


@dataclass
class Counters:
    """A broker's cumulative figures at one moment."""

    cpu: float
    fsyncs: float
    bytes: float
    messages: float

    def __sub__(self, other: Counters) -> Counters:
        return Counters(self.cpu - other.cpu, self.fsyncs - other.fsyncs,
                        self.bytes - other.bytes, self.messages - other.messages)


async def counters(url: str, pid: int, *, end: bool) -> Counters:
    """CPU seconds of ``pid`` and the fsync rounds, frame bytes and messages it applied.

    Scraping ``/metrics`` costs CPU (a line per topic), so the CPU figure is read after the
    scrape when a measurement starts and before it when one ends (``end``).
    """
    before = cpu_seconds(pid)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session, \
            session.get(f"{url}/metrics") as resp:
        text = await resp.read()
    cpu = before if end else cpu_seconds(pid)
    found = {m.group(1).decode(): float(m.group(2)) for m in _COUNTER.finditer(text)}
    return Counters(cpu, found.get("fsyncs", 0.0), found.get("bytes_published", 0.0),
                    found.get("messages_published", 0.0))


async def create_topics(url: str, first: int, last: int, chunk: int = 5000) -> None:
    """One 100-byte message to each topic ``first..last`` (multi-topic POSTs)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        for start in range(first, last + 1, chunk):
            end = min(last, start + chunk - 1)
            body = encode_many(Message(0, 1, t, PAYLOAD) for t in range(start, end + 1))
            async with session.post(f"{url}/messaging/messages", data=body,
                                    headers={"Content-Type": FRAMES_CONTENT_TYPE}) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"creating topics answered {resp.status}")
