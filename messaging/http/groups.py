"""The application of a node in a cluster of topic groups (``--groups`` above 1).

It serves the same routes as :func:`messaging.http.app.make_app`. A request on one topic or
stream finds its group (:mod:`messaging.placement`); when this node holds the group and has
caught up, the group's own handlers serve it here; otherwise the request is forwarded to a
holder of the group, whose answer (streams too) is passed back as it comes: a 200 still means
that a holder's state machine applied it. ``X-Messaging-Node`` names the node that served it.
A forwarded request is never forwarded again: a holder that is not ready answers 503.

Routes over every group (``GET /messaging/topics``, ``GET /messaging/consumers``) gather each
group's answer from this node or a holder; node routes (ping, health, diagnostics, retention,
metrics) answer for this node; ``GET /messaging/groups`` lists each group, its holders and its
etcd cluster.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import hdrs, web

from messaging.cluster.node import GroupNode, GroupStack
from messaging.config import BrokerConfig
from messaging.errors import (
    BadRequestError,
    ClusterUnavailableError,
    CommitUnknownError,
    NotFoundError,
    StreamConflictError,
)
from messaging.headers import (
    ERROR_HEADER,
    FORWARDED_HEADER,
    NODE_HEADER,
    STREAM_FORKED_FROM_HEADER,
)
from messaging.http.app import (
    EVERY_GROUP,
    GROUPS,
    NODE,
    ROUTES,
    STREAM_NAME,
    TOPIC_PARAM,
    TOPIC_PATH,
    Handler,
    Handlers,
    Route,
    add_route,
    limits_of,
    make_handlers,
    new_app,
)
from messaging.http.auth import OPEN, Tokens, declared_scope, requires
from messaging.http.console import ConsoleHandlers
from messaging.http.consumers import ConsumerHandlers
from messaging.http.executors import EXECUTORS, Executors
from messaging.http.health import HealthHandlers, healthz
from messaging.http.limits import Limits
from messaging.http.messages import MessageHandlers
from messaging.http.responses import json_answer
from messaging.http.snapshot import SnapshotHandlers
from messaging.http.streams import CORS_HEADERS, StreamHandlers
from messaging.http.streams import PREFIX as STREAMS_PREFIX
from messaging.http.topic_param import topic_reference
from messaging.http.topics import TopicHandlers
from messaging.json_ids import parse_u64
from messaging.placement import group_of_name, group_of_topic

log = logging.getLogger(__name__)

#: Asks a node for one group's part of a route over every group.
GROUP_PARAM = "group"

#: Headers that belong to one connection, not to the request or answer passed on. The
#: client's Host is kept: what a holder writes in Location names the node the client used.
_HOP_BY_HOP = {hdrs.CONNECTION, hdrs.KEEP_ALIVE, hdrs.PROXY_AUTHENTICATE,
               hdrs.PROXY_AUTHORIZATION, hdrs.TE, hdrs.TRAILER, hdrs.TRANSFER_ENCODING,
               hdrs.UPGRADE, hdrs.CONTENT_LENGTH}
_SERVED_BY = web.RequestKey("served_by", str)


class GroupRouter:
    """Serves each request from the group it names: here, or at a holder."""

    def __init__(self, node: GroupNode, config: BrokerConfig, executors: Executors,
                 limits: Limits) -> None:
        self.node = node
        self.config = config
        self.executors = executors
        self.limits = limits
        self._handlers: dict[int, tuple[GroupStack, Handlers]] = {}
        self._session: aiohttp.ClientSession | None = None
        node.on_stopped.append(self._stopped)
        self._group_diagnostics = self.per_topic(_route("diagnostics"))

    async def start(self, _app: web.Application) -> None:
        """Open the session used to forward requests (an ``on_startup`` hook)."""
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=3),
            auto_decompress=False)

    async def stop(self, _app: web.Application) -> None:
        """Stop the groups' handlers and close the session (an ``on_cleanup`` hook)."""
        for group in list(self._handlers):
            await self._handlers.pop(group)[1].streams.stop(_app)
        if self._session is not None:
            await self._session.close()

    async def _stopped(self, group: int) -> None:
        entry = self._handlers.pop(group, None)
        if entry is not None:
            await entry[1].streams.stop(web.Application())

    async def handlers(self, group: int, *, read: bool = True) -> Handlers | None:
        """The handlers of ``group`` when this node serves it (see :meth:`GroupNode.ready`)."""
        stack = self.node.ready(group, read=read)
        if stack is None:
            return None
        entry = self._handlers.get(group)
        if entry is None or entry[0] is not stack:
            handlers = make_handlers(stack, self.config, self.executors, self.limits)
            await handlers.streams.start(web.Application())
            self._handlers[group] = (stack, handlers)
            return handlers
        return entry[1]

    # -- finding the group ------------------------------------------------------------------

    def group_of(self, request: web.Request, finds: str) -> int | None:
        """The group a request names (None: it names none, or not validly)."""
        groups = self.node.groups
        explicit = request.query.get(GROUP_PARAM)
        if explicit is not None:
            if not (explicit.isascii() and explicit.isdigit()) or int(explicit) >= groups:
                raise BadRequestError(f"invalid group {explicit!r}: there are groups 0 to "
                                      f"{groups - 1}")
            return int(explicit)
        if finds == STREAM_NAME:
            return group_of_name(request.match_info["name"], groups)
        text = (request.match_info.get("id") if finds == TOPIC_PATH
                else request.query.get("topicID"))
        if text is None or text == "":
            return None
        if not (text.isascii() and text.isdigit()):  # a stream's name: the group of the name
            return group_of_name(text, groups) if text.isprintable() else None
        return group_of_topic(int(text), groups) if int(text) < 1 << 64 else None

    # -- serving ----------------------------------------------------------------------------

    def per_topic(self, route: Route) -> Handler:
        """A handler that serves ``route`` from the group its request names."""

        async def handler(request: web.Request) -> web.StreamResponse:
            group = self.group_of(request, route.finds)
            if route.finds == STREAM_NAME and group is not None:
                self._check_fork(request, group)
            if group is None and route.finds == TOPIC_PARAM and request.method == "DELETE":
                return await self.delete_everywhere(request, route)
            if group is None:  # no valid topic: any group's handler says what is wrong
                group = next(iter(sorted(self.node.stacks)), 0)
            handlers = await self.handlers(group, read=request.method in ("GET", "HEAD"))
            if handlers is None:
                return await self.forward(request, group)
            request[_SERVED_BY] = self.node.url
            return await route.of(handlers)(request)

        return _declaring(handler, route)

    def every_group(self, route: Route) -> Handler:
        """A handler that gathers every group's JSON list for ``route``."""
        one_group = self.per_topic(route)

        async def handler(request: web.Request) -> web.StreamResponse:
            if GROUP_PARAM in request.query or "topicID" in request.query:
                return await one_group(request)
            # Every group at once: the read barriers of the groups held here in one etcd
            # cluster then share one quorum read. The first failure, in group order, answers.
            answers = await asyncio.gather(
                *(self._answer_of(request, route, group) for group in range(self.node.groups)),
                return_exceptions=True)
            rows: list[Any] = []
            for answer in answers:
                if isinstance(answer, BaseException):
                    raise answer
                rows.extend(json.loads(answer or b"[]"))
            return json_answer(rows)

        return _declaring(handler, route)

    async def _answer_of(self, request: web.Request, route: Route, group: int, *,
                         missing_ok: bool = False) -> bytes | None:
        """One group's JSON answer to ``request`` (a route over every group): from its
        handlers here, or from a holder; with ``missing_ok``, None for a 404."""
        handlers = await self.handlers(group, read=request.method in ("GET", "HEAD"))
        if handlers is None:
            return await self.fetch(request, group, missing_ok=missing_ok)
        try:
            response = await route.of(handlers)(request)
        except NotFoundError:
            if missing_ok:
                return None
            raise
        assert isinstance(response, web.Response) and response.body is not None
        return bytes(response.body)  # type: ignore[arg-type]

    def _check_fork(self, request: web.Request, group: int) -> None:
        """A fork is made in its source's group (it shares the source's data there): a name
        in another group is refused with the group it would need."""
        source = request.headers.get(STREAM_FORKED_FROM_HEADER, "").strip()
        if request.method != "PUT" or not source:
            return
        source = source.removeprefix(STREAMS_PREFIX).lstrip("/")
        wanted = group_of_name(source, self.node.groups)
        if wanted != group:
            raise StreamConflictError(
                f"a fork is kept in its source's group: {source!r} is in group {wanted} and "
                f"{request.match_info['name']!r} in group {group} (of {self.node.groups}); "
                f"choose a name in group {wanted} (GET /messaging/groups?name=NAME tells)")

    async def delete_everywhere(self, request: web.Request, route: Route) -> web.StreamResponse:
        """A delete that names no topic (a consumer in every topic): done in every group."""
        topics: list[Any] = []
        name = request.match_info.get("name", "")
        for group in range(self.node.groups):
            body = await self._answer_of(request, route, group, missing_ok=True)
            if body is not None:
                topics.extend(json.loads(body)["topics"])
        if not topics:
            raise NotFoundError(f"no consumer {name!r}")
        return json_answer({"name": name, "topics": sorted(parse_u64(t) for t in topics)})

    async def forward(self, request: web.Request, group: int) -> web.StreamResponse:
        """Pass ``request`` to a holder of ``group`` and its answer back as it comes (or,
        with ``--group-requests redirect``, send the client there with a 307)."""
        targets = self._targets(request, group)
        if self.config.group_requests == "redirect":
            raise web.HTTPTemporaryRedirect(targets[0].rstrip("/") + request.path_qs)
        body = await request.read()
        assert self._session is not None
        failures = []
        for url in targets:
            try:
                upstream = await self._session.request(
                    request.method, url.rstrip("/") + request.path_qs, data=body,
                    headers=self._forwarded_headers(request), allow_redirects=False)
            except aiohttp.ClientConnectorError as err:  # never sent: the next holder may
                failures.append(f"{url}: {err.os_error.strerror or err}")
                continue
            except (aiohttp.ClientError, TimeoutError) as err:
                # Sent, perhaps applied: sending it again could store it twice.
                raise CommitUnknownError(
                    f"the holder {url} of group {group} failed before answering "
                    f"({type(err).__name__}: {err}); the request may have been applied") from err
            if upstream.status == 503 and url != targets[-1]:
                # Not applied there (catching up, or no etcd quorum): the next holder may.
                failures.append(f"{url}: 503 {upstream.headers.get(ERROR_HEADER, '')}")
                upstream.release()
                continue
            try:
                response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                for name, value in upstream.headers.items():
                    if name not in _HOP_BY_HOP:
                        response.headers.add(name, value)
                if upstream.headers.get(hdrs.CONTENT_LENGTH) is not None:
                    response.content_length = int(upstream.headers[hdrs.CONTENT_LENGTH])
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
            finally:
                upstream.release()
        raise ClusterUnavailableError(
            f"group {group} is held by {', '.join(targets)}, and none answered "
            f"({'; '.join(failures)})")

    async def fetch(self, request: web.Request, group: int, *,
                    missing_ok: bool = False) -> bytes | None:
        """One group's answer to ``request``, from a holder (for a route over every group);
        with ``missing_ok``, None when the holder answers 404."""
        targets = self._targets(request, group)
        assert self._session is not None
        failures = []
        query = {**request.query, GROUP_PARAM: str(group)}
        for url in targets:
            try:
                async with self._session.request(
                        request.method, url.rstrip("/") + request.path, params=query,
                        headers=self._forwarded_headers(request)) as resp:
                    body = await resp.read()
                    if resp.status == 404 and missing_ok:
                        return None
                    if resp.status != 200:
                        failures.append(f"{url}: {resp.status} "
                                        f"{resp.headers.get(ERROR_HEADER, '')}".rstrip())
                        continue
                    return body
            except (aiohttp.ClientError, TimeoutError) as err:  # a read: any holder may
                failures.append(f"{url}: {err or type(err).__name__}")
        raise ClusterUnavailableError(
            f"group {group} is held by {', '.join(targets)}, and none answered "
            f"({'; '.join(failures)})")

    def _targets(self, request: web.Request, group: int) -> list[str]:
        if request.headers.get(FORWARDED_HEADER):
            raise ClusterUnavailableError(
                f"group {group} is not served by {self.node.url} now (it is not caught up, or "
                "no longer holds it); a forwarded request is not forwarded again")
        targets = [u for u in self.node.holders(group) if u != self.node.url]
        if not targets:
            raise ClusterUnavailableError(f"group {group} has no holder that serves it now")
        return targets

    def _forwarded_headers(self, request: web.Request) -> dict[str, str]:
        headers = {name: value for name, value in request.headers.items()
                   if name not in _HOP_BY_HOP}
        headers[FORWARDED_HEADER] = self.node.url
        return headers

    # -- node routes ------------------------------------------------------------------------

    @requires("read")
    async def ping(self, request: web.Request) -> web.Response:
        """GET or POST /messaging/ping: every live node's URL."""
        return json_answer({"urls": self.node.members()})

    @requires("read")
    async def groups(self, request: web.Request) -> web.Response:
        """GET /messaging/groups: each group, its holders and its etcd cluster. A lookup,
        ``name=NAME`` (a stream's name, whether the stream exists or not) or ``topicID=T``
        (a topic id, or a stream's name), answers that alone: ``{"lookup": {"topic": T}``
        (or ``"name"``) ``, "group": G, "holders": [...]}}``, an id below 2^53 as a number."""
        name, topic = request.query.get("name"), request.query.get("topicID")
        if name is None and topic is None:
            return json_answer(self.node.describe())
        looked_up: dict[str, Any]
        if name is not None:
            looked_up = {"name": name}
            group = group_of_name(name, self.node.groups)
        else:
            reference = topic_reference(topic)
            if reference is None:
                raise BadRequestError("missing topicID: a topic id or a stream's name")
            if isinstance(reference, str):
                looked_up = {"name": reference}
                group = group_of_name(reference, self.node.groups)
            else:
                looked_up = {"topic": reference}  # json_answer: a string from 2^53 up
                group = group_of_topic(reference, self.node.groups)
        return json_answer({"lookup": {**looked_up, "group": group,
                                       "holders": self.node.holders(group)}})

    @requires("admin")
    async def diagnostics(self, request: web.Request) -> web.StreamResponse:
        """GET /messaging/diagnostics: this node's groups, and each held group's log; with
        ``topicID`` (or ``group``), that group's own diagnostics, from a holder."""
        if "topicID" in request.query or GROUP_PARAM in request.query:
            return await self._group_diagnostics(request)
        window = request.query.get("window")
        seconds = float(window) if window and window.replace(".", "", 1).isdigit() else 60.0
        return json_answer({
            **self.node.describe(),
            "etcd": self.node.etcd_diagnostics(),
            "held": {str(g): stack.log.diagnostics(seconds)
                     for g, stack in sorted(self.node.stacks.items())}})

    @requires("admin")
    async def retention(self, request: web.Request) -> web.Response:
        """POST /messaging/retention: run retention now in every group held here."""
        return json_answer({"deleted_bytes": await self.node.enforce_retention()})

    @requires("read")
    async def metrics(self, request: web.Request) -> web.Response:
        """GET /metrics?group=G: this node's metrics of a group it holds (a scraper asks each
        node for its own)."""
        group = self.group_of(request, NODE)
        stack = self.node.stacks.get(group) if group is not None else None
        if stack is None:
            raise BadRequestError("with --groups, /metrics takes group=G, a group this node "
                                  f"holds ({', '.join(map(str, sorted(self.node.stacks)))})")
        return web.Response(body=stack.broker.metrics.render(),
                            content_type="text/plain", charset="utf-8")

    @requires(OPEN)
    async def readyz(self, request: web.Request) -> web.Response:
        """Ready when every group this node holds has caught up."""
        reason = self.node.not_ready()
        if reason is not None:
            return json_answer({"ready": False, "problems": [reason]}, status=503)
        return json_answer({"ready": True})

    @requires("admin")
    async def snapshot(self, request: web.Request) -> web.StreamResponse:
        """GET /messaging/snapshot?cluster=NAME~gG: one held group's snapshot for a peer."""
        cluster = request.query.get("cluster", "")
        for stack in self.node.stacks.values():
            if stack.log.cluster == cluster:
                return await SnapshotHandlers(stack.log, self.executors).snapshot(request)
        raise ClusterUnavailableError(f"this node holds no group with log {cluster!r}")

    async def served_by(self, request: web.Request, response: web.StreamResponse) -> None:
        """Name the node that served a request (an ``on_response_prepare`` hook)."""
        served = request.get(_SERVED_BY)
        if served is not None:
            response.headers.setdefault(NODE_HEADER, served)
        if request.path.startswith(STREAMS_PREFIX):
            for name, value in CORS_HEADERS.items():
                response.headers.setdefault(name, value)


