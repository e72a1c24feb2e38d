"""A log that stays readable under a flood: each kind of recurring line at most once per
interval, the ones held back counted and reported with the next line of that kind.

A full disk fails every group, a lost etcd quorum every put, a watch every retry: without
this, one fault writes thousands of identical lines a second and buries the first one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

#: How often a recurring failure (etcd unreachable, a watch retrying) is logged.
RECURRING_LOG_INTERVAL = 10.0


class QuietLog:
    """Lines of one ``logger``, each ``kind`` at most ``lines`` times per ``interval`` seconds
    (a window opens with the first line of a kind and lasts ``interval``).

    Thread-safe: the broker's writer thread and the event loop may share one.
    """

    def __init__(self, logger: logging.Logger, interval: float, lines: int = 1,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.interval = interval
        self.lines = lines
        self._clock = clock
        self._lock = threading.Lock()
        self._windows: dict[str, tuple[float, int]] = {}  # kind -> (opened, lines logged)
        self._held: dict[str, int] = {}

    def log(self, kind: str, level: int, message: str, *args: Any,
            exc_info: bool = False) -> bool:
        """Log ``message % args`` unless this window's lines of ``kind`` are used up (then
        it is only counted); returns whether it was logged."""
        now = self._clock()
        with self._lock:
            opened, logged = self._windows.get(kind, (float("-inf"), 0))
            if now - opened >= self.interval:
                opened, logged = now, 0
            if logged >= self.lines:
                self._held[kind] = self._held.get(kind, 0) + 1
                return False
            self._windows[kind] = (opened, logged + 1)
            held = self._held.pop(kind, 0)
        if held:
            message += " (%d more like it not logged)"
            args = (*args, held)
        self.logger.log(level, message, *args, exc_info=exc_info)
        return True

    def held(self, kind: str) -> int:
        """How many lines of ``kind`` were held back since the last one logged."""
        with self._lock:
            return self._held.get(kind, 0)

    def take_held(self, kind: str) -> int:
        """The count :meth:`held` says, reset to 0 (for a summary line of one's own)."""
        with self._lock:
            return self._held.pop(kind, 0)

    def window_end(self, kind: str) -> float:
        """When the current window of ``kind`` ends (on this log's clock)."""
        with self._lock:
            return self._windows.get(kind, (float("-inf"), 0))[0] + self.interval
