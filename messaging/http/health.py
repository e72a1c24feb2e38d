"""``/healthz`` (the process answers) and ``/readyz`` (recovered, writable, in quorum).

Both are open to anyone, tokens or not: load balancers and orchestrators call them.
"""

from __future__ import annotations

from aiohttp import web

from messaging import __version__
from messaging.broker.view import BrokerView
from messaging.clock import now_ms
from messaging.http.auth import OPEN, requires
from messaging.http.responses import json_answer
from messaging.log.base import Log


class HealthHandlers:
    """``GET /healthz`` and ``GET /readyz`` of one broker and its log."""

    def __init__(self, broker: BrokerView, log: Log) -> None:
        self.broker = broker
        self.log = log

    @requires(OPEN)
    async def healthz(self, request: web.Request) -> web.Response:
        """The process answers (and its version)."""
        return await healthz(request)

    @requires(OPEN)
    async def readyz(self, request: web.Request) -> web.Response:
        """Ready (200) or not (503, with the problems): the log takes writes and no topic has
        stopped after a failed fsync."""
        problems = []
        reason = self.log.not_ready()
        if reason is not None:
            problems.append(reason)
        stopped = [t.id for t in self.broker.topics() if t.failure is not None]
        if stopped:
            problems.append(f"topics stopped after a failed fsync: "
                            f"{', '.join(map(str, stopped[:10]))}")
        if problems:
            return json_answer({"ready": False, "problems": problems}, status=503)
        return json_answer({"ready": True})


@requires(OPEN)
async def healthz(request: web.Request) -> web.Response:
    """``GET /healthz``: the process answers, its version, and its wall clock (``time_ms``:
    the peers of a cluster node measure their clocks' offset from it)."""
    return json_answer({"status": "ok", "version": __version__, "time_ms": now_ms()})
