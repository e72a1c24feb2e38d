"""The broker's HTTP/1.1 connections: a header timeout, a cap on open connections, and
rejected requests logged as one rate-limited warning line instead of a traceback.

:func:`connection_factory` serves an app runner's server through :class:`BrokerConnection`;
:class:`ConnectionLimits` is the policy they share, :class:`RejectionLog` the rate limit of
their warnings.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from messaging.config import DEFAULT_HEADER_TIMEOUT, DEFAULT_MAX_CONNECTIONS
from messaging.headers import ERROR_HEADER
from messaging.http.access_log import AccessLogger
from messaging.http.responses import error_response, one_line
from messaging.quiet_log import QuietLog

log = logging.getLogger(__name__)

#: Warning lines about rejected requests and connections per second; the rest are counted.
REJECTIONS_LOGGED_PER_SECOND = 10
#: How long a connection refused with 503 may take to read it before it is cut.
_REFUSED_LINGER = 2.0


class RejectionLog:
    """One warning line per rejected request or connection, at most ``per_second`` a second.

    A flood of malformed requests must not flood the log: past the limit, rejections are
    counted (a :class:`~messaging.quiet_log.QuietLog` on the loop's clock) and one summary
    line reports the count when the second is over.
    """

    _KIND = "rejection"

    def __init__(self, logger: logging.Logger = log,
                 per_second: int = REJECTIONS_LOGGED_PER_SECOND) -> None:
        self.logger = logger
        self.per_second = per_second
        self._quiet = QuietLog(logger, 1.0, lines=per_second,
                               clock=lambda: asyncio.get_running_loop().time())
        self._summary: asyncio.TimerHandle | None = None

    @property
    def suppressed(self) -> int:
        """Rejections not logged since the last summary."""
        return self._quiet.held(self._KIND)

    def warning(self, message: str, *args: object) -> None:
        """Log one rejection, or count it if this second's lines are used up."""
        if self._quiet.log(self._KIND, logging.WARNING, message, *args):
            return
        if self._summary is None:
            self._summary = asyncio.get_running_loop().call_at(
                self._quiet.window_end(self._KIND), self.flush)

    def flush(self) -> None:
        """Log how many rejections went unlogged since the last summary."""
        if self._summary is not None:
            self._summary.cancel()
            self._summary = None
        suppressed = self._quiet.take_held(self._KIND)
        if suppressed:
            self.logger.warning("%d more rejected requests or connections not logged (at most "
                                "%d lines a second)", suppressed, self.per_second)


class ConnectionLimits:
    """The connection policy of one broker: header timeout, connection cap, rejection log."""

    def __init__(self, header_timeout: float = DEFAULT_HEADER_TIMEOUT,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 rejections: RejectionLog | None = None) -> None:
        if header_timeout <= 0:
            raise ValueError(f"header timeout must be positive, not {header_timeout}")
        if max_connections < 1:
            raise ValueError(f"max connections must be at least 1, not {max_connections}")
        self.header_timeout = header_timeout
        self.max_connections = max_connections
        self.rejections = rejections or RejectionLog()
        #: Connections being served now (refused ones are not counted).
        self.open = 0
        self._refused: set[asyncio.Transport] = set()

    def close(self) -> None:
        """Cut connections still being refused and log the last summary."""
        for transport in list(self._refused):
            transport.abort()
        self._refused.clear()
        self.rejections.flush()

    def refuse(self, transport: asyncio.Transport) -> None:
        """Answer a connection past the cap with 503 and close it once the client has read it."""
        message = (f"too many connections: this broker serves at most {self.max_connections} "
                   "at once; retry later")
        body = (message + "\n").encode("ascii")
        transport.write(
            b"HTTP/1.1 503 Service Unavailable\r\n"
            b"Content-Type: text/plain; charset=utf-8\r\n"
            b"Content-Length: %d\r\nConnection: close\r\nRetry-After: 1\r\n"
            b"%s: %s\r\n\r\n%s" % (len(body), ERROR_HEADER.encode(), message.encode(), body))
        # Half-close and drain rather than close: closing a socket with the client's
        # request unread sends a reset, which can destroy the 503 before it is read.
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        self._refused.add(transport)
        asyncio.get_running_loop().call_later(_REFUSED_LINGER, self._cut, transport)
        self.rejections.warning("refused a connection from %s: %d connections open (the "
                                "maximum)", _peer(transport), self.open)

    def _cut(self, transport: asyncio.Transport) -> None:
        if transport in self._refused:
            self._refused.discard(transport)
            transport.abort()

    def refused_closed(self, transport: asyncio.Transport | None) -> None:
        """A refused connection has gone."""
        self._refused.discard(transport)


def _peer(transport: asyncio.BaseTransport | None) -> str:
    peer = transport.get_extra_info("peername") if transport is not None else None
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else "?"


class BrokerConnection(RequestHandler):
    """aiohttp's HTTP/1.1 connection with a header timeout, a connection cap, and rejected
    requests logged as one rate-limited warning line instead of a traceback.

    The header timeout is aiohttp's keep-alive timer, which closes a connection that has been
    waiting for a complete request head that long, counted from the connection's start or
    from the end of its previous response; it never fires while a request is being handled,
    so uploads and streaming GETs are not cut. Measuring from the connection's state rather
    than from the first byte of a request also catches a partial request that arrived behind
    a complete one, and closes kept-alive connections left idle that long (as Apache and
    Node.js do by default).
    """

    __slots__ = ("_counted", "_limits", "_refused", "_reported")

    def __init__(self, manager: web.Server, *, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(manager, keepalive_timeout=limits.header_timeout, **kwargs)
        self._limits = limits
        self._refused = False
        self._reported = False
        #: Whether this connection holds a place under the cap (released once, however
        #: often the connection is reported lost).
        self._counted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Serve the connection, or refuse it with 503 when the broker is at its cap."""
        limits = self._limits
        if limits.open >= limits.max_connections:
            self._refused = True
            self.transport = transport  # type: ignore[assignment]
            limits.refuse(transport)  # type: ignore[arg-type]
            return
        limits.open += 1
        self._counted = True
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        """Release the connection's place under the cap."""
        if self._refused:
            self._limits.refused_closed(self.transport)
            self.transport = None
            return
        if self._counted:
            self._counted = False
            self._limits.open -= 1
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Parse as aiohttp does; a refused connection's request is read and dropped."""
        if not self._refused:
            super().data_received(data)

    def report(self, message: str, *args: object) -> None:
        """Log a rejection once per connection (one bad request often trips several checks)."""
        if self._reported:
            log.debug(message, *args)
            return
        self._reported = True
        self._limits.rejections.warning(message, *args)

    def handle_error(self, request: BaseRequest, status: int = 500,
                     exc: BaseException | None = None, message: str | None = None,
                     ) -> web.StreamResponse:
        """A request aiohttp could not parse: one warning line and an API error, no traceback."""
        if status >= 500:  # a bug, not the client's fault: keep aiohttp's traceback
            return super().handle_error(request, status, exc, message)
        if isinstance(exc, HttpProcessingError) and exc.message:
            detail = exc.message
        else:
            detail = message or str(exc or "malformed request")
        detail = one_line(detail)
        self.report("rejected a malformed request from %s: %s", request.remote, detail)
        if request.writer.output_size > 0:
            raise ConnectionError("response already started; cannot send the error")
        response = error_response(status, f"bad request: {detail}")
        response.force_close()
        return response

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """Errors the client caused are reported once, without a traceback; others as usual."""
        exc = kw.get("exc_info")
        if isinstance(exc, web.RequestPayloadError | HttpProcessingError | ConnectionError):
            self.report("rejected a request body from %s: %s", _peer(self.transport),
                        one_line(str(exc)))
            return
        super().log_exception(*args, **kw)


def report_rejection(request: web.Request, message: str, *args: object) -> None:
    """Log a rejected request: once per connection and rate-limited when it came through a
    :class:`BrokerConnection`, as a plain warning otherwise."""
    protocol = request.protocol
    if isinstance(protocol, BrokerConnection):
        protocol.report(message, *args)
    else:
        log.warning(message, *args)


def connection_factory(server: web.Server, limits: ConnectionLimits,
                       access_log: logging.Logger | None = None,
                       access_log_class: type[AccessLogger] = AccessLogger,
                       ) -> Callable[[], BrokerConnection]:
    """A protocol factory for ``loop.create_server`` serving ``server`` (an app runner's);
    ``access_log``: log every request there (:mod:`messaging.http.access_log`)."""
    loop = asyncio.get_running_loop()

    def connection() -> BrokerConnection:
        return BrokerConnection(server, limits=limits, loop=loop, access_log=access_log,
                                access_log_class=access_log_class)

    return connection
