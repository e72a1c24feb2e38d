"""Lean socket clients for live delivery: asyncio protocols that write prepared requests and
parse only what they must, for our broker (HTTP/1.1, chunked stream) and for Redis (RESP,
parsed by hiredis in C); the peer benchmark's live workloads and the latency and fan-out
experiments time both servers with them.

The library clients (aiohttp's, redis-py) spend more CPU per message than either server: at
1,000 subscribers in one process they, not the servers, set the latency. The same lean
client on both sides measures the servers. NATS keeps nats-py: its push consumers need the
JetStream API, which is not worth re-implementing here, and its figures say so.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, cast
from urllib.parse import urlsplit

import aiohttp
import hiredis

from bench.harness.figures import Figure, latencies, percentile
from bench.harness.loops import DRAIN_SECONDS, paced
from bench.harness.payloads import PAYLOAD, latency_of, stamped
from messaging.frames import HEADER_SIZE, BatchDecoder

#: Publisher connections: enough that a slow answer never holds the next publish back.
PUBLISHERS = 8
CONNECT_SECONDS = 60


class Subscriber(asyncio.Protocol):
    """A receiving connection: ``done`` resolves once it has everything, or it ended."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish(None)

    def _finish(self, err: Exception | None) -> None:
        if not self.done.done():
            if err is None:
                self.done.set_result(None)
            else:
                self.done.set_exception(err)


def raise_failure(subscribers: Iterable[Subscriber]) -> None:
    """Raise the error the first failed subscriber ended with, if any did."""
    for subscriber in subscribers:
        done = subscriber.done
        if done.done() and done.exception() is not None:
            raise done.exception()  # type: ignore[misc]


class ChunkedStream(Subscriber):
    """A streaming GET of a topic: counts the body's bytes, times sampled messages."""

    def __init__(self, request: bytes, want: int, delays: list[float] | None) -> None:
        super().__init__()
        self.request = request
        self.want = want
        self.delays = delays
        self.decoder = BatchDecoder(after=0) if delays is not None else None
        self.got = 0
        self._pending = b""
        self._head = True
        self._left = 0  # body bytes left in this chunk; -n: n bytes of CRLF to skip

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        buf = self._pending + data if self._pending else data
        pos, end = 0, len(buf)
        if self._head:
            head_end = buf.find(b"\r\n\r\n")
            if head_end < 0:
                self._pending = buf
                return
            if not buf.startswith(b"HTTP/1.1 200"):
                self._finish(RuntimeError(f"stream: {buf[:head_end].decode(errors='replace')}"))
                return
            self._head, pos = False, head_end + 4
        parts = []
        while pos < end:
            if self._left < 0:
                skip = min(-self._left, end - pos)
                pos += skip
                self._left += skip
            elif self._left > 0:
                take = min(self._left, end - pos)
                parts.append(buf[pos:pos + take])
                pos += take
                self._left -= take
                if not self._left:
                    self._left = -2
            else:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    break
                self._left = int(buf[pos:eol], 16) or -2
                pos = eol + 2
        self._pending = buf[pos:]
        for part in parts:
            self.got += len(part)
            if self.decoder is not None and self.delays is not None:
                for batch in self.decoder.feed(part):
                    self.delays.extend(latency_of(m.data, now) for m in batch.messages())
        if self.got >= self.want:
            self._finish(None)


class RequestReply(asyncio.Protocol):
    """One request at a time over a kept-alive connection; ``parse`` finds whole replies."""

    def __init__(self, parse: Callable[[bytes], tuple[Any, bytes] | None]) -> None:
        self.parse = parse
        self.transport: asyncio.Transport | None = None
        self._buf = b""
        self._reply: asyncio.Future[Any] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    async def ask(self, request: bytes) -> Any:
        assert self.transport is not None
        self._reply = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return await self._reply

    def data_received(self, data: bytes) -> None:
        self._buf += data
        found = self.parse(self._buf)
        if found is not None and self._reply is not None:
            reply, self._buf = found
            self._reply.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._reply is not None and not self._reply.done():
            self._reply.set_exception(ConnectionError(f"connection lost: {exc}"))


