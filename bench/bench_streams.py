"""Many open streams: what streaming subscribers cost the broker.

1. Single-publish latency: one client POSTs single 100-byte messages one after another at
   about 200/s, with no streams open and then with N streaming subscribers of the same topic
   that read (and discard) everything, rounds interleaved A B B A on one broker.
2. Memory per stream that never reads: the broker's RSS grown by 200 streaming GETs of a
   64 MiB backlog whose clients never read, against 200 streams waiting at the end of a topic.

The broker is a subprocess on 127.0.0.1 (``--fsync always``). The streams live in a second
child process (this script run with ``--hold``), so the load generator's event loop only runs
the publisher and the streams' reading is not the generator's bottleneck. Every child is
stopped by its PID; every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench.common import Row, command_line, percentile, report
from bench.procs import broker
from messaging.frames import FRAMES_CONTENT_TYPE, encode_batch

PAYLOAD = b"x" * 100
#: Every SAMPLE_EVERY-th stream of the holder times the delivery of each message.
SAMPLE_EVERY = 50
FRAME = 26 + len(PAYLOAD)  # bytes of one stored (and streamed) 100-byte message
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- the process's limits and its children's figures from /proc ------------------------------

def raise_nofile() -> int:
    """Raise RLIMIT_NOFILE's soft limit to the hard limit; children inherit it. The new limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:  # the kernel caps descriptors at fs.nr_open anyway
        hard = int(Path("/proc/sys/fs/nr_open").read_text())
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def nofile_of(pid: int) -> int:
    """The soft open-files limit of process ``pid``."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise RuntimeError(f"no open-files limit for {pid}")


def rss_kib(pid: int) -> int:
    """VmRSS of ``pid`` in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15)


def tcp_mem_kib() -> int:
    """Kernel memory held by every TCP socket on the machine (``/proc/net/sockstat``), KiB."""
    match = re.search(r"^TCP:.* mem (\d+)", Path("/proc/net/sockstat").read_text(), re.M)
    return int(match.group(1)) * os.sysconf("SC_PAGE_SIZE") // 1024 if match else 0


