"""Stored consumer positions: the commands that change them and their HTTP surface.

A consumer is a subscriber by another name: what it heartbeats (``POST /messaging/heartbeat``
with ``url=NAME``) is its committed position in a topic. Heartbeats only move a position
forward; moving it anywhere else is an explicit reset, and forgetting a consumer a delete.
Both are broker-internal commands (:data:`messaging.broker.subscribers.CONSUMER_OP`) through the
same log as heartbeats, so they are applied in the group transaction, saved in
``broker.json`` before the answer, and identical on every node of a cluster.

Endpoints (routed in :mod:`messaging.http.app`):

- ``GET /messaging/consumers`` (optional ``topicID``, ``name``): every consumer's position,
  the topic's last index, lag (the messages after its position) and when it was last seen.
- ``PUT /messaging/consumers/{name}?topicID=T&index=I``: reset a position (also backwards).
- ``DELETE /messaging/consumers/{name}`` (optional ``topicID``): forget a consumer.

``GET /messaging/messages?topicID=T&consumer=NAME`` (in :mod:`messaging.http.messages`) starts right
after NAME's position (:func:`start_index`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from messaging.broker.subscribers import DELETE, RESET, consumer_command
from messaging.broker.view import BrokerView
from messaging.errors import BadRequestError, MessagingError, NotFoundError
from messaging.http.auth import principal_of, requires
from messaging.http.executors import Executors
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
        retention back.
        """
        monotonic = time.monotonic()
        rows = []
        for topic_id, who, record in self.broker.positions.subscribers():
            if (topic is not None and topic_id != topic) or (name is not None and who != name):
                continue
            found = self.broker.topic(topic_id)
            last = found.committed_index if found is not None else 0
            idle = max(monotonic - record.seen, 0.0)
            rows.append({"topic": topic_id, "name": who, "index": record.index,
                         "last_index": last, "lag": max(last - record.index, 0),
                         "last_seen": round(record.seen_at, 3),
                         "idle": round(idle, 3),
                         "live": idle <= self.broker.subscriber_timeout})
        return rows

    @requires("read")
    async def list(self, request: web.Request) -> web.Response:
        """GET /messaging/consumers (those of the topics the token may read)."""
        principal = principal_of(request)
        topic = _optional_int(request.query.get("topicID"), "topicID")
        if topic is not None:
            principal.require("read", str(topic), f"topic {topic}")
        name = request.query.get("name") or None
        rows = [row for row in self.listing(topic, name)
                if principal.can("read", str(row["topic"]))]
        if self.executors is not None and rows:
            await self.executors.read(self._count_lags, rows)
        return web.json_response(rows)

    def _count_lags(self, rows: Sequence[dict[str, Any]]) -> None:
        """Make each row's ``lag`` the messages after its position, not the difference of
        broker indexes (shared by every topic, so the difference overstates it). Reads the
        topics' indexes: on a read thread."""
        for row in rows:
            topic = self.broker.topic(row["topic"])
            if topic is None:
                continue
            try:
                row["lag"] = topic.count_after(row["index"])
            except MessagingError:  # damaged or deleted under us: the index difference
                continue

    @requires("admin")
    async def reset(self, request: web.Request) -> web.Response:
        """PUT /messaging/consumers/{name}?topicID=T&index=I: set a position, also backwards."""
        name = check_name(request.match_info.get("name"))
        topic = _required_int(request.query.get("topicID"), "topicID")
        index = _required_int(request.query.get("index"), "index")
        await self.log.apply(consumer_command(RESET, topic, name, index))
        return web.json_response({"topic": topic, "name": name, "index": index})

    @requires("admin")
    async def delete(self, request: web.Request) -> web.Response:
        """DELETE /messaging/consumers/{name} (optional topicID): forget a consumer."""
        name = check_name(request.match_info.get("name"))
        topic = _optional_int(request.query.get("topicID"), "topicID")
        known = [row["topic"] for row in self.listing(topic, name)]
        if not known:
            where = f" in topic {topic}" if topic is not None else ""
            raise NotFoundError(f"no consumer {name!r}{where}")
        await self.log.apply(consumer_command(DELETE, topic, name))
        return web.json_response({"name": name, "topics": known})


def _optional_int(value: str | None, name: str) -> int | None:
    if value is None or value == "":
        return None
    if not (value.isascii() and value.isdigit() and len(value) <= 20) or int(value) >= 2**64:
        raise BadRequestError(f"invalid {name} {value!r}: expected an unsigned integer")
    return int(value)


def _required_int(value: str | None, name: str) -> int:
    number = _optional_int(value, name)
    if number is None:
        raise BadRequestError(f"missing parameter {name}")
    return number
