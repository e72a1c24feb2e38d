"""The native API at ``/messaging/``: publish, read and stream, heartbeat, ping, topics,
diagnostics, retention and metrics, and the parsing of their parameters.

:class:`MessageHandlers` depends on :class:`~messaging.broker.view.BrokerView` (reads) and
:class:`~messaging.log.base.Log` (writes: every publish and heartbeat is a command through the
log). Errors are raised as :class:`~messaging.errors.MessagingError`; the middleware in
:mod:`messaging.http.app` turns them into answers. Blocking work goes to the room's threads
(:mod:`messaging.http.executors`): file reads to the read pool, big publish bodies to the
validation pool.
"""

from __future__ import annotations

import asyncio
import logging
import time
from array import array
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from aiohttp import HttpVersion11, web

from messaging import __version__ as VERSION
from messaging.broker.commands import Command, heartbeat_command, produce, validate_publish
from messaging.broker.view import BrokerView
from messaging.config import DEFAULT_MAX_REQUEST_SIZE
from messaging.errors import (
    BadRequestError,
    MessageTooLargeError,
    MessagingError,
    NotFoundError,
)
from messaging.frames import FRAMES_CONTENT_TYPE, INTERNAL_TYPE, encode
from messaging.headers import (
    CONSUMER_INDEX_HEADER,
    DUPLICATE_HEADER,
    INDEX_HEADER,
    PRODUCER_EPOCH_HEADER,
    PRODUCER_SEQ_HEADER,
)
from messaging.http import sse
from messaging.http.auth import principal_of, requires
from messaging.http.consumers import check_name, start_index
from messaging.http.executors import Executors
from messaging.http.follow import TopicStreamer
from messaging.http.limits import Limits
from messaging.http.producer_headers import parse_producer
from messaging.http.responses import json_answer
from messaging.http.time_param import parse_time
from messaging.http.topic_param import (
    readable,
    readable_reference,
    resolve,
    topic_reference,
    topic_to_read,
    topic_to_write,
)
from messaging.http.topics import raise_if_deleted
from messaging.log.base import Log
from messaging.topic.view import TopicView

log = logging.getLogger(__name__)

_FIRST_FRAME = array("q", [0])  # the offsets of a single-frame command
#: Publish bodies up to this size are validated on the event loop (about 0.4 ms for 256 KiB of
#: 100 B frames); bigger ones on a validation thread.
VALIDATE_ON_LOOP = 256 << 10
_MAX_U64_DIGITS = len(str(2**64 - 1))
#: The most runs one ``GET /messaging/times`` answers (``through`` then says where they end).
MAX_TIME_RUNS = 10_000


