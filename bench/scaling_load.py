"""Load and probes of the scaling benchmark (bench/bench_scaling.py).

Closed-loop POST senders, an open-loop single-message publisher, the disk's write+fdatasync
ceiling for a given write size and file count, and a broker's counters: CPU seconds, fsync
rounds and bytes from ``/metrics``, descriptors from ``/proc/PID/fd``.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench.bench_streams import PAYLOAD, publish_one
from bench.procs import cpu_seconds, rss_bytes
from messaging.frames import FRAMES_CONTENT_TYPE, Message, encode_many

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
        async def one() -> None:
            t = time.perf_counter()
            await publish_one(session, url, topic)
            latencies.append(time.perf_counter() - t)

        tasks = []
        started = time.perf_counter()
        for k in range(count):
            delay = started + k / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one()))
        await asyncio.wait_for(asyncio.gather(*tasks), 120)
        elapsed = time.perf_counter() - started
    return Load(len(latencies), len(latencies), 100 * len(latencies), elapsed, latencies)


def disk_rate(directory: Path, size: int, *, files: int = 1, seconds: float = 1.0,
              max_writes: int = 100_000, max_open: int = 1000) -> float:
    """Writes/s of a loop appending ``size`` bytes then fdatasync, round-robin over ``files``
    files (opened once when at most ``max_open``, else opened and closed around each write)."""
    directory.mkdir(parents=True, exist_ok=True)
    block = b"x" * size
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    names = [directory / f"probe-{i}" for i in range(files)]
    kept = [os.open(n, flags, 0o644) for n in names] if files <= max_open else []
    count = 0
    started = time.perf_counter()
    try:
        while count < max_writes and time.perf_counter() - started < seconds:
            i = count % files
            fd = kept[i] if kept else os.open(names[i], flags, 0o644)
            os.write(fd, block)
            os.fdatasync(fd)
            if not kept:
                os.close(fd)
            count += 1
        elapsed = time.perf_counter() - started
    finally:
        for fd in kept:
            os.close(fd)
        for n in names:
            n.unlink(missing_ok=True)
    return count / elapsed


def descriptors(pid: int) -> int:
    """How many descriptors ``pid`` has open (0 when it is gone)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


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


def rss_kib(pid: int) -> float:
    """VmRSS of ``pid`` in KiB."""
    return rss_bytes(pid) / 1024


def machine_busy() -> tuple[float, float]:
    """Seconds every core of the machine spent busy (not idle, not waiting on I/O) and in
    total so far, from ``/proc/stat``."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal
    busy = total - fields[3] - fields[4]
    tick = os.sysconf("SC_CLK_TCK")
    return busy / tick, total / tick


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
