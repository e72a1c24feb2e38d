"""Kill points and holds at the system-call boundary, for processes a test starts.

Run a broker under it (``python tests/faultpoint.py broker --data ...``) or ``install()`` it
in a child script. Only calls on paths under ``FAULT_ROOT`` count, and only while the file
``FAULT_ARM`` exists, so start-up and earlier work pass untouched:

- ``FAULT_TRACE``: append ``<n> <op> <path>`` for every counted call (a run with no kill
  enumerates the boundaries of what it did); a child may add its own lines (``op <name>``).
- ``FAULT_KILL``: ``<n>`` sends this process SIGKILL just before the n-th counted call;
  ``<n>+`` just after it; ``<n>~`` (a write) after writing half of its bytes: a torn write.
- ``FAULT_TEAR``: ``<suffix>#<k>``: the k-th write to a path ending with ``suffix`` writes
  half of its bytes and the process dies (a torn write at a chosen kind of file).
- ``FAULT_HOLD``: ``<op>:<suffix>``: that call on a path ending with ``suffix`` waits while
  ``FAULT_ARM`` exists (the test kills the process while it waits); ``<op>:<suffix>@<text>``
  holds only a write whose bytes contain ``text``. The trace says ``held <op> <path>`` when
  a hold begins.
- ``FAULT_FAIL``: ``<op>:<suffix>``: the first such call on a path ending with ``suffix`` (once
  ``FAULT_ARM`` exists) fails with EIO instead of running (a disk that refuses a write or
  an fsync).
- ``FAULT_SKIP``: comma-separated substrings of paths not counted (work on a timer, such as
  a cluster node's checkpoint, would make the numbering differ from run to run).
- ``FAULT_SYNCED``: a file to append ``<size>\t<path>`` to whenever a file under the root is
  known durable at that size (at start, for what is there; after each ``fsync`` and
  ``fdatasync``; a rename carries its source's size; a truncation lowers it; an unlink
  records ``-1``). After a kill, :func:`lose_unsynced` cuts every file back to that size, or
  removes it: what a power loss leaves of the process's writes.

The calls are the ones durability rests on: ``write``, ``fsync``, ``fdatasync``,
``ftruncate``, ``truncate``, ``replace``, ``rename``, ``unlink``, ``mkdir``, ``rmdir``.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_lock = threading.Lock()
_count = 0

OPS = ("write", "fsync", "fdatasync", "ftruncate", "truncate", "replace", "rename", "unlink",
       "mkdir", "rmdir")


def _path_of(target: Any) -> str:
    if isinstance(target, int):
        try:
            return os.readlink(f"/proc/self/fd/{target}")
        except OSError:
            return ""
    return os.path.abspath(os.fsdecode(target))


def install(environ: dict[str, str] | None = None) -> None:
    """Wrap the ``os`` functions according to the ``FAULT_*`` variables (no-op without
    ``FAULT_ROOT``)."""
    env = os.environ if environ is None else environ
    root = env.get("FAULT_ROOT")
    if not root:
        return
    root = os.path.abspath(root)
    arm = env.get("FAULT_ARM", "")
    trace = env.get("FAULT_TRACE", "")
    kill = env.get("FAULT_KILL", "")
    kill_at = int(kill.rstrip("+~")) if kill else 0
    kill_when = kill[-1] if kill and kill[-1] in "+~" else "-"
    tear_suffix, _, tear_at = env.get("FAULT_TEAR", "").partition("#")
    tears = [0]
    hold_op, _, hold_suffix = env.get("FAULT_HOLD", "").partition(":")
    hold_suffix, _, hold_text = hold_suffix.partition("@")
    fail_op, _, fail_suffix = env.get("FAULT_FAIL", "").partition(":")
    failed: list[str] = []
    skip = [part for part in env.get("FAULT_SKIP", "").split(",") if part]

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(10)  # SIGKILL is delivered at once; never run on

    def tear(write: Callable[..., Any], target: Any, data: Any) -> None:
        """Write half of ``data`` and die: a torn write."""
        view = memoryview(data)
        write(target, view[:max(len(view) // 2, 1)])
        die()

    def wrap(op: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(target: Any, *args: Any, **kwargs: Any) -> Any:
            global _count
            path = _path_of(target)
            if (not path.startswith(root) or (arm and not os.path.exists(arm))
                    or any(part in path for part in skip)):
                return real(target, *args, **kwargs)
            with _lock:
                _count += 1
                n = _count
                if trace:
                    with open(trace, "a") as f:
                        f.write(f"{n} {op} {path}\n")
            if op == fail_op and path.endswith(fail_suffix):
                with _lock:
                    first = not failed
                    failed.append(path)
                if first:
                    raise OSError(errno.EIO, f"injected {op} failure", path)
            if op == hold_op and path.endswith(hold_suffix) and (
                    not hold_text or hold_text.encode() in bytes(args[0])):
                if trace:
                    with _lock, open(trace, "a") as f:
                        f.write(f"held {op} {path}\n")
                deadline = time.monotonic() + 60
                while os.path.exists(arm) and time.monotonic() < deadline:
                    time.sleep(0.005)
            if n == kill_at and kill_when == "-":
                die()
            if tear_suffix and op == "write" and path.endswith(tear_suffix):
                with _lock:
                    tears[0] += 1
                    torn = tears[0] == int(tear_at)
                if torn:
                    tear(real, target, args[0])
            if n == kill_at and kill_when == "~" and op == "write":
                tear(real, target, args[0])
            result = real(target, *args, **kwargs)
            if n == kill_at:
                die()
            return result
        return call

    for op in OPS:
        setattr(os, op, wrap(op, getattr(os, op)))
    synced_record = env.get("FAULT_SYNCED", "")
    if synced_record:
        _record_durable_sizes(root, synced_record)


def _record_durable_sizes(root: str, record: str) -> None:
    """Record the size at which each file under ``root`` is durable (see FAULT_SYNCED)."""
    durable: dict[str, int] = {}

    def note(path: str, size: int) -> None:
        durable[path] = size
        with _lock, open(record, "a") as f:
            f.write(f"{size}\t{path}\n")

    for directory, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(directory, name)
            note(path, os.path.getsize(path))

    def synced(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(fd: int, *args: Any) -> Any:
            result = real(fd, *args)
            path = _path_of(fd)
            if path.startswith(root) and os.path.isfile(path):
                note(path, os.fstat(fd).st_size)
            return result
        return call

    def moved(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(source: Any, target: Any, *args: Any, **kwargs: Any) -> Any:
            result = real(source, target, *args, **kwargs)
            src, dst = _path_of(source), _path_of(target)
            if dst.startswith(root):
                note(dst, durable.get(src, 0))
            if src.startswith(root):
                note(src, -1)
            return result
        return call

    def cut(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(target: Any, length: int, *args: Any) -> Any:
            result = real(target, length, *args)
            path = _path_of(target)
            if path.startswith(root) and durable.get(path, 0) > length:
                note(path, length)
            return result
        return call

    def gone(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(target: Any, *args: Any, **kwargs: Any) -> Any:
            path = _path_of(target)
            result = real(target, *args, **kwargs)
            if path.startswith(root):
                note(path, -1)
            return result
        return call

    os.fsync = synced(os.fsync)
    os.fdatasync = synced(os.fdatasync)
    os.replace = moved(os.replace)
    os.rename = moved(os.rename)
    os.ftruncate = cut(os.ftruncate)
    os.truncate = cut(os.truncate)
    os.unlink = gone(os.unlink)


def lose_unsynced(root: str | os.PathLike[str], record: str | os.PathLike[str]) -> int:
    """What a power loss leaves under ``root`` of a killed process that ran with
    ``FAULT_SYNCED=record``: every file cut back to the size at which it was last durable,
    a file never durable removed. Returns the bytes lost."""
    durable: dict[str, int] = {}
    for line in Path(record).read_text().splitlines():
        recorded, _, path = line.partition("\t")
        durable[path] = int(recorded)
    lost = 0
    for directory, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(os.path.abspath(directory), name)
            size = os.path.getsize(path)
            keep = durable.get(path, -1)
            if keep < 0:
                lost += size
                os.remove(path)
            elif size > keep:
                lost += size - keep
                os.truncate(path, keep)
    return lost


def mark(name: str) -> None:
    """Write ``op <name>`` to the trace (what the boundaries that follow belong to)."""
    trace = os.environ.get("FAULT_TRACE")
    arm = os.environ.get("FAULT_ARM", "")
    if trace and (not arm or os.path.exists(arm)):
        with _lock, open(trace, "a") as f:
            f.write(f"op {name}\n")


def read_trace(path: str | os.PathLike[str]) -> list[tuple[int, str, str, str]]:
    """The counted calls of a trace: ``(n, op, path, the op mark before it)``."""
    calls = []
    current = ""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    for line in text.splitlines():
        word, _, rest = line.partition(" ")
        if word == "op":
            current = rest
        elif word != "held":  # a hold began (FAULT_HOLD), not a call
            op, _, where = rest.partition(" ")
            calls.append((int(word), op, where, current))
    return calls


if __name__ == "__main__":
    # Run as a script, this file's folder (tests/) is first on sys.path, and its http/ would
    # shadow the standard library's: put the repository there instead.
    sys.path[0] = str(Path(__file__).resolve().parents[1])
    install()
    from messaging.cli.main import main

    sys.argv[0] = "messaging"
    sys.exit(main())
