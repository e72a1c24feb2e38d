"""Readings of processes (by PID) and of the machine, from /proc: CPU seconds (of a process
or of each of its threads), resident
memory (now, or once it settles), descriptors, threads, the open-files limit, the machine's
busy time, the kernel's TCP memory and the load average.

A reading of a process that is gone is 0, so a sampler can outlive what it samples (an etcd
member killed on purpose).
"""

from __future__ import annotations

import os
import re
import resource
import time
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds ``pid`` used so far (0 when it is gone)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15)
    except (OSError, ValueError, IndexError):
        return 0.0


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """CPU seconds of each live thread of ``pid``: thread id -> (its OS name, seconds)."""
    out: dict[int, tuple[str, float]] = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            out[int(task.name)] = (name, (int(fields[11]) + int(fields[12])) / CLK_TCK)
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return out


def children_cpu() -> float:
    """CPU seconds of this process's finished children (wrk, redis-benchmark, once reaped)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def generator_cpu() -> float:
    """CPU seconds of the load generator: this process and its finished children."""
    return time.process_time() + children_cpu()


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


def rss_kib(pid: int | None) -> int:
    """Resident set size of ``pid`` in KiB (0 when it is gone)."""
    return rss_bytes(pid) // 1024


def settled_rss(pid: int, *, window: float = 2.0, limit: float = 60.0) -> int:
    """VmRSS (KiB) once it stayed within 1% (or 1 MiB) for ``window`` s, or after ``limit`` s
    (blocking: run it off the loop)."""
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


def descriptors(pid: int) -> int:
    """How many descriptors ``pid`` has open (0 when it is gone)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def threads(pid: int) -> int:
    """How many threads ``pid`` runs (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def nofile_of(pid: int) -> int:
    """The soft open-files limit of process ``pid``."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise RuntimeError(f"no open-files limit for {pid}")


def machine_times() -> tuple[float, float]:
    """Seconds all the machine's cores spent busy (not idle, not waiting on I/O) and in total
    since boot, from ``/proc/stat``."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal; guest is in user
    busy = total - fields[3] - fields[4]
    return busy / CLK_TCK, total / CLK_TCK


def machine_busy() -> float:
    """Seconds all the machine's cores spent busy since boot."""
    return machine_times()[0]


def tcp_mem_kib() -> int:
    """Kernel memory held by every TCP socket on the machine (``/proc/net/sockstat``), KiB."""
    match = re.search(r"^TCP:.* mem (\d+)", Path("/proc/net/sockstat").read_text(), re.M)
    return int(match.group(1)) * os.sysconf("SC_PAGE_SIZE") // 1024 if match else 0


def load_average() -> str:
    """The machine's 1, 5 and 15 minute load averages, as /proc/loadavg says them."""
    return ", ".join(Path("/proc/loadavg").read_text().split()[:3])
