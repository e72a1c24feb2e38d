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
from pathlib import Path

HERE = Path(__file__).resolve().parent


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


class Proc:
    """A child process that is stopped (by its PID) when the benchmark ends."""

    def __init__(self, args: list[str], ready: str, timeout: float = 30.0) -> None:
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        line = _first_line(self.proc, timeout)
        if ready not in line:
            self.stop()
            raise RuntimeError(f"{args[:4]} did not start: {line!r}")
        self.line = line

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def broker(data: Path, *args: str) -> tuple[Proc, str]:
    """A ``messaging broker`` process and its URL."""
    proc = Proc([sys.executable, "-m", "messaging.cli", "broker", "--data", str(data),
                 "--bind", "127.0.0.1:0", "--log-level", "WARNING", *args], "listening on")
    match = re.search(r"listening on (http://\S+)", proc.line)
    assert match
    return proc, match.group(1)


def bare_server() -> tuple[Proc, str]:
    """The bare aiohttp baseline server and its URL."""
    port = free_port()
    proc = Proc([sys.executable, str(HERE / "bare_server.py"), str(port)], "ready")
    return proc, f"http://127.0.0.1:{port}"


def ensure_tool(name: str, package: str) -> str | None:
    """The path of ``name``, installing Debian's ``package`` when running as root."""
    found = shutil.which(name)
    if found or os.geteuid() != 0 or not shutil.which("apt-get"):
        return found
    subprocess.run(["apt-get", "install", "-y", "-qq", package], capture_output=True,
                   timeout=300, check=False)
    return shutil.which(name)
