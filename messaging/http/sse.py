"""Server-Sent Events: the encoder shared by every SSE answer, and native topics read as SSE.

:func:`event` is how an event is written, by the Durable Streams reads
(:mod:`messaging.http.streams`) and by ``GET /messaging/messages?topicID=T&format=sse``
(:func:`send_topic`), which follows a native topic as a browser's ``EventSource`` reads it:

- one ``data`` event per message, ``id:`` its broker index (so a reconnecting
  ``EventSource`` sends ``Last-Event-ID`` and resumes right after it); the data as text when it
  is UTF-8, else a ``data-base64`` event carrying it in base64;
- after each batch a ``control`` event, JSON ``{"nextIndex": N, "upToDate": true|false}``
  (``nextIndex`` as :mod:`messaging.json_ids` writes integers: a string from 2^53 up);
- a ``: keepalive`` comment after :data:`KEEPALIVE` seconds without an event, so proxies and
  load balancers keep an idle stream open.
"""

from __future__ import annotations

import asyncio
import base64
import re

from aiohttp import web

from messaging import json_ids
from messaging.frames import decode_verified
from messaging.http.executors import Executors
from messaging.topic.view import ReaderView

#: Seconds without an event after which a keepalive comment is written.
KEEPALIVE = 15.0
#: Bytes read from a topic's files per step.
SSE_CHUNK = 64 << 10
CONTENT_TYPE = "text/event-stream"
#: The event a message whose data is not UTF-8 comes as (its data in base64).
BASE64_EVENT = "data-base64"
_LINE_END = re.compile(r"\r\n|\r|\n")


def event(name: str, payload: str, event_id: str | None = None) -> str:
    """One SSE event: its name, optional id, and ``payload`` as data lines (CR, LF and CRLF
    all end a line in SSE, so each line of the payload is a ``data:`` line of its own)."""
    head = f"event: {name}\n" + (f"id: {event_id}\n" if event_id is not None else "")
    lines = _LINE_END.split(payload)
    return head + "".join(f"data:{line}\n" for line in lines) + "\n"


def message_event(index: int, data: bytes) -> str:
    """A native message as an event: ``data`` (UTF-8 text) or ``data-base64``."""
    try:
        return event("data", data.decode("utf-8"), str(index))
    except UnicodeDecodeError:
        return event(BASE64_EVENT, base64.b64encode(data).decode("ascii"), str(index))


def control_event(next_index: int, up_to_date: bool) -> str:
    """Where a reader resumes, and whether it has caught up with the topic."""
    return event("control", json_ids.dumps({"nextIndex": next_index, "upToDate": up_to_date},
                                           separators=(",", ":")))


async def send_topic(response: web.StreamResponse, reader: ReaderView, first: bytes,
                     executors: Executors) -> None:
    """Write a topic's messages from ``reader`` as events, ``first`` (its first chunk, already
    read) first, and follow the topic until it closes or the reader reaches its end."""
    topic = reader.topic
    chunk: bytes | memoryview = first
    if not chunk:  # say at once that the stream is open and where it stands
        await response.write(control_event(reader.last_index + 1, True).encode())
    while True:
        if chunk:
            messages = decode_verified(bytes(chunk))
            out = [message_event(m.index, m.data) for m in messages]
            out.append(control_event(reader.last_index + 1,
                                     reader.last_index >= topic.committed_index))
            await response.write("".join(out).encode())
        elif reader.done or topic.closed:
            return
        else:
            try:
                await asyncio.wait_for(topic.wait_for(reader.last_index), KEEPALIVE)
            except TimeoutError:
                await response.write(b": keepalive\n\n")
                continue
        tail = reader.read_tail()
        chunk = tail if tail is not None else await executors.read(reader.read, SSE_CHUNK)
