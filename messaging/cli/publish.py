"""``messaging publish``: one message given on the command line, or standard input's lines in
batches, to a topic (framed batches through ``/messaging/messages``) or a named stream (appends
through ``/v1/stream/{name}``); with a summary of what was stored at the end.

Topic publishes are idempotent (the client's producer lanes) and stream appends carry Durable
Streams producer headers, so a request resent after a failover is stored once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import quote

from messaging.cli.arguments import Topic, label
from messaging.cli.connect import connect, learn_nodes
from messaging.cli.stdin import StdinReader
from messaging.client.client import Client
from messaging.errors import MessageTooLargeError, MessagingError, PublishOutcomeUnknownError
from messaging.frames import HARD_MAX_MESSAGE_SIZE
from messaging.headers import (
    CONTENT_TYPE_HEADER,
    PRODUCER_EPOCH_HEADER,
    PRODUCER_ID_HEADER,
    PRODUCER_SEQ_HEADER,
    STREAM_NEXT_OFFSET_HEADER,
)

#: Lines of standard input gathered into one publish request (at most), and how long the
#: first line of a request waits for more.
BATCH_SIZE = 1000
LINGER = 0.1


async def run_publish(args: argparse.Namespace) -> int:
    """``messaging publish``: DATA, or standard input's lines in batches."""
    async with connect(args) as client:
        await learn_nodes(client)
        sink = await Sink.open(client, args.topic, args.type)
        if args.data is not None:  # the message's index (a stream: its offset after it)
            print((await sink.send([args.data.encode()])).first)
            return 0
        summary = await publish_lines(sink, args.batch_size, args.linger)
    if not args.quiet:
        print(summary.describe(label(args.topic)), flush=True)
    return 0


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
        response = await client.request("HEAD", _stream_path(topic))
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
        response = await self.client.request("POST", _stream_path(str(self.topic)),
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


def _stream_path(name: str) -> str:
    return "/v1/stream/" + quote(name, safe="/")


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
    """What a publish of standard input did."""

    def __init__(self) -> None:
        self.messages = 0
        self.batches = 0
        self.first: str | None = None
        self.last: str | None = None
        self.started = time.monotonic()

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


async def publish_lines(sink: Sink, batch_size: int, linger: float) -> Summary:
    """Publish standard input's lines in batches of up to ``batch_size``; a batch goes when
    full, when it reaches the request size limit, or ``linger`` seconds after its first line
    when no more come. A failed batch ends the command and says how far it got."""
    summary = Summary()
    lines: list[bytes] = []
    size = 0
    budget = min(sink.client.max_request_size, 64 << 20) // 2

    async def send(batch: list[bytes]) -> None:
        """Send ``batch``; one the broker finds too big (its --max-request-size may be below
        what this side assumed) is split in halves, and later batches are kept smaller."""
        nonlocal budget
        try:
            sent = await sink.send(batch)
        except MessageTooLargeError as err:
            if len(batch) < 2 or "request body too large" not in str(err):
                raise
            budget = max(sum(map(len, batch)) // 2, 1)
            half = len(batch) // 2
            await send(batch[:half])
            await send(batch[half:])
            return
        summary.add(len(batch), sent)

    async def flush() -> None:
        nonlocal lines, size
        batch, lines, size = lines, [], 0
        stored = summary.messages
        try:
            await send(batch)
        except PublishOutcomeUnknownError:
            raise
        except MessagingError as err:
            kept = summary.messages - stored
            raise MessagingError(
                f"{err} (after {summary.messages} messages were stored in {summary.batches} "
                f"requests; of this batch of {len(batch)}, {len(batch) - kept} were not)",
            ) from err

    reader = StdinReader(asyncio.get_running_loop())
    loop = asyncio.get_running_loop()
    deadline = 0.0
    try:
        while True:
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
            for line in reader.lines(chunk):
                if len(line) > HARD_MAX_MESSAGE_SIZE:
                    raise MessagingError(f"a line of {len(line)} bytes is over the largest "
                                         f"message ({HARD_MAX_MESSAGE_SIZE} bytes)")
                if not lines:
                    deadline = loop.time() + linger
                lines.append(line)
                size += len(line) + 32
                if len(lines) >= batch_size or size >= budget:
                    await flush()
        rest = reader.rest()
        if rest is not None:
            lines.append(rest)
        if lines:
            await flush()
    finally:
        reader.stop()
    return summary
