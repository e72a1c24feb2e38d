"""The web console at ``/console``, and the two small routes it needs besides the public API.

The console is a set of static files in the package (:data:`STATIC`, in
``messaging/console/static/``): plain ES modules, no build step, nothing fetched from anywhere
else. They are open to anyone (the page asks for a token and sends it with every API call), so
each is served by a route of its own declared :data:`~messaging.http.auth.OPEN`; no path
parameter, so nothing outside the listed files can be named. Every answer carries a strict
Content-Security-Policy (scripts and styles from this origin only, no inline script, no
framing) and ``X-Content-Type-Options: nosniff``.

- ``GET /console/config.json`` (open): whether the broker takes tokens, so the page asks for
  one before calling anything.
- ``GET /messaging/whoami`` (read): the calling token's name and scopes, so the console shows
  only what they allow (``"auth": false`` when the broker takes no tokens).
- ``GET /messaging/disk`` (read): total, used and free bytes of the file system holding the
  broker's data directory.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from messaging.http.auth import OPEN, principal_of, requires
from messaging.http.responses import json_answer

#: Where the console's files are (package data).
STATIC_DIR = Path(__file__).resolve().parent.parent / "console" / "static"
#: Every file of the console and its content type: the only files served.
STATIC: dict[str, str] = {
    "index.html": "text/html; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "api.js": "text/javascript; charset=utf-8",
    "dom.js": "text/javascript; charset=utf-8",
    "format.js": "text/javascript; charset=utf-8",
    "topics.js": "text/javascript; charset=utf-8",
    "messages.js": "text/javascript; charset=utf-8",
    "tail.js": "text/javascript; charset=utf-8",
    "publish.js": "text/javascript; charset=utf-8",
    "consumers.js": "text/javascript; charset=utf-8",
    "cluster.js": "text/javascript; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
PREFIX = "/console"
#: What the page may load and do: its own files and API only.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


class ConsoleHandlers:
    """The console's files, ``whoami`` and ``disk`` of one node (``data``: its data
    directory)."""

    def __init__(self, data: Path) -> None:
        self.data = data

    def file(self, name: str) -> web.StreamResponse:
        """One of :data:`STATIC` (aiohttp reads it off the event loop)."""
        return web.FileResponse(STATIC_DIR / name,
                                headers={"Content-Type": STATIC[name], **SECURITY_HEADERS})

    def serve(self, name: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """A route handler, open to anyone, that serves ``name``."""

        @requires(OPEN)
        async def serve_file(request: web.Request) -> web.StreamResponse:
            return self.file(name)

        return serve_file

    @requires(OPEN)
    async def redirect(self, request: web.Request) -> web.StreamResponse:
        """``GET /console``: to ``/console/`` (the page's relative links start there)."""
        raise web.HTTPFound(PREFIX + "/", headers=SECURITY_HEADERS)

    @requires(OPEN)
    async def config(self, request: web.Request) -> web.Response:
        """``GET /console/config.json``: whether the page must ask for a token (anyone can
        tell that from a 401; this saves the page a refused request)."""
        return json_answer({"auth": request.app.get(AUTH_ON, False)},
                           headers=SECURITY_HEADERS)

    @requires("read")
    async def whoami(self, request: web.Request) -> web.Response:
        """``GET /messaging/whoami``: the token's name and scopes."""
        principal = principal_of(request)
        auth = request.app.get(AUTH_ON, False)
        return json_answer({"name": principal.name, "auth": auth,
                            "scopes": [str(scope) for scope in principal.scopes]})

    @requires("read")
    async def disk(self, request: web.Request) -> web.Response:
        """``GET /messaging/disk``: the data directory's file system, in bytes."""
        usage = await asyncio.to_thread(shutil.disk_usage, self.data)
        return json_answer({"total": usage.total, "used": usage.used, "free": usage.free})


#: Whether the application authenticates requests (set by :func:`add_console_files`).
AUTH_ON = web.AppKey("console_auth_on", bool)


def add_console_files(app: web.Application, *, auth: bool) -> None:
    """Serve the console's own files on ``app`` (``auth``: the app takes tokens); its two API
    routes, ``whoami`` and ``disk``, are in the table of routes
    (:data:`messaging.http.app.ROUTES`)."""
    console = ConsoleHandlers(Path())
    app[AUTH_ON] = auth
    app.router.add_get(PREFIX, console.redirect)
    app.router.add_get(PREFIX + "/", console.serve("index.html"))
    app.router.add_get(PREFIX + "/config.json", console.config)
    for name in STATIC:
        app.router.add_get(f"{PREFIX}/{name}", console.serve(name))
