"""The client-side commands of ``messaging``: publish, tail, consumers, topics, ping.

Each takes its brokers as an optional first argument, ``--url`` (a list), ``$MESSAGING_URL``
or a saved context (:mod:`messaging.cli.contexts`), learns the cluster's other nodes from the
first that answers, and fails over between them as the Python client does: refused
connections and 503/504 answers go to the next node, publishes are idempotent. Every failure
is one line on standard error, ``messaging: <message>``, and exit status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import concurrent.futures
import contextlib
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from messaging.aio import cancel_and_wait
from messaging.cli.contexts import Target, add_target_options, looks_like_urls, resolve
from messaging.client.client import Client
from messaging.clock import format_moment, parse_moment
from messaging.errors import (
    ClientConfigError,
    ConnectionFailedError,
    InvalidURLError,
    MessageTooLargeError,
    MessagingError,
    NotABrokerError,
    NotFoundError,
    PublishOutcomeUnknownError,
)
from messaging.failover import DEFAULT_RETRY_TIMEOUT
from messaging.frames import HARD_MAX_MESSAGE_SIZE, Message
from messaging.json_ids import dumps

Command = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]
Topic = int | str

#: How long each broker may take to list the cluster's nodes before the next is asked (a
#: busy node can take seconds; a hung one costs this much once, at the start).
LEARN_TIMEOUT = 5.0
#: How often a following tail asks the cluster for its nodes again (nodes that joined since,
#: or had not registered yet when it started).
RELEARN_INTERVAL = 10.0
#: How long a broker may take to start answering a command's request before it counts as
#: failed and the request goes to the next node (a stopped or hung node).
ANSWER_TIMEOUT = 10.0
#: Lines of standard input gathered into one publish request (at most), and how long the
#: first line of a request waits for more.
BATCH_SIZE = 1000
LINGER = 0.1
_STDIN_CHUNK = 1 << 16


def add_client_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register publish, tail, consumers, topics and ping."""
    p = sub.add_parser(
        "publish", help="publish messages",
        description="Publish DATA, or every line of standard input when DATA is omitted: lines "
                    "are gathered into batches (each stored all or nothing, sent again after "
                    "a failover and stored once) and a summary is printed at the end. TOPIC is "
                    "a topic id or a stream name.")
    _positionals(p, "TOPIC", "DATA")
    p.add_argument("--type", type=int, default=1, help="message type (default 1)")
    p.add_argument("--batch-size", type=_positive, default=BATCH_SIZE, metavar="N",
                   help=f"lines per request at most (default {BATCH_SIZE}); a request also "
                        "ends at the broker's request size limit")
    p.add_argument("--linger", type=_seconds, default=LINGER, metavar="SECONDS",
                   help=f"how long a line waits for more before its batch goes (default "
                        f"{LINGER}; for slow writers such as a terminal)")
    p.add_argument("--quiet", action="store_true", help="print nothing when all went well")
    add_connection_options(p)
    p.set_defaults(run=_runner(_publish), shape=("topic", "data"))

    p = sub.add_parser(
        "tail", help="print a topic's messages",
        description="Print a topic's messages (TOPIC: a topic id or a stream name) from "
                    "--from (default: the first kept), from --since a time, or the last N; "
                    "--follow keeps waiting for new ones and rides out broker restarts and "
                    "failovers.")
    _positionals(p, "TOPIC")
    start = p.add_mutually_exclusive_group()
    start.add_argument("--from", dest="start", type=_start, default=None,
                       metavar="earliest|latest|INDEX",
                       help="where to start: the first kept message (earliest, the default), "
                            "after the last one (latest: only new ones), or a broker index")
    start.add_argument("--last", type=_positive, metavar="N",
                       help="start at the N-th message back from the end")
    start.add_argument("--since", type=_since, metavar="TIME",
                       help="start at the first message appended at or after TIME: a "
                            "duration back from now (15m, 2h, 7d), an RFC 3339 time "
                            "(2026-11-26T10:00:00Z) or milliseconds since the Unix epoch")
    start.add_argument("--consumer", metavar="NAME",
                       help="start right after NAME's stored position and commit what is "
                            "printed as NAME's position")
    p.add_argument("--limit", type=_positive, metavar="N", help="stop after N messages")
    p.add_argument("--follow", action="store_true", help="wait for new messages")
    p.add_argument("--retry", type=_retry, default=None, metavar="SECONDS|forever",
                   help="how long to wait for a broker that is down before giving up (default "
                        f"forever with --follow, else {DEFAULT_RETRY_TIMEOUT:g})")
    p.add_argument("--format", choices=["text", "json"], default="text",
                   help="text: index, type, data (UTF-8, else hex); json: one object a line, "
                        "with the append time (ms since the epoch; null if unknown)")
    p.add_argument("--times", action="store_true",
                   help="text: print each message's append time (RFC 3339, UTC) after its "
                        "index")
    p.add_argument("--commit-every", type=_positive, default=1, metavar="N",
                   help="with --consumer: commit after every N messages printed, and at the "
                        "end (default 1)")
    add_connection_options(p)
    p.set_defaults(run=_runner(_tail), shape=("topic",))

    p = sub.add_parser("consumers", help="list, reset or delete stored consumer positions",
                       description="List every consumer's stored position (of TOPIC), the "
                                   "topic's last index, the lag (messages after the position) "
                                   "and when it was last seen.")
    _positionals(p, "TOPIC", optional=True)
    p.add_argument("--reset", metavar="NAME",
                   help="set NAME's position in TOPIC to --to (also backwards)")
    p.add_argument("--to", type=_index, metavar="INDEX", help="the index --reset sets")
    p.add_argument("--delete", metavar="NAME",
                   help="forget NAME (in TOPIC, or in every topic)")
    p.add_argument("--format", choices=["text", "json"], default="text")
    add_connection_options(p)
    p.set_defaults(run=_runner(_consumers), shape=("topic",))

    p = sub.add_parser("topics", help="list topics")
    _positionals(p)
    add_connection_options(p)
    p.set_defaults(run=_runner(_topics), shape=())

    p = sub.add_parser("ping", help="check a broker and list the cluster's URLs")
    _positionals(p)
    add_connection_options(p)
    p.set_defaults(run=_runner(_ping), shape=())


