"""The stream holder: a child process (:mod:`bench.harness.hold_streams`) that keeps N
streaming GETs of one topic open, so that the load generator's own event loop runs only the
publisher, driven from here by :class:`Holder`; and the calls to the broker it is used with
(a single publish stamped with its send time, the broker's count of open streams).

The child prints ``ready N`` once its streams are open, answers ``stats`` on stdin with
``stats <bytes received> <streams closed by the broker> <p50 ms> <p99 ms> <messages timed>``
(every ``SAMPLE_EVERY``-th stream times each message from the send time its payload starts
with) and ends on ``stop``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time

import aiohttp

from bench.harness.payloads import PAYLOAD
from bench.harness.procs import child_env, read_line

#: Every SAMPLE_EVERY-th stream of the holder times the delivery of each message.
SAMPLE_EVERY = 50


class Holder:
    """A child process holding ``count`` streaming GETs of ``topic`` open, stopped by PID."""

    def __init__(self, url: str, topic: int, count: int, *, index: int = 0, read: bool = True,
                 rcvbuf: int = 0, timeout: float = 120.0) -> None:
        self.count = count
        args = [sys.executable, "-m", "bench.harness.hold_streams", url, "--topic", str(topic),
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
