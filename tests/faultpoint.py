"""Kill points and holds at the system-call boundary, for processes a test starts.

Run a broker under it (``python tests/faultpoint.py broker --data ...``) or ``install()`` it
in a child script. Only calls on paths under ``FAULT_ROOT`` count, and only while the file
``FAULT_ARM`` exists, so start-up and earlier work pass untouched:

- ``FAULT_TRACE``: append ``<n> <op> <path>`` for every counted call (a run with no kill
  enumerates the boundaries of what it did); a child may add its own lines (``op <name>``).
- ``FAULT_KILL``: ``<n>`` sends this process SIGKILL just before the n-th counted call;
  ``<n>+`` just after it; ``<n>~`` (a write) after writing half of its bytes: a torn write.
- ``FAULT_HOLD``: ``<op>:<suffix>``: that call on a path ending with ``suffix`` waits while
  ``FAULT_ARM`` exists (the test kills the process while it waits).
- ``FAULT_FAIL``: ``<op>:<suffix>``: the first such call on a path ending with ``suffix`` (once
  ``FAULT_ARM`` exists) fails with EIO instead of running (a disk that refuses a write or
  an fsync).
- ``FAULT_SKIP``: comma-separated substrings of paths not counted (work on a timer, such as
  a cluster node's checkpoint, would make the numbering differ from run to run).

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
    hold_op, _, hold_suffix = env.get("FAULT_HOLD", "").partition(":")
    fail_op, _, fail_suffix = env.get("FAULT_FAIL", "").partition(":")
    failed: list[str] = []
    skip = [part for part in env.get("FAULT_SKIP", "").split(",") if part]

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(10)  # SIGKILL is delivered at once; never run on

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
            if op == hold_op and path.endswith(hold_suffix):
                deadline = time.monotonic() + 60
                while os.path.exists(arm) and time.monotonic() < deadline:
                    time.sleep(0.005)
            if n == kill_at and kill_when == "-":
                die()
            if n == kill_at and kill_when == "~" and op == "write":
                data = memoryview(args[0])
                real(target, data[:max(len(data) // 2, 1)])
                die()
            result = real(target, *args, **kwargs)
            if n == kill_at:
                die()
            return result
        return call

    for op in OPS:
        setattr(os, op, wrap(op, getattr(os, op)))


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
        else:
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
