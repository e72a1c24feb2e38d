"""The aiohttp application: every endpoint of the HTTP API over a narrow broker protocol.

Handlers depend on :class:`BrokerView` (reads) and :class:`messaging.log.base.Log` (writes); only
this module turns exceptions into responses: status, ``X-Broker-Error`` and a text body.
"""

from __future__ import annotations

import asyncio
import logging
import time
from array import array
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any, Protocol

from aiohttp import HttpVersion11, hdrs, web
from aiohttp.http_exceptions import ContentEncodingError, HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from messaging import __version__ as VERSION
from messaging.broker.catalog import parse_producer, stream_command
from messaging.broker.metrics import BrokerMetrics
from messaging.config import (
    DEFAULT_HEADER_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_MAX_REQUEST_SIZE,
)
from messaging.errors import (
    BadRequestError,
    MessageTooLargeError,
    MessagingError,
    NotFoundError,
)
from messaging.frames import (
    FRAMES_CONTENT_TYPE,
    INTERNAL_TYPE,
    Command,
    encode,
    validate_publish,
)
from messaging.http.access_log import AccessLogger
from messaging.http.auth import (
    OPEN,
    PRINCIPAL,
    ForbiddenError,
    Principal,
    Tokens,
    UndeclaredScopeError,
    declared_scope,
    principal_of,
    requires,
)
from messaging.http.consumers import (
    CONSUMER_INDEX_HEADER,
    ConsumerHandlers,
    PositionsView,
    add_routes,
    check_name,
    start_index,
)
from messaging.http.fanout import FanOuts
from messaging.http.limits import Limits
from messaging.log.base import Log
from messaging.topic.segment import Segment
from messaging.topic.tail import Tail, TailChunk

log = logging.getLogger(__name__)

ERROR_HEADER = "X-Broker-Error"
INDEX_HEADER = "X-Broker-Index"
#: Set on the answer to an idempotent publish that was already stored (a retry).
DUPLICATE_HEADER = "X-Broker-Duplicate"
_FIRST_FRAME = array("q", [0])  # the offsets of a single-frame command
#: Publish bodies up to this size are validated on the event loop (about 0.4 ms for 256 KiB of
#: 100 B frames); bigger ones on a thread.
VALIDATE_ON_LOOP = 256 << 10
#: Bytes a stream reads from disk per write: it starts at the minimum and doubles up to the
#: maximum while the socket keeps up (see Handlers._send).
STREAM_CHUNK_MIN = 16 << 10
STREAM_CHUNK = 64 << 10
_MAX_U64_DIGITS = len(str(2**64 - 1))
#: Warning lines about rejected requests and connections per second; the rest are counted.
REJECTIONS_LOGGED_PER_SECOND = 10
#: How long a connection refused with 503 may take to read it before it is cut.
_REFUSED_LINGER = 2.0


class ReaderView(Protocol):
    """What the handlers need of a topic reader."""

    @property
    def topic(self) -> TopicView: ...
    @property
    def done(self) -> bool: ...
    @property
    def last_index(self) -> int: ...
    @property
    def delivered(self) -> int: ...
    @property
    def end(self) -> int | None: ...
    @property
    def remaining(self) -> int | None: ...
    def read(self, max_bytes: int) -> bytes: ...
    def read_tail(self) -> bytes | memoryview | None: ...
    def tail_position(self) -> tuple[Segment, int] | None: ...
    def adopt_tail(self, chunk: TailChunk) -> int: ...