def settled_rss(pid: int, *, window: float = 2.0, limit: float = 60.0) -> int:
    """VmRSS once it stayed within 1% (or 1 MiB) for ``window`` s, or after ``limit`` s."""
    samples: list[tuple[float, int]] = []
    started = time.monotonic()
    for _ in range(int(limit / 0.2) + 1):
        now = time.monotonic()
        samples.append((now, rss_kib(pid)))
        recent = [kib for at, kib in samples if at >= now - window]
        if now - started >= window and max(recent) - min(recent) <= max(1024, recent[-1] // 100):
            break
        if now - started >= limit:
            break
        time.sleep(0.2)
    return samples[-1][1]


def _line(stream: Any, timeout: float) -> str:
    """One line from a child's stdout, or "" after ``timeout`` seconds."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return lines[0] if lines else ""


# -- the stream holder: a child process keeping N streaming GETs open -------------------------

class Holder:
    """A child process holding ``count`` streaming GETs of ``topic`` open, stopped by PID."""

    def __init__(self, url: str, topic: int, count: int, *, index: int = 0, read: bool = True,
                 rcvbuf: int = 0, timeout: float = 120.0) -> None:
        self.count = count
        args = [sys.executable, str(Path(__file__).resolve()), "--hold", url,
                "--hold-topic", str(topic), "--hold-count", str(count),
                "--hold-index", str(index), "--hold-rcvbuf", str(rcvbuf)]
        if not read:
            args.append("--hold-no-read")
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        line = _line(self.proc.stdout, timeout)
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
        assert self.proc.stdin is not None
        self.proc.stdin.write("stats\n")
        self.proc.stdin.flush()
        line = _line(self.proc.stdout, 30.0).split()
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


# -- talking to the broker -----------------------------------------------------------------

async def active_streams(session: aiohttp.ClientSession, url: str) -> int:
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
    # The payload starts with the send time: sampled streams time their delivery.
    payload = (b"T%.6f;" % time.time()).ljust(len(PAYLOAD), b"x")
    async with session.post(f"{url}/messaging/messages", params={"topicID": str(topic)},
                            data=payload) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"publish answered {resp.status}")
        return int(resp.headers["X-Broker-Index"])


async def publish_round(session: aiohttp.ClientSession, url: str, count: int,
                        rate: float) -> tuple[list[float], float, int]:
    """Sequential single-message POSTs at about ``rate``/s: latencies, elapsed s, last index."""
    latencies: list[float] = []
    last = 0
    started = time.perf_counter()
    deadline = started + max(60.0, 10 * count / rate)
    next_at = started
    for _ in range(count):
        delay = next_at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        t = time.perf_counter()
        if t > deadline:
            break
        next_at = t + 1 / rate  # no catching up: one request at a time, never a burst
        last = await publish_one(session, url, 1)
        latencies.append(time.perf_counter() - t)
    return latencies, time.perf_counter() - started, last


async def preload(session: aiohttp.ClientSession, url: str, topic: int, size: int) -> int:
    """Publish about ``size`` bytes of 100-byte messages to ``topic`` in batches of 10,000."""
    body = encode_batch(topic, [PAYLOAD] * 10_000)
    last = 0
    for _ in range(max(1, round(size / len(body)))):
        async with session.post(f"{url}/messaging/messages", data=body,
                                headers={"Content-Type": FRAMES_CONTENT_TYPE}) as resp:
            last = (await resp.json())["last"]
    return last


def off_loop(fn: Callable[[], Any]) -> Awaitable[Any]:
    """Run a blocking helper (a child's start or stop, an RSS wait) on a thread."""
    return asyncio.get_running_loop().run_in_executor(None, fn)


# -- 1. single-publish latency with N streams open --------------------------------------------

async def latency_rounds(tmp: Path, args: argparse.Namespace) -> tuple[list[Row], str]:
    proc, url = broker(tmp / "latency")
    pid = proc.proc.pid
    if nofile_of(pid) < args.streams + 100:
        proc.stop()
        raise RuntimeError(f"broker may open only {nofile_of(pid)} files")
    rounds: dict[str, list[tuple[float, float, float, float]]] = {"idle": [], "streams": []}
    checks: list[str] = []
    try:
        async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=1),
                timeout=aiohttp.ClientTimeout(total=60)) as session:
            last = 0
            for _ in range(50):  # warm-up: topic 1 exists, connection and code paths are hot
                last = await publish_one(session, url, 1)
            for kind in ("idle", "streams", "streams", "idle"):
                holder = None
                holder_cpu = 0.0
                if kind == "streams":
                    holder = await off_loop(partial(Holder, url, 1, args.streams, index=last + 1))
                    await wait_streams(session, url, args.streams)
                    await asyncio.sleep(1.0)
                    holder_cpu = cpu_seconds(holder.pid)
                cpu = cpu_seconds(pid)
                latencies, elapsed, new_last = await publish_round(
                    session, url, args.publishes, args.rate)
                broker_cpu = cpu_seconds(pid) - cpu
                published = new_last - last
                last = new_last
                if holder is not None:
                    holder_cpu = cpu_seconds(holder.pid) - holder_cpu
                    # Every stream must have had every message before the holder goes.
                    want = published * FRAME * args.streams
                    got, closed, d50, d99, timed = 0, 0, 0.0, 0.0, 0
                    for _ in range(300):
                        got, closed, d50, d99, timed = await off_loop(holder.delivery)
                        if got >= want:
                            break
                        await asyncio.sleep(0.1)
                    received = ("every stream got them all" if got >= want else
                                f"streams got only {got / want:.0%} of their bytes")
                    checks.append(f"{published} publishes in {elapsed:.0f} s, {received}, "
                                  f"{closed} streams closed by the broker, stream holder CPU "
                                  f"{holder_cpu / elapsed:.0%} of a core, delivery to every "
                                  f"{SAMPLE_EVERY}th stream p50 {d50:.1f} ms, p99 {d99:.1f} ms "
                                  f"over {timed:,} messages")
                    await off_loop(holder.stop)
                    await wait_streams(session, url, 0)
                p50 = percentile(latencies, 50) * 1000
                p99 = percentile(latencies, 99) * 1000
                rounds[kind].append((p50, p99, len(latencies) / elapsed,
                                     broker_cpu / len(latencies) * 1000))
                print(f"  round {kind:7}: p50 {p50:.2f} ms, p99 {p99:.2f} ms, "
                      f"{len(latencies) / elapsed:.0f} publishes/s, broker CPU "
                      f"{broker_cpu / elapsed:.0%}", flush=True)
    finally:
        proc.stop()

    def med(kind: str, i: int) -> float:
        return statistics.median(r[i] for r in rounds[kind])

    n = args.streams
    idle50, idle99, loaded50, loaded99 = med("idle", 0), med("idle", 1), med("streams", 0), \
        med("streams", 1)
    rows = [
        Row(f"single publish p50 with {n:,} streams", loaded50, "ms", "idle (0 streams)",
            idle50),
        Row(f"single publish p99 with {n:,} streams", loaded99, "ms", "idle (0 streams)",
            idle99, "p99 ≤ 5× idle p99", loaded99 <= 5 * idle99),
        Row(f"broker CPU per publish with {n:,} streams", med("streams", 3), "ms",
            "idle (0 streams)", med("idle", 3)),
    ]
    note = (f"Achieved publish rate (median of rounds): {med('idle', 2):.0f}/s idle, "
            f"{med('streams', 2):.0f}/s with {n:,} streams (target {args.rate:.0f}/s). "
            f"Stream rounds: {'; '.join(checks)}.")
    return rows, note


