"""``messaging publish``: one message given on the command line, or standard input's lines in
batches, to a topic (framed batches through ``/messaging/messages``) or a named stream (appends
through ``/v1/stream/{name}``); with a summary of what was stored at the end.

Topic publishes are idempotent (explicit producer headers for DATA, the client's producer
lanes for lines) and stream appends carry Durable Streams producer headers, so a request
resent after a failover is stored once. One message to a topic is usually settled before this
module is imported (:mod:`messaging.cli.quick`); it comes here when the first broker did not
settle it, with the producer it was sent as.

Ctrl-C while standard input is being published stops reading, waits for the request in
flight, and says how many lines were stored and the last index (a second Ctrl-C does not
wait); the exit status is then 130.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from messaging.cli.arguments import Topic, label, new_producer_id, stream_path, too_large
from messaging.cli.connect import connect, learn_nodes
from messaging.cli.runner import note
from messaging.cli.stdin import StdinReader
from messaging.errors import MessageTooLargeError, MessagingError, PublishOutcomeUnknownError
from messaging.frames import HARD_MAX_MESSAGE_SIZE
from messaging.headers import (
    CONTENT_TYPE_HEADER,
    PRODUCER_EPOCH_HEADER,
    PRODUCER_ID_HEADER,
    PRODUCER_SEQ_HEADER,
    STREAM_NEXT_OFFSET_HEADER,
)

if TYPE_CHECKING:
    from messaging.client.client import Client

#: The exit status of a publish of standard input that Ctrl-C ended (128 + SIGINT).
INTERRUPTED = 130


async def run_publish(args: argparse.Namespace, *, producer: tuple[str, int, int] | None = None,
                      failed: str | None = None) -> int:
    """``messaging publish``: DATA, or standard input's lines in batches.

    ``producer`` (id, epoch, seq) is what DATA was sent as already, and ``failed`` the broker
    that did not answer it (tried last now): :mod:`messaging.cli.quick`'s first attempt."""
    async with connect(args) as client:
        if failed is not None:
            client.brokers.failed(failed)
        await learn_nodes(client)
        if args.data is not None and isinstance(args.topic, int):
            data = os.fsencode(args.data)
            try:
                published = await client.publish_as(
                    args.topic, [data], producer or (new_producer_id(), 0, 0), args.type)
            except MessageTooLargeError as err:
                limit = await max_message_size(client, args.topic)
                raise MessagingError(too_large("DATA", len(data), args.topic, limit)) from err
            print(published.first)
            return 0
        sink = await Sink.open(client, args.topic, args.type)
        if args.data is not None:  # a stream: its offset after the append
            print((await sink.send([os.fsencode(args.data)])).first)
            return 0
        summary = await publish_lines(sink, args.batch_size, args.linger)
    if summary.interrupted:
        note(summary.interruption(label(args.topic)))
        return INTERRUPTED
    if not args.quiet:
        print(summary.describe(label(args.topic)), flush=True)
    return 0


async def max_message_size(client: Client, topic: Topic) -> int | None:
    """The largest message ``topic`` takes, as its broker says (None: it did not say)."""
    try:
        answer = await client.describe_topic(topic)
        value = answer["settings"]["max-message-size"]["value"]
    except (MessagingError, KeyError, TypeError):
        return None
    return value if isinstance(value, int) else None


