"""The Durable Streams protocol (v1.0) at ``/v1/stream/{name}``, over the broker's log.

Every write is a command through the log (see :mod:`messaging.broker.catalog`): create, append,
close and delete are durable under the same ``--fsync`` rules as native publishes, replicated
in a cluster, and decided by the state machine (idempotent producers included). Reads go
through a stream's fork lineage (:mod:`~messaging.broker.stream_reads`) on the room's read
threads (:mod:`messaging.http.executors`); long-poll and SSE wait for the writer's
notifications, never in a sleep loop.

Sliding TTLs are kept per node: a read or write on a node extends the stream's life there;
the node that finds a stream expired deletes it through the log.

This module is over 600 lines because it is the whole protocol surface (five methods, catch-up,
long-poll and SSE reads, ETags, cursors and CORS) in one place, as the protocol document reads.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import random
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from types import MappingProxyType
from typing import Any

from aiohttp import hdrs, web

from messaging.aio import cancel_and_wait
from messaging.broker import stream_reads
from messaging.broker.commands import (
    ForkSpec,
    append_stream,
    create_stream,
    delete_stream,
    expire_stream,
)
from messaging.broker.state import (
    MAX_MESSAGE_SIZE,
    Position,
    Stream,
    expired,
    media_type,
    parse_token,
    token,
)
from messaging.broker.view import BrokerView
from messaging.config import DEFAULT_LONG_POLL_TIMEOUT, DEFAULT_MAX_REQUEST_SIZE
from messaging.errors import (
    BadRequestError,
    MessagingError,
    StreamConflictError,
    StreamGoneError,
    StreamNotFoundError,
)
from messaging.headers import (
    ETAG_HEADER,
    PRODUCER_EPOCH_HEADER,
    PRODUCER_EXPECTED_SEQ_HEADER,
    PRODUCER_ID_HEADER,
    PRODUCER_RECEIVED_SEQ_HEADER,
    PRODUCER_SEQ_HEADER,
    STREAM_CLOSED_HEADER,
    STREAM_CURSOR_HEADER,
    STREAM_EXPIRES_AT_HEADER,
    STREAM_FORK_OFFSET_HEADER,
    STREAM_FORK_SUB_OFFSET_HEADER,
    STREAM_FORKED_FROM_HEADER,
    STREAM_NEXT_OFFSET_HEADER,
    STREAM_SEQ_HEADER,
    STREAM_SSE_DATA_ENCODING_HEADER,
    STREAM_TTL_HEADER,
    STREAM_UP_TO_DATE_HEADER,
)
from messaging.http import sse
from messaging.http.auth import OPEN, principal_of, requires
from messaging.http.executors import Executors
from messaging.http.limits import Limits
from messaging.http.producer_headers import parse_producer
from messaging.http.time_param import parse_time
from messaging.log.base import Log

log = logging.getLogger(__name__)

PREFIX = "/v1/stream/"
#: An SSE response is ended after this long so that CDNs can collapse readers (seconds).
DEFAULT_SSE_LIFETIME = 60.0
#: Expired streams are looked for this often (seconds); requests also check on access.
EXPIRY_SWEEP_INTERVAL = 5.0
_CURSOR_EPOCH = datetime.fromisoformat("2024-10-09T00:00:00+00:00").timestamp()
_CURSOR_INTERVAL = 20
_INTEGER = re.compile(r"(0|[1-9][0-9]*)")
_DIGITS = re.compile(r"[0-9]+")
_MEDIA_TYPE = re.compile(r"[\w-]+/[\w-]+")

CORS_HEADERS = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Methods": "GET, POST, PUT, DELETE, HEAD, OPTIONS",
    "Access-Control-Allow-Headers": ", ".join((
        "content-type", "authorization", STREAM_SEQ_HEADER, STREAM_TTL_HEADER,
        STREAM_EXPIRES_AT_HEADER, STREAM_CLOSED_HEADER, PRODUCER_ID_HEADER,
        PRODUCER_EPOCH_HEADER, PRODUCER_SEQ_HEADER, STREAM_FORKED_FROM_HEADER,
        STREAM_FORK_OFFSET_HEADER, STREAM_FORK_SUB_OFFSET_HEADER, hdrs.IF_NONE_MATCH)),
    "Access-Control-Expose-Headers": ", ".join((
        STREAM_NEXT_OFFSET_HEADER, STREAM_CURSOR_HEADER, STREAM_UP_TO_DATE_HEADER,
        STREAM_CLOSED_HEADER, PRODUCER_EPOCH_HEADER, PRODUCER_SEQ_HEADER,
        PRODUCER_EXPECTED_SEQ_HEADER, PRODUCER_RECEIVED_SEQ_HEADER,
        STREAM_SSE_DATA_ENCODING_HEADER, ETAG_HEADER, hdrs.CONTENT_TYPE, hdrs.LOCATION)),
    "X-Content-Type-Options": "nosniff",
    "Cross-Origin-Resource-Policy": "cross-origin",
}


#: The scope each method of ``/v1/stream/{name}`` needs on the stream's name: reads read,
#: writes write, deleting a stream admin; CORS preflights carry no credentials.
SCOPES: Mapping[str, str] = MappingProxyType({
    "GET": "read", "HEAD": "read", "PUT": "write", "POST": "write", "DELETE": "admin",
    "OPTIONS": OPEN})


def cursor(client: str | None) -> str:
    """A ``Stream-Cursor``: the current 20 s interval, always above the client's own."""
    current = int((time.time() - _CURSOR_EPOCH) // _CURSOR_INTERVAL)
    if client is None or not _DIGITS.fullmatch(client) or int(client) < current:
        return str(current)
    return str(int(client) + max(1, -(-random.randint(1, 3600) // _CURSOR_INTERVAL)))


def _is_true(value: str | None) -> bool:
    return value is not None and value.strip().lower() == "true"


def _expires(text: str) -> float:
    """An RFC 3339 time as POSIX seconds (400 if it is not one)."""
    try:
        value = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError as err:
        raise BadRequestError(f"invalid Stream-Expires-At {text!r}: not an RFC 3339 time"
                              ) from err
    if value.tzinfo is None:
        raise BadRequestError(f"invalid Stream-Expires-At {text!r}: no time zone")
    return value.timestamp()


class StreamHandlers:
    """The ``/v1/stream/{name}`` endpoints of one broker.

    :mod:`messaging.http.app` routes :meth:`handle`, adds :meth:`add_cors` to every answer
    and runs the expiry sweep from :meth:`start` to :meth:`stop`.
    """

    def __init__(self, broker: BrokerView, log_: Log, executors: Executors,
                 max_message_size: int, *, long_poll_timeout: float = DEFAULT_LONG_POLL_TIMEOUT,
                 sse_lifetime: float = DEFAULT_SSE_LIFETIME,
                 max_request_size: int = DEFAULT_MAX_REQUEST_SIZE,
                 limits: Limits | None = None) -> None:
        self.broker = broker
        self.log = log_
        self.executors = executors
        self.max_message_size = max_message_size
        self.max_request_size = max_request_size
        self.limits = limits or Limits()
        self.long_poll_timeout = long_poll_timeout
        self.sse_lifetime = sse_lifetime
        self._used: dict[str, float] = {}  # name -> last read or write here (sliding TTL)
        self._started = time.time()
        self._sweeper: asyncio.Task[None] | None = None

    # -- wiring (see messaging.http.app) ----------------------------------------------------

    async def add_cors(self, request: web.Request, response: web.StreamResponse) -> None:
        """Give every answer under PREFIX (errors too) the CORS and security headers."""
        if request.path.startswith(PREFIX):
            for name, value in CORS_HEADERS.items():
                response.headers.setdefault(name, value)

    async def start(self, _app: web.Application) -> None:
        """Start the expiry sweep (an ``on_startup`` hook)."""
        self._sweeper = asyncio.create_task(self._sweep(), name="messaging-stream-expiry")

    async def stop(self, _app: web.Application) -> None:
        """Stop the expiry sweep (an ``on_cleanup`` hook)."""
        sweeper, self._sweeper = self._sweeper, None
        await cancel_and_wait(sweeper)

    async def _sweep(self) -> None:
        """Delete expired streams through the log, every EXPIRY_SWEEP_INTERVAL."""
        while True:
            await asyncio.sleep(EXPIRY_SWEEP_INTERVAL)
            now = time.time()
            for stream in self.broker.committed.streams():
                if not stream.deleted and self._expired(stream, now):
                    try:
                        await self._expire(stream)
                    except MessagingError as err:
                        log.warning("could not delete expired stream %r: %s", stream.name, err)

    @requires(SCOPES)
    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Dispatch one request on a stream."""
        name = request.match_info["name"]
        method = request.method
        if method == "OPTIONS":
            return web.Response(status=204)
        handler: Callable[[web.Request, str], Awaitable[web.StreamResponse]] | None = {
            "PUT": self.create, "POST": self.append, "GET": self.read, "HEAD": self.head,
            "DELETE": self.delete,
        }.get(method)
        if handler is None:
            raise web.HTTPMethodNotAllowed(method, sorted(SCOPES))
        principal_of(request).require(SCOPES[method], name, f"stream {name!r}")
        if method in ("GET", "HEAD"):
            await self.log.read_barrier()  # what any node acknowledged before is seen here
        return await handler(request, name)

    # -- lookups and expiry -----------------------------------------------------------------

    def _expired(self, stream: Stream, now: float) -> bool:
        used = self._used.get(stream.name, max(stream.created, self._started))
        return expired(stream, now, used)

    async def _expire(self, stream: Stream) -> None:
        await self.log.apply(expire_stream(stream.name, stream.topic))
        self._used.pop(stream.name, None)

    async def _lookup(self, name: str, *, gone_ok: bool = False) -> Stream:
        """The live stream (404 if missing or expired, 410 if soft-deleted)."""
        stream = self.broker.committed.stream(name)
        if stream is not None and not stream.deleted and self._expired(stream, time.time()):
            await self._expire(stream)
            stream = self.broker.committed.stream(name)
        if stream is None:
            raise StreamNotFoundError(f"stream {name!r} not found")
        if stream.deleted and not gone_ok:
            raise StreamGoneError(f"stream {name!r} was deleted")
        return stream

    def _touch(self, name: str) -> None:
        self._used[name] = time.time()

    # -- create -----------------------------------------------------------------------------

    async def create(self, request: web.Request, name: str) -> web.StreamResponse:
        """PUT: create a stream (or a fork); 201, or 200 when it exists alike, 409 if not."""
        headers = request.headers
        fork_from = headers.get(STREAM_FORKED_FROM_HEADER)
        source_name = ""
        if fork_from:
            source_name = fork_from.strip()
            if source_name.startswith(PREFIX):
                source_name = source_name[len(PREFIX):]
            source_name = source_name.lstrip("/")
            principal_of(request).require("read", source_name, f"stream {source_name!r}")
        content_type = headers.get("Content-Type")
        if content_type is None or not _MEDIA_TYPE.match(content_type.strip()):
            content_type = None if fork_from else "application/octet-stream"
        ttl_text = headers.get(STREAM_TTL_HEADER)
        expires_text = headers.get(STREAM_EXPIRES_AT_HEADER)
        if ttl_text is not None and expires_text is not None:
            raise BadRequestError("give Stream-TTL or Stream-Expires-At, not both")
        ttl: int | None = None
        if ttl_text is not None:
            if not _INTEGER.fullmatch(ttl_text):
                raise BadRequestError(f"invalid Stream-TTL {ttl_text!r}: a non-negative "
                                      "integer without sign or leading zeros")
            ttl = int(ttl_text)
        expires = _expires(expires_text) if expires_text is not None else None
        fork: ForkSpec | None = None
        sub_text = headers.get(STREAM_FORK_SUB_OFFSET_HEADER)
        offset_text = headers.get(STREAM_FORK_OFFSET_HEADER)
        if not fork_from and (sub_text is not None or offset_text is not None):
            raise BadRequestError("Stream-Fork-Offset and Stream-Fork-Sub-Offset need "
                                  "Stream-Forked-From")
        json_mode = content_type is not None and media_type(content_type) == "application/json"
        if fork_from:
            sub = 0
            if sub_text is not None:
                if not _INTEGER.fullmatch(sub_text.strip()):
                    raise BadRequestError(f"invalid Stream-Fork-Sub-Offset {sub_text!r}")
                sub = int(sub_text.strip())
            at: Position | None = None
            if offset_text is not None:
                at = parse_token(offset_text.strip())
                if at is None:
                    raise BadRequestError(f"invalid Stream-Fork-Offset {offset_text!r}")
            try:
                source = await self._lookup(source_name)
            except StreamGoneError as err:
                raise StreamConflictError(f"fork source {source_name!r} was deleted") from err
            if at is None:
                at = source.tail
            if at > source.tail:
                raise BadRequestError("Stream-Fork-Offset is beyond the source stream's tail")
            if sub:
                at = await self.executors.read(stream_reads.resolve_sub_offset, self.broker,
                                               self.broker.committed, source, at, sub)
            fork = ForkSpec(source_name, at, offset_text, sub)
            if content_type is None:
                json_mode = source.json
            self._touch(source_name)
        existing = self.broker.committed.stream(name)
        replaces: int | None = None
        if existing is not None and not existing.deleted and self._expired(existing,
                                                                            time.time()):
            replaces = existing.topic
        body = await self.limits.read_body(request, self.max_request_size)
        if json_mode:
            messages = stream_reads.json_messages(body, allow_empty=True) if body else []
        else:
            # Frames of a repeated create go to the stream that exists (or are skipped);
            # otherwise to a new topic, which has no settings of its own yet.
            kept = (existing if existing is not None and not existing.deleted
                    and replaces is None else None)
            messages = self._pieces(body, kept.topic if kept is not None else None)
        result = await self.log.apply(create_stream(
            name, content_type=content_type, now=time.time(), ttl=ttl,
            expires_at=expires_text, expires=expires,
            closed=_is_true(headers.get(STREAM_CLOSED_HEADER)), fork=fork, replaces=replaces,
            messages=messages))
        outcome = result.stream
        assert outcome is not None
        self._touch(name)
        answer = {"Content-Type": outcome.content_type or (content_type or ""),
                  STREAM_NEXT_OFFSET_HEADER: token(outcome.tail)}
        if outcome.closed:
            answer[STREAM_CLOSED_HEADER] = "true"
        if outcome.created:
            answer["Location"] = str(request.url.with_query(None))
            return web.Response(status=201, headers=answer)
        stream = self.broker.committed.stream(name)
        if stream is not None:
            answer["Content-Type"] = stream.content_type
            answer[STREAM_NEXT_OFFSET_HEADER] = token(stream.tail)
        return web.Response(status=200, headers=answer)

    def _pieces(self, body: bytes, topic: int | None) -> list[bytes]:
        """A byte body as messages no bigger than the maximum message size of the stream's
        ``topic`` (None: a new topic): its own max-message-size, else the broker's."""
        if not body:
            return []
        size = self.max_message_size
        if topic is not None:
            size = min(size, self.broker.settings(topic).settings.get(MAX_MESSAGE_SIZE, size))
        return [body[i:i + size] for i in range(0, len(body), size)]


    # -- append and close -------------------------------------------------------------------

    async def append(self, request: web.Request, name: str) -> web.StreamResponse:
        """POST: append (one message; JSON arrays are flattened one level) and/or close."""
        headers = request.headers
        close = _is_true(headers.get(STREAM_CLOSED_HEADER))
        producer = parse_producer(headers)
        seq = headers.get(STREAM_SEQ_HEADER)
        self.limits.admit_append(f"stream {name!r}")
        body = await self.limits.read_body(request, self.max_request_size)
        if not body and not close:
            raise BadRequestError("an append needs a body (or Stream-Closed: true to close)")
        content_type = headers.get("Content-Type")
        if body and not content_type:
            raise BadRequestError("an append needs a Content-Type")
        stream = await self._lookup(name)
        messages: list[bytes] = []
        if body:
            if stream.json and not stream.closed and media_type(content_type or "") == (
                    "application/json"):
                messages = stream_reads.json_messages(body, allow_empty=False)
            else:
                messages = self._pieces(body, stream.topic)
        result = await self.log.apply(append_stream(
            name, now=time.time(), messages=messages,
            content_type=content_type if body else None, close=close, seq=seq,
            producer=producer))
        outcome = result.stream
        assert outcome is not None
        self._touch(name)
        answer = {STREAM_NEXT_OFFSET_HEADER: token(outcome.tail)}
        if outcome.closed:
            answer[STREAM_CLOSED_HEADER] = "true"
        if producer is not None and outcome.producer is not None:
            answer[PRODUCER_EPOCH_HEADER] = str(outcome.producer[0])
            answer[PRODUCER_SEQ_HEADER] = str(outcome.producer[1])
        elif producer is not None:
            answer[PRODUCER_EPOCH_HEADER] = str(producer[1])
            answer[PRODUCER_SEQ_HEADER] = str(producer[2])
        if outcome.duplicate or not messages:
            return web.Response(status=204, headers=answer)
        return web.Response(status=200 if producer is not None else 204, headers=answer)

    # -- delete and head --------------------------------------------------------------------

    async def delete(self, request: web.Request, name: str) -> web.StreamResponse:
        """DELETE: remove the stream (soft-deleted while forks read it)."""
        await self._lookup(name)
        await self.log.apply(delete_stream(name))
        self._used.pop(name, None)
        return web.Response(status=204)

    async def head(self, request: web.Request, name: str) -> web.StreamResponse:
        """HEAD: the stream's metadata (not cacheable; does not extend a sliding TTL)."""
        stream = await self._lookup(name)
        answer = {"Content-Type": stream.content_type,
                  STREAM_NEXT_OFFSET_HEADER: token(stream.tail), hdrs.CACHE_CONTROL: "no-store",
                  ETAG_HEADER: self._etag(stream, "-1", token(stream.tail), stream.closed)}
        if stream.closed:
            answer[STREAM_CLOSED_HEADER] = "true"
        if stream.ttl is not None:
            answer[STREAM_TTL_HEADER] = str(stream.ttl)
        if stream.expires_at is not None:
            answer[STREAM_EXPIRES_AT_HEADER] = stream.expires_at
        return web.Response(status=200, headers=answer)

    @staticmethod
    def _etag(stream: Stream, start: str, end: str, closed: bool) -> str:
        return f'"{stream.topic:x}:{start}:{end}{":c" if closed else ""}"'

    # -- reads ------------------------------------------------------------------------------

    def _offset(self, request: web.Request, stream: Stream) -> tuple[str, Position]:
        """The ``offset`` parameter and the position it names (400 when malformed)."""
        offsets = request.query.getall("offset", [])
        if len(offsets) > 1:
            raise BadRequestError("give one offset parameter")
        if not offsets:
            return "-1", (0, 0)
        text = offsets[0]
        if text == "-1":
            return text, (0, 0)
        if text == "now":
            return text, stream.tail
        position = parse_token(text)
        if position is None:
            raise BadRequestError(f"invalid offset {text!r}")
        return text, position

    async def _since(self, request: web.Request, stream: Stream) -> tuple[str, Position]:
        """``since=T`` (as on native reads, instead of ``offset``): the position before the
        first message appended at or after T, and its offset token (400 when malformed)."""
        if "offset" in request.query:
            raise BadRequestError("give one of offset and since, not both")
        moment = parse_time(request.query["since"], "since")
        position = await self.executors.read(stream_reads.position_at_time, self.broker,
                                             self.broker.committed, stream, moment)
        return token(position), position

    async def read(self, request: web.Request, name: str) -> web.StreamResponse:
        """GET: catch-up, ``live=long-poll`` or ``live=sse`` from ``offset`` (or ``since``)."""
        stream = await self._lookup(name)
        live = request.query.get("live")
        if live not in (None, "long-poll", "sse"):
            raise BadRequestError(f"invalid live mode {live!r}: long-poll or sse")
        if live is not None and "offset" not in request.query and "since" not in request.query:
            raise BadRequestError(f"live={live} needs an offset (or since)")
        if "since" in request.query:
            start_text, position = await self._since(request, stream)
        else:
            start_text, position = self._offset(request, stream)
        self._touch(name)
        client_cursor = request.query.get("cursor")
        if live == "sse":
            with self.limits.stream():
                return await self._sse(request, stream, position, client_cursor)
        if start_text == "now" and live is None:
            answer = {"Content-Type": stream.content_type,
                      STREAM_NEXT_OFFSET_HEADER: token(stream.tail),
                      STREAM_UP_TO_DATE_HEADER: "true", hdrs.CACHE_CONTROL: "no-store"}
            if stream.closed:
                answer[STREAM_CLOSED_HEADER] = "true"
            return web.Response(status=200, headers=answer,
                                body=b"[]" if stream.json else b"")
        items = await self._read_items(stream, position)
        if not items and live == "long-poll":
            if stream.closed and position >= stream.tail:
                return self._no_content(stream, position, None, closed=True)
            with self.limits.stream():
                items, stream = await self._wait(name, stream, position,
                                                 self.long_poll_timeout)
            self._touch(name)
            if not items:
                return self._no_content(stream, position, client_cursor,
                                        closed=stream.closed and position >= stream.tail)
        stream = (self.broker.committed.stream(name) or stream)
        end = items[-1].position if items else max(position, stream.tail) if (
            start_text == "now") else position
        up_to_date = end >= stream.tail
        closed = stream.closed and up_to_date
        answer = {"Content-Type": stream.content_type, STREAM_NEXT_OFFSET_HEADER: token(end),
                  ETAG_HEADER: self._etag(stream, start_text, token(end), closed)}
        if live == "long-poll":
            answer[STREAM_CURSOR_HEADER] = cursor(client_cursor)
        else:
            answer[hdrs.CACHE_CONTROL] = "public, max-age=60, stale-while-revalidate=300"
        if up_to_date:
            answer[STREAM_UP_TO_DATE_HEADER] = "true"
        if closed:
            answer[STREAM_CLOSED_HEADER] = "true"
        if request.headers.get(hdrs.IF_NONE_MATCH) == answer[ETAG_HEADER]:
            return web.Response(status=304, headers={ETAG_HEADER: answer[ETAG_HEADER]})
        return web.Response(status=200, headers=answer, body=stream_reads.body(stream, items))

    def _no_content(self, stream: Stream, position: Position, client_cursor: str | None, *,
                    closed: bool) -> web.Response:
        answer = {STREAM_NEXT_OFFSET_HEADER: token(max(position, stream.tail) if closed
                                              else position),
                  STREAM_UP_TO_DATE_HEADER: "true"}
        if closed:
            answer[STREAM_CLOSED_HEADER] = "true"
        else:
            answer[STREAM_CURSOR_HEADER] = cursor(client_cursor)
        return web.Response(status=204, headers=answer)

    async def _read_items(self, stream: Stream, position: Position) -> list[stream_reads.Item]:
        return await self.executors.read(stream_reads.read, self.broker, self.broker.committed,
                                         stream, position)

    async def _wait(self, name: str, stream: Stream, position: Position, timeout: float,
                    ) -> tuple[list[stream_reads.Item], Stream]:
        """Wait up to ``timeout`` for data after ``position`` (or the stream closing)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            current = self.broker.committed.stream(name)
            if current is None or current.deleted:
                raise StreamNotFoundError(f"stream {name!r} was deleted")
            stream = current
            items, after = await self._read_after(stream, position)
            if items:
                return items, stream
            if stream.closed and position >= stream.tail:
                return [], stream
            remaining = deadline - loop.time()
            if remaining <= 0:
                return [], stream
            await self.wait_for_change(stream, after, remaining)

    async def _read_after(self, stream: Stream, position: Position,
                          ) -> tuple[list[stream_reads.Item], int]:
        """The stream's items after ``position`` (none when it has nothing more), and the
        index to wait past next: the last item's, or when there are none see
        :func:`wait_after`."""
        if stream.tail <= position:
            return [], position[0]
        topic = self.broker.topic(stream.topic)
        committed = topic.committed_index if topic is not None else 0
        items = await self._read_items(stream, position)
        if items:
            return items, items[-1].position[0]
        return items, wait_after(position, committed)

    async def wait_for_change(self, stream: Stream, after: int, timeout: float) -> None:
        """Return when the stream's own topic has frames after index ``after``, its metadata
        changes, or at timeout.

        ``after`` is the reader's own position (see :func:`wait_after`), not whatever the
        topic holds now, so a commit that landed while the reader was busy is not missed:
        indexes are broker-wide, so the stream's next frame has an index above any position
        it has.
        """
        topic = self.broker.topic(stream.topic)
        waits: list[asyncio.Future[Any]] = [
            asyncio.ensure_future(self.broker.streams_changed.wait()),
            asyncio.ensure_future(topic.wait_for(after) if topic is not None
                                  else self.broker.wait_for_topic(stream.topic)),
        ]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waits:
                waiter.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    # -- SSE --------------------------------------------------------------------------------

    async def _sse(self, request: web.Request, stream: Stream, position: Position,
                   client_cursor: str | None) -> web.StreamResponse:
        """``live=sse``: data and control events until closed, or for ``sse_lifetime``."""
        binary = not (media_type(stream.content_type).startswith("text/") or stream.json)
        headers = {"Content-Type": "text/event-stream", hdrs.CACHE_CONTROL: "no-cache"}
        if binary:
            headers[STREAM_SSE_DATA_ENCODING_HEADER] = "base64"
        response = web.StreamResponse(status=200, headers=headers)
        await response.prepare(request)
        loop = asyncio.get_running_loop()
        ends = loop.time() + self.sse_lifetime
        name = stream.name
        while True:
            current = self.broker.committed.stream(name)
            if current is None or current.deleted:
                break
            stream = current
            items, after = await self._read_after(stream, position)
            out: list[str] = []
            for i, item in enumerate(items):
                out.append(sse.event("data", _event_text(stream, item, binary)))
                if i < len(items) - 1:  # every data event is followed by a control event
                    out.append(_control_event(item.position, client_cursor, up_to_date=False,
                                                  closed=False))
            if items:
                position = items[-1].position
            stream = (self.broker.committed.stream(name) or stream)
            up_to_date = position >= stream.tail
            closed = stream.closed and up_to_date
            out.append(_control_event(position, client_cursor, up_to_date=up_to_date,
                                      closed=closed))
            await response.write("".join(out).encode())
            if closed:
                break
            remaining = ends - loop.time()
            if remaining <= 0:
                break
            if up_to_date or not items:
                await self.wait_for_change(stream, after, min(remaining, self.long_poll_timeout))
                self._touch(name)
        with contextlib.suppress(ConnectionError):
            await response.write_eof()
        return response


def wait_after(position: Position, committed_before_read: int) -> int:
    """The index to wait past after a read from ``position`` found nothing.

    Frames the topic had committed before the read, past the position, were not there to
    read (a retention cut, a gap): waiting for them again would return at once, and the
    reader would spin; wait for a newer commit instead. Otherwise the frames are not
    committed yet (the catalog commits first): wait for them.
    """
    return committed_before_read if committed_before_read > position[0] else position[0]


def _control_event(position: Position, client_cursor: str | None, *, up_to_date: bool,
                   closed: bool) -> str:
    """A control event: the offset after the data so far, the cursor, caught up, closed."""
    control: dict[str, Any] = {"streamNextOffset": token(position)}
    if closed:
        control["streamClosed"] = True
        control["upToDate"] = True
    else:
        control["streamCursor"] = cursor(client_cursor)
        if up_to_date:
            control["upToDate"] = True
    return sse.event("control", json.dumps(control, separators=(",", ":")))


def _event_text(stream: Stream, item: stream_reads.Item, binary: bool) -> str:
    if binary:
        return base64.b64encode(item.data).decode()
    if stream.json:
        return "[" + item.data.decode("utf-8", "replace") + "]"
    return item.data.decode("utf-8", "replace")
