"""How loud a cluster node's failures are while it starts.

A node started with its etcd cluster (the README's three members and three nodes, started
together) sees, for a second or two, what would be faults later: members refusing
connections, no leader elected yet, a watch that cannot start, no quorum. Until the node is
first ready (its watch live and etcd's quorum seen) and for at most STARTUP_GRACE seconds,
those lines are INFO; a node still not ready after that says so once at WARNING, with why,
and from then on every failure has its own level again. A refusal of the node's
credentials is an ERROR at once (:mod:`messaging.log.etcd.client`): waiting will not cure it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from messaging.quiet_log import QuietLog

#: How long a start may take before its failures are faults (etcd elects a leader in 1-3 s).
STARTUP_GRACE = 10.0


class Startup:
    """The start of one node's command log: :meth:`ready` ends it, or STARTUP_GRACE does."""

    def __init__(self, logger: logging.Logger, name: str = "", grace: float = STARTUP_GRACE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``name``: what starts (the log key), at the head of its lines."""
        self.logger = logger
        self.name = name
        self.grace = grace
        self._clock = clock
        self._started = clock()
        self._ready = False
        self._overdue_told = False

    @property
    def starting(self) -> bool:
        """Whether the node is still starting: not ready yet, within the grace period."""
        return not self._ready and self._clock() - self._started < self.grace

    def level(self, level: int = logging.WARNING) -> int:
        """``level``, or INFO while starting."""
        return min(level, logging.INFO) if self.starting else level

    def log(self, quiet: QuietLog, kind: str, level: int, message: str, *args: Any) -> bool:
        """``quiet.log`` at :meth:`level`; lines while starting are a kind of their own, so
        they never hold back the first real fault of ``kind``."""
        if self.starting:
            return quiet.log(f"{kind} (starting)", self.level(level), message, *args)
        return quiet.log(kind, level, message, *args)

    def check(self, not_ready: str | None) -> None:
        """Note the node's readiness now (``not_ready``: why it is not, None when it is):
        the first ready ends the start; past the grace period, still not ready is told once
        at WARNING."""
        if self._ready:
            return
        took = self._clock() - self._started
        if not_ready is None:
            self._ready = True
            self.logger.info("%s: ready %.1fs after start", self.name, took)
        elif took >= self.grace and not self._overdue_told:
            self._overdue_told = True
            self.logger.warning("%s: not ready %.0fs after start: %s", self.name, took,
                                not_ready)