# -- 2. memory per stream that never reads -----------------------------------------------------

async def memory_per_stream(tmp: Path, args: argparse.Namespace) -> tuple[list[Row], str]:
    data = tmp / "memory"
    proc, url = broker(data)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
            backlog = await preload(session, url, 2, args.backlog_mib << 20) * FRAME
            last3 = await publish_one(session, url, 3)
    finally:
        proc.stop()

    async def measure(topic: int, index: int) -> tuple[float, int]:
        """KiB of broker RSS per stream, and kernel TCP memory grown, on a fresh broker."""
        proc, url = broker(data)
        pid = proc.proc.pid
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
                await publish_one(s, url, 4)  # warm: the write path, metrics, one connection
                await active_streams(s, url)
                before = await off_loop(lambda: settled_rss(pid))
                tcp_before = tcp_mem_kib()
                holder = await off_loop(lambda: Holder(url, topic, args.mem_streams,
                                                       index=index, read=False,
                                                       rcvbuf=args.rcvbuf_kib << 10))
                try:
                    await wait_streams(s, url, args.mem_streams)
                    after = await off_loop(lambda: settled_rss(pid))
                    tcp = tcp_mem_kib() - tcp_before
                finally:
                    await off_loop(holder.stop)
        finally:
            proc.stop()
        per_stream = (after - before) / args.mem_streams
        print(f"  topic {topic}: RSS {before / 1024:.1f} → {after / 1024:.1f} MiB, "
              f"{per_stream:.0f} KiB per stream; kernel TCP memory +{tcp / 1024:.1f} MiB",
              flush=True)
        return per_stream, tcp

    idle, idle_tcp = await measure(3, last3 + 1)
    stalled, stalled_tcp = await measure(2, 0)
    n = args.mem_streams
    rows = [Row(f"broker RSS per non-reading stream of a {backlog / 2**20:.0f} MiB backlog "
                f"({n} streams)", stalled, "KiB", "idle stream at the end of a topic", idle,
                "≤ 256 KiB per non-reading stream", stalled <= 256)]
    note = (f"Memory: {n} raw sockets with SO_RCVBUF {args.rcvbuf_kib} KiB (set before "
            f"connect) that never read, each on a fresh broker; RSS is VmRSS once settled. "
            f"Kernel TCP memory (both ends, /proc/net/sockstat, not in RSS) grew "
            f"{stalled_tcp / n:.0f} KiB per non-reading stream, {idle_tcp / n:.0f} KiB per "
            f"idle one.")
    return rows, note