def _route(handler: str) -> Route:
    return next(r for r in ROUTES if r.handler == handler)


_HANDLER_CLASSES: dict[str, type] = {"messages": MessageHandlers, "consumers": ConsumerHandlers,
                                     "health": HealthHandlers, "streams": StreamHandlers,
                                     "topics": TopicHandlers}


def _declaring(handler: Handler, route: Route) -> Handler:
    """``handler`` with the scope the route's own handler declares."""
    declared = declared_scope(getattr(_HANDLER_CLASSES[route.bundle], route.handler))
    assert declared is not None, route
    return requires(declared)(handler)


_NodeHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def make_group_app(node: GroupNode, config: BrokerConfig, *,
                   tokens: Tokens | None = None) -> web.Application:
    """The application of a node in a cluster of topic groups."""
    executors = Executors()
    router = GroupRouter(node, config, executors, limits_of(config))
    app = new_app(config, tokens)
    app.on_startup.append(executors.start)
    app.on_startup.append(router.start)
    app.on_cleanup.append(router.stop)
    app.on_cleanup.append(executors.stop)
    app.on_response_prepare.append(router.served_by)
    console = ConsoleHandlers(config.data)
    for route in ROUTES:
        if GROUPS not in route.served:
            continue
        if route.handler == "healthz":
            handler: _NodeHandler = healthz
        elif route.bundle == "console":
            handler = getattr(console, route.handler)
        elif route.finds == NODE:
            handler = getattr(router, route.handler)
        elif route.finds == EVERY_GROUP:
            handler = router.every_group(route)
        else:
            handler = router.per_topic(route)
        add_route(app, route, handler)
    app[EXECUTORS] = executors
    return app
