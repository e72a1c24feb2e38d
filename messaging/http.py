"""The aiohttp application: every endpoint of the HTTP API over a narrow broker protocol.

Handlers depend on :class:`BrokerView` (reads) and :class:`messaging.log.Log` (writes); only
this module turns exceptions into responses: status, ``X-Broker-Error`` and a text body.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Protocol

from aiohttp import HttpVersion11, web

from messaging.broker import ApplyResult
from messaging.errors import (
    BadRequestError,
    MessageTooLargeError,
    MessagingError,
    NoLeaderError,
    NotFoundError,
    NotLeaderError,
)
from messaging.log import Log
from messaging.message import (
    DEFAULT_MAX_MESSAGE_SIZE,
    FRAMES_CONTENT_TYPE,
    INTERNAL_TYPE,
    encode,
    validate_publish,
)
from messaging.metrics import BrokerMetrics
from messaging.topic import Topic, TopicReader

log = logging.getLogger(__name__)

ERROR_HEADER = "X-Broker-Error"
INDEX_HEADER = "X-Broker-Index"
DEFAULT_MAX_REQUEST_SIZE = 64 << 20
#: Publish bodies up to this size are validated on the event loop; bigger ones on a thread.
VALIDATE_ON_LOOP = 64 << 10
#: Bytes a stream reads from disk per write: it starts at the minimum and doubles up to the
#: maximum while the socket keeps up (see Handlers._send).
STREAM_CHUNK_MIN = 64 << 10
STREAM_CHUNK = 256 << 10



class BrokerView(Protocol):
    """The broker methods the handlers call."""

    metrics: BrokerMetrics
    index: int

    def topic(self, topic_id: int) -> Topic | None: ...
    def topics(self) -> list[Topic]: ...
    def topic_info(self, topic: Topic) -> dict[str, Any]: ...
    async def wait_for_topic(self, topic_id: int) -> Topic | None: ...
    def diagnostics(self) -> dict[str, Any]: ...
    def enforce_retention(self, now: float | None = None) -> int: ...


class Handlers:
    """The request handlers, bound to one broker and one log."""

    def __init__(self, broker: BrokerView, log: Log, max_message_size: int) -> None:
        self.broker = broker
        self.log = log
        self.max_message_size = max_message_size

    # -- writes -----------------------------------------------------------------------------

    def _require_leader(self) -> None:
        if self.log.is_leader():
            return
        leader = self.log.leader_url()
        if leader is None:
            raise NoLeaderError("no leader: the cluster cannot accept writes right now")
        raise NotLeaderError(leader)

    async def publish(self, request: web.Request) -> web.Response:
        """POST /messaging/messages: one message's data, or a body of frames."""
        self._require_leader()
        frames = request.content_type == FRAMES_CONTENT_TYPE
        if frames:
            command = await request.read()
            topic_id = _optional_int(request, "topicID")
            if len(command) <= VALIDATE_ON_LOOP:
                validate_publish(command, topic=topic_id, max_length=self.max_message_size)
            else:  # a big batch would stall every other request: check it on a thread
                await asyncio.get_running_loop().run_in_executor(None, partial(
                    validate_publish, command, topic=topic_id,
                    max_length=self.max_message_size))
        else:
            topic = _required_int(request, "topicID")
            type_ = _optional_int(request, "type")
            type_ = 1 if type_ is None else type_
            if type_ & INTERNAL_TYPE or type_ > 0xFFFF:
                raise BadRequestError(f"invalid type {type_}: must be 0..{INTERNAL_TYPE - 1}")
            if (request.content_length or 0) > self.max_message_size:
                raise MessageTooLargeError(f"message of {request.content_length} bytes exceeds "
                                           f"the maximum of {self.max_message_size}")
            body = await request.read()
            if len(body) > self.max_message_size:
                raise MessageTooLargeError(f"message of {len(body)} bytes exceeds the maximum "
                                           f"of {self.max_message_size}")
            command = encode(type_, topic, body)
        result = await self.log.apply(command)
        headers = {INDEX_HEADER: str(result.last)}
        if frames:
            return web.json_response(_range(result), headers=headers)
        return web.Response(headers=headers)

    async def heartbeat(self, request: web.Request) -> web.Response:
        """POST /messaging/heartbeat: a subscriber has processed a topic through an index."""
        self._require_leader()
        topic = _required_int(request, "topicID")
        index = _required_int(request, "index")
        url = request.query.get("url", "")
        if not url:
            raise BadRequestError("missing parameter url (the subscriber's id)")
        await self.log.heartbeat(topic, index, url)
        return web.Response()

    async def cluster_change(self, request: web.Request) -> web.Response:
        """POST /messaging/cluster/join or /leave with ``addr`` (a Raft HOST:PORT)."""
        self._require_leader()
        address = request.query.get("addr", "")
        if not address:
            raise BadRequestError("missing parameter addr (the node's raft HOST:PORT)")
        log_: Any = self.log
        if not hasattr(log_, "add_node"):
            raise BadRequestError("this broker is not running in cluster mode")
        if request.match_info["action"] == "join":
            await log_.add_node(address)
        else:
            await log_.remove_node(address)
        return web.json_response({"urls": self.log.urls()})

    async def retention(self, request: web.Request) -> web.Response:
        """POST /messaging/retention: run retention now (it also runs on a timer)."""
        loop = asyncio.get_running_loop()
        deleted = await loop.run_in_executor(None, self.broker.enforce_retention)
        return web.json_response({"deleted_bytes": deleted})

    # -- reads ------------------------------------------------------------------------------

    async def read(self, request: web.Request) -> web.StreamResponse:
        """GET /messaging/messages: frames from ``index``; ``streaming=true`` keeps it open.

        A non-streaming read of a topic that never existed is a 404; a streaming one waits
        for the topic's first message. HEAD answers the headers a GET would, without a body.
        """
        topic_id = _required_int(request, "topicID")
        index = _optional_int(request, "index") or 0
        end = _optional_int(request, "end")
        limit = _optional_int(request, "limit")
        streaming = _bool(request, "streaming")
        topic = self.broker.topic(topic_id)
        if topic is None and not streaming:
            raise NotFoundError(f"topic {topic_id} not found")
        reader = topic.reader(index, end, limit) if topic is not None else None
        loop = asyncio.get_running_loop()
        # Read the first chunk before answering, so an error (410, damage on disk) is a
        # proper status rather than a broken 200.
        first = b""
        if reader is not None and request.method != "HEAD":
            first = await loop.run_in_executor(None, reader.read, STREAM_CHUNK_MIN)
        response = web.StreamResponse(headers={
            "Content-Type": FRAMES_CONTENT_TYPE,
            INDEX_HEADER: str(topic.committed_index if topic is not None else 0),
        })
        if request.method == "HEAD":
            await response.prepare(request)
            return response
        if not streaming and request.version >= HttpVersion11:
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
                await self._send(response, reader, first, streaming, metrics,
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

    async def _send(self, response: web.StreamResponse, reader: TopicReader,
                    chunk: bytes | memoryview, streaming: bool, metrics: BrokerMetrics,
                    transport: asyncio.Transport | None) -> None:
        """Write chunks, reading the next one on a thread while the socket keeps up.

        Chunks grow from STREAM_CHUNK_MIN to STREAM_CHUNK while each write leaves the socket
        drained, and drop back (with no read-ahead) when it does not: a subscriber that stops
        reading pins at most about one STREAM_CHUNK. A follower that has caught up takes each
        new commit from the topic's in-memory tail, shared with every other follower, with no
        thread and no system call but the socket write. A read in flight is always awaited,
        whatever happens to the response.
        """
        loop = asyncio.get_running_loop()
        topic = reader.topic
        sent = 0
        size = STREAM_CHUNK_MIN
        while True:
            if chunk:
                caught_up = reader.last_index >= topic.committed_index
                ahead = (loop.run_in_executor(None, reader.read, size)
                         if not caught_up and _drained(transport) else None)
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
                size = min(size * 2, STREAM_CHUNK) if _drained(transport) else STREAM_CHUNK_MIN
                if ahead is not None:
                    chunk = await ahead
                elif caught_up:
                    chunk = b""
                else:
                    chunk = await loop.run_in_executor(None, reader.read, size)
                continue
            if reader.done or topic.closed or not streaming:
                return
            await topic.wait_for(reader.last_index)
            tail = reader.read_tail()
            chunk = tail if tail is not None else await loop.run_in_executor(
                None, reader.read, size)

    async def ping(self, request: web.Request) -> web.Response:
        """GET or POST /messaging/ping: the leader lists the cluster's URLs."""
        self._require_leader()
        return web.json_response({"urls": self.log.urls()})

    async def topics(self, request: web.Request) -> web.Response:
        """GET /messaging/topics."""
        return web.json_response([self.broker.topic_info(t) for t in self.broker.topics()])

    async def topic(self, request: web.Request) -> web.Response:
        """GET /messaging/topics/{id}, with ``after`` and ``count`` for count-based batching."""
        topic_id = _int(request.match_info["id"], "topic id")
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

    async def diagnostics(self, request: web.Request) -> web.Response:
        """GET /messaging/diagnostics."""
        return web.json_response({**self.broker.diagnostics(), **self.log.diagnostics()})

    async def metrics(self, request: web.Request) -> web.Response:
        """GET /metrics in the Prometheus text format."""
        return web.Response(body=self.broker.metrics.render(),
                            headers={"Content-Type": "text/plain; version=0.0.4"})


def _drained(transport: asyncio.Transport | None) -> bool:
    """Whether everything written to the socket so far has been handed to the kernel."""
    return transport is None or transport.get_write_buffer_size() == 0


def _range(result: ApplyResult) -> dict[str, int]:
    return {"first": result.first, "last": result.last, "count": result.count}


def _int(value: str, name: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise BadRequestError(f"invalid {name} {value!r}: expected an unsigned integer") from None
    if number < 0 or number >= 2**64:
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


def error_response(status: int, message: str, headers: dict[str, str] | None = None,
                   ) -> web.Response:
    """The error shape of the API: status, ``X-Broker-Error`` and the message as text."""
    message = message.replace("\r", " ").replace("\n", " ")
    return web.Response(status=status, text=message + "\n",
                        headers={ERROR_HEADER: message, **(headers or {})})


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn exceptions into API errors; a 307 keeps the path and query."""
    try:
        return await handler(request)
    except NotLeaderError as err:
        location = err.leader_url.rstrip("/") + request.path_qs
        return error_response(307, str(err), {"Location": location})
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
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except Exception as err:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(500, f"internal error: {type(err).__name__}: {err}")


def make_app(broker: BrokerView, log_: Log, *,
             max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
             max_request_size: int = DEFAULT_MAX_REQUEST_SIZE) -> web.Application:
    """The aiohttp application for one broker and its log."""
    handlers = Handlers(broker, log_, max_message_size)
    app = web.Application(middlewares=[errors_middleware],
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
    app.router.add_post("/messaging/cluster/{action:join|leave}", handlers.cluster_change)
    app.router.add_get("/metrics", handlers.metrics)
    return app
