"""The aiohttp application of a broker node: its middlewares and, in :func:`make_app`, every
route it serves, registered in one place.

The other modules of :mod:`messaging.http` provide handlers only: the native API
(:mod:`~messaging.http.messages`), consumer positions (:mod:`~messaging.http.consumers`),
health (:mod:`~messaging.http.health`), Durable Streams (:mod:`~messaging.http.streams`) and,
in a cluster, snapshots for peers (:mod:`~messaging.http.snapshot`). Handlers raise
:class:`~messaging.errors.MessagingError`; only this module turns exceptions into answers:
status, ``X-Broker-Error`` and a text body (:func:`~messaging.http.responses.error_response`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import hdrs, web
from aiohttp.http_exceptions import ContentEncodingError

from messaging.broker.view import SNAPSHOT_PATH, BrokerView
from messaging.config import BrokerConfig
from messaging.errors import ForbiddenError, MessagingError, UndeclaredScopeError
from messaging.http.auth import OPEN, PRINCIPAL, Tokens, declared_scope
from messaging.http.connections import report_rejection
from messaging.http.console import ConsoleHandlers, add_console_files
from messaging.http.consumers import ConsumerHandlers
from messaging.http.executors import EXECUTORS, Executors
from messaging.http.health import HealthHandlers
from messaging.http.limits import Limits
from messaging.http.messages import MessageHandlers
from messaging.http.responses import error_response, one_line
from messaging.http.snapshot import SnapshotHandlers, SnapshotSource
from messaging.http.streams import PREFIX as STREAMS_PREFIX
from messaging.http.streams import StreamHandlers
from messaging.http.topics import TopicHandlers
from messaging.stack.assemble import Stack

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Handlers:
    """The route handlers of one broker and its log (``console``: of the node, the same for
    every stack; ``snapshots``: a cluster node's, for peers)."""

    messages: MessageHandlers
    consumers: ConsumerHandlers
    health: HealthHandlers
    streams: StreamHandlers
    topics: TopicHandlers
    console: ConsoleHandlers | None = None
    snapshots: SnapshotHandlers | None = None


def make_handlers(stack: Stack[Any], config: BrokerConfig, executors: Executors,
                  limits: Limits, *, snapshots: SnapshotSource | None = None) -> Handlers:
    """The handlers of one broker stack (a node of a cluster of topic groups has one set
    per group it holds): reads through the broker's view, writes through its log."""
    broker: BrokerView = stack.broker
    log_ = stack.log
    messages = MessageHandlers(broker, log_, executors, config.max_message_size,
                               config.max_request_size, limits,
                               retention=stack.retention.run_now,
                               object_status=stack.object_status)
    return Handlers(
        messages=messages,
        consumers=ConsumerHandlers(broker, log_, executors),
        health=HealthHandlers(broker, log_),
        streams=StreamHandlers(broker, log_, executors, config.max_message_size,
                               long_poll_timeout=config.long_poll_timeout,
                               max_request_size=config.max_request_size, limits=limits),
        topics=TopicHandlers(broker, log_, config.max_message_size, messages.topic),
        console=ConsoleHandlers(config.data),
        snapshots=SnapshotHandlers(snapshots, executors) if snapshots is not None else None)


#: How a request names the group of its topic (in a cluster of topic groups).
TOPIC_PARAM, TOPIC_PATH, STREAM_NAME, EVERY_GROUP, NODE = (
    "topic param", "topic path", "stream name", "every group", "node")


#: Which applications serve a route: a single node's (:func:`make_app`), a node's of a
#: cluster of topic groups (:func:`messaging.http.groups.make_group_app`).
SINGLE, GROUPS = "single", "groups"


@dataclass(frozen=True)
class Route:
    """One route: method, path, the handler (``bundle.method`` of :class:`Handlers`; a
    cluster of groups serves a node route with its router's method of the same name), where
    a request finds its topic (one of the constants above), and which applications serve
    it."""

    method: str
    path: str
    bundle: str
    handler: str
    finds: str
    served: tuple[str, ...] = (SINGLE, GROUPS)

    def served_by(self, handlers: Handlers) -> bool:
        """Whether ``handlers`` have this route's bundle (a single node has no snapshot for
        peers)."""
        return getattr(handlers, self.bundle, None) is not None

    def of(self, handlers: Handlers) -> Handler:
        """This route's handler in ``handlers``."""
        handler: Handler = getattr(getattr(handlers, self.bundle), self.handler)
        return handler


#: Every route a node serves, besides the console's own files
#: (:func:`messaging.http.console.add_console_files`).
ROUTES = (
    # The native API (InfluxDB's paths).
    Route("POST", "/messaging/messages", "messages", "publish", TOPIC_PARAM),
    Route("GET", "/messaging/messages", "messages", "read", TOPIC_PARAM),
    Route("POST", "/messaging/heartbeat", "messages", "heartbeat", TOPIC_PARAM),
    Route("GET", "/messaging/ping", "messages", "ping", NODE),
    Route("POST", "/messaging/ping", "messages", "ping", NODE),
    Route("GET", "/messaging/topics", "messages", "topics", EVERY_GROUP),
    Route("GET", "/messaging/times", "messages", "times", TOPIC_PARAM),
    # One topic: described, created or configured, deleted (messaging.http.topics).
    Route("GET", "/messaging/topics/{id}", "topics", "describe", TOPIC_PATH),
    Route("PUT", "/messaging/topics/{id}", "topics", "configure", TOPIC_PATH),
    Route("DELETE", "/messaging/topics/{id}", "topics", "delete", TOPIC_PATH),
    Route("GET", "/messaging/diagnostics", "messages", "diagnostics", NODE),
    Route("POST", "/messaging/retention", "messages", "retention", NODE),
    Route("GET", "/metrics", "messages", "metrics", NODE),
    # Stored consumer positions.
    Route("GET", "/messaging/consumers", "consumers", "list", EVERY_GROUP),
    Route("PUT", "/messaging/consumers/{name}", "consumers", "reset", TOPIC_PARAM),
    Route("DELETE", "/messaging/consumers/{name}", "consumers", "delete", TOPIC_PARAM),
    # Health, open to anyone.
    Route("GET", "/healthz", "health", "healthz", NODE),
    Route("GET", "/readyz", "health", "readyz", NODE),
    # Durable Streams: one handler for every method, which declares a scope per method.
    Route("*", STREAMS_PREFIX + "{name:.+}", "streams", "handle", STREAM_NAME),
    # What the web console asks of the node besides the API.
    Route("GET", "/messaging/whoami", "console", "whoami", NODE),
    Route("GET", "/messaging/disk", "console", "disk", NODE),
    # A cluster: the snapshot peers catch up from; the map of topic groups.
    Route("GET", SNAPSHOT_PATH, "snapshots", "snapshot", NODE),
    Route("GET", "/messaging/groups", "node", "groups", NODE, served=(GROUPS,)),
)


def add_route(app: web.Application, route: Route, handler: Handler) -> None:
    """Serve ``route`` with ``handler`` (a GET route answers HEAD too)."""
    if route.method == "GET":
        app.router.add_get(route.path, handler)
    else:
        app.router.add_route(route.method, route.path, handler)


def limits_of(config: BrokerConfig) -> Limits:
    """The request limits ``config`` sets (shared by every group of a node)."""
    return Limits(max_streams=config.max_streams, max_subscribers=config.max_subscribers,
                  min_upload_rate=config.min_upload_rate,
                  max_append_rate=config.max_append_rate)


def new_app(config: BrokerConfig, tokens: Tokens | None) -> web.Application:
    """An application with the error (and, with ``tokens``, authentication) middlewares, and
    the web console (:mod:`messaging.http.console`), which every node serves alike."""
    # Without tokens every request is allowed: no authentication step at all.
    middlewares = [errors_middleware] + ([auth_middleware(tokens)] if tokens is not None else [])
    app = web.Application(middlewares=middlewares, client_max_size=max(
        config.max_request_size, config.max_message_size + 1024))
    add_console_files(app, auth=tokens is not None)
    return app


def make_app(stack: Stack[Any], config: BrokerConfig | None = None, *,
             tokens: Tokens | None = None,
             snapshots: SnapshotSource | None = None) -> web.Application:
    """The application of one broker stack: every route a node serves.

    ``config`` gives the limits (the defaults without it); ``tokens``: authenticate every
    request; ``snapshots``: serve the snapshot cluster peers catch up from.
    """
    config = config or BrokerConfig()
    executors = Executors()
    handlers = make_handlers(stack, config, executors, limits_of(config), snapshots=snapshots)
    app = new_app(config, tokens)
    app.on_startup.append(executors.start)
    app.on_startup.append(handlers.streams.start)
    app.on_cleanup.append(handlers.streams.stop)
    app.on_cleanup.append(executors.stop)
    app.on_response_prepare.append(handlers.streams.add_cors)
    for route in ROUTES:
        if SINGLE in route.served and route.served_by(handlers):
            add_route(app, route, route.of(handlers))
    app[EXECUTORS] = executors
    return app


# -- middlewares ----------------------------------------------------------------------------


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn exceptions into API errors (status, ``X-Broker-Error``, the message as text)."""
    try:
        return await handler(request)
    except MessagingError as err:
        return error_response(err.status, str(err), err.headers())
    except web.HTTPException as err:
        if err.status < 400:
            raise
        reason = err.text if err.text and err.status != 404 else err.reason
        if err.status == 404:
            reason = f"not found: {request.method} {request.path}"
        elif err.status == 405:
            reason = f"method {request.method} not allowed on {request.path}"
        elif err.status == 413:
            reason = "request body too large"
        return error_response(err.status, reason or "error")
    except web.RequestPayloadError as err:
        message = _payload_error(request, err)
        report_rejection(request, "rejected request from %s: %s", request.remote, message)
        response = error_response(400, message)
        response.force_close()  # the rest of the body cannot be parsed either
        return response
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except Exception as err:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(500, f"internal error: {type(err).__name__}: {err}")


def _payload_error(request: web.Request, err: web.RequestPayloadError) -> str:
    """What was wrong with a request body that aiohttp could not decode."""
    encoding = request.headers.get(hdrs.CONTENT_ENCODING, "").strip()
    if isinstance(err.__cause__, ContentEncodingError) and encoding:
        return (f"invalid request body: Content-Encoding is {encoding!r} but the body is "
                f"not valid {encoding} data")
    return f"invalid request body: {one_line(str(err.__cause__ or err))}"


def auth_middleware(tokens: Tokens) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Authenticate every request with a bearer token and check the scope kind its route
    declares (:func:`messaging.http.auth.requires`), before the handler parses anything.

    401 without a valid token, 403 when the token holds no scope of the route's kind; routes
    declared :data:`messaging.http.auth.OPEN` (health, CORS preflights) are served without looking
    at any token. A route that declares nothing is refused (500), never served. Unknown paths
    and wrong methods are answered 404 and 405 only to an authenticated caller: everyone
    else gets 401 first, and learns nothing of the routes.
    """

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        kind = _required_kind(request)
        if kind == OPEN:
            return await handler(request)
        principal = tokens.principal(request.headers.get(hdrs.AUTHORIZATION))
        request[PRINCIPAL] = principal
        if kind is None:  # no route serves this method on this path
            match = request.match_info
            if match.http_exception is not None:
                return await handler(request)  # aiohttp's own 404 or 405
            raise web.HTTPMethodNotAllowed(request.method, sorted(_declared(match.route)))
        if not principal.holds(kind):
            raise ForbiddenError(f"token {principal.name!r} has no {kind} scope "
                                 f"({request.method} {request.path} needs {kind})")
        return await handler(request)

    return middleware


def _declared(route: web.AbstractRoute) -> str | Mapping[str, str]:
    """What a route declared (:class:`UndeclaredScopeError` if nothing: fail closed)."""
    declared = declared_scope(route.handler)
    if declared is None:
        where = route.resource.canonical if route.resource is not None else "?"
        raise UndeclaredScopeError(f"refused: the route {route.method} {where} declares no "
                                   "scope (see messaging.http.auth.requires)")
    return declared


def _required_kind(request: web.Request) -> str | None:
    """The scope kind (or OPEN) the request's route declares for its method; None when no
    route serves the method (an unknown path, a wrong method)."""
    match = request.match_info
    if match.http_exception is not None:
        return None
    declared = _declared(match.route)
    if isinstance(declared, str):
        return declared
    return declared.get(request.method)
