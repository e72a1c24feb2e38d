"""The access log.

The access log (``--access-log``) has one line per request: method, path, status, bytes
sent, duration and the name of the token that made it (never the token itself), on the
``messaging.access`` logger.
"""

from __future__ import annotations

import logging

from aiohttp.abc import AbstractAccessLogger
from aiohttp.web import BaseRequest, StreamResponse

from messaging.http.auth import PRINCIPAL

ACCESS_LOGGER = "messaging.access"


class AccessLogger(AbstractAccessLogger):
    """aiohttp's access logger, writing one line per request (see the module docstring)."""

    def log(self, request: BaseRequest, response: StreamResponse, duration: float) -> None:
        """Log one finished request."""
        principal = request.get(PRINCIPAL)
        fields = {"method": request.method, "path": request.path,
                  "status": response.status, "bytes": response.body_length,
                  "duration_ms": round(duration * 1000, 3),
                  "token": principal.name if principal is not None else "-",
                  "remote": request.remote or "-"}
        self.logger.info("%s %s %d %d %.3fms token=%s remote=%s", fields["method"],
                         fields["path"], fields["status"], fields["bytes"],
                         fields["duration_ms"], fields["token"], fields["remote"],
                         extra={"access": fields})

    @property
    def enabled(self) -> bool:
        """Whether the access logger is on."""
        return self.logger.isEnabledFor(logging.INFO)