class Sink:
    """Where publishes go: a topic (framed batches through ``/messaging/messages``) or a
    named stream (appends through ``/v1/stream/{name}``, with Durable Streams producer
    headers so a resent append is stored once)."""

    def __init__(self, client: Client, topic: Topic, type_: int,
                 content_type: str | None = None) -> None:
        self.client = client
        self.topic = topic
        self.type = type_
        self.content_type = content_type
        self._producer = f"messaging-cli-{time.time_ns():x}"
        self._seq = 0

    @classmethod
    async def open(cls, client: Client, topic: Topic, type_: int) -> Sink:
        """A sink for ``topic``; for a stream, its content type is asked first."""
        if isinstance(topic, int):
            return cls(client, topic, type_)
        response = await client.request("HEAD", stream_path(topic))
        return cls(client, topic, type_, response.headers.get(CONTENT_TYPE_HEADER,
                                                              "application/octet-stream"))

    async def send(self, lines: Sequence[bytes]) -> Sent:
        """Publish ``lines``: one request for a topic or a JSON stream (all or nothing), one
        append per line for any other stream (each append is one message of it)."""
        if isinstance(self.topic, int):
            first, last = await self.client.publish_batch(self.topic, lines, self.type)
            return Sent(1, str(first), str(last))
        if self.content_type is not None and self.content_type.split(";")[0].strip() == (
                "application/json"):
            offset = await self._append(_json_array(lines))
            return Sent(1, offset, offset)
        offsets = [await self._append(line) for line in lines]
        return Sent(len(offsets), offsets[0], offsets[-1])

    async def _append(self, body: bytes) -> str:
        """One append; the stream's offset after it (``Stream-Next-Offset``)."""
        headers = {CONTENT_TYPE_HEADER: self.content_type or "application/octet-stream",
                   PRODUCER_ID_HEADER: self._producer, PRODUCER_EPOCH_HEADER: "0",
                   PRODUCER_SEQ_HEADER: str(self._seq)}
        response = await self.client.request("POST", stream_path(str(self.topic)),
                                             data=body, headers=headers, write=True)
        self._seq += 1
        return response.headers.get(STREAM_NEXT_OFFSET_HEADER, "?")


@dataclass(frozen=True)
class Sent:
    """What one :meth:`Sink.send` stored: in how many requests, and where (a topic's first
    and last index, or a stream's offset after the first and the last append)."""

    requests: int
    first: str
    last: str


def _json_array(lines: Sequence[bytes]) -> bytes:
    values = []
    for number, line in enumerate(lines, 1):
        try:
            values.append(json.loads(line))
        except ValueError as err:
            raise MessagingError(f"line {number} of this batch is not JSON ({err}); a JSON "
                                 "stream takes one JSON value per line") from err
    return json.dumps(values).encode()


class Summary:
    """What a publish of standard input did (and, when Ctrl-C ended it, what it left)."""

    def __init__(self) -> None:
        self.messages = 0
        self.batches = 0
        self.first: str | None = None
        self.last: str | None = None
        self.started = time.monotonic()
        #: Whether Ctrl-C ended it; the lines read then but never sent, and those of a
        #: request a second Ctrl-C stopped waiting for (stored or not: unknown).
        self.interrupted = False
        self.unsent = 0
        self.unknown = 0

    def add(self, count: int, sent: Sent) -> None:
        """``count`` messages were stored as ``sent`` says."""
        self.messages += count
        self.batches += sent.requests
        self.first = sent.first if self.first is None else self.first
        self.last = sent.last

    def describe(self, target: str) -> str:
        """One line: how many, where, how fast."""
        took = max(time.monotonic() - self.started, 1e-6)
        where = ""
        if self.first is not None and target.startswith("topic"):
            where = f", indexes {self.first}..{self.last}"
        elif self.last is not None:
            where = f", offset {self.last} after the last"
        requests = f"{self.batches} request{'s' * (self.batches != 1)}"
        return (f"published {self.messages} message{'s' * (self.messages != 1)} to {target} "
                f"in {requests}{where} ({took:.2f} s, {self.messages / took:,.0f} msg/s)")

    def interruption(self, target: str) -> str:
        """One line for a publish Ctrl-C ended: the lines stored, the last index (a stream:
        its offset after the last), and what was read but not stored."""
        if self.last is None:
            said = f"interrupted: no lines stored in {target}"
        else:
            where = (f"the last at index {self.last}" if target.startswith("topic")
                     else f"offset {self.last} after the last")
            said = (f"interrupted: {self.messages} line{'s' * (self.messages != 1)} stored in "
                    f"{target}, {where}")
        if self.unknown:
            said += (f"; {self.unknown} more were in a request whose answer was not waited "
                     "for (stored or not)")
        if self.unsent:
            said += f"; {self.unsent} line{'s' * (self.unsent != 1)} read were not sent"
        return said


