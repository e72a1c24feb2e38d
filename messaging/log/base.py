"""The Log protocol: what the HTTP layer and the server need from a log.

A log orders commands and hands them to the broker's state machine. LocalLog
(:mod:`messaging.log.local`) is the embedded single-node log; a replicated log implements the
same protocol.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, Protocol

from messaging.broker.commands import ApplyResult


class Log(Protocol):
    """What the HTTP layer and the server need from a log: ordered writes and the nodes."""

    async def start(self) -> None:
        """Start background work (the writer; in a cluster, the watch of the command log)."""
        ...

    async def close(self) -> None:
        """Finish queued commands, make them durable, stop."""
        ...

    async def apply(self, command: bytes) -> ApplyResult:
        """Order and apply a command (a publish, a stream operation, a heartbeat: see
        :mod:`messaging.broker.commands`); raises a MessagingError when it cannot."""
        ...

    def urls(self) -> list[str]:
        """Every node's advertised URL."""
        ...

    def diagnostics(self, window: float = 60.0) -> dict[str, Any]:
        """Role, leader, peers and positions; figures of recent publishes cover the last
        ``window`` seconds."""
        ...

    def not_ready(self) -> str | None:
        """Why this node cannot take writes right now (None: it can)."""
        ...

    async def read_barrier(self) -> None:
        """Return once this node has applied every command acknowledged anywhere before the
        call (a read that follows then sees them); raise a MessagingError when it cannot."""
        ...


def answer_callers(futures: Iterable[asyncio.Future[ApplyResult]],
           results: Iterable[ApplyResult | BaseException]) -> None:
    """Hand each caller still waiting its command's result, or its error (on the loop)."""
    for future, result in zip(futures, results, strict=True):
        if future.done():
            continue
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)