def _positionals(parser: argparse.ArgumentParser, *names: str, optional: bool = False) -> None:
    """``[URL] NAMES...``: the URL list is optional; whether the first word is one is decided
    by its shape (``scheme://``), see :func:`place_positionals`."""
    parser.add_argument("url_arg", metavar="URL", nargs="?",
                        help="broker URLs, comma-separated (default: --url, $MESSAGING_URL, "
                             "the current context, else http://127.0.0.1:8086)")
    for name in names:
        required = name == "TOPIC" and not optional
        parser.add_argument(name.lower(), metavar=name, nargs=None if required else "?")


def place_positionals(args: argparse.Namespace) -> None:
    """Give the words to the right names when the optional URL was left out
    (``messaging tail orders``): argparse fills URL first."""
    shape: tuple[str, ...] = getattr(args, "shape", ())
    if args.url_arg is None or looks_like_urls(args.url_arg):
        words = [getattr(args, name) for name in shape]
    else:
        words = [args.url_arg, *(getattr(args, name) for name in shape)]
        args.url_arg = None
        if len(words) > len(shape) and words[-1] is not None:
            if not shape:
                raise MessagingError(f"{words[0]!r} is not a broker URL (expected "
                                     "http://HOST:PORT or https://HOST:PORT)")
            raise MessagingError(f"too many arguments: {' '.join(map(str, words))}")
    for name, word in zip(shape, words, strict=False):
        setattr(args, name, word)
    if "topic" in shape and args.topic is not None:
        args.topic = parse_topic(args.topic)


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    """The options every client command shares: where the brokers are and how to
    authenticate (:func:`messaging.cli.contexts.add_target_options`)."""
    add_target_options(parser)


def parse_topic(text: str | int) -> Topic:
    """A topic id (an unsigned 64-bit integer) or a stream name."""
    if isinstance(text, int):
        return text
    if text.isascii() and text.isdigit():
        if int(text) >= 2**64:
            raise MessagingError(f"invalid topic id {text}: above 2^64 - 1")
        return int(text)
    if not text or text != text.strip() or any(c in text for c in "?#") or len(text) > 1024:
        raise MessagingError(f"invalid topic {text!r}: a topic id or a stream name")
    return text


