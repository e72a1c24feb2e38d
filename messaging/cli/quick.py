"""``messaging publish``'s entry: one message to a topic in one synchronous request, without
loading the async client; everything else through :mod:`messaging.cli.publish`.

Loading asyncio and aiohttp takes longer than the publish itself (about 0.3 s of the 0.45 s
``messaging publish URL 1 x`` took on a 2-core machine; ``make bench-cli`` measures it). So
one message (DATA) to a topic id is first sent with :mod:`http.client` to the first broker,
as an idempotent publish: producer headers with a new producer id, epoch 0, sequence 0.

If that broker answers with the message's index, that is all. An error answer of the broker's
(4xx, 5xx) is that error, as the client would raise it. Anything else (no connection, a
redirect, 503 or 504, a time-out, an answer that is not a broker's) hands the message to the
async client, which fails over, follows redirects, retries and words connection failures; it
sends the same producer id, epoch and sequence number, so a request that reached a broker
before its answer was lost is stored once.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
from collections.abc import Coroutine
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from messaging.cli.arguments import Topic, new_producer_id, too_large
from messaging.cli.connect import LEARN_TIMEOUT
from messaging.cli.contexts import Target, resolve
from messaging.errors import MessageTooLargeError, MessagingError, error_for_status
from messaging.headers import (
    AUTHORIZATION_HEADER,
    CONTENT_TYPE_HEADER,
    ERROR_HEADER,
    INDEX_HEADER,
    PRODUCER_EPOCH_HEADER,
    PRODUCER_ID_HEADER,
    PRODUCER_SEQ_HEADER,
)

#: An idempotent producer: id, epoch, sequence number.
Producer = tuple[str, int, int]


def publish(args: argparse.Namespace) -> int | Coroutine[Any, Any, int]:
    """``messaging publish``: DATA to a topic id in one request when its first broker takes
    it; otherwise the coroutine of the full command (:func:`messaging.cli.publish.run_publish`)
    for the caller to run."""
    from_stdin = args.data is None
    if from_stdin or not isinstance(args.topic, int):
        return _full(args)
    target = resolve(args)
    args.target = target
    data = os.fsencode(args.data)
    producer: Producer = (new_producer_id(), 0, 0)
    first = target.urls[0]
    try:
        index = publish_once(first, target, args.topic, data, args.type, producer)
    except _Unsettled as unsettled:
        return _full(args, producer=producer, failed=None if unsettled.answered else first)
    print(index)
    return 0


def _full(args: argparse.Namespace, **options: Any) -> Coroutine[Any, Any, int]:
    from messaging.cli.publish import run_publish

    return run_publish(args, **options)


class _Unsettled(Exception):
    """The first broker did not settle the publish: the async client takes it over.
    ``answered``: whether the broker answered at all (a 307, a 503) or the request failed on
    the way (then the client tries that broker last)."""

    def __init__(self, *, answered: bool) -> None:
        super().__init__()
        self.answered = answered


def publish_once(url: str, target: Target, topic: int, data: bytes, type_: int,
                 producer: Producer) -> int:
    """POST ``data`` to ``topic`` at the broker ``url``; the index it was stored at.

    :class:`_Unsettled` for whatever the async client's failover handles; the broker's
    error (as :func:`~messaging.errors.error_for_status` makes it) for an error answer."""
    headers = {CONTENT_TYPE_HEADER: "application/octet-stream",
               PRODUCER_ID_HEADER: producer[0], PRODUCER_EPOCH_HEADER: str(producer[1]),
               PRODUCER_SEQ_HEADER: str(producer[2])}
    query = urlencode({"topicID": topic, "type": type_})
    status, answer, _body = _request(url, target, "POST", f"/messaging/messages?{query}",
                                     data, headers)
    if 200 <= status < 300:
        index = answer.get(INDEX_HEADER.lower(), "")
        if not (index.isascii() and index.isdigit()):
            raise _Unsettled(answered=True)  # not a broker's: the client says what it is
        return int(index)
    if status in (307, 503, 504) or ERROR_HEADER.lower() not in answer:
        raise _Unsettled(answered=True)  # redirects, retries, not a broker: the client's
    error = error_for_status(status, answer, url)
    if isinstance(error, MessageTooLargeError):
        raise MessagingError(too_large("DATA", len(data), topic,
                                       _max_message_size(url, target, topic))) from error
    raise error


def _max_message_size(url: str, target: Target, topic: Topic) -> int | None:
    """The largest message ``topic`` takes (None: the broker did not say)."""
    try:
        status, _answer, body = _request(url, target, "GET",
                                         f"/messaging/topics/{quote(str(topic), safe='')}")
        setting = json.loads(body)["settings"]["max-message-size"]["value"]
    except (_Unsettled, ValueError, KeyError, TypeError):
        return None
    return setting if status == 200 and isinstance(setting, int) else None


def _request(url: str, target: Target, method: str, path: str, body: bytes | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """One request to ``url``: the status, the headers (names in lower case) and the body;
    :class:`_Unsettled` when it fails on the way."""
    sent = dict(headers or {})
    if target.token:
        sent[AUTHORIZATION_HEADER] = f"Bearer {target.token}"
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        if parts.scheme == "https":
            import ssl

            context = ssl.create_default_context(
                cafile=str(target.ca) if target.ca is not None else None)
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                host, parts.port or 443, timeout=LEARN_TIMEOUT, context=context)
        else:
            conn = http.client.HTTPConnection(host, parts.port or 80, timeout=LEARN_TIMEOUT)
        try:
            conn.request(method, path, body=body, headers=sent)
            response = conn.getresponse()
            return (response.status, {k.lower(): v for k, v in response.getheaders()},
                    response.read())
        finally:
            conn.close()
    except (OSError, http.client.HTTPException, ValueError) as err:
        raise _Unsettled(answered=False) from err
