"""``/healthz`` (the process answers) and ``/readyz`` (recovered, writable, in quorum).

Both are open to anyone, tokens or not: load balancers and orchestrators call them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from aiohttp import web

from messaging import __version__
from messaging.http.auth import OPEN, requires
from messaging.log.base import Log


class TopicHealth(Protocol):
    """What readiness reads of a topic."""

    @property
    def id(self) -> int: ...
    @property
    def failure(self) -> Exception | None: ...


class BrokerHealth(Protocol):
    """What readiness reads of the broker."""

    def topics(self) -> Sequence[TopicHealth]: ...


def add_health_routes(app: web.Application, broker: BrokerHealth, log: Log) -> None:
    """Serve ``GET /healthz`` and ``GET /readyz``."""

    @requires(OPEN)
    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "version": __version__})

    @requires(OPEN)
    async def readyz(request: web.Request) -> web.Response:
        problems = []
        reason = log.not_ready()
        if reason is not None:
            problems.append(reason)
        stopped = [t.id for t in broker.topics() if t.failure is not None]
        if stopped:
            problems.append(f"topics stopped after a failed fsync: "
                            f"{', '.join(map(str, stopped[:10]))}")
        if problems:
            return web.json_response({"ready": False, "problems": problems}, status=503)
        return web.json_response({"ready": True})

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