# -- main --------------------------------------------------------------------------------------

def run_loop(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` on uvloop when installed (as the broker does), else asyncio's loop."""
    try:
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=800,
                   help="reading streams open during the loaded rounds (default 800)")
    p.add_argument("--publishes", type=int, default=300,
                   help="sequential publishes per round (default 300)")
    p.add_argument("--rate", type=float, default=200.0, help="publishes/s (default 200)")
    p.add_argument("--mem-streams", type=int, default=200,
                   help="non-reading streams of the memory figure (default 200)")
    p.add_argument("--backlog-mib", type=int, default=64,
                   help="backlog the non-reading streams start at (default 64)")
    p.add_argument("--rcvbuf-kib", type=int, default=64,
                   help="SO_RCVBUF of the non-reading sockets (default 64)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 50 streams, 50 publishes, 8 MiB backlog; its results go "
                        "to a temporary directory, not bench/RESULTS.md")
    p.add_argument("--hold", metavar="URL", help=argparse.SUPPRESS)
    p.add_argument("--hold-topic", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--hold-count", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--hold-index", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--hold-rcvbuf", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--hold-no-read", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--hold-lifetime", type=float, default=1800.0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.quick:
        args.streams, args.publishes, args.mem_streams, args.backlog_mib = 50, 50, 50, 8
    return args


def main() -> None:
    args = parse_args()
    if args.hold:
        run_loop(hold(args.hold, args.hold_topic, args.hold_count, args.hold_index,
                      not args.hold_no_read, args.hold_rcvbuf, args.hold_lifetime))
        return
    limit = raise_nofile()  # the broker child inherits it (checked in /proc/PID/limits)
    if limit < max(args.streams, args.mem_streams) + 100:
        sys.exit(f"RLIMIT_NOFILE hard limit {limit} is too low for {args.streams} streams")
    with tempfile.TemporaryDirectory(prefix="bench-streams-",
                                     dir=os.environ.get("BENCH_DIR")) as t:
        tmp = Path(t)
        print(f"1. single-publish latency, 0 and {args.streams} streams (A B B A)", flush=True)
        latency_rows, latency_note = run_loop(latency_rounds(tmp, args))
        print(f"2. memory of {args.mem_streams} non-reading streams", flush=True)
        memory_rows, memory_note = run_loop(memory_per_stream(tmp, args))
    if args.quick:  # a smoke run never overwrites the recorded results
        out = Path(tempfile.mkdtemp(prefix="bench-streams-quick-"))
        common.RESULTS, common.RESULTS_MD = out / "results", out / "RESULTS.md"
        print(f"(--quick: results written under {out})")
    report("streams", "Many open streams", latency_rows + memory_rows, command_line(), notes=(
        f"Latency: one aiohttp client POSTs 100-byte messages to topic 1 one at a time "
        f"(about {args.rate:.0f}/s, {args.publishes} per round) on one broker, rounds "
        f"interleaved idle, {args.streams} streams, {args.streams} streams, idle; figures are "
        f"medians of the per-round p50/p99. The streams are raw asyncio TCP connections "
        f"(`streaming=true` from the topic's end) in a separate child process that reads and "
        f"discards everything, so the load generator's loop runs only the publisher; broker, "
        f"generator and stream holder share the machine's cores. {latency_note}\n\n"
        f"{memory_note}"))


if __name__ == "__main__":
    main()