async def publish_lines(sink: Sink, batch_size: int, linger: float) -> Summary:
    """Publish standard input's lines in batches of up to ``batch_size``; a batch goes when
    full, when it reaches the request size limit, or ``linger`` seconds after its first line
    when no more come. A failed batch ends the command and says how far it got.

    The first Ctrl-C (SIGINT) stops reading and sends nothing more once the request in
    flight is answered; a second one stops waiting for that answer. Either way the summary
    says so (:attr:`Summary.interrupted`)."""
    summary = Summary()
    lines: list[bytes] = []
    size = 0
    budget = min(sink.client.max_request_size, 64 << 20) // 2
    in_flight = 0  # lines of the request being sent

    async def send(batch: list[bytes]) -> None:
        """Send ``batch``; one the broker finds too big (its --max-request-size may be below
        what this side assumed) is split in halves, and later batches are kept smaller."""
        nonlocal budget
        try:
            sent = await sink.send(batch)
        except MessageTooLargeError as err:
            if "request body too large" not in str(err):
                raise await _line_too_large(sink, batch, summary.messages) from err
            if len(batch) < 2:
                raise
            budget = max(sum(map(len, batch)) // 2, 1)
            half = len(batch) // 2
            await send(batch[:half])
            await send(batch[half:])
            return
        summary.add(len(batch), sent)

    async def flush() -> None:
        nonlocal lines, size, in_flight
        batch, lines, size = lines, [], 0
        stored = summary.messages
        in_flight = len(batch)
        try:
            await send(batch)
        except PublishOutcomeUnknownError:
            raise
        except MessagingError as err:
            if not summary.messages:
                raise MessagingError(f"{err} (nothing was stored)") from err
            kept = summary.messages - stored
            raise MessagingError(
                f"{err} (after {summary.messages} messages were stored in {summary.batches} "
                f"requests; of this batch of {len(batch)}, {len(batch) - kept} were not)",
            ) from err
        in_flight = 0

    loop = asyncio.get_running_loop()
    reader = StdinReader(loop)
    task = asyncio.current_task()

    def interrupt() -> None:
        if summary.interrupted and task is not None:
            task.cancel()  # a second Ctrl-C: stop waiting for the request in flight
        summary.interrupted = True
        reader.interrupt()

    loop.add_signal_handler(signal.SIGINT, interrupt)
    deadline = 0.0
    gathered: list[bytes] = []  # the complete lines of the last chunk read ...
    taken = 0  # ... and how many of them went into batches
    try:
        while not summary.interrupted:
            if lines:
                chunk = await reader.get(max(deadline - loop.time(), 0.0))
                if chunk is None:  # nothing more came in time: send what there is
                    await flush()
                    continue
            else:
                chunk = await reader.get(None)
                assert chunk is not None
            if chunk == b"":
                break
            gathered, taken = reader.lines(chunk), 0
            for line in gathered:
                if len(line) > HARD_MAX_MESSAGE_SIZE:
                    raise MessagingError(
                        f"line {summary.messages + len(lines) + 1} is {len(line)} bytes: more "
                        f"than any broker takes ({HARD_MAX_MESSAGE_SIZE} bytes)")
                if not lines:
                    deadline = loop.time() + linger
                lines.append(line)
                taken += 1
                size += len(line) + 32
                if len(lines) >= batch_size or size >= budget:
                    await flush()
                    if summary.interrupted:
                        break
        rest = reader.rest()
        if rest is not None:
            lines.append(rest)
        if summary.interrupted:
            summary.unsent = len(lines) + len(gathered) - taken
        elif lines:
            await flush()
    except asyncio.CancelledError:
        if task is None or not summary.interrupted or task.uncancel():
            raise  # not the second Ctrl-C's
        summary.unknown = in_flight
        summary.unsent = len(lines) + len(gathered) - taken
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        reader.stop()
    return summary


async def _line_too_large(sink: Sink, batch: Sequence[bytes], before: int) -> MessagingError:
    """The error for a batch the broker refused for a message over the topic's largest:
    which line (counted from the first of standard input), how big, and the limit."""
    limit = await max_message_size(sink.client, sink.topic)
    sizes = [len(line) for line in batch]
    over = [i for i, size in enumerate(sizes) if limit is None or size > limit]
    i = over[0] if limit is not None and over else sizes.index(max(sizes))
    return MessagingError(too_large(f"line {before + i + 1}", sizes[i], sink.topic, limit))
