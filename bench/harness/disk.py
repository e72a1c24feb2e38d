"""The disk as a baseline: how many write + fdatasync rounds per second it takes for a given
write size and file count, and zero-filling a file the way a preallocating log would
(blocking: run them off the event loop)."""

from __future__ import annotations

import os
import time
from pathlib import Path

#: The zeros written per call when filling a file.
FILL_CHUNK = 1 << 20


def disk_rate(directory: Path, size: int, *, files: int = 1, seconds: float = 1.0,
              max_writes: int = 100_000, max_open: int = 1000) -> float:
    """Writes/s of a loop appending ``size`` bytes then fdatasync, round-robin over ``files``
    files in ``directory`` (opened once when at most ``max_open``, else opened and closed
    around each write); the files are removed afterwards."""
    directory.mkdir(parents=True, exist_ok=True)
    block = b"x" * size
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    names = [directory / f"probe-{i}" for i in range(files)]
    kept = [os.open(n, flags, 0o644) for n in names] if files <= max_open else []
    count = 0
    started = time.perf_counter()
    try:
        while count < max_writes and time.perf_counter() - started < seconds:
            i = count % files
            fd = kept[i] if kept else os.open(names[i], flags, 0o644)
            os.write(fd, block)
            os.fdatasync(fd)
            if not kept:
                os.close(fd)
            count += 1
        elapsed = time.perf_counter() - started
    finally:
        for fd in kept:
            os.close(fd)
        for n in names:
            n.unlink(missing_ok=True)
    return count / elapsed


def fill(fd: int, size: int) -> None:
    """Write ``size`` zero bytes from offset 0 of ``fd`` and fsync once."""
    block = bytes(FILL_CHUNK)
    for offset in range(0, size, FILL_CHUNK):
        os.pwrite(fd, block[:min(FILL_CHUNK, size - offset)], offset)
    os.fsync(fd)
