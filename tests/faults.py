"""Fault injection at the system-call boundary: ``os.write``, ``os.fdatasync``, ``os.fsync``,
``os.open`` and ``os.close`` fail (or write short) for files under one directory only.

The broker calls these through the ``os`` module, so patching the module attributes puts the
faults exactly where the kernel would report them; sockets and files elsewhere are untouched.
"""

from __future__ import annotations

import errno
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

_real_write = os.write
_real_fdatasync = os.fdatasync
_real_fsync = os.fsync
_real_open = os.open
_real_close = os.close


def fd_path(fd: int) -> str:
    """The path a descriptor refers to ("" if it cannot be told)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


@dataclass
class Faults:
    """What to break, for paths under ``root`` that ``match`` accepts."""

    root: Path
    match: Callable[[str], bool] = lambda path: True
    #: bytes that may still be written before writes go short and then fail; None: no limit
    write_budget: int | None = None
    write_errno: int = errno.ENOSPC
    #: how many fdatasync/fsync calls fail from now on (fsync of files and directories)
    sync_failures: int = 0
    sync_errno: int = errno.EIO
    #: how many os.open calls creating a file (one that does not exist yet) fail
    create_failures: int = 0
    create_errno: int = errno.EMFILE
    opened: Counter[int] = field(default_factory=Counter)
    closed: Counter[int] = field(default_factory=Counter)
    injected: int = 0

    def covers(self, path: str) -> bool:
        """Whether a path is under the root and accepted by ``match``."""
        return path.startswith(str(self.root)) and self.match(path)

    def heal(self) -> None:
        """Stop injecting faults (space came back, the disk recovered)."""
        self.write_budget = None
        self.sync_failures = 0
        self.create_failures = 0


@contextmanager
def inject(monkeypatch: pytest.MonkeyPatch, faults: Faults) -> Iterator[Faults]:
    """Patch the ``os`` functions for the duration of the block."""

    def write(fd: int, data: bytes | memoryview) -> int:
        if faults.write_budget is None or not faults.covers(fd_path(fd)):
            return _real_write(fd, data)
        if faults.write_budget <= 0:
            faults.injected += 1
            raise OSError(faults.write_errno, os.strerror(faults.write_errno))
        allowed = min(len(data), faults.write_budget)
        written = _real_write(fd, memoryview(data)[:allowed])
        faults.write_budget -= written
        if written < len(data):
            faults.injected += 1
        return written

    counting = threading.Lock()  # files are fsynced side by side on several threads

    def syncer(real: Callable[[int], None]) -> Callable[[int], None]:
        def sync(fd: int) -> None:
            if faults.covers(fd_path(fd)):
                with counting:
                    fail = faults.sync_failures > 0
                    if fail:
                        faults.sync_failures -= 1
                        faults.injected += 1
                if fail:
                    raise OSError(faults.sync_errno, os.strerror(faults.sync_errno))
            real(fd)
        return sync

    def open_(path: str | os.PathLike[str], flags: int, mode: int = 0o777, *,
              dir_fd: int | None = None) -> int:
        text = os.fspath(path)
        if (flags & os.O_CREAT and faults.create_failures > 0 and faults.covers(text)
                and not os.path.exists(text)):
            faults.create_failures -= 1
            faults.injected += 1
            raise OSError(faults.create_errno, os.strerror(faults.create_errno), text)
        fd = _real_open(path, flags, mode, dir_fd=dir_fd)
        if faults.covers(text):
            faults.opened[fd] += 1
        return fd

    def close(fd: int) -> None:
        if faults.opened[fd] > faults.closed[fd]:
            faults.closed[fd] += 1
        _real_close(fd)

    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(os, "fdatasync", syncer(_real_fdatasync))
    monkeypatch.setattr(os, "fsync", syncer(_real_fsync))
    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "close", close)
    try:
        yield faults
    finally:
        monkeypatch.undo()


def open_files_under(root: Path) -> list[str]:
    """Paths under ``root`` this process holds open right now."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        path = fd_path(int(name))
        if path.startswith(str(root)):
            found.append(path)
    return found
