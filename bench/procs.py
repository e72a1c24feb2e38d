"""Start and stop the servers a benchmark measures, each in its own process on 127.0.0.1."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
REFERENCE = ROOT / "conformance" / "reference-server.mjs"
REFERENCE_PACKAGE = ROOT / "conformance" / "node_modules" / "@durable-streams" / "server"


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _first_line(proc: subprocess.Popen[str], timeout: float) -> str:
    lines: list[str] = []
    assert proc.stdout is not None
    stdout = proc.stdout
    reader = threading.Thread(target=lambda: lines.append(stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return lines[0] if lines else ""


def stop_process(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM a child by its PID (SIGKILL after 20 s), then reap it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


class Proc:
    """A child process that is stopped (by its PID) when the benchmark ends.

    Its stderr goes to ``log`` (appended) when given, else nowhere.
    """

    def __init__(self, args: list[str], ready: str, timeout: float = 30.0,
                 log: Path | None = None) -> None:
        err: IO[bytes] | int = log.open("ab") if log is not None else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, text=True,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
        finally:
            if not isinstance(err, int):
                err.close()  # the child keeps its own copy of the descriptor
        line = _first_line(self.proc, timeout)
        if ready not in line:
            self.stop()
            raise RuntimeError(f"{args[:4]} did not start: {line!r}")
        self.line = line

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        stop_process(self.proc)

    def kill(self) -> None:
        """SIGKILL, then reap."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


def broker(data: Path, *args: str, port: int = 0, log: Path | None = None,
           launcher: list[str] | None = None) -> tuple[Proc, str]:
    """A ``messaging broker`` process and its URL; ``launcher`` replaces the command that
    takes the ``broker ...`` arguments (``python -m messaging.cli.main``)."""
    command = launcher or [sys.executable, "-m", "messaging.cli"]
    proc = Proc([*command, "broker", "--data", str(data),
                 "--bind", f"127.0.0.1:{port}", "--log-level", "WARNING", *args],
                "listening on", log=log)
    match = re.search(r"listening on (http://\S+)", proc.line)
    assert match
    return proc, match.group(1)


def bare_server() -> tuple[Proc, str]:
    """The bare aiohttp baseline server and its URL."""
    port = free_port()
    proc = Proc([sys.executable, str(HERE / "bare_server.py"), str(port)], "ready")
    return proc, f"http://127.0.0.1:{port}"


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


def ensure_tool(name: str, package: str) -> str | None:
    """The path of ``name``, installing Debian's ``package`` when running as root."""
    found = shutil.which(name)
    if found or os.geteuid() != 0 or not shutil.which("apt-get"):
        return found
    subprocess.run(["apt-get", "install", "-y", "-qq", package], capture_output=True,
                   timeout=300, check=False)
    return shutil.which(name)


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
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.running and self.proc is not None else None

    def kill(self) -> None:
        """SIGKILL (kill -9) by PID, then reap."""
        if self.proc is not None:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(15)

    def stop(self) -> None:
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


def rss_bytes(pid: int | None) -> int:
    """Resident set size of ``pid`` (0 when it is gone)."""
    if pid is None:
        return 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds ``pid`` used so far (0 when it is gone)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0
