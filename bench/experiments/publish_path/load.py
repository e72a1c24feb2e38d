"""One measured run of the publish path, in a process of its own (``run.py`` starts it with
the checkout under test first on ``PYTHONPATH``, so ``messaging`` is that checkout's client).

Publishes 100 B messages at ``rate`` a second (open loop) to one topic of the broker at
``url`` while one streaming ``Conn`` of the same client library reads the topic, and prints
one JSON line: for every message the time from the publish being sent to its
acknowledgement and to the subscriber yielding it (percentiles), and this process's CPU per
message; with a sixth argument, a file path, it also writes every message's times there
(JSON: ``sent``, ``acked`` and ``received``, ``time.perf_counter()`` readings by message
number) for :mod:`bench.experiments.publish_path.phases`. ``case`` says what publishes:

- ``lean``: a minimal keep-alive HTTP/1.1 client (8 connections, prepared requests): the
  broker's own part;
- ``lean-alone``: the lean publisher with one message in flight at a time (the next is sent
  once this one is acknowledged and yielded, at the pace's next slot): every message alone
  in the broker, for the phases;
- ``lean-producer``: the same with idempotent producer headers (one producer per
  connection): what the broker's idempotent path adds;
- ``client-plain``: ``Client.publish`` with ``idempotent=False``: what the client library adds;
- ``client``: ``Client.publish`` as users run it (idempotent by default).

Self-contained on purpose (no ``bench`` imports): it must run against older checkouts too.
"""

from __future__ import annotations

import asyncio
import json
import struct
import sys
import time
from typing import Any
from urllib.parse import urlsplit

from messaging.client.client import Client

STAMP = struct.Struct(">qd")  # message number, send time (perf_counter)
SIZE = 100
CONNECTIONS = 8
DRAIN = 30.0


class _Exchange(asyncio.Protocol):
    """One request at a time on a kept-alive connection; the answer's status."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.reply: asyncio.Future[int] | None = None
        self.buffer = b""
        self.lane = ""
        self.seq = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0 or self.reply is None:
            return
        head = self.buffer[:end].lower()
        at = head.find(b"\r\ncontent-length:")
        length = int(head[at + 17:head.find(b"\r\n", at + 2) if head.find(
            b"\r\n", at + 2) > 0 else None]) if at >= 0 else 0
        if len(self.buffer) < end + 4 + length:
            return
        status = int(self.buffer[9:12])
        self.buffer = self.buffer[end + 4 + length:]
        self.reply.set_result(status)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.reply is not None and not self.reply.done():
            self.reply.set_exception(ConnectionError(f"connection lost: {exc}"))

    async def post(self, host: str, topic: int, body: bytes, producer: bool) -> int:
        assert self.transport is not None
        extra = b""
        if producer:
            extra = b"Producer-Id: %b\r\nProducer-Epoch: 0\r\nProducer-Seq: %d\r\n" % (
                self.lane.encode(), self.seq)
        self.reply = asyncio.get_running_loop().create_future()
        self.transport.write(b"POST /messaging/messages?topicID=%d HTTP/1.1\r\nHost: %b\r\n"
                             b"%bContent-Length: %d\r\n\r\n%b"
                             % (topic, host.encode(), extra, len(body), body))
        status = await self.reply
        if status == 200:
            self.seq += 1
        return status


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {"p50": float("nan"), "p99": float("nan")}
    pick = lambda q: ordered[min(len(ordered) - 1, int(len(ordered) * q))]  # noqa: E731
    return {"p50": pick(0.50) * 1000, "p99": pick(0.99) * 1000}


async def run(url: str, case: str, topic: int, rate: int, seconds: float,
              times_out: str | None = None) -> dict[str, Any]:
    count = int(rate * seconds)
    acked: dict[int, float] = {}
    received: dict[int, float] = {}
    sent: dict[int, float] = {}
    all_in = asyncio.Event()
    arrived = asyncio.Event()
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    async with Client(url) as reader, Client(url, idempotent=case == "client") as writer:
        conn = reader.conn(topic)
        await conn.open(0)

        async def read() -> None:
            async for message in conn:
                k, _at = STAMP.unpack_from(message.data)
                if k >= 0 and k not in received:
                    received[k] = time.perf_counter()
                    arrived.set()
                    if len(received) == count:
                        all_in.set()
                        return

        reading = asyncio.create_task(read())
        pool: list[_Exchange] = []
        if case.startswith("lean"):
            loop = asyncio.get_running_loop()
            for n in range(CONNECTIONS):
                _t, exchange = await loop.create_connection(_Exchange, host, port)
                exchange.lane = f"lean-{time.time_ns()}-{n}"
                pool.append(exchange)
        idle = list(pool)
        await writer.publish(topic, STAMP.pack(-1, 0.0).ljust(SIZE, b"w"))  # warm-up

        async def one(k: int) -> None:
            body = STAMP.pack(k, 0.0).ljust(SIZE, b"m")
            sent[k] = started = time.perf_counter()
            if pool:
                exchange = idle.pop() if idle else None
                if exchange is None:  # every connection busy: one more, kept
                    _t, exchange = await asyncio.get_running_loop().create_connection(
                        _Exchange, host, port)
                    exchange.lane = f"lean-{time.time_ns()}-{len(pool)}"
                    pool.append(exchange)
                status = await exchange.post(host, topic, body, case == "lean-producer")
                idle.append(exchange)
                if status != 200:
                    raise RuntimeError(f"publish answered HTTP {status}")
            else:
                await writer.publish(topic, body)
            acked[k] = time.perf_counter() - started

        cpu = time.process_time()
        begin = time.perf_counter()
        tasks = []
        for k in range(count):
            delay = begin + k / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if case == "lean-alone":
                await one(k)
                async with asyncio.timeout(DRAIN):
                    while k not in received:
                        arrived.clear()
                        await arrived.wait()
                continue
            tasks.append(asyncio.create_task(one(k)))
        await asyncio.gather(*tasks)
        await asyncio.wait_for(all_in.wait(), DRAIN)
        cpu = time.process_time() - cpu
        reading.cancel()
        await conn.close()
        for exchange in pool:
            if exchange.transport is not None:
                exchange.transport.close()
    delivered = [received[k] - sent[k] for k in range(count)]
    if times_out:
        with open(times_out, "w", encoding="utf-8") as f:
            json.dump({"sent": [sent[k] for k in range(count)],
                       "acked": [sent[k] + acked[k] for k in range(count)],
                       "received": [received[k] for k in range(count)]}, f)
    return {"case": case, "count": count, "ack": _percentiles(list(acked.values())),
            "delivered": _percentiles(delivered),
            "after_ack": _percentiles([received[k] - sent[k] - acked[k] for k in range(count)]),
            "cpu_us_per_message": cpu * 1e6 / count}


def main() -> None:
    url, case, topic, rate, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), \
        int(sys.argv[4]), float(sys.argv[5])
    times_out = sys.argv[6] if len(sys.argv) > 6 else None
    print(json.dumps(asyncio.run(run(url, case, topic, rate, seconds, times_out))),
          flush=True)


if __name__ == "__main__":
    main()