class MessageHandlers:
    """The native API's handlers, bound to one broker, its log and the room's threads."""

    def __init__(self, broker: BrokerView, log: Log, executors: Executors,
                 max_message_size: int, max_request_size: int = DEFAULT_MAX_REQUEST_SIZE,
                 limits: Limits | None = None, *,
                 retention: Callable[[], Awaitable[int]] | None = None,
                 object_status: Callable[[], dict[str, Any] | None] | None = None) -> None:
        self.broker = broker
        self.log = log
        #: Runs retention now (the broker's retention service); None: not served here.
        self.run_retention = retention
        #: What diagnostics show of the object store (the uploader's status).
        self.object_status = object_status
        self.executors = executors
        self.max_message_size = max_message_size
        self.max_request_size = max_request_size
        self.limits = limits or Limits()
        self.streamer = TopicStreamer(executors, broker.metrics)

    # -- writes -----------------------------------------------------------------------------

    @requires("write")
    async def publish(self, request: web.Request) -> web.Response:
        """POST /messaging/messages: one message's data, or a body of frames."""
        principal = principal_of(request)
        frames = request.content_type == FRAMES_CONTENT_TYPE
        if frames:
            topic_id = topic_to_write(request.query.get("topicID"))
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
                       else await self.executors.validate(check))
        else:
            topic = topic_to_write(request.query.get("topicID"))
            if topic is None:
                raise BadRequestError("missing parameter topicID")
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
            payload: bytes = produce(command.topic, producer, time.time(), command)
        else:
            payload = command
        result = await self.log.apply(payload)
        first, last = result.first, result.last
        outcome = result.stream
        if outcome is not None and outcome.producer is not None:
            first, last = outcome.first, outcome.last
            headers[PRODUCER_EPOCH_HEADER] = str(outcome.producer[0])
            headers[PRODUCER_SEQ_HEADER] = str(outcome.producer[1])
            if outcome.duplicate:
                headers[DUPLICATE_HEADER] = "true"
        headers[INDEX_HEADER] = str(last)
        if frames:
            count = last - first + 1 if last else 0
            return json_answer({"first": first, "last": last, "count": count},
                               headers=headers)
        return web.Response(headers=headers)

    @requires("consume")
    async def heartbeat(self, request: web.Request) -> web.Response:
        """POST /messaging/heartbeat: a subscriber has processed a topic through an index."""
        url = request.query.get("url", "")
        if not url:
            raise BadRequestError("missing parameter url (the subscriber's id)")
        principal_of(request).require("consume", url, f"subscriber {url!r}")
        reference = topic_reference(request.query.get("topicID"))
        if reference is None:
            raise BadRequestError("missing parameter topicID")
        topic = resolve(self.broker, reference)
        index = _required_int(request, "index")
        self.limits.check_subscriber(url, self.broker.subscribers(topic))
        await self.log.apply(heartbeat_command(topic, index, url))
        return web.Response()

    @requires("admin")
    async def retention(self, request: web.Request) -> web.Response:
        """POST /messaging/retention: run retention now (it also runs on a timer)."""
        if self.run_retention is None:
            raise NotFoundError("this node runs no retention of its own")
        return json_answer({"deleted_bytes": await self.run_retention()})

    # -- reads ------------------------------------------------------------------------------

    @requires("read")
    async def read(self, request: web.Request) -> web.StreamResponse:
        """GET /messaging/messages: frames from ``index`` (or from the first message appended
        at or after ``since``: RFC 3339, ms since the epoch, or a duration back from now);
        ``streaming=true`` keeps it open; ``format=sse``: Server-Sent Events, following the
        topic (:mod:`messaging.http.sse`).

        ``topicID`` is a topic id or a named stream's name. A non-streaming read of a topic
        that never existed is a 404; a streaming one waits for the topic's first message.
        HEAD answers the headers a GET would, without a body.
        """
        streaming = _bool(request, "streaming")
        fmt = request.query.get("format", "frames")
        if fmt not in ("frames", "sse"):
            raise BadRequestError(f"invalid format {fmt!r}: expected frames or sse")
        once = fmt != "sse" and (not streaming or request.method == "HEAD")
        if once or "consumer" in request.query or "since" in request.query:
            # A read that answers once sees what any node acknowledged before it began, and
            # so does the start of a stream from a stored position or a time (both looked up
            # here); a stream from an index follows the topic and gets it as it is applied.
            await self.log.read_barrier()
        topic_id = topic_to_read(request, self.broker)
        if topic_id is None:
            raise BadRequestError("missing parameter topicID")
        index = _optional_int(request, "index") or 0
        end = _optional_int(request, "end")
        limit = _optional_int(request, "limit")
        if fmt == "sse":
            with self.limits.stream():
                return await self._read_sse(request, topic_id, index, end, limit)
        if streaming and request.method != "HEAD":
            with self.limits.stream():
                return await self._read(request, topic_id, index, end, limit, streaming)
        return await self._read(request, topic_id, index, end, limit, streaming)

    async def _start(self, request: web.Request, topic_id: int, topic: TopicView | None,
                     index: int, extra: dict[str, str]) -> int:
        """The first index a read wants: ``index``, the first message appended at or after
        ``since`` (the next one to come when none is yet), or right after a consumer's
        stored position (named in ``extra``)."""
        given = [name for name in ("index", "since", "consumer") if name in request.query]
        if len(given) > 1:
            raise BadRequestError("give one of index, since and consumer, not "
                                  + " and ".join(given))
        if "since" in request.query:
            moment = parse_time(request.query["since"], "since")
            if topic is None:
                return 0  # every message of a topic still to come is appended after it
            # The end as it was before the lookup: a message committed while it ran (on a
            # thread) is read, not skipped.
            end_before = topic.committed_index
            found = await self.executors.read(topic.index_at_time, moment)
            return found if found is not None else end_before + 1
        if "consumer" in request.query:  # start right after a consumer's stored position
            index, position = start_index(
                self.broker.subscribers(topic_id), check_name(request.query["consumer"]),
                topic.first_index if topic is not None else 0)
            extra[CONSUMER_INDEX_HEADER] = str(position)
        return index

    async def _read(self, request: web.Request, topic_id: int, index: int, end: int | None,
                    limit: int | None, streaming: bool) -> web.StreamResponse:
        topic = self.broker.topic(topic_id)
        if topic is None:
            raise_if_deleted(self.broker, topic_id)
        extra: dict[str, str] = {}
        index = await self._start(request, topic_id, topic, index, extra)
        if topic is None and not streaming:
            raise NotFoundError(f"topic {topic_id} not found")
        reader = topic.reader(index, end, limit) if topic is not None else None
        # Read the first chunk before answering, so an error (410, damage on disk) is a
        # proper status rather than a broken 200.
        first: list[bytes] = []  # handed over to the streamer, which alone then holds it
        if reader is not None and request.method != "HEAD":
            first.append(await self.streamer.first_chunk(reader))
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
                await self.streamer.send(response, reader, first.pop() if first else b"",
                                         streaming, request.transport)
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

    async def _read_sse(self, request: web.Request, topic_id: int, index: int,
                        end: int | None, limit: int | None) -> web.StreamResponse:
        """``format=sse``: the topic's messages as events from ``index`` (or right after a
        consumer's position, or after ``Last-Event-ID`` when a browser reconnects)."""
        topic = self.broker.topic(topic_id)
        if topic is None:
            raise_if_deleted(self.broker, topic_id)
        extra: dict[str, str] = {}
        last_event = request.headers.get("Last-Event-ID", "").strip()
        if last_event:
            index = _int(last_event, "Last-Event-ID") + 1
        else:
            index = await self._start(request, topic_id, topic, index, extra)
        reader = topic.reader(index, end, limit) if topic is not None else None
        first = await self.streamer.first_chunk(reader) if reader is not None else b""
        response = web.StreamResponse(headers={
            "Content-Type": sse.CONTENT_TYPE, "Cache-Control": "no-cache",
            INDEX_HEADER: str(topic.committed_index if topic is not None else 0), **extra})
        await response.prepare(request)
        if request.method == "HEAD":
            return response
        streams = self.broker.metrics.active_streams
        streams.inc()
        try:
            while reader is None:  # a topic with no message yet: wait for its first
                await response.write(sse.control_event(index, True).encode())
                found = await _within(self.broker.wait_for_topic(topic_id), sse.KEEPALIVE)
                if found is not None:
                    reader = found.reader(index, end, limit)
            await sse.send_topic(response, reader, first, self.executors)
        except MessagingError as err:
            log.warning("SSE stream of topic %d broken off: %s", topic_id, err)
            if request.transport is not None:
                request.transport.abort()
            return response
        finally:
            streams.dec()
        await response.write_eof()
        return response

    @requires("read")
    async def ping(self, request: web.Request) -> web.Response:
        """GET or POST /messaging/ping: every live node's URL."""
        return json_answer({"urls": self.log.urls()})

    @requires("read")
    async def topics(self, request: web.Request) -> web.Response:
        """GET /messaging/topics (those the token may read), each row with ``count``: the
        messages it holds (counted on a read thread: broker indexes are shared by every
        topic, so a topic's index range is not its count)."""
        await self.log.read_barrier()
        principal = principal_of(request)
        rows = [(t, self.broker.topic_info(t)) for t in self.broker.topics()
                if readable(principal, self.broker, t.id)]

        def counted() -> list[dict[str, Any]]:
            for topic, info in rows:
                try:
                    info["count"] = topic.count_after(max(topic.first_index - 1, 0))
                except MessagingError:  # deleted or cut meanwhile: no figure
                    info["count"] = None
            return [info for _topic, info in rows]

        return json_answer(await self.executors.read(counted))

    @requires("read")
    async def times(self, request: web.Request) -> web.Response:
        """GET /messaging/times?topicID=T&index=I[&end=E]: when the topic's messages from
        ``index`` (to ``end``, exclusive) were appended, as runs: ``[first index, time]``,
        each holding until the next one starts, through ``through`` (the last index they
        cover); a time is ms since the epoch, null for messages written before times."""
        await self.log.read_barrier()
        topic_id = topic_to_read(request, self.broker)
        if topic_id is None:
            raise BadRequestError("missing parameter topicID")
        index = _optional_int(request, "index") or 0
        end = _optional_int(request, "end")
        topic = self.broker.topic(topic_id)
        if topic is None:
            raise_if_deleted(self.broker, topic_id)
            raise NotFoundError(f"topic {topic_id} not found")
        through = topic.committed_index if end is None else min(end - 1, topic.committed_index)
        start = max(index, topic.first_index)
        runs = await self.executors.read(topic.times, start, through) if start <= through else []
        if len(runs) > MAX_TIME_RUNS:  # a bounded answer: the client asks again from there
            through = runs[MAX_TIME_RUNS][0] - 1
            del runs[MAX_TIME_RUNS:]
        return json_answer({"topic": topic_id, "index": start, "through": through,
                            "runs": [list(run) for run in runs]})

    @requires("read")
    async def topic(self, request: web.Request) -> web.Response:
        """GET /messaging/topics/{id} (through :meth:`TopicHandlers.describe`, which waits for
        the read barrier first), with ``after`` and ``count`` for count-based batching,
        ``last``: the index of the ``last``-th message back from the end, or ``at``: the index
        of the first message appended at or after that time (null: none yet); with
        ``objects=true``, the object store's URL and the topic's objects in it (name, index
        range, size, count, marks)."""
        reference = topic_reference(request.match_info["id"], "topic id")
        if reference is None:
            raise BadRequestError("missing topic id")
        topic_id = readable_reference(principal_of(request), self.broker, reference, "topic id")
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
            info["index"] = await self.executors.read(topic.index_after, after, count)
        last = _optional_int(request, "last")
        if last is not None:  # where a read of the last ``last`` messages starts
            if after is not None or last < 1:
                raise BadRequestError("last takes a count of at least 1, without after")
            info["index"] = await self.executors.read(topic.index_before_end, last)
        if "at" in request.query:
            if after is not None or last is not None:
                raise BadRequestError("at takes a time, without after or last")
            moment = parse_time(request.query["at"], "at")
            info["index"] = await self.executors.read(topic.index_at_time, moment)
        if _bool(request, "objects"):  # for readers of the store itself (Spark executors)
            info["object_store"] = self.broker.object_store_url
            info["objects"] = [
                {"name": o.name(topic_id).name, "first": o.first, "last": o.last,
                 "size": o.size, "count": o.count, "marks": [list(m) for m in o.marks]}
                for o in self.broker.manifest(topic_id).objects]
        return json_answer(info)

    @requires("read")
    async def diagnostics(self, request: web.Request) -> web.Response:
        """GET /messaging/diagnostics (file system paths only for admin tokens); ``window``:
        the seconds of recent publishes that the publish budget covers (default 60)."""
        window = float(_optional_int(request, "window") or 60)
        report = {"version": VERSION, **self.broker.diagnostics(),
                  **self.log.diagnostics(window=window)}
        status = self.object_status() if self.object_status is not None else None
        if status is not None:
            report["object_store"] = status
        if not principal_of(request).can("admin"):
            report = _without_paths(report)
        return json_answer(report)

    @requires("admin")
    async def metrics(self, request: web.Request) -> web.Response:
        """GET /metrics in the Prometheus text format."""
        return web.Response(body=self.broker.metrics.render(),
                            headers={"Content-Type": "text/plain; version=0.0.4"})


async def _within(waiting: Awaitable[TopicView | None], seconds: float) -> TopicView | None:
    """What ``waiting`` gives within ``seconds`` (None after that: it is cancelled)."""
    try:
        return await asyncio.wait_for(waiting, seconds)
    except TimeoutError:
        return None


def _without_paths(value: Any) -> Any:
    """A diagnostics report without the file system paths in it."""
    if isinstance(value, dict):
        return {k: _without_paths(v) for k, v in value.items() if k != "path"}
    if isinstance(value, list):
        return [_without_paths(v) for v in value]
    return value


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

