"""The stream holder's child process: ``python -m bench.harness.hold_streams URL --topic T
--count N [--index I] [--rcvbuf BYTES] [--no-read] [--lifetime SECONDS]``.

It opens N raw asyncio connections, each a ``streaming=true`` GET of topic T from index I
(with SO_RCVBUF set before connecting when asked; never read from with ``--no-read``),
prints ``ready N``, then answers ``stats`` on stdin and ends on ``stop``, at end of input or
after ``--lifetime`` seconds (see :mod:`bench.harness.stream_holder`, whose ``Holder`` starts
and stops it).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import socket
import sys
import time
from functools import partial
from urllib.parse import urlsplit

from bench.harness.loops import run_loop
from bench.harness.procs import raise_nofile
from bench.harness.stream_holder import SAMPLE_EVERY


async def hold(url: str, topic: int, count: int, index: int, read: bool, rcvbuf: int,
               lifetime: float) -> None:
    """The holder's body: open the streams, say "ready", answer "stats", end on "stop"."""
    raise_nofile()
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    loop = asyncio.get_running_loop()
    request = (f"GET /messaging/messages?topicID={topic}&streaming=true&index={index} "
               f"HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n").encode()
    received = 0
    closed = 0
    delays: list[float] = []  # send-to-receive of the sampled streams' messages
    stamp = re.compile(rb"T(\d{10}\.\d{6});")

    class Sink(asyncio.Protocol):
        """Reads everything as it arrives and throws it away (a sample of the streams also
        times each message: its payload starts with the publisher's send time)."""

        def __init__(self, sampled: bool) -> None:
            self.sampled = sampled
            self.rest = b""

        def data_received(self, data: bytes) -> None:
            nonlocal received
            received += len(data)
            if self.sampled:
                now = time.time()
                text = self.rest + data
                delays.extend(now - float(m.group(1)) for m in stamp.finditer(text))
                self.rest = text[-20:]

        def connection_lost(self, exc: Exception | None) -> None:
            nonlocal closed
            closed += 1

    transports: list[asyncio.BaseTransport] = []
    socks: list[socket.socket] = []
    connecting = asyncio.Semaphore(64)  # under the broker's listen backlog

    async def open_one() -> None:
        async with connecting:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            sampled = len(socks) % SAMPLE_EVERY == 1
            if rcvbuf:  # before connect, so the advertised window is small from the start
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            sock.setblocking(False)
            await loop.sock_connect(sock, (host, port))
            if read:
                transport, _ = await loop.create_connection(partial(Sink, sampled), sock=sock)
                transports.append(transport)
                transport.write(request)
            else:
                await loop.sock_sendall(sock, request)  # and never read from it

    await asyncio.wait_for(asyncio.gather(*(open_one() for _ in range(count))), 120)
    print(f"ready {count}", flush=True)
    commands = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(commands), sys.stdin)
    deadline = loop.time() + lifetime
    for _ in range(100_000):
        left = deadline - loop.time()
        if left <= 0:
            break
        try:
            line = (await asyncio.wait_for(commands.readline(), left)).decode().strip()
        except TimeoutError:
            break
        if line == "stats":
            ordered = sorted(delays)
            p50 = ordered[len(ordered) // 2] * 1000 if ordered else 0.0
            p99 = ordered[min(len(ordered) - 1, len(ordered) * 99 // 100)] * 1000 \
                if ordered else 0.0
            print(f"stats {received} {closed} {p50:.3f} {p99:.3f} {len(ordered)}", flush=True)
        else:  # "stop", or end of input: the parent is gone
            break
    for transport in transports:
        transport.abort()  # type: ignore[attr-defined]
    for sock in socks:
        sock.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("url")
    p.add_argument("--topic", type=int, default=1)
    p.add_argument("--count", type=int, default=0)
    p.add_argument("--index", type=int, default=0)
    p.add_argument("--rcvbuf", type=int, default=0)
    p.add_argument("--no-read", action="store_true")
    p.add_argument("--lifetime", type=float, default=1800.0)
    args = p.parse_args()
    run_loop(hold(args.url, args.topic, args.count, args.index, not args.no_read, args.rcvbuf,
                  args.lifetime))


if __name__ == "__main__":
    main()
