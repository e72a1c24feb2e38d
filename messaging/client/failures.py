"""What a failed connection to a broker means: whether the request may have been sent, whether
trying again can mend it, and what went wrong in words a user reads (no library class names).

The client's transport (:mod:`messaging.client.transport`) asks these questions of the
exceptions aiohttp raises; the words end up in :class:`~messaging.errors.ConnectionFailedError`
and :class:`~messaging.errors.PublishOutcomeUnknownError` messages.
"""

from __future__ import annotations

import asyncio
import socket

import aiohttp

from messaging.client.exchange import NotSent, ServerClosed
from messaging.failover import refused

_CONNECT_TIMEOUT: tuple[type[BaseException], ...] = tuple(
    t for t in [getattr(aiohttp, "ConnectionTimeoutError", None)] if t is not None)
#: Failures of a request that never left this machine (safe to send elsewhere) ...
NOT_SENT: tuple[type[BaseException], ...] = (aiohttp.ClientConnectorError, NotSent,
                                             *_CONNECT_TIMEOUT)
#: ... and of one that may have reached a broker.
MAYBE_SENT = (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)


def definitive(err: BaseException) -> bool:
    """Whether a connection failed definitively (see :func:`messaging.failover.refused`): also
    a TLS handshake or certificate that failed, which no retry mends (https to an http port,
    the wrong CA), and a connection closed without an answer (an HTTPS port given an http://
    URL): while no broker ever answered, a few rounds of these end the request."""
    if isinstance(err, aiohttp.ClientSSLError | aiohttp.ClientConnectorCertificateError
                  | aiohttp.ServerDisconnectedError | ServerClosed):
        return True
    return isinstance(err, aiohttp.ClientConnectorError | NotSent) and refused(err.os_error)


def describe(err: BaseException) -> str:
    """What went wrong with a connection, in words (no library class names)."""
    if isinstance(err, aiohttp.ClientConnectorCertificateError):
        return "the TLS certificate was not accepted"
    if isinstance(err, aiohttp.ClientSSLError):
        return "the TLS handshake failed"
    if isinstance(err, aiohttp.ClientConnectorError | NotSent):
        return _describe_os_error(err.os_error)
    if isinstance(err, aiohttp.ServerDisconnectedError | ServerClosed):
        return "the server closed the connection"
    if isinstance(err, aiohttp.ClientPayloadError):
        return "the answer was cut off"
    if isinstance(err, asyncio.TimeoutError):
        return "timed out"
    if isinstance(err, OSError):
        return _describe_os_error(err)
    return "the connection failed"


def _describe_os_error(err: OSError) -> str:
    if isinstance(err, socket.gaierror):
        if err.errno == socket.EAI_NONAME:
            return "unknown host"
        return f"host name lookup failed ({(err.strerror or 'no reason given').lower()})"
    if refused(err):
        return "connection refused"
    if isinstance(err, TimeoutError):
        return "timed out"
    if err.strerror:
        return err.strerror[0].lower() + err.strerror[1:]
    return "the connection failed"


def why(url: str, err: BaseException) -> str:
    """:func:`describe`, with what a connection closed before any answer usually means."""
    if isinstance(err, aiohttp.ServerDisconnectedError | ServerClosed) \
            and url.startswith("http://"):
        return ("the server closed the connection without an answer (an HTTPS port given an "
                "http:// URL does this)")
    return describe(err)


def unreachable(failures: dict[str, BaseException]) -> str:
    """``cannot connect to URL: why``, for every URL that failed."""
    if len(failures) == 1:
        (url, err), = failures.items()
        return f"cannot connect to {url}: {why(url, err)}"
    reasons = "; ".join(f"{url}: {why(url, err)}" for url, err in failures.items())
    return f"cannot connect to any broker ({reasons or 'no URL tried'})"
