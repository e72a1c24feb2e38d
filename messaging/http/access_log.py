"""The access log.

The access log has one line per request: method, path, status, bytes sent, duration and the
name of the token that made it (never the token itself), on the ``messaging.access`` logger:
at INFO with ``--access-log`` (:class:`AccessLogger`), else at DEBUG
(:class:`DebugAccessLogger`, so that ``--log-level debug`` shows every request).
"""

from __future__ import annotations

import logging

from aiohttp.abc import AbstractAccessLogger
from aiohttp.web import BaseRequest, StreamResponse

from messaging.http.auth import PRINCIPAL

ACCESS_LOGGER = "messaging.access"


class AccessLogger(AbstractAccessLogger):
    """aiohttp's access logger, writing one line per request (see the module docstring)."""

    #: The level of its lines.
    level = logging.INFO

    def log(self, request: BaseRequest, response: StreamResponse, duration: float) -> None:
        """Log one finished request."""
        principal = request.get(PRINCIPAL)
        fields = {"method": request.method, "path": request.path,
                  "status": response.status, "bytes": response.body_length,
                  "duration_ms": round(duration * 1000, 3),
                  "token": principal.name if principal is not None else "-",
                  "remote": request.remote or "-"}
        self.logger.log(self.level, "%s %s %d %d %.3fms token=%s remote=%s",
                        fields["method"], fields["path"], fields["status"], fields["bytes"],
                        fields["duration_ms"], fields["token"], fields["remote"],
                        extra={"access": fields})

    @property
    def enabled(self) -> bool:
        """Whether its lines are written (aiohttp asks once per connection)."""
        return self.logger.isEnabledFor(self.level)


class DebugAccessLogger(AccessLogger):
    """The access log without ``--access-log``: the same lines at DEBUG."""

    level = logging.DEBUG