def _client(args: argparse.Namespace, **options: Any) -> Client:
    """A Client for the command's brokers, token and CA."""
    target: Target = resolve(args)
    options.setdefault("timeout", ANSWER_TIMEOUT)
    return Client(target.urls, token=target.token, ca=target.ca, **options)


async def keep_learning(client: Client) -> None:
    """:func:`learn_nodes` every RELEARN_INTERVAL until cancelled; what fails is left to the
    reads, which say so."""
    while True:
        await asyncio.sleep(RELEARN_INTERVAL)
        with contextlib.suppress(MessagingError):
            await learn_nodes(client)


async def learn_nodes(client: Client) -> None:
    """Ask the first broker that answers for the cluster's nodes, so a failover can reach
    nodes the command was not given. A broker that cannot be reached now is the command's
    own error to report (or wait out); a wrong URL (not a broker, TLS mismatch) is reported
    here, at once."""
    try:
        async with asyncio.timeout(LEARN_TIMEOUT * min(len(client.urls), 3)):
            await client.ping(timeout=LEARN_TIMEOUT)
    except ConnectionFailedError as err:
        if err.refused and not client.reached:
            raise  # nothing listens there: the command would say the same, later
        return
    except TimeoutError:
        return
    except (NotABrokerError, ClientConfigError, InvalidURLError):
        raise  # a wrong URL or setting: no use going on
    except MessagingError as err:
        if err.status == 401:
            raise  # a bad token fails every command alike
        return  # a token that may not ping, a 503: the command has its own say


def _runner(command: Command) -> Callable[[argparse.Namespace], int]:
    """Run ``command``; a failure becomes one line ``messaging: <message>`` and status 1."""

    def run(args: argparse.Namespace) -> int:
        try:
            place_positionals(args)
            return asyncio.run(command(args))
        except (BrokenPipeError, KeyboardInterrupt):
            raise  # the caller handles these: a closed pipe is not an error
        except MessagingError as err:
            return _fail(str(err))
        except Exception as err:  # a bug, but still no traceback for a user
            return _fail(f"unexpected error ({type(err).__name__}: {err})")

    return run


def _fail(message: str) -> int:
    _note(message)
    return 1


def _note(message: str) -> None:
    print(f"messaging: {' '.join(message.split())}", file=sys.stderr, flush=True)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}: expected a positive integer")
    return int(text)


def _index(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) >= 2**64:
        raise argparse.ArgumentTypeError(f"invalid index {text!r}: expected an unsigned integer")
    return int(text)


def _since(text: str) -> int:
    """A ``--since`` moment, fixed now (a retried read starts from the same moment)."""
    try:
        return parse_moment(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).replace("invalid time", "invalid --since",
                                                          1)) from None


def _start(text: str) -> str | int:
    if text in ("earliest", "latest"):
        return text
    try:
        return _index(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"invalid --from {text!r}: earliest, latest or a broker index") from None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 3600:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: seconds, 0 to 3600")
    return value


def _retry(text: str) -> float:
    if text == "forever":
        return math.inf
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"invalid --retry {text!r}: seconds or forever")
    return value


def _label(topic: Topic) -> str:
    return f"topic {topic}" if isinstance(topic, int) else f"stream {topic!r}"


# -- publish ---------------------------------------------------------------------------------