def http_response(buf: bytes) -> tuple[int, bytes] | None:
    """The status of one whole HTTP/1.1 response at the start of ``buf``, and what follows."""
    head_end = buf.find(b"\r\n\r\n")
    if head_end < 0:
        return None
    head = buf[:head_end].lower()
    at = head.find(b"\r\ncontent-length:")
    length = 0
    if at >= 0:
        line_end = head.find(b"\r\n", at + 2)
        length = int(head[at + 17:line_end if line_end > 0 else None])
    if len(buf) < head_end + 4 + length:
        return None
    return int(buf[9:12]), buf[head_end + 4 + length:]


class RespParser:
    """Whole RESP replies, parsed by hiredis (one parser per connection)."""

    def __init__(self) -> None:
        self.reader = hiredis.Reader()

    def __call__(self, buf: bytes) -> tuple[Any, bytes] | None:
        self.reader.feed(buf)
        reply = self.reader.gets()
        return None if reply is False else (reply, b"")


def resp(*args: bytes) -> bytes:
    """One command in RESP."""
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%b\r\n" % (len(a), a) for a in args)


async def connect(host: str, port: int, factory: Callable[[], asyncio.Protocol]) -> Any:
    """A connection to ``host:port`` driven by ``factory()``: its protocol."""
    _transport, protocol = await asyncio.get_running_loop().create_connection(
        factory, host, port)
    return protocol


def close_all(transports: list[asyncio.Transport | None]) -> None:
    """Close every transport that was made."""
    for transport in transports:
        if transport is not None:
            transport.close()


async def publish_paced(pool: list[RequestReply], rate: int, seconds: float,
                        request: Callable[[int], bytes], ok: Callable[[Any], bool],
                        round_trips: list[float] | None = None) -> int:
    """``paced`` publishing over a pool of connections, one request in flight on each;
    each publish's round trip (request written → answer parsed) goes to ``round_trips``."""
    idle = list(pool)
    freed = asyncio.Event()

    async def publish(k: int) -> None:
        while not idle:
            freed.clear()
            await freed.wait()
        conn = idle.pop()
        started = time.perf_counter()
        try:
            reply = await conn.ask(request(k))
        finally:
            idle.append(conn)
            freed.set()
        if round_trips is not None:
            round_trips.append(time.perf_counter() - started)
        if not ok(reply):
            raise RuntimeError(f"publish refused: {reply!r}")

    return await paced(rate, int(rate * seconds), publish)


def round_trip_figures(figure: Figure, round_trips: list[float]) -> None:
    """Put the publishes' round-trip p50 and p99 (ms) into ``figure.extra``."""
    if round_trips:
        figure.extra["publish_p50"] = percentile(round_trips, 50) * 1000
        figure.extra["publish_p99"] = percentile(round_trips, 99) * 1000


