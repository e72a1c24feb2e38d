"""Logging for operators: every line the broker writes, as text or JSON lines.

Everything goes through :mod:`logging`: the broker's own lines, Python warnings
(:func:`logging.captureWarnings`), exceptions no code caught, on the main thread or another
(``sys.excepthook``, ``threading.excepthook``), and asyncio's (its ``asyncio`` logger); gRPC's
core, which would write raw lines of its own, is silenced (``GRPC_VERBOSITY=NONE`` unless the
environment sets it: every etcd call that fails reaches the log through the broker). Lines
go to standard error, except the one startup line (the ``messaging.ready`` logger, see
:data:`messaging.http.server.READY_LOGGER`): it goes to standard output, alone there, so that
scripts and supervisors can wait for it, and it is written at every ``--log-level``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from types import TracebackType
from typing import Any, TextIO

from messaging.http.server import READY_LOGGER

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: Loggers of libraries whose DEBUG lines say nothing an operator of the broker can use (and
#: flood a ``--log-level debug`` run); they stay at INFO.
QUIET_LIBRARIES = ("asyncio", "aiohttp", "grpc", "urllib3", "hpack")


class JSONFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and the access fields)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        access = getattr(record, "access", None)
        if isinstance(access, dict):
            entry.update(access)
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup_logging(level: str, fmt: str = "text", *, stdout: TextIO | None = None,
                  stderr: TextIO | None = None) -> None:
    """Configure logging for a broker process: ``level`` (any case) and ``text`` or ``json``
    lines on standard error, the startup line on standard output (see the module docstring).

    ``stdout``/``stderr`` replace the process's streams (tests)."""
    formatter = JSONFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(_handler(stderr or sys.stderr, formatter))
    root.setLevel(level.upper())
    ready = logging.getLogger(READY_LOGGER)
    for old in list(ready.handlers):
        ready.removeHandler(old)
    ready.addHandler(_handler(stdout or sys.stdout, formatter))
    ready.setLevel(logging.INFO)  # written whatever --log-level says: tools wait for it
    ready.propagate = False  # once, on standard output only
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(max(logging.INFO, root.level))
    logging.captureWarnings(True)
    # Read when grpc starts, which is later: only cluster mode imports it.
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    sys.excepthook = _log_uncaught
    threading.excepthook = _log_uncaught_in_thread


def _handler(stream: TextIO, formatter: logging.Formatter) -> logging.Handler:
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    return handler


def _log_uncaught(kind: type[BaseException], error: BaseException,
                  traceback: TracebackType | None) -> None:
    """``sys.excepthook``: an exception nothing caught is one logged line, not raw text."""
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, error, traceback)
        return
    logging.getLogger("messaging").critical("uncaught %s: %s", kind.__name__, error,
                                            exc_info=(kind, error, traceback))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    """``threading.excepthook``: the same for a thread's exception."""
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "a thread"
    logging.getLogger("messaging").error(
        "uncaught %s in %s: %s", args.exc_type.__name__, name, args.exc_value,
        exc_info=(args.exc_type, args.exc_value or args.exc_type(), args.exc_traceback))