async def _publish(args: argparse.Namespace) -> int:
    async with _client(args) as client:
        await learn_nodes(client)
        sink = await Sink.open(client, args.topic, args.type)
        if args.data is not None:  # the message's index (a stream: its offset after it)
            print((await sink.send([args.data.encode()])).first)
            return 0
        summary = await publish_lines(sink, args.batch_size, args.linger)
    if not args.quiet:
        print(summary.describe(_label(args.topic)), flush=True)
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
        return cls(client, topic, type_, response.headers.get("Content-Type",
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
        headers = {"Content-Type": self.content_type or "application/octet-stream",
                   "Producer-Id": self._producer, "Producer-Epoch": "0",
                   "Producer-Seq": str(self._seq)}
        response = await self.client.request("POST", _stream_path(str(self.topic)),
                                             data=body, headers=headers, write=True)
        self._seq += 1
        return response.headers.get("Stream-Next-Offset", "?")


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


class StdinReader:
    """Standard input read on a thread of its own in chunks, handed to the loop.

    A daemon thread, because a read of a terminal or a pipe cannot be interrupted: when the
    command ends early (a failed publish) it is left blocked and ends with the process.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=8)
        self._partial = b""
        self._pending: asyncio.Future[bytes] | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="messaging-stdin", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # The file descriptor, not sys.stdin.buffer: a read left blocked in the buffered
        # object when the command ends holds its lock, and the interpreter's shutdown, which
        # takes that lock, aborts ("could not acquire lock ... daemon threads").
        fd = sys.stdin.fileno()
        while not self._stopped.is_set():
            try:
                chunk = os.read(fd, _STDIN_CHUNK)
            except OSError:
                chunk = b""
            try:
                asyncio.run_coroutine_threadsafe(self._queue.put(chunk), self._loop).result()
            except (RuntimeError, asyncio.CancelledError, concurrent.futures.CancelledError):
                return  # the command ended: its loop is closing or gone
            if not chunk:
                return

    async def get(self, timeout: float | None) -> bytes | None:
        """The next chunk (b"" at the end of input); None when ``timeout`` passed first."""
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._queue.get())
        done, _ = await asyncio.wait({self._pending}, timeout=timeout)
        if not done:
            return None
        chunk, self._pending = self._pending.result(), None
        return chunk

    def lines(self, chunk: bytes) -> list[bytes]:
        """The complete lines ``chunk`` ends (without line ends)."""
        *complete, self._partial = (self._partial + chunk).split(b"\n")
        return [line[:-1] if line.endswith(b"\r") else line for line in complete]

    def rest(self) -> bytes | None:
        """A last line without a newline, if any."""
        rest, self._partial = self._partial, b""
        return rest.removesuffix(b"\r") if rest else None

    def stop(self) -> None:
        """Stop reading (the thread ends after the read it is in)."""
        self._stopped.set()
        if self._pending is not None:
            self._pending.cancel()


# -- tail ------------------------------------------------------------------------------------


def format_message(message: Message, fmt: str, *, times: bool = False) -> str:
    """One output line of ``messaging tail`` (``times``: text lines show the append time)."""
    try:
        text, encoding = message.data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        text, encoding = "", "binary"
    if fmt == "json":
        record: dict[str, Any] = {"index": message.index, "topic": message.topic,
                                  "type": message.type, "time": message.time}
        if encoding == "utf-8":
            record["data"] = text
        else:
            record["data_base64"] = base64.b64encode(message.data).decode()
        return dumps(record)  # ids and indexes of 2^53 and more as strings, as the API does
    shown = text if encoding == "utf-8" else "0x" + message.data.hex()
    if times:
        when = "-" if message.time is None else format_moment(message.time)
        return f"{message.index}\t{when}\t{message.type}\t{shown}"
    return f"{message.index}\t{message.type}\t{shown}"


async def start_index(client: Client, args: argparse.Namespace) -> int | None:
    """The index ``tail`` starts at (0: the first kept), or None when there is nothing to
    print (said on standard error)."""
    if args.start in (None, "earliest") and args.last is None:
        return 0  # also --since: the read itself finds where to start
    try:
        info = await client.topic(args.topic, last=args.last)
    except NotFoundError:
        if args.follow:
            return 0 if args.last is not None or args.start == "latest" else int(args.start)
        _note(f"{_label(args.topic)} does not exist")
        return None
    last = int(info.get("last_index") or 0)
    if args.last is not None:
        return int(info.get("index") or 0) if last else 0
    if args.start == "latest":
        return last + 1
    start = int(args.start)
    if start > last and not args.follow:
        _note(f"{_label(args.topic)} ends at index {last}: nothing from index {start} on "
              "(--follow waits for it)")
        return None
    return start


async def _tail(args: argparse.Namespace) -> int:
    if args.consumer == "":
        return _fail("--consumer needs a name")
    if args.consumer is None and args.commit_every != 1:
        return _fail("--commit-every goes with --consumer NAME")
    retry = args.retry if args.retry is not None else (
        math.inf if args.follow else DEFAULT_RETRY_TIMEOUT)
    async with _client(args, retry_timeout=retry) as client:
        await learn_nodes(client)
        index = 0 if args.consumer is not None else await start_index(client, args)
        if index is None:
            return 0
        # With --consumer, commits are explicit (heartbeat_interval 0): only what was printed.
        timed = args.format == "json" or args.times
        conn = client.conn(args.topic, heartbeat_interval=0,
                           consumer=args.consumer, times=timed)
        if args.follow:  # a long wait says so; a short read fails with one line
            conn.on_wait = lambda err: _note(
                f"waiting for the broker ({err}); retrying "
                + ("forever" if math.isinf(retry) else f"for {retry:g} s"))
            conn.on_resume = lambda: _note("reading again")
        await conn.open(index=index, streaming=args.follow, since=args.since)
        relearn = asyncio.create_task(keep_learning(client)) if args.follow else None
        printed = 0
        try:
            async for message in conn:
                print(format_message(message, args.format, times=args.times),
                      flush=args.follow or args.consumer is not None)
                printed += 1
                if args.consumer is not None and printed % args.commit_every == 0:
                    await conn.commit(message.index)
                if args.limit is not None and printed >= args.limit:
                    break
        finally:
            if relearn is not None:
                await cancel_and_wait(relearn)
            await conn.close()  # commits the last message printed, with --consumer
    return 0


# -- consumers, topics, ping -----------------------------------------------------------------


async def _consumers(args: argparse.Namespace) -> int:
    async with _client(args) as client:
        await learn_nodes(client)
        if args.reset is not None:
            if args.topic is None or args.to is None:
                return _fail("--reset NAME needs TOPIC and --to INDEX")
            await client.reset_consumer(args.reset, args.topic, args.to)
        elif args.delete is not None:
            await client.delete_consumer(args.delete, args.topic)
        elif args.to is not None:
            return _fail("--to goes with --reset NAME")
        consumers = await client.consumers(args.topic)
    if args.format == "json":
        for row in consumers:
            print(dumps(row))
        return 0
    print(f"{'TOPIC':>8} {'INDEX':>12} {'LAST':>12} {'LAG':>10} {'LAG-TIME':>9} {'IDLE':>9}"
          "  NAME")
    for c in consumers:
        idle = c.get("idle")
        shown = f"{idle:.1f}s" if isinstance(idle, int | float) else "?"
        if c.get("live") is False:
            shown += "*"
        behind = _lag_time(c.get("lag_ms"))
        print(f"{c.get('topic', '?'):>8} {c.get('index', '?'):>12} {c.get('last_index', '?'):>12} "
              f"{c.get('lag', '?'):>10} {behind:>9} {shown:>9}  {c.get('name', '?')}")
    return 0


def _lag_time(lag_ms: Any) -> str:
    """How long ago a consumer's first unread message was appended, short (``-``: unknown)."""
    if not isinstance(lag_ms, int):
        return "-"
    seconds = lag_ms / 1000
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= length:
            return f"{seconds / length:.1f}{unit}"
    return f"{seconds:.1f}s"


async def _topics(args: argparse.Namespace) -> int:
    async with _client(args) as client:
        await learn_nodes(client)
        topics = await client.topics()
    print(f"{'TOPIC':>8} {'FIRST':>12} {'LAST':>12} {'SIZE':>14} {'SEGMENTS':>8}  SUBSCRIBERS")
    for t in topics:
        subscribers = t.get("subscribers")
        subs = "-"
        if isinstance(subscribers, dict) and subscribers:
            subs = ", ".join(f"{u}@{i}" for u, i in sorted(subscribers.items()))
        shown = t.get("name") or t.get("id", "?")
        print(f"{shown:>8} {t.get('first_index', '?'):>12} "
              f"{t.get('last_index', '?'):>12} {t.get('size', '?'):>14} "
              f"{t.get('segments', '?'):>8}  {subs}")
    return 0


async def _ping(args: argparse.Namespace) -> int:
    async with _client(args, retry_timeout=LEARN_TIMEOUT) as client:
        for url in await client.ping():
            print(url)
    return 0
