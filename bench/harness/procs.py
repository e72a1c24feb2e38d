"""Child processes a benchmark starts and stops by PID, each on 127.0.0.1 on a free port: our
broker, the bare aiohttp baseline, any server that is ready once its port accepts
connections; the tools installed when missing; the open-files limit children inherit.

Every child runs with this checkout first on its ``PYTHONPATH`` (:func:`child_env`), so a
child started as ``python -m bench...`` or ``python -m messaging.cli`` runs the code the
benchmark itself imported.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[2]


class Unavailable(RuntimeError):
    """A server that cannot be installed or started; the benchmark skips it with this note."""


def child_env() -> dict[str, str]:
    """This process's environment for a child: unbuffered output, this checkout importable."""
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def read_line(stream: IO[str], timeout: float) -> str:
    """One line from a child's output, or "" after ``timeout`` seconds (read on a thread, so
    a child that never writes cannot hang the benchmark)."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return lines[0] if lines else ""


def stop_process(proc: subprocess.Popen[Any], grace: float = 20.0) -> int:
    """SIGTERM a child by its PID (SIGKILL after ``grace`` s), reap it; its exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait(10)


class Proc:
    """A child process that prints ``ready`` (a line containing it) once it serves, and is
    stopped (by its PID) when the benchmark ends.

    Its stderr goes to ``log`` (appended) when given, else nowhere. ``env`` and ``cwd``
    replace :func:`child_env` and this process's working directory.
    """

    def __init__(self, args: list[str], ready: str, timeout: float = 30.0,
                 log: Path | None = None, *, env: dict[str, str] | None = None,
                 cwd: Path | None = None) -> None:
        self.args = args
        err: IO[bytes] | int = log.open("ab") if log is not None else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, text=True,
                                         env=env if env is not None else child_env(), cwd=cwd)
        finally:
            if not isinstance(err, int):
                err.close()  # the child keeps its own copy of the descriptor
        assert self.proc.stdout is not None
        line = read_line(self.proc.stdout, timeout)
        if ready not in line:
            self.stop()
            raise RuntimeError(f"{args[:4]} did not start: {line!r}")
        self.line = line

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, grace: float = 20.0) -> int:
        """SIGTERM (SIGKILL after ``grace`` s), then reap; the exit code."""
        return stop_process(self.proc, grace)

    def kill(self) -> None:
        """SIGKILL, then reap."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


def broker(data: Path, *args: str, port: int = 0, log: Path | None = None,
           launcher: list[str] | None = None, log_level: str = "WARNING",
           env: dict[str, str] | None = None, cwd: Path | None = None) -> tuple[Proc, str]:
    """A ``messaging broker`` process and its URL; ``launcher`` replaces the command that
    takes the ``broker ...`` arguments (``python -m messaging.cli``); ``env`` and ``cwd`` as
    for :class:`Proc` (another checkout's code: its directory first on ``PYTHONPATH``, and
    as the working directory, which ``python -m`` puts before ``PYTHONPATH``)."""
    command = launcher or [sys.executable, "-m", "messaging.cli"]
    proc = Proc([*command, "broker", "--data", str(data),
                 "--bind", f"127.0.0.1:{port}", "--log-level", log_level, *args],
                "listening on", log=log, env=env, cwd=cwd)
    match = re.search(r"listening on (http://\S+)", proc.line)
    assert match
    return proc, match.group(1)


def bare_server() -> tuple[Proc, str]:
    """The bare aiohttp baseline server (:mod:`bench.harness.bare_server`) and its URL."""
    port = free_port()
    proc = Proc([sys.executable, "-m", "bench.harness.bare_server", str(port)], "ready")
    return proc, f"http://127.0.0.1:{port}"


class PortServer:
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


def ensure_tool(name: str, package: str) -> str | None:
    """The path of ``name``, installing Debian's ``package`` when running as root."""
    found = shutil.which(name)
    if found or os.geteuid() != 0 or not shutil.which("apt-get"):
        return found
    subprocess.run(["apt-get", "install", "-y", "-qq", package], capture_output=True,
                   timeout=300, check=False)
    return shutil.which(name)


def raise_nofile() -> int:
    """Raise RLIMIT_NOFILE's soft limit to the hard limit; children inherit it. The new limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:  # the kernel caps descriptors at fs.nr_open anyway
        hard = int(Path("/proc/sys/fs/nr_open").read_text())
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
