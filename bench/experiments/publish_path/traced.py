"""A broker with a clock reading at each phase of a single publish: ``python traced.py
broker ...`` runs ``messaging``'s command line (of whichever checkout is first on
``PYTHONPATH``) after wrapping the functions that begin and end each phase, and writes the
readings to ``$PUBLISH_PHASES_OUT`` (JSON: ``[[phase, perf_counter], ...]``) when it exits.

The readings are ``time.perf_counter()``: the system's monotonic clock, the same one the load
process reads, so the two processes' readings fall on one time line. A function that a
checkout lacks is not wrapped (its phases are then missing from that side's breakdown).
Each wrapper costs about a microsecond, so the traced broker runs a little slower than the
one the latency figures are measured on.

Self-contained on purpose (no ``bench`` imports): it runs against older checkouts too.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import importlib
import json
import os
import sys
import time
from typing import Any

EVENTS: list[tuple[str, float]] = []
_clock = time.perf_counter
_note = EVENTS.append

#: (module, class, method, reading before the call, reading after it or "").
POINTS = (
    ("aiohttp.web_protocol", "RequestHandler", "data_received", "received", ""),
    ("messaging.log.local", "LocalLog", "apply", "queued", ""),
    ("messaging.log.local", "LocalLog", "_write", "writing", "written"),
    ("messaging.log.local", "LocalLog", "_settle", "settling", "settled"),
    ("messaging.http.fanout", "FanOut", "_write_slice", "fanning", "fanned"),
)


def _wrap(owner: Any, name: str, before: str, after: str) -> None:
    original = getattr(owner, name)
    if asyncio.iscoroutinefunction(original):
        @functools.wraps(original)
        async def traced_async(*args: Any, **kwargs: Any) -> Any:
            _note((before, _clock()))
            return await original(*args, **kwargs)
        setattr(owner, name, traced_async)
        return

    @functools.wraps(original)
    def traced(*args: Any, **kwargs: Any) -> Any:
        _note((before, _clock()))
        try:
            return original(*args, **kwargs)
        finally:
            if after:
                _note((after, _clock()))
    setattr(owner, name, traced)


def _wrap_fdatasync() -> None:
    original = os.fdatasync

    def fdatasync(fd: Any) -> None:
        _note(("sync", _clock()))
        try:
            original(fd)
        finally:
            _note(("synced", _clock()))
    os.fdatasync = fdatasync  # every module calls it as os.fdatasync


def install() -> list[str]:
    """Wrap every point this checkout has; returns the ones it lacks."""
    missing = []
    for module_name, class_name, method, before, after in POINTS:
        try:
            owner = getattr(importlib.import_module(module_name), class_name)
            getattr(owner, method)
        except (ImportError, AttributeError):
            missing.append(f"{module_name}.{class_name}.{method}")
            continue
        _wrap(owner, method, before, after)
    _wrap_fdatasync()
    return missing


def _dump() -> None:
    out = os.environ.get("PUBLISH_PHASES_OUT")
    if out:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(EVENTS, f)


def main() -> int:
    missing = install()
    if missing:
        print(f"traced: not in this checkout: {', '.join(missing)}", file=sys.stderr)
    atexit.register(_dump)
    from messaging.cli.main import main as messaging_main
    return messaging_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
