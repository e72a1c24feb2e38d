"""Logging for operators: text or JSON lines, and the access log.

The access log (``--access-log``) has one line per request: method, path, status, bytes
sent, duration and the name of the token that made it (never the token itself), on the
``messaging.access`` logger.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from aiohttp.abc import AbstractAccessLogger
from aiohttp.web import BaseRequest, StreamResponse

from messaging.auth import PRINCIPAL

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
ACCESS_LOGGER = "messaging.access"


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


def setup_logging(level: str, fmt: str = "text") -> None:
    """Configure the root logger: ``level`` (any case), ``text`` or ``json`` lines."""
    handler = logging.StreamHandler()
    handler.setFormatter(JSONFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


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