class TopicView(Protocol):
    """What the handlers (and the fan-out they park streams in) need of a topic."""

    @property
    def id(self) -> int: ...
    @property
    def first_index(self) -> int: ...
    @property
    def committed_index(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def segment_count(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    @property
    def tail(self) -> Tail: ...
    def reader(self, index: int, end: int | None = None,
               limit: int | None = None) -> ReaderView: ...
    def index_after(self, after: int, count: int) -> int | None: ...
    async def wait_for(self, after_index: int) -> None: ...
    def listen(self, callback: Callable[[], None]) -> None: ...
    def unlisten(self, callback: Callable[[], None]) -> None: ...


class BrokerView(Protocol):
    """The broker methods the handlers call."""

    metrics: BrokerMetrics
    index: int

    def topic(self, topic_id: int) -> TopicView | None: ...
    def topics(self) -> Sequence[TopicView]: ...
    def topic_info(self, topic: TopicView) -> dict[str, Any]: ...
    def stream_name(self, topic_id: int) -> str | None: ...
    async def wait_for_topic(self, topic_id: int) -> TopicView | None: ...
    def diagnostics(self) -> dict[str, Any]: ...
    def enforce_retention(self, now: float | None = None) -> int: ...
    # Stored consumer positions (messaging.http.consumers).
    def subscribers(self, topic_id: int) -> dict[str, int]: ...
    @property
    def positions(self) -> PositionsView: ...
    @property
    def subscriber_timeout(self) -> float: ...


class Handlers:
    """The request handlers, bound to one broker and one log."""

    def __init__(self, broker: BrokerView, log: Log, max_message_size: int,
                 max_request_size: int = DEFAULT_MAX_REQUEST_SIZE,
                 limits: Limits | None = None) -> None:
        self.broker = broker
        self.log = log
        self.max_message_size = max_message_size
        self.max_request_size = max_request_size
        self.limits = limits or Limits()
        self.fanouts = FanOuts(broker.metrics)

    # -- writes -----------------------------------------------------------------------------

    @requires("write")
    async def publish(self, request: web.Request) -> web.Response:
        """POST /messaging/messages: one message's data, or a body of frames."""
        principal = principal_of(request)
        frames = request.content_type == FRAMES_CONTENT_TYPE
        if frames:
            topic_id = _optional_int(request, "topicID")
            if topic_id is None and not principal.can("write"):
                raise BadRequestError("give topicID: this token may write to some topics only")
            if topic_id is not None:
                principal.require("write", str(topic_id), f"topic {topic_id}")
                self.limits.admit_append(f"topic {topic_id}")
            body = await self.limits.read_body(request, self.max_request_size)
            check = partial(validate_publish, body, topic=topic_id,
                            max_length=self.max_message_size)
            # A big batch would stall every other request: check it on a thread.
            command = (check() if len(body) <= VALIDATE_ON_LOOP
                       else await asyncio.get_running_loop().run_in_executor(None, check))
        else:
            topic = _required_int(request, "topicID")
            principal.require("write", str(topic), f"topic {topic}")
            self.limits.admit_append(f"topic {topic}")
            type_ = _optional_int(request, "type")
            type_ = 1 if type_ is None else type_
            if type_ & INTERNAL_TYPE or type_ > 0xFFFF:
                raise BadRequestError(f"invalid type {type_}: must be 0..{INTERNAL_TYPE - 1}")
            if (request.content_length or 0) > self.max_message_size:
                raise MessageTooLargeError(f"message of {request.content_length} bytes exceeds "
                                           f"the maximum of {self.max_message_size}")
            body = await self.limits.read_body(request, self.max_request_size)
            if len(body) > self.max_message_size:
                raise MessageTooLargeError(f"message of {len(body)} bytes exceeds the maximum "
                                           f"of {self.max_message_size}")
            command = Command.of(encode(type_, topic, body), _FIRST_FRAME, topic)
        producer = parse_producer(request.headers)
        headers: dict[str, str] = {}
        if producer is not None:
            # Idempotent: the state machine stores it once whatever retries bring.
            if command.topic is None:
                raise BadRequestError("a publish with producer headers goes to one topic: "
                                      "give topicID")
            payload: bytes = stream_command({"op": "produce", "topic": command.topic,
                                             "producer": list(producer), "now": time.time()},
                                            command)
        else:
            payload = command
        result = await self.log.apply(payload)
        first, last = result.first, result.last
        outcome = result.stream
        if outcome is not None and outcome.producer is not None:
            first, last = outcome.first, outcome.last
            headers["Producer-Epoch"] = str(outcome.producer[0])
            headers["Producer-Seq"] = str(outcome.producer[1])
            if outcome.duplicate:
                headers[DUPLICATE_HEADER] = "true"
        headers[INDEX_HEADER] = str(last)
        if frames:
            count = last - first + 1 if last else 0
            return web.json_response({"first": first, "last": last, "count": count},
                                     headers=headers)
        return web.Response(headers=headers)

    @requires("consume")
    async def heartbeat(self, request: web.Request) -> web.Response:
        """POST /messaging/heartbeat: a subscriber has processed a topic through an index."""
        url = request.query.get("url", "")
        if not url:
            raise BadRequestError("missing parameter url (the subscriber's id)")
        principal_of(request).require("consume", url, f"subscriber {url!r}")
        topic = _required_int(request, "topicID")
        index = _required_int(request, "index")
        self.limits.check_subscriber(url, self.broker.subscribers(topic))
        await self.log.heartbeat(topic, index, url)
        return web.Response()

    @requires("admin")
    async def retention(self, request: web.Request) -> web.Response:
        """POST /messaging/retention: run retention now (it also runs on a timer)."""
        loop = asyncio.get_running_loop()
        deleted = await loop.run_in_executor(None, self.broker.enforce_retention)
        return web.json_response({"deleted_bytes": deleted})

    # -- reads ------------------------------------------------------------------------------

    @requires("read")
    async def read(self, request: web.Request) -> web.StreamResponse:
        """GET /messaging/messages: frames from ``index``; ``streaming=true`` keeps it open.

        A non-streaming read of a topic that never existed is a 404; a streaming one waits
        for the topic's first message. HEAD answers the headers a GET would, without a body.
        """
        topic_id = _required_int(request, "topicID")
        self._require_read(request, topic_id)
        index = _optional_int(request, "index") or 0
        end = _optional_int(request, "end")
        limit = _optional_int(request, "limit")
        streaming = _bool(request, "streaming")
        if streaming and request.method != "HEAD":
            with self.limits.stream():
                return await self._read(request, topic_id, index, end, limit, streaming)
        return await self._read(request, topic_id, index, end, limit, streaming)

    async def _read(self, request: web.Request, topic_id: int, index: int, end: int | None,
                    limit: int | None, streaming: bool) -> web.StreamResponse:
        topic = self.broker.topic(topic_id)
        extra: dict[str, str] = {}
        if "consumer" in request.query:  # start right after a consumer's stored position
            if "index" in request.query:
                raise BadRequestError("give index or consumer, not both")
            index, position = start_index(
                self.broker.subscribers(topic_id), check_name(request.query["consumer"]),
                topic.first_index if topic is not None else 0)
            extra[CONSUMER_INDEX_HEADER] = str(position)
        if topic is None and not streaming:
            raise NotFoundError(f"topic {topic_id} not found")
        reader = topic.reader(index, end, limit) if topic is not None else None
        loop = asyncio.get_running_loop()
        # Read the first chunk before answering, so an error (410, damage on disk) is a
        # proper status rather than a broken 200.
        first: list[bytes] = []  # handed over to _send, which alone then holds the chunk
        if reader is not None and request.method != "HEAD":
            first.append(await loop.run_in_executor(None, reader.read, STREAM_CHUNK_MIN))
        response = web.StreamResponse(headers={
            "Content-Type": FRAMES_CONTENT_TYPE,
            INDEX_HEADER: str(topic.committed_index if topic is not None else 0), **extra,
        })
        if request.method == "HEAD":
            await response.prepare(request)
            return response
        if request.version >= HttpVersion11:  # HTTP/1.0 gets a body ended by closing
            response.enable_chunked_encoding()
        await response.prepare(request)
        metrics = self.broker.metrics
        streams = metrics.active_streams if streaming else None
        if streams is not None:
            streams.inc()
        try:
            if reader is None:
                topic = await self.broker.wait_for_topic(topic_id)
                reader = topic.reader(index, end, limit) if topic is not None else None
            if reader is not None:
                await self._send(response, reader, first.pop() if first else b"", streaming,
                                 metrics,
                                 request.transport)
        except MessagingError as err:
            # The 200 and its headers are gone: end the stream abruptly, so the reader sees a
            # broken response, reconnects from where it got to, and is told the error then.
            log.warning("stream of topic %d broken off: %s", topic_id, err)
            if request.transport is not None:
                request.transport.abort()
            return response
        finally:
            if streams is not None:
                streams.dec()
        await response.write_eof()
        return response

    async def _send(self, response: web.StreamResponse, reader: ReaderView,
                    chunk: bytes | memoryview, streaming: bool, metrics: BrokerMetrics,
                    transport: asyncio.Transport | None) -> None:
        """Write chunks, reading the next one on a thread while the socket keeps up.

        Chunks grow from STREAM_CHUNK_MIN to STREAM_CHUNK while each write leaves the socket
        drained, and drop back (with no read-ahead) when it does not: a subscriber that stops
        reading pins at most about one STREAM_CHUNK. A follower that has caught up parks in
        the topic's fan-out (:mod:`messaging.http.fanout`), which writes each new commit from the
        in-memory tail to its socket; one a little behind reads that tail on the loop. A read
        in flight is always awaited, whatever happens to the response.
        """
        loop = asyncio.get_running_loop()
        topic = reader.topic
        sent = 0
        size = STREAM_CHUNK_MIN
        while True:
            if chunk:
                caught_up = reader.last_index >= topic.committed_index
                # Behind, but the topic's in-memory tail still holds what comes next: take it
                # from there, with no read and no thread (a follower that fell a little behind
                # stays cheap, and does not take a thread from every other one).
                following = None if caught_up else reader.read_tail()
                ahead = (loop.run_in_executor(None, reader.read, size)
                         if not caught_up and following is None and _drained(transport)
                         else None)
                try:
                    await response.write(chunk)
                except BaseException:
                    if ahead is not None:
                        await asyncio.wait([ahead])  # never leave a read running behind us
                        if not ahead.cancelled():
                            ahead.exception()  # retrieved: its error does not matter now
                    raise
                metrics.bytes_streamed.inc(len(chunk))
                metrics.messages_streamed.inc(reader.delivered - sent)
                sent = reader.delivered
                if following is not None:
                    chunk = following
                elif ahead is not None:
                    chunk = await ahead
                elif caught_up:
                    chunk = b""
                    continue
                else:
                    chunk = await loop.run_in_executor(None, reader.read, size)
                size = min(size * 2, STREAM_CHUNK) if _drained(transport) else STREAM_CHUNK_MIN
                continue
            if reader.done or topic.closed or not streaming:
                return
            if (transport is not None and reader.end is None and reader.remaining is None
                    and reader.last_index >= topic.committed_index and _drained(transport)):
                # Caught up, socket drained: park in the fan-out, which writes every new
                # commit to this socket without waking this task, until it needs the files.
                sent += await self.fanouts.follow(reader, transport, response.chunked)
                continue
            await topic.wait_for(reader.last_index)
            tail = reader.read_tail()
            chunk = tail if tail is not None else await loop.run_in_executor(
                None, reader.read, size)

    def _readable(self, principal: Principal, topic_id: int) -> bool:
        """Whether the principal may read a topic (by id, or by its stream's name)."""
        if principal.can("read", str(topic_id)):
            return True
        name = self.broker.stream_name(topic_id)
        return name is not None and principal.can("read", name)

    def _require_read(self, request: web.Request, topic_id: int) -> None:
        principal = principal_of(request)
        if not self._readable(principal, topic_id):
            principal.require("read", str(topic_id), f"topic {topic_id}")

    @requires("read")
    async def ping(self, request: web.Request) -> web.Response:
        """GET or POST /messaging/ping: every live node's URL."""
        return web.json_response({"urls": self.log.urls()})

    @requires("read")
    async def topics(self, request: web.Request) -> web.Response:
        """GET /messaging/topics (those the token may read)."""
        principal = principal_of(request)
        return web.json_response([self.broker.topic_info(t) for t in self.broker.topics()
                                  if self._readable(principal, t.id)])

    @requires("read")
    async def topic(self, request: web.Request) -> web.Response:
        """GET /messaging/topics/{id}, with ``after`` and ``count`` for count-based batching."""
        topic_id = _int(request.match_info["id"], "topic id")
        self._require_read(request, topic_id)
        topic = self.broker.topic(topic_id)
        if topic is None:
            raise NotFoundError(f"topic {topic_id} not found")
        info = self.broker.topic_info(topic)
        after = _optional_int(request, "after")
        count = _optional_int(request, "count")
        if (after is None) != (count is None):
            raise BadRequestError("after and count go together")
        if after is not None and count is not None:
            if count < 1:
                raise BadRequestError("count must be at least 1")
            loop = asyncio.get_running_loop()
            info["index"] = await loop.run_in_executor(None, topic.index_after, after, count)
        return web.json_response(info)

    @requires("read")
    async def diagnostics(self, request: web.Request) -> web.Response:
        """GET /messaging/diagnostics (file system paths only for admin tokens)."""
        report = {"version": VERSION, **self.broker.diagnostics(), **self.log.diagnostics()}
        if not principal_of(request).can("admin"):
            report = _without_paths(report)
        return web.json_response(report)

    @requires("admin")
    async def metrics(self, request: web.Request) -> web.Response:
        """GET /metrics in the Prometheus text format."""
        return web.Response(body=self.broker.metrics.render(),
                            headers={"Content-Type": "text/plain; version=0.0.4"})


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


def _without_paths(value: Any) -> Any:
    """A diagnostics report without the file system paths in it."""
    if isinstance(value, dict):
        return {k: _without_paths(v) for k, v in value.items() if k != "path"}
    if isinstance(value, list):
        return [_without_paths(v) for v in value]
    return value


def _drained(transport: asyncio.Transport | None) -> bool:
    """Whether everything written to the socket so far has been handed to the kernel."""
    return transport is None or transport.get_write_buffer_size() == 0


def _int(value: str, name: str) -> int:
    # ASCII digits only: int() would also take "１２", "1_0", "+7" and " 1 ".
    if not (value.isascii() and value.isdigit() and len(value) <= _MAX_U64_DIGITS):
        raise BadRequestError(f"invalid {name} {value!r}: expected an unsigned integer")
    number = int(value)
    if number >= 2**64:
        raise BadRequestError(f"invalid {name} {value!r}: expected an unsigned integer")
    return number


def _optional_int(request: web.Request, name: str) -> int | None:
    value = request.query.get(name)
    return None if value is None or value == "" else _int(value, name)


def _required_int(request: web.Request, name: str) -> int:
    value = _optional_int(request, name)
    if value is None:
        raise BadRequestError(f"missing parameter {name}")
    return value


def _bool(request: web.Request, name: str) -> bool:
    value = request.query.get(name, "false").lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no", ""):
        return False
    raise BadRequestError(f"invalid {name} {value!r}: expected true or false")


def _printable(text: str) -> str:
    """``text`` safe for a header line: printable ASCII, everything else escaped."""
    if text.isascii() and text.isprintable():
        return text
    return "".join(ch if " " <= ch <= "~" else _escape(ch) for ch in text)


def _escape(ch: str) -> str:
    if ch in "\r\n\t":
        return " "
    return ch.encode("unicode_escape").decode("ascii")


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


def _payload_error(request: web.Request, err: web.RequestPayloadError) -> str:
    """What was wrong with a request body that aiohttp could not decode."""
    encoding = request.headers.get(hdrs.CONTENT_ENCODING, "").strip()
    if isinstance(err.__cause__, ContentEncodingError) and encoding:
        return (f"invalid request body: Content-Encoding is {encoding!r} but the body is "
                f"not valid {encoding} data")
    return f"invalid request body: {_one_line(str(err.__cause__ or err))}"


def _report_rejection(request: web.Request, message: str, *args: object) -> None:
    protocol = request.protocol
    if isinstance(protocol, BrokerConnection):
        protocol.report(message, *args)
    else:
        log.warning(message, *args)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


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
        _report_rejection(request, "rejected request from %s: %s", request.remote, message)
        response = error_response(400, message)
        response.force_close()  # the rest of the body cannot be parsed either
        return response
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except Exception as err:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(500, f"internal error: {type(err).__name__}: {err}")


def make_app(broker: BrokerView, log_: Log, *,
             max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
             max_request_size: int = DEFAULT_MAX_REQUEST_SIZE,
             tokens: Tokens | None = None, limits: Limits | None = None) -> web.Application:
    """The aiohttp application for one broker and its log (``tokens``: authenticate)."""
    handlers = Handlers(broker, log_, max_message_size, max_request_size, limits)
    # Without tokens every request is allowed: no authentication step at all.
    middlewares = [errors_middleware] + ([auth_middleware(tokens)] if tokens is not None else [])
    app = web.Application(middlewares=middlewares,
                          client_max_size=max(max_request_size, max_message_size + 1024))
    app.router.add_post("/messaging/messages", handlers.publish)
    app.router.add_get("/messaging/messages", handlers.read)
    app.router.add_post("/messaging/heartbeat", handlers.heartbeat)
    app.router.add_get("/messaging/ping", handlers.ping)
    app.router.add_post("/messaging/ping", handlers.ping)
    app.router.add_get("/messaging/topics", handlers.topics)
    app.router.add_get("/messaging/topics/{id}", handlers.topic)
    app.router.add_get("/messaging/diagnostics", handlers.diagnostics)
    app.router.add_post("/messaging/retention", handlers.retention)
    app.router.add_get("/metrics", handlers.metrics)
    add_routes(app, ConsumerHandlers(broker, log_))
    return app


# -- connections ----------------------------------------------------------------------------


def _one_line(text: str, limit: int = 200) -> str:
    """A client-supplied error text as one short line (aiohttp's span several)."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[:limit - 3] + "..."


class RejectionLog:
    """One warning line per rejected request or connection, at most ``per_second`` a second.

    A flood of malformed requests must not flood the log: past the limit, rejections are
    counted and one summary line reports the count when the second is over.
    """

    def __init__(self, logger: logging.Logger = log,
                 per_second: int = REJECTIONS_LOGGED_PER_SECOND) -> None:
        self.logger = logger
        self.per_second = per_second
        self.suppressed = 0
        self._window_start = float("-inf")
        self._lines = 0
        self._summary: asyncio.TimerHandle | None = None

    def warning(self, message: str, *args: object) -> None:
        """Log one rejection, or count it if this second's lines are used up."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if now - self._window_start >= 1.0:
            self._window_start, self._lines = now, 0
        if self._lines < self.per_second:
            self._lines += 1
            self.logger.warning(message, *args)
            return
        self.suppressed += 1
        if self._summary is None:
            self._summary = loop.call_at(self._window_start + 1.0, self.flush)

    def flush(self) -> None:
        """Log how many rejections went unlogged since the last summary."""
        if self._summary is not None:
            self._summary.cancel()
            self._summary = None
        if self.suppressed:
            self.logger.warning("%d more rejected requests or connections not logged (at most "
                                "%d lines a second)", self.suppressed, self.per_second)
            self.suppressed = 0


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

    __slots__ = ("_limits", "_refused", "_reported")

    def __init__(self, manager: web.Server, *, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(manager, keepalive_timeout=limits.header_timeout, **kwargs)
        self._limits = limits
        self._refused = False
        self._reported = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Serve the connection, or refuse it with 503 when the broker is at its cap."""
        limits = self._limits
        if limits.open >= limits.max_connections:
            self._refused = True
            self.transport = transport  # type: ignore[assignment]
            limits.refuse(transport)  # type: ignore[arg-type]
            return
        limits.open += 1
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        """Release the connection's place under the cap."""
        if self._refused:
            self._limits.refused_closed(self.transport)
            self.transport = None
            return
        if self._manager is not None:  # aiohttp's own guard against a second call
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
        detail = _one_line(detail)
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
                        _one_line(str(exc)))
            return
        super().log_exception(*args, **kw)


def connection_factory(server: web.Server, limits: ConnectionLimits,
                       access_log: logging.Logger | None = None,
                       ) -> Callable[[], BrokerConnection]:
    """A protocol factory for ``loop.create_server`` serving ``server`` (an app runner's);
    ``access_log``: log every request there (:class:`messaging.http.access_log.AccessLogger`)."""
    loop = asyncio.get_running_loop()

    def connection() -> BrokerConnection:
        return BrokerConnection(server, limits=limits, loop=loop, access_log=access_log,
                                access_log_class=AccessLogger)

    return connection
