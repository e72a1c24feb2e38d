"""etcd members for the benchmarks that run a cluster (cluster, groups, soak): members started
and stopped (or killed) by PID, each with its own data directory, and what the benchmarks ask
them over etcd's JSON gateway (status, who leads, health, the Raft index)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import aiohttp

from bench.harness.procs import free_port

Session = aiohttp.ClientSession


class Etcd:
    """One etcd member with its own data directory, started and stopped by its PID.

    Its log goes to ``<data>.log``. Restarting it (``start`` again) reuses the data directory,
    so it rejoins the cluster it was created in.
    """

    def __init__(self, name: str, data: Path, initial_cluster: str, client_port: int,
                 peer_port: int, snapshot_count: int = 2000) -> None:
        self.name, self.data, self.initial_cluster = name, data, initial_cluster
        self.client_url = f"http://127.0.0.1:{client_port}"
        self.peer_url = f"http://127.0.0.1:{peer_port}"
        self.snapshot_count = snapshot_count
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the member on 127.0.0.1 (a new data directory makes a new cluster)."""
        etcd = shutil.which("etcd")
        if etcd is None:
            raise RuntimeError("etcd is not on PATH (apt-get install etcd-server, 3.4.22+)")
        with self.data.with_suffix(".log").open("ab") as log:
            self.proc = subprocess.Popen(
                [etcd, "--name", self.name, "--data-dir", str(self.data),
                 "--listen-client-urls", self.client_url,
                 "--advertise-client-urls", self.client_url,
                 "--listen-peer-urls", self.peer_url,
                 "--initial-advertise-peer-urls", self.peer_url,
                 "--initial-cluster", self.initial_cluster, "--initial-cluster-state", "new",
                 "--initial-cluster-token", "messaging-bench",
                 "--snapshot-count", str(self.snapshot_count),
                 "--logger", "zap", "--log-level", "warn"],
                stdout=log, stderr=log)

    @property
    def running(self) -> bool:
        """Whether the member's process was started and has not ended."""
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The running member's PID, None while it is down."""
        return self.proc.pid if self.running and self.proc is not None else None

    def kill(self) -> None:
        """SIGKILL (kill -9) by PID, then reap."""
        if self.proc is not None:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(15)

    def stop(self) -> None:
        """SIGTERM by PID; SIGKILL if it has not ended within 20 s."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


def etcd_cluster(tmp: Path, size: int = 3, snapshot_count: int = 2000) -> list[Etcd]:
    """``size`` etcd members of one new cluster on free 127.0.0.1 ports (not started)."""
    ports = [(free_port(), free_port()) for _ in range(size)]
    initial = ",".join(f"e{i}=http://127.0.0.1:{peer}" for i, (_, peer) in enumerate(ports))
    return [Etcd(f"e{i}", tmp / f"etcd{i}", initial, client, peer, snapshot_count)
            for i, (client, peer) in enumerate(ports)]


async def etcd_status(session: Session, member: Etcd) -> dict[str, Any] | None:
    """etcd's maintenance status of ``member`` (JSON gateway), None when it does not answer."""
    if not member.running:
        return None
    try:
        async with session.post(f"{member.client_url}/v3/maintenance/status", json={},
                                timeout=aiohttp.ClientTimeout(total=2)) as resp:
            if resp.status != 200:
                return None
            result: dict[str, Any] = await resp.json(content_type=None)
            return result
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


async def etcd_leader(session: Session, members: list[Etcd]) -> Etcd:
    """The member that leads (RuntimeError when none does in 100 rounds, 0.1 s apart)."""
    for _ in range(100):
        for member in members:
            status = await etcd_status(session, member)
            if status and status.get("leader") not in (None, "0") \
                    and status["leader"] == status["header"]["member_id"]:
                return member
        await asyncio.sleep(0.1)
    raise RuntimeError("no etcd leader found")


def wait_for_leader(members: list[Etcd]) -> None:
    """Block until one of ``members`` leads (from synchronous code, before any load)."""
    async def led() -> None:
        async with aiohttp.ClientSession() as session:
            await etcd_leader(session, members)
    asyncio.run(led())


async def etcd_healthy(session: Session, members: list[Etcd]) -> bool:
    """Every member runs, answers /health and names the same leader."""
    leaders = set()
    for member in members:
        status = await etcd_status(session, member)
        if status is None or status.get("leader") in (None, "0"):
            return False
        leaders.add(status["leader"])
        try:
            async with session.get(f"{member.client_url}/health",
                                   timeout=aiohttp.ClientTimeout(total=2)) as resp:
                health = await resp.json(content_type=None)
                if resp.status != 200 or health.get("health") != "true":
                    return False
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return False
    return len(leaders) == 1


async def raft_index(session: Session, members: list[Etcd]) -> int:
    """The highest Raft index any answering member reports (0 if none answers)."""
    best = 0
    for member in members:
        status = await etcd_status(session, member)
        if status is not None:
            best = max(best, int(status.get("raftIndex", 0)))
    return best
