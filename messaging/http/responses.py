"""The shapes of the API's answers: JSON (ids and indexes exact for every reader, one line
ending with a newline) and errors (status, ``X-Broker-Error`` and the same message as text).

Errors are built here for the error middleware (:mod:`messaging.http.app`, which alone turns
exceptions into answers) and for the connections that answer requests aiohttp could not parse
(:mod:`messaging.http.connections`).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from messaging import json_ids
from messaging.headers import ERROR_HEADER


def json_answer(value: Any, *, status: int = 200, headers: dict[str, str] | None = None,
                ) -> web.Response:
    """A JSON answer; every integer of 2^53 or more in it (a named stream's topic id, an
    index) is a string, so JavaScript and ``jq`` read it exactly (:mod:`messaging.json_ids`).
    It ends with a newline, as a text error does: ``curl`` leaves the prompt on a line of
    its own, and line-based tools see a complete line."""
    return web.json_response(value, status=status, headers=headers, dumps=_json_line)


def _json_line(value: Any) -> str:
    return json_ids.dumps(value) + "\n"


def error_response(status: int, message: str, headers: dict[str, str] | None = None,
                   ) -> web.Response:
    """The error shape of the API: status, ``X-Broker-Error`` and the message as text.

    The message is made printable ASCII here, once for every error: it often quotes what a
    client sent (a path with ``%00``, a parameter), and a control character in a header
    would make aiohttp refuse to send the response at all.
    """
    message = _printable(message)
    return web.Response(status=status, text=message + "\n",
                        headers={ERROR_HEADER: message, **(headers or {})})


def one_line(text: str, limit: int = 200) -> str:
    """A client-supplied error text as one short line (aiohttp's span several)."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _printable(text: str) -> str:
    """``text`` safe for a header line: printable ASCII, everything else escaped."""
    if text.isascii() and text.isprintable():
        return text
    return "".join(ch if " " <= ch <= "~" else _escape(ch) for ch in text)


def _escape(ch: str) -> str:
    if ch in "\r\n\t":
        return " "
    return ch.encode("unicode_escape").decode("ascii")
