"""Stored consumer positions: the commands that change them and their HTTP surface.

A consumer is a subscriber by another name: what it heartbeats (``POST /messaging/heartbeat``
with ``url=NAME``) is its committed position in a topic. Heartbeats only move a position
forward; moving it anywhere else is an explicit reset, and forgetting a consumer a delete.
Both are broker-internal commands (:data:`messaging.broker.subscribers.CONSUMER_OP`) through the
same log as heartbeats, so they are applied in the group transaction, saved in
``broker.json`` before the answer, and identical on every node of a cluster.

Endpoints (routed in :mod:`messaging.http.app`):

- ``GET /messaging/consumers`` (optional ``topicID``, ``name``): every consumer's position,
  the topic's last index, lag (the messages after its position), lag_ms (how long ago the
  first of them was appended) and when it was last seen.
- ``PUT /messaging/consumers/{name}?topicID=T&index=I``: reset a position (also backwards);
  or the same two in a JSON body, ``{"topicID": T, "index": I}`` (read as JSON whatever its
  Content-Type when the query has no topicID), each a number or a decimal string
  (:func:`messaging.json_ids.parse_u64`; ``topicID`` may be a stream's name).
- ``DELETE /messaging/consumers/{name}`` (optional ``topicID``): forget a consumer.

``topicID`` is a topic id or a named stream's name (:mod:`messaging.http.topic_param`).

``GET /messaging/messages?topicID=T&consumer=NAME`` (in :mod:`messaging.http.messages`) starts right
after NAME's position (:func:`start_index`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from messaging.broker.commands import delete_consumer, reset_consumer
from messaging.broker.view import BrokerView
from messaging.clock import now_ms
from messaging.errors import BadRequestError, MessagingError, NotFoundError
from messaging.http.auth import principal_of, requires
from messaging.http.executors import Executors
from messaging.http.responses import json_answer
from messaging.http.topic_param import readable, resolve, topic_reference, topic_to_read
from messaging.json_ids import parse_u64
from messaging.log.base import Log

#: Longest consumer name accepted (it is saved in broker.json and sent in every heartbeat).
MAX_NAME = 1024


def start_index(positions: Mapping[str, int], name: str, first_index: int) -> tuple[int, int]:
    """Where a read by consumer ``name`` starts, and the position it starts after.

    Right after the committed position; a new consumer (or one at 0) starts at the first
    index retention kept (``first_index``; 0 when the topic has nothing yet).
    """
    position = positions.get(name, 0)
    return (position + 1 if position else first_index), position


def check_name(name: str | None) -> str:
    """A consumer name from a request (400 when missing, empty or too long)."""
    if not name:
        raise BadRequestError("missing consumer name")
    if len(name) > MAX_NAME:
        raise BadRequestError(f"consumer name longer than {MAX_NAME} characters")
    return name


class ConsumerHandlers:
    """``/messaging/consumers`` over a broker and its log."""

    def __init__(self, broker: BrokerView, log: Log, executors: Executors | None = None,
                 ) -> None:
        self.broker = broker
        self.executors = executors
        self.log = log

    def listing(self, topic: int | None = None, name: str | None = None,
                ) -> list[dict[str, Any]]:
        """Every consumer (of ``topic``, named ``name`` when given), by topic and name.

        ``last_seen`` is when this node applied its last heartbeat (POSIX time; a restart
        counts as seen), ``idle`` the seconds since, ``live`` whether it still holds
        retention back. A Kafka topic's partition also has ``kafka_topic`` and
        ``kafka_partition`` (a Kafka group's committed offsets are its positions there).
        """
        monotonic = time.monotonic()
        rows = []
        for topic_id, who, record in self.broker.committed.subscriber_records():
            if (topic is not None and topic_id != topic) or (name is not None and who != name):
                continue
            found = self.broker.topic(topic_id)
            last = found.committed_index if found is not None else 0
            idle = max(monotonic - record.seen, 0.0)
            rows.append({"topic": topic_id, "name": who, "index": record.index,
                         "last_index": last, "lag": max(last - record.index, 0),
                         "lag_ms": None,
                         "last_seen": round(record.seen_at, 3),
                         "idle": round(idle, 3),
                         "live": idle <= self.broker.subscriber_timeout})
            kafka = self.broker.settings(topic_id).kafka
            if kafka is not None:
                rows[-1]["kafka_topic"], rows[-1]["kafka_partition"] = kafka
        return rows

    @requires("read")
    async def list(self, request: web.Request) -> web.Response:
        """GET /messaging/consumers (those of the topics the token may read)."""
        await self.log.read_barrier()
        principal = principal_of(request)
        topic = topic_to_read(request, self.broker)
        name = request.query.get("name") or None
        rows = [row for row in self.listing(topic, name)
                if readable(principal, self.broker, row["topic"])]
        if self.executors is not None and rows:
            await self.executors.read(self._count_lags, rows)
        return json_answer(rows)

    def _count_lags(self, rows: Sequence[dict[str, Any]]) -> None:
        """Make each row's ``lag`` the messages after its position, not the difference of
        broker indexes (shared by every topic, so the difference overstates it), and
        ``lag_ms`` how long ago the first of them was appended (0 when caught up, null when
        its time is unknown). Reads the topics' indexes: on a read thread."""
        now = now_ms()
        for row in rows:
            topic = self.broker.topic(row["topic"])
            if topic is None:
                continue
            try:
                row["lag"] = topic.count_after(row["index"])
                if row["lag"] == 0:
                    row["lag_ms"] = 0
                    continue
                behind = topic.index_after(row["index"] + 1, 1)
                appended = topic.time_of(behind) if behind is not None else None
                if appended is not None:
                    row["lag_ms"] = max(now - appended, 0)
            except MessagingError:  # damaged or deleted under us: the index difference
                continue

    @requires("admin")
    async def reset(self, request: web.Request) -> web.Response:
        """PUT /messaging/consumers/{name}?topicID=T&index=I: set a position, also backwards.

        Or both in a JSON object body, whatever its Content-Type when the query names no
        topic: ``curl -d`` sends JSON as a form."""
        name = check_name(request.match_info.get("name"))
        given: Mapping[str, object] = request.query
        if request.content_type == "application/json" or (
                "topicID" not in request.query and request.body_exists):
            given = await _json_object(request)
        reference = _topic_given(given.get("topicID"))
        if reference is None:
            raise BadRequestError("missing parameter topicID")
        topic = resolve(self.broker, reference)
        index = given.get("index")
        if index is None or index == "":
            raise BadRequestError("missing parameter index")
        try:
            position = parse_u64(index, "index")
        except ValueError as err:
            raise BadRequestError(str(err)) from err
        await self.log.apply(reset_consumer(topic, name, position))
        return json_answer({"topic": topic, "name": name, "index": position})

    @requires("admin")
    async def delete(self, request: web.Request) -> web.Response:
        """DELETE /messaging/consumers/{name} (optional topicID): forget a consumer."""
        name = check_name(request.match_info.get("name"))
        reference = topic_reference(request.query.get("topicID"))
        topic = resolve(self.broker, reference) if reference is not None else None
        known = [row["topic"] for row in self.listing(topic, name)]
        if not known:
            where = f" in topic {topic}" if topic is not None else ""
            raise NotFoundError(f"no consumer {name!r}{where}")
        await self.log.apply(delete_consumer(topic, name))
        return json_answer({"name": name, "topics": known})


async def _json_object(request: web.Request) -> Mapping[str, object]:
    """A request's JSON object body (400 when it is not one)."""
    try:
        value = json.loads(await request.read())
    except ValueError as err:  # JSONDecodeError and UnicodeDecodeError
        raise BadRequestError(f"invalid JSON body: {err}") from err
    if not isinstance(value, dict):
        raise BadRequestError("invalid JSON body: expected an object such as "
                              '{"topicID": 1, "index": 10}')
    return value


def _topic_given(value: object) -> int | str | None:
    """The topic a query or JSON body names: an id (a number or a decimal string) or a
    stream's name; None when missing."""
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return parse_u64(value, "topicID")
        except ValueError as err:
            raise BadRequestError(str(err)) from err
    if value is None or isinstance(value, str):
        return topic_reference(value)
    raise BadRequestError(f"invalid topicID {value!r}: expected an unsigned integer (a number "
                          "or a string of decimal digits) or a stream's name")
