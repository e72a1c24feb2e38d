"""Cluster benchmark: 3-node batch publish throughput beside a single node, and failover time.

Every node is its own process on 127.0.0.1 (all sharing this machine's 2 cores and disk).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Row, command_line, report
from bench.procs import Proc, broker, free_port
from messaging.client import Client
from messaging.errors import MessagingError

SECONDS = float(os.environ.get("BENCH_SECONDS", "5"))
FAILOVERS = int(os.environ.get("BENCH_FAILOVERS", "5"))
PAYLOAD = b"x" * 100


class Node:
    def __init__(self, data: Path, raft: str, peers: list[str]) -> None:
        self.data, self.raft, self.peers = data, raft, peers
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: Proc | None = None

    def start(self) -> None:
        peers = [a for p in self.peers for a in ("--peer", p)]
        self.proc = Proc([sys.executable, "-m", "messaging.cli", "broker", "--data",
                          str(self.data), "--bind", f"127.0.0.1:{self.port}", "--log-level",
                          "WARNING", "--raft-bind", self.raft, *peers, "--advertise", self.url],
                         "listening on")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.proc.kill()
            self.proc.proc.wait(10)


async def leader(session: aiohttp.ClientSession, nodes: list[Node], timeout: float = 30) -> Node:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for node in nodes:
            try:
                async with session.get(f"{node.url}/messaging/diagnostics") as resp:
                    d = await resp.json()
                if d["role"] == "leader" and len(d["urls"]) == len(nodes):
                    return node
            except (aiohttp.ClientError, OSError):
                pass
        await asyncio.sleep(0.1)
    raise RuntimeError("no leader")


async def throughput(urls: list[str], topic: int, senders: int = 4) -> float:
    datas = [PAYLOAD] * 1000
    count = 0
    async with Client(urls) as client:
        deadline = time.perf_counter() + SECONDS

        async def sender() -> None:
            nonlocal count
            while time.perf_counter() < deadline:
                await client.publish_batch(topic, datas)
                count += 1000

        started = time.perf_counter()
        await asyncio.gather(*(sender() for _ in range(senders)))
        return count / (time.perf_counter() - started)


async def failover(nodes: list[Node]) -> float:
    """Seconds from SIGKILL of the leader to the first publish acknowledged by a new one."""
    async with aiohttp.ClientSession() as session:
        old = await leader(session, nodes)
    survivors = [n for n in nodes if n is not old]
    async with Client([n.url for n in survivors], retry_timeout=30) as client:
        old.kill()
        killed = time.perf_counter()
        while True:
            try:
                await client.publish(9, b"after failover")
                break
            except MessagingError:
                await asyncio.sleep(0.01)
        elapsed = time.perf_counter() - killed
    old.start()
    async with aiohttp.ClientSession() as session:
        await leader(session, nodes)
    return elapsed


async def run(tmp: Path) -> list[Row]:
    single_proc, single_url = broker(tmp / "single")
    try:
        single = statistics.median([await throughput([single_url], 1) for _ in range(3)])
    finally:
        single_proc.stop()
    rafts = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    nodes = [Node(tmp / f"node{i}", rafts[i], [r for r in rafts if r != rafts[i]])
             for i in range(3)]
    for node in nodes:
        node.start()
    try:
        async with aiohttp.ClientSession() as session:
            first = await leader(session, nodes)
        cluster = statistics.median([await throughput([first.url], 1) for _ in range(3)])
        times = [await failover(nodes) for _ in range(FAILOVERS)]
    finally:
        for node in nodes:
            if node.proc is not None:
                node.proc.stop()
    median = statistics.median(times)
    return [
        Row("batch publish 1000 × 100 B, 3-node cluster", cluster, "msg/s",
            "single node, same client", single, "≥ 50% of single", cluster >= 0.5 * single),
        Row(f"failover: leader SIGKILL → first ack on new leader, median of {len(times)}",
            median, "s", "", None, "≤ 3 s", median <= 3.0),
        Row("failover, slowest run", max(times), "s", "", None, "", None),
    ]


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-cluster-",
                                     dir=os.environ.get("BENCH_DIR")) as t:
        rows = asyncio.run(run(Path(t)))
    report("cluster", "Raft cluster (3 nodes on one machine)", rows, command_line(), notes=(
        "Four concurrent senders of 1000-message batches for "
        f"{SECONDS:.0f} s, median of 3 runs. The single node runs `--fsync always`; the cluster "
        "acknowledges once a majority has the command in its pysyncobj journal and the leader "
        "has applied it (topic files are fsynced every 100 ms). Raft election timeouts are "
        "0.4–1.0 s."))


if __name__ == "__main__":
    main()