async def ours_fanout_raw(url: str, topic: int, subscribers: int, rate: int, seconds: float,
                          sample_every: int) -> Figure:
    """Our broker: ``subscribers`` streaming GETs of one topic, one POST per message."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    total = int(rate * seconds)
    want = total * (HEADER_SIZE + len(PAYLOAD))
    delays: list[float] = []
    round_trips: list[float] = []
    get = (b"GET /messaging/messages?topicID=%d&streaming=true HTTP/1.1\r\nHost: %b\r\n\r\n"
           % (topic, host.encode()))
    streams: list[ChunkedStream] = []
    pool: list[RequestReply] = []
    try:
        async with asyncio.timeout(CONNECT_SECONDS):
            for i in range(subscribers):
                sampled = delays if i % sample_every == 0 else None
                streams.append(await connect(host, port, partial(ChunkedStream, get, want,
                                                                 sampled)))
            pool = [await connect(host, port, lambda: RequestReply(http_response))
                    for _ in range(PUBLISHERS)]
        await asyncio.sleep(0.2 + subscribers / 2000)
        head = b"POST /messaging/messages?topicID=%d HTTP/1.1\r\nHost: %b\r\n" % (
            topic, host.encode())

        def request(k: int) -> bytes:
            body = stamped(k)
            return head + b"Content-Length: %d\r\n\r\n%b" % (len(body), body)

        lag_before = await fanout_lag(url)
        sent = await publish_paced(pool, rate, seconds, request, lambda status: status == 200,
                                   round_trips)
        await asyncio.wait([s.done for s in streams], timeout=DRAIN_SECONDS)
        lag = [(bound, count - before)
               for (bound, count), (_, before) in zip(await fanout_lag(url), lag_before,
                                                      strict=True)]
    finally:
        close_all([s.transport for s in streams] + [p.transport for p in pool])
    raise_failure(streams)
    sizes = [stream.got for stream in streams]
    figure = latencies(delays, sent, min(sizes) // (HEADER_SIZE + len(PAYLOAD)))
    figure.extra["all_delivered"] = all(size == want for size in sizes)
    figure.extra["broker_lag_p50"] = lag_quantile(lag, 0.5)
    figure.extra["broker_lag_p99"] = lag_quantile(lag, 0.99)
    round_trip_figures(figure, round_trips)
    return figure


_LAG_BUCKET = re.compile(rb'^messaging_fanout_lag_seconds_bucket\{le="([^"]+)"\} (\S+)', re.M)


async def fanout_lag(url: str) -> list[tuple[float, float]]:
    """The broker's fan-out lag histogram (``messaging_fanout_lag_seconds``: per slice, the
    oldest commit it carried, from visible to written), as (upper bound s, cumulative count).
    """
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session, \
            session.get(f"{url}/metrics") as resp:
        text = await resp.read()
    return [(float(bound), float(count)) for bound, count in _LAG_BUCKET.findall(text)]


def lag_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """The upper bound (ms) of the bucket holding quantile ``q`` of cumulative ``buckets``;
    None without observations, ``inf`` past the last finite bound."""
    total = buckets[-1][1] if buckets else 0
    if not total:
        return None
    bound = next(b for b, count in buckets if count >= q * total)
    return bound * 1000 if math.isfinite(bound) else math.inf


class XReadLoop(Subscriber):
    """A Redis reader: XREAD BLOCK COUNT 1000 from the last id, again on every reply."""

    def __init__(self, key: bytes, start: bytes, total: int, delays: list[float] | None,
                 ) -> None:
        super().__init__()
        self.key, self.last, self.total, self.delays = key, start, total, delays
        self.reader = hiredis.Reader()
        self.count = 0

    def _ask(self) -> None:
        assert self.transport is not None
        self.transport.write(resp(b"XREAD", b"COUNT", b"1000", b"BLOCK", b"1000", b"STREAMS",
                                  self.key, self.last))

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self._ask()

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            if isinstance(reply, hiredis.ReplyError):
                self._finish(RuntimeError(f"XREAD: {reply}"))
                return
            if reply:
                entries = reply[0][1]
                self.last = entries[-1][0]
                self.count += len(entries)
                if self.delays is not None:
                    self.delays.extend(latency_of(fields[1], now) for _, fields in entries)
            if self.count >= self.total:
                self._finish(None)
                return
            self._ask()


async def redis_fanout_raw(port: int, key: str, subscribers: int, rate: int, seconds: float,
                           sample_every: int) -> Figure:
    """Redis: ``subscribers`` XREAD BLOCK loops, one XADD per message."""
    total = int(rate * seconds)
    name = key.encode()
    delays: list[float] = []
    round_trips: list[float] = []
    readers: list[XReadLoop] = []
    pool: list[RequestReply] = []
    try:
        async with asyncio.timeout(CONNECT_SECONDS):
            pool = [await connect("127.0.0.1", port, lambda: RequestReply(RespParser()))
                    for _ in range(PUBLISHERS)]
            await pool[0].ask(resp(b"DEL", name))
            start = await pool[0].ask(resp(b"XADD", name, b"*", b"f", b"start"))
            for i in range(subscribers):
                sampled = delays if i % sample_every == 0 else None
                readers.append(await connect("127.0.0.1", port, partial(
                    XReadLoop, name, start, total, sampled)))
        await asyncio.sleep(0.2 + subscribers / 2000)
        sent = await publish_paced(
            pool, rate, seconds, lambda k: resp(b"XADD", name, b"*", b"f", stamped(k)),
            lambda reply: isinstance(reply, bytes), round_trips)
        await asyncio.wait([r.done for r in readers], timeout=DRAIN_SECONDS)
    finally:
        close_all([r.transport for r in readers] + [p.transport for p in pool])
    raise_failure(readers)
    counts = [reader.count for reader in readers]
    figure = latencies(delays, sent, min(counts))
    figure.extra["all_delivered"] = all(c == total for c in counts)
    round_trip_figures(figure, round_trips)
    return figure
