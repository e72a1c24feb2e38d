"""Topic management at ``/messaging/topics/{id}``: describe (GET), create or configure (PUT)
and delete (DELETE) one topic, named by its id or, for a named stream, by its name.

Settings and deletions are commands through the log (:mod:`messaging.broker.commands`),
so every node of a cluster applies them, and they survive restarts and snapshots exactly as
publishes do. A stream's topic takes settings like any topic; it is deleted through
``DELETE /v1/stream/{name}`` only (its catalog entry, forks and producers go with it there).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from messaging.broker.commands import configure_command, delete_command, parse_settings
from messaging.broker.state import (
    MAX_MESSAGE_SIZE,
    MAX_SEGMENT_SIZE,
    MAX_TOPIC_SIZE,
    RETENTION_AGE,
    effective,
)
from messaging.broker.view import BrokerView
from messaging.errors import BadRequestError, NotFoundError, TopicDeletedError
from messaging.http.auth import principal_of, requires
from messaging.http.responses import json_answer
from messaging.http.topic_param import readable_reference, resolve, topic_reference
from messaging.log.base import Log
from messaging.placement import NAMED_TOPIC_BASE

#: The handler that describes a topic that exists (its row of the topic list, and ``after``/
#: ``count``/``last`` lookups): :meth:`messaging.http.messages.MessageHandlers.topic`.
Describe = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: The largest settings body read.
_MAX_BODY = 64 << 10


def raise_if_deleted(broker: BrokerView, topic_id: int) -> None:
    """410 for a topic that was deleted and has not been created again (call it when the
    broker has no such topic)."""
    deleted_at = broker.deleted_at(topic_id)
    if deleted_at is not None:
        raise TopicDeletedError(topic_id, deleted_at)


class TopicHandlers:
    """``/messaging/topics/{id}``: one topic's settings and its deletion."""

    def __init__(self, broker: BrokerView, log: Log, max_message_size: int,
                 describe_existing: Describe) -> None:
        self.broker = broker
        self.log = log
        self.max_message_size = max_message_size
        self.describe_existing = describe_existing

    @requires("read")
    async def describe(self, request: web.Request) -> web.Response:
        """GET /messaging/topics/{id}: the topic's row of ``GET /messaging/topics`` (with
        ``after``/``count``/``last`` as before) and ``settings``: each setting's value and
        source (``topic``, ``broker`` or ``default``). 410 for a deleted topic."""
        reference = _reference(request)
        await self.log.read_barrier()
        topic_id = readable_reference(principal_of(request), self.broker, reference,
                                      "topic id")
        topic = self.broker.topic(topic_id)
        if topic is None:
            raise_if_deleted(self.broker, topic_id)
        entry = self.broker.settings(topic_id)
        if topic is not None:
            response = await self.describe_existing(request)
            assert isinstance(response, web.Response) and response.body is not None
            info: dict[str, Any] = json.loads(bytes(response.body))  # type: ignore[arg-type]
        elif self.broker.stream_name(topic_id) is not None or (
                topic_id < NAMED_TOPIC_BASE and entry.settings):
            # A stream before its first append: nothing on disk yet, but it exists. An id
            # in the named range with no stream behind it is no topic (404, as PUT says).
            info = _empty_row(topic_id, self.broker.stream_name(topic_id))
        else:
            raise NotFoundError(f"topic {topic_id} not found")
        info["settings"] = self._effective(topic_id)
        return json_answer(info)

    @requires("admin")
    async def configure(self, request: web.Request) -> web.Response:
        """PUT /messaging/topics/{id}: set (or, with null, reset) settings; creates a native
        topic that does not exist yet, empty (201). Answers like :meth:`describe`."""
        topic_id = resolve(self.broker, _reference(request), "topic id")
        settings = parse_settings(await _json_body(request), self.max_message_size)
        result = await self.log.apply(configure_command(topic_id, settings))
        info = self._row(topic_id)
        info["settings"] = self._effective(topic_id)
        return json_answer(info, status=201 if result.created else 200)

    @requires("admin")
    async def delete(self, request: web.Request) -> web.Response:
        """DELETE /messaging/topics/{id}: delete a native topic (its files, settings and
        subscribers' positions) on every node; readers then get 410. A stream is deleted
        with ``DELETE /v1/stream/{name}``."""
        reference = _reference(request)
        topic_id = resolve(self.broker, reference, "topic id")
        if topic_id >= NAMED_TOPIC_BASE:
            name = self.broker.stream_name(topic_id) or reference
            raise BadRequestError(f"topic {topic_id} holds the stream {name!r}: delete it with "
                                  f"DELETE /v1/stream/{name}")
        if self.broker.topic(topic_id) is None and not self.broker.settings(topic_id).settings:
            raise_if_deleted(self.broker, topic_id)
            raise NotFoundError(f"topic {topic_id} not found")
        await self.log.apply(delete_command(topic_id))
        return json_answer({"id": topic_id, "deleted": True,
                            "deleted_at": self.broker.deleted_at(topic_id)})

    def _row(self, topic_id: int) -> dict[str, Any]:
        topic = self.broker.topic(topic_id)
        if topic is None:
            return _empty_row(topic_id, self.broker.stream_name(topic_id))
        return self.broker.topic_info(topic)

    def _effective(self, topic_id: int) -> dict[str, dict[str, Any]]:
        return effective(self.broker.settings(topic_id), {
            MAX_TOPIC_SIZE: self.broker.max_topic_size,
            RETENTION_AGE: (None if self.broker.retention_age is None
                            else round(self.broker.retention_age * 1000)),
            MAX_SEGMENT_SIZE: self.broker.max_segment_size,
            MAX_MESSAGE_SIZE: self.max_message_size})


def _reference(request: web.Request) -> int | str:
    reference = topic_reference(request.match_info.get("id"), "topic id")
    if reference is None:
        raise BadRequestError("missing topic id")
    return reference


def _empty_row(topic_id: int, name: str | None) -> dict[str, Any]:
    """The row of a topic that holds nothing on disk yet."""
    row: dict[str, Any] = {"name": name} if name is not None else {}
    return row | {"id": topic_id, "first_index": 0, "last_index": 0, "size": 0, "segments": 0,
                  "subscribers": {}}


async def _json_body(request: web.Request) -> Any:
    """The request's JSON body (400 when it is missing, too large or not JSON)."""
    if (request.content_length or 0) > _MAX_BODY:
        raise BadRequestError(f"the settings body is over {_MAX_BODY} bytes")
    body = await request.read()
    if len(body) > _MAX_BODY:
        raise BadRequestError(f"the settings body is over {_MAX_BODY} bytes")
    if not body.strip():
        return {}
    try:
        return json.loads(body)
    except ValueError as err:
        raise BadRequestError(f"the body is not JSON: {err}") from err
