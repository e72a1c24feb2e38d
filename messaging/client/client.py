"""The async Python client's API: :class:`Client` (publish, read, topics, consumers,
heartbeats, ping) and :class:`Published`.

Each call is one or a few requests through the client's transport
(:class:`~messaging.client.transport.Transport`: the HTTP session, failover, retries and the
map of topic groups), whose answers :mod:`messaging.client.answers` reads. Publishes are
idempotent by default (:mod:`~messaging.client.producer`): each carries producer headers, so
one whose answer was lost is sent again and the broker stores it once. With
``idempotent=False`` a publish that may have reached a broker is never retried: the caller gets
:class:`PublishOutcomeUnknownError`. Subscriptions are :class:`Conn`
(:mod:`messaging.client.conn`); it and :class:`Response` are re-exported here.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from messaging.client.answers import (
    CONSUMER_INTEGERS,
    TOPIC_INTEGERS,
    Response,
    broker_index,
    check_content_type,
    index_field,
    integers,
    json_object,
    url_list,
)
from messaging.client.conn import TIMES_ATTEMPTS, TIMES_RETRY_DELAY, Conn
from messaging.client.producer import Lanes
from messaging.client.times import TimeRuns, timed
from messaging.client.transport import Transport
from messaging.client.url_file import save_urls, saved_urls
from messaging.config import DEFAULT_MAX_REQUEST_SIZE
from messaging.errors import (
    CorruptFrameError,
    InvalidURLError,
    MessagingError,
    NotABrokerError,
    ProducerSequenceGapError,
    TopicTruncatedError,
)
from messaging.failover import DEFAULT_RETRY_TIMEOUT
from messaging.frames import FRAMES_CONTENT_TYPE, HEADER_SIZE, Message, decode, encode_batch
from messaging.headers import (
    CONTENT_TYPE_HEADER,
    DUPLICATE_HEADER,
    PRODUCER_EPOCH_HEADER,
    PRODUCER_ID_HEADER,
    PRODUCER_SEQ_HEADER,
)

__all__ = ["DEFAULT_MAX_REQUEST_SIZE", "DEFAULT_RETRY_TIMEOUT", "Client", "Conn",
           "Published", "Response"]


class Client(Transport):
    """A connection pool to a broker or cluster; use as ``async with Client(urls) as c``.

    Its requests with failover (:meth:`request`, :meth:`stream`) and what it knows of the
    brokers (:attr:`urls`, :attr:`leader`, :attr:`reached`) are the transport's; the methods
    here are the broker's API.
    """

    def __init__(self, urls: Sequence[str] | str, config_path: Path | str | None = None, *,
                 timeout: float = 30.0, retry_timeout: float = DEFAULT_RETRY_TIMEOUT,
                 max_request_size: int = DEFAULT_MAX_REQUEST_SIZE,
                 idempotent: bool = True, producer_id: str | None = None,
                 token: str | None = None, ca: Path | str | None = None) -> None:
        self.config_path = Path(config_path) if config_path is not None else None
        # The config file is read by open(), on a thread: nothing here touches the disk.
        super().__init__(urls, timeout=timeout, retry_timeout=retry_timeout, token=token, ca=ca)
        if not self.brokers.urls and self.config_path is None:
            raise InvalidURLError("no broker URL given")
        self.max_request_size = max_request_size
        #: Producer lanes of idempotent publishes (None: publishes are not idempotent).
        self.producers = Lanes(producer_id) if idempotent else None

    async def __aenter__(self) -> Client:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Read the config file, create the HTTP session (``async with`` does this)."""
        if self.config_path is not None:
            self.brokers.add(await asyncio.to_thread(saved_urls, self.config_path))
            if not self.brokers.urls:
                raise InvalidURLError(f"no broker URL given, and none in {self.config_path}")
        await super().open()

    async def publish(self, topic: int, data: bytes, type: int = 1) -> int:
        """Publish one message; returns its index once the broker acknowledged it.

        Idempotent (unless the client was made with ``idempotent=False``): retried until the
        broker answers, and stored once however often it was sent.
        """
        response = await self._publish(topic, {"topicID": topic, "type": type}, data,
                                       "application/octet-stream")
        return broker_index(response)

    async def _publish(self, topic: int, params: dict[str, Any], data: bytes,
                       content_type: str) -> Response:
        """POST one publish request, on a producer lane of ``topic`` when idempotent.

        A broker that answers a lane's request with "new here, start at seq 0" has forgotten
        the producer (its topic was deleted, or the producer went unused for a week): nothing
        of the request is stored, so it is sent once more as a new epoch from seq 0 (the
        old epoch fenced, should a copy of an earlier attempt still arrive).
        """
        lanes = self.producers
        lane = lanes.take(topic) if lanes is not None else None
        for attempt in range(2):
            try:
                response = await self.request(
                    "POST", "/messaging/messages", params=params, data=data,
                    headers={CONTENT_TYPE_HEADER: content_type,
                             **(lane.headers() if lane is not None else {})},
                    write=True, idempotent=lane is not None)
            except ProducerSequenceGapError as err:
                if lane is not None and attempt == 0 and err.expected == 0 and lane.seq > 0:
                    lane.epoch, lane.seq = lane.epoch + 1, 0
                    continue
                if lane is not None and lanes is not None:
                    lanes.give_back(lane, err)
                raise
            except BaseException as err:
                if lane is not None and lanes is not None:
                    lanes.give_back(lane, err)
                raise
            break
        if lane is not None and lanes is not None:
            lanes.give_back(lane)
        return response

    async def publish_batch(self, topic: int, datas: Sequence[bytes],
                            type: int = 1) -> tuple[int, int]:
        """Publish many messages framed here (CRC computed once, on this side).

        Bodies are split at ``max_request_size``; each request is all-or-nothing, and the
        returned range spans from the first request's first index to the last one's last.
        """
        if not datas:
            raise MessagingError("publish_batch needs at least one message")
        first = last = 0
        for chunk in _split(datas, self.max_request_size):
            response = await self._publish(topic, {"topicID": topic},
                                           encode_batch(topic, chunk, type),
                                           FRAMES_CONTENT_TYPE)
            result = json_object(response)
            first = first or index_field(response, result, "first")
            last = index_field(response, result, "last")
        return first, last

    async def ping(self, timeout: float | None = None) -> list[str]:
        """Ask the leader for the cluster's URLs; remember and persist them. ``timeout``: how
        long each broker may take to answer (default the client's)."""
        response = await self.request("POST", "/messaging/ping", write=True, timeout=timeout)
        urls = url_list(response)
        if urls:
            self.brokers.replace(urls, start=response.url)
            if self.config_path is not None:
                await save_urls(self.config_path, urls)
        return urls

    async def topics(self) -> list[dict[str, Any]]:
        """Every topic with first/last index, size, segments and subscribers."""
        response = await self.request("GET", "/messaging/topics")
        result = response.json()
        if not isinstance(result, list) or not all(isinstance(t, dict) for t in result):
            raise NotABrokerError.at(response.url, "its topic list is not a JSON list of objects")
        return [integers(response, row, TOPIC_INTEGERS) for row in result]

    async def topic(self, topic: int | str, after: int | None = None,
                    count: int | None = None, last: int | None = None,
                    at: int | str | None = None) -> dict[str, Any]:
        """One topic (an id, or a stream's name); with ``after`` and ``count`` also the index
        of the count-th message, with ``last`` that of the last-th message from the end, with
        ``at`` (ms since the epoch, RFC 3339 text, or a duration back from now such as
        ``"15m"``) that of the first message appended at or after then (None: none yet)."""
        response = await self.request("GET", f"/messaging/topics/{quote(str(topic), safe='')}",
                                      params={"after": after, "count": count, "last": last,
                                              "at": at})
        return integers(response, json_object(response), TOPIC_INTEGERS)

    async def times(self, topic: int | str, index: int = 0,
                    end: int | None = None) -> TimeRuns:
        """When ``topic``'s messages from ``index`` (to ``end``, exclusive) were appended."""
        response = await self.request("GET", "/messaging/times",
                                      params={"topicID": topic, "index": index, "end": end})
        return TimeRuns.parse(json_object(response))  # ids as numbers or strings alike

    # -- topic management (PUT, GET, DELETE /messaging/topics/{id}) ---------------------------

    async def create_topic(self, topic: int | str, **settings: int | str | None,
                           ) -> dict[str, Any]:
        """Create ``topic`` (an id; or a stream's name, whose topic exists already) with
        ``settings``, or change those of a topic that exists: the same request. Settings are
        keywords: ``max_topic_size``, ``max_segment_size``, ``max_message_size``, each a byte
        count or a size text such as ``"10M"``, and ``retention_age`` (ms, or a duration
        text such as ``"7d"``; 0 turns age retention off for the topic); None resets one to
        the broker's value.
        Returns :meth:`describe_topic`'s answer."""
        return await self.configure_topic(topic, **settings)

    async def configure_topic(self, topic: int | str, **settings: int | str | None,
                              ) -> dict[str, Any]:
        """Change ``topic``'s settings (only those given; see :meth:`create_topic`)."""
        body = {key.replace("_", "-"): value for key, value in settings.items()}
        response = await self.request(
            "PUT", f"/messaging/topics/{quote(str(topic), safe='')}",
            data=json.dumps(body).encode(), headers={CONTENT_TYPE_HEADER: "application/json"},
            write=True)
        return integers(response, json_object(response), TOPIC_INTEGERS)

    async def describe_topic(self, topic: int | str) -> dict[str, Any]:
        """``topic`` as :meth:`topic` shows it, with ``settings``: each setting's ``value``
        and ``source`` (``topic``, ``broker`` or ``default``)."""
        return await self.topic(topic)

    async def delete_topic(self, topic: int | str) -> dict[str, Any]:
        """Delete a native topic (admin): its messages, settings and consumer positions, on
        every node. Not retried once sent (a second delete would answer 410)."""
        response = await self.request("DELETE", f"/messaging/topics/{quote(str(topic), safe='')}",
                                      write=True, idempotent=False)
        return integers(response, json_object(response), ("id", "deleted_at"))

    async def heartbeat(self, topic: int, index: int, url: str) -> None:
        """Tell the broker subscriber ``url`` has processed ``topic`` through ``index``."""
        await self.request("POST", "/messaging/heartbeat",
                           params={"topicID": topic, "index": index, "url": url}, write=True)

    async def read(self, topic: int, index: int = 0, end: int | None = None,
                   limit: int | None = None, *, since: int | str | None = None,
                   times: bool = False) -> list[Message]:
        """A non-streaming read of messages ``index`` ≤ i < ``end`` (up to ``limit``).

        ``index`` 0 means the first index retention kept. ``since`` (ms since the epoch,
        RFC 3339 text, or a duration back from now such as ``"15m"``) starts at the first
        message appended at or after then instead. ``times``: each message carries its
        append time (:attr:`Message.time`), at the cost of one more request.
        """
        params: dict[str, Any] = {"topicID": topic, "index": index, "end": end,
                                  "limit": limit}
        if since is not None:
            if index:
                raise ValueError("give index or since, not both")
            del params["index"]
            params["since"] = since
        try:
            response = await self.request("GET", "/messaging/messages", params=params)
        except TopicTruncatedError as err:
            if index != 0 or err.first_index <= 0:
                raise
            params.pop("since", None)  # retention passed the time's message: from the first
            index = params["index"] = err.first_index
            response = await self.request("GET", "/messaging/messages", params=params)
        check_content_type(response.url, response.headers.get(CONTENT_TYPE_HEADER, ""),
                           FRAMES_CONTENT_TYPE)
        messages, used = decode(response.body, after=max(index - 1, 0))
        if used != len(response.body):
            raise CorruptFrameError("the broker's answer ended inside a frame")
        if times and messages:
            return await self._stamp_times(topic, messages)
        return messages

    async def _stamp_times(self, topic: int, messages: list[Message]) -> list[Message]:
        """``messages`` (in index order) with their append times, asking again while the
        node that answers is behind the one that served them (a cluster)."""
        stamped: list[Message] = []
        for attempt in range(TIMES_ATTEMPTS):
            if attempt:
                await asyncio.sleep(TIMES_RETRY_DELAY * attempt)
            runs = await self.times(topic, messages[len(stamped)].index,
                                    messages[-1].index + 1)
            while len(stamped) < len(messages):
                message = messages[len(stamped)]
                if message.index < runs.index:  # retention took it since: its time too
                    stamped.append(timed(message, None))
                elif runs.covers(message.index):
                    stamped.append(timed(message, runs.time_of(message.index)))
                else:
                    break
            if len(stamped) == len(messages):
                return stamped
        raise MessagingError(f"topic {topic}: no broker answered the append times of "
                             f"messages from index {messages[len(stamped)].index}")

    def conn(self, topic: int, data_url: str | None = None,
             heartbeat_interval: float = 1.0, *, consumer: str | None = None,
             times: bool = False) -> Conn:
        """A subscription to ``topic``; ``data_url`` names it for heartbeats.

        With ``consumer`` it starts right after that consumer's stored position and
        heartbeats as it; ``heartbeat_interval`` 0 leaves committing to :meth:`Conn.commit`.
        With ``times`` every message it hands out carries its append time
        (:attr:`Message.time`; fetched a stretch at a time, not per message).
        """
        return Conn(self, topic, data_url, heartbeat_interval, consumer, times=times)

    # -- stored consumer positions and explicit producers (messaging.client.consumer, .journal) ---

    async def consumers(self, topic: int | None = None,
                        name: str | None = None) -> list[dict[str, Any]]:
        """Stored consumer positions: topic, name, index, last_index, lag, last_seen, live."""
        response = await self.request("GET", "/messaging/consumers",
                                      params={"topicID": topic, "name": name})
        result = response.json()
        if not isinstance(result, list) or not all(isinstance(c, dict) for c in result):
            raise NotABrokerError.at(response.url, "its consumer list is not a JSON list")
        return [integers(response, row, CONSUMER_INTEGERS) for row in result]

    async def reset_consumer(self, name: str, topic: int, index: int) -> None:
        """Set consumer ``name``'s position in ``topic`` to ``index`` (also backwards)."""
        await self.request("PUT", f"/messaging/consumers/{quote(name, safe='')}",
                           params={"topicID": topic, "index": index}, write=True)

    async def delete_consumer(self, name: str, topic: int | None = None) -> list[int]:
        """Forget consumer ``name`` (in ``topic``, or everywhere); returns the topics."""
        response = await self.request("DELETE", f"/messaging/consumers/{quote(name, safe='')}",
                                      params={"topicID": topic}, write=True)
        topics = json_object(response).get("topics")
        return [int(t) for t in topics] if isinstance(topics, list) else []

    async def publish_as(self, topic: int, datas: Sequence[bytes],
                         producer: tuple[str, int, int], type: int = 1) -> Published:
        """Publish ``datas`` as one all-or-nothing request with explicit producer headers.

        ``producer`` is ``(id, epoch, seq)``: sending the same one again (after a crash, by
        another process) is stored once; the answer says whether this one was a duplicate
        (then the indexes are the original's). Retried like any idempotent publish; a fenced
        epoch (403) or a sequence gap (409) raises.
        """
        if not datas:
            raise MessagingError("publish_as needs at least one message")
        pid, epoch, seq = producer
        response = await self.request(
            "POST", "/messaging/messages", params={"topicID": topic},
            data=encode_batch(topic, datas, type),
            headers={CONTENT_TYPE_HEADER: FRAMES_CONTENT_TYPE, PRODUCER_ID_HEADER: pid,
                     PRODUCER_EPOCH_HEADER: str(epoch), PRODUCER_SEQ_HEADER: str(seq)},
            write=True)
        result = json_object(response)
        return Published(index_field(response, result, "first"),
                         index_field(response, result, "last"),
                         response.headers.get(DUPLICATE_HEADER) == "true")


@dataclass(frozen=True, slots=True)
class Published:
    """The answer to :meth:`Client.publish_as`: the stored index range, and whether the
    request was a duplicate of one stored before."""

    first: int
    last: int
    duplicate: bool


def _split(datas: Sequence[bytes], max_bytes: int) -> Iterator[Sequence[bytes]]:
    """``datas`` in runs whose frames fit in ``max_bytes`` (one message alone may not)."""
    start = 0
    size = 0
    for i, data in enumerate(datas):
        frame = HEADER_SIZE + len(data)
        if i > start and size + frame > max_bytes:
            yield datas[start:i]
            start, size = i, 0
        size += frame
    yield datas[start:]
