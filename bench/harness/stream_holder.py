"""The stream holder: a child process that keeps N streaming GETs of one topic open, so that
the load generator's own event loop runs only the publisher; and the calls to the broker it
is used with (a stamped single publish, the broker's count of open streams).

Started by :class:`Holder` as ``python -m bench.harness.stream_holder URL --topic T --count N
[--index I] [--rcvbuf BYTES] [--no-read]``. It opens the streams (raw asyncio connections,
``streaming=true`` from ``index``), prints ``ready N``, answers ``stats`` on stdin with
``stats <bytes received> <streams closed by the broker> <p50 ms> <p99 ms> <messages timed>``
(every ``SAMPLE_EVERY``-th stream times each message from the send time its payload starts
with) and ends on ``stop``, at end of input, or after ``--lifetime`` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from functools import partial
from urllib.parse import urlsplit

import aiohttp

from bench.harness.loops import run_loop
from bench.harness.payloads import PAYLOAD
from bench.harness.procs import child_env, raise_nofile, read_line

#: Every SAMPLE_EVERY-th stream of the holder times the delivery of each message.
SAMPLE_EVERY = 50


class Holder:
    """A child process holding ``count`` streaming GETs of ``topic`` open, stopped by PID."""

    def __init__(self, url: str, topic: int, count: int, *, index: int = 0, read: bool = True,
                 rcvbuf: int = 0, timeout: float = 120.0) -> None:
        self.count = count
        args = [sys.executable, "-m", "bench.harness.stream_holder", url, "--topic", str(topic),
                "--count", str(count), "--index", str(index), "--rcvbuf", str(rcvbuf)]
        if not read:
            args.append("--no-read")
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env=child_env())
        assert self.proc.stdout is not None
        line = read_line(self.proc.stdout, timeout)
        if not line.startswith("ready"):
            self.stop()
            raise RuntimeError(f"stream holder did not open {count} streams: {line!r}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stats(self) -> tuple[int, int]:
        """Bytes the streams received so far, and how many of them were closed by the broker."""
        received, closed, _p50, _p99, _count = self.delivery()
        return int(received), int(closed)

    def delivery(self) -> tuple[int, int, float, float, int]:
        """Bytes received, streams closed by the broker, and the sampled streams' delivery
        p50/p99 (ms, publisher's send to holder's receipt) over how many messages."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("stats\n")
        self.proc.stdin.flush()
        line = read_line(self.proc.stdout, 30.0).split()
        if len(line) != 6 or line[0] != "stats":
            raise RuntimeError(f"stream holder answered {line!r}")
        return int(line[1]), int(line[2]), float(line[3]), float(line[4]), int(line[5])

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.write("stop\n")
                self.proc.stdin.flush()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.kill(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(5)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


# -- talking to the broker -----------------------------------------------------------------

async def active_streams(session: aiohttp.ClientSession, url: str) -> int:
    """The broker's count of open streams (``messaging_active_streams``)."""
    async with session.get(f"{url}/metrics") as resp:
        text = await resp.text()
    match = re.search(r"^messaging_active_streams (\S+)", text, re.M)
    return int(float(match.group(1))) if match else 0


async def wait_streams(session: aiohttp.ClientSession, url: str, count: int,
                       limit: float = 60.0) -> None:
    """Wait (bounded) until the broker counts exactly ``count`` open streams."""
    seen = -1
    for _ in range(int(limit / 0.1)):
        seen = await active_streams(session, url)
        if seen == count:
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"broker has {seen} open streams, expected {count}")


async def publish_one(session: aiohttp.ClientSession, url: str, topic: int) -> int:
    """One 100-byte message to ``topic``, its payload starting with the send time (sampled
    streams time their delivery by it); its index."""
    payload = (b"T%.6f;" % time.time()).ljust(len(PAYLOAD), b"x")
    async with session.post(f"{url}/messaging/messages", params={"topicID": str(topic)},
                            data=payload) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"publish answered {resp.status}")
        return int(resp.headers["X-Broker-Index"])


# -- the holder process --------------------------------------------------------------------

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
