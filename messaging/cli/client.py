"""The client-side commands of ``messaging``: publish, tail, consumers, topics, ping.

Every failure is one line on standard error, ``messaging: <message>``, and exit status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from messaging.client.client import Client
from messaging.errors import MessagingError
from messaging.frames import Message

Command = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]


def add_client_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register publish, tail, topics and ping."""
    p = sub.add_parser("publish", help="publish messages",
                       description="Publish DATA, or each line of standard input when DATA is "
                                   "omitted; prints the index of every message.")
    p.add_argument("url", metavar="URL")
    p.add_argument("topic", metavar="TOPIC", type=_topic)
    p.add_argument("data", metavar="DATA", nargs="?")
    p.add_argument("--type", type=int, default=1, help="message type (default 1)")
    add_connection_options(p)
    p.set_defaults(run=_runner(_publish))

    p = sub.add_parser("tail", help="print a topic's messages",
                       description="Print messages from --from (default: the first kept); "
                                   "--follow keeps waiting for new ones.")
    p.add_argument("url", metavar="URL")
    p.add_argument("topic", metavar="TOPIC", type=_topic)
    p.add_argument("--from", dest="start", type=_topic, default=0, metavar="INDEX",
                   help="first index to print (default 0: the first kept)")
    p.add_argument("--follow", action="store_true", help="wait for new messages")
    p.add_argument("--format", choices=["text", "json"], default="text",
                   help="text: index, type, data (UTF-8, else hex); json: one object a line")
    p.add_argument("--consumer", metavar="NAME",
                   help="start right after NAME's stored position and commit what is printed "
                        "as NAME's position (instead of --from)")
    p.add_argument("--commit-every", type=_positive, default=1, metavar="N",
                   help="with --consumer: commit after every N messages printed, and at the "
                        "end (default 1)")
    add_connection_options(p)
    p.set_defaults(run=_runner(_tail))

    p = sub.add_parser("consumers", help="list, reset or delete stored consumer positions",
                       description="List every consumer's stored position (of TOPIC), the "
                                   "topic's last index, the lag and when it was last seen.")
    p.add_argument("url", metavar="URL")
    p.add_argument("topic", metavar="TOPIC", type=_topic, nargs="?")
    p.add_argument("--reset", metavar="NAME",
                   help="set NAME's position in TOPIC to --to (also backwards)")
    p.add_argument("--to", type=_topic, metavar="INDEX", help="the index --reset sets")
    p.add_argument("--delete", metavar="NAME",
                   help="forget NAME (in TOPIC, or in every topic)")
    p.add_argument("--format", choices=["text", "json"], default="text")
    add_connection_options(p)
    p.set_defaults(run=_runner(_consumers))

    p = sub.add_parser("topics", help="list topics")
    p.add_argument("url", metavar="URL")
    add_connection_options(p)
    p.set_defaults(run=_runner(_topics))

    p = sub.add_parser("ping", help="check a broker and list the cluster's URLs")
    p.add_argument("url", metavar="URL")
    add_connection_options(p)
    p.set_defaults(run=_runner(_ping))


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    """``--token`` and ``--ca``, shared by every client command."""
    parser.add_argument("--token", default=os.environ.get("MESSAGING_TOKEN"),
                        help="bearer token (default $MESSAGING_TOKEN)")
    parser.add_argument("--ca", type=Path, default=os.environ.get("MESSAGING_CA"),
                        metavar="FILE", help="CA file that signed the broker's certificate "
                        "(https URLs; default $MESSAGING_CA, else the system's CAs)")


def _client(args: argparse.Namespace, **options: Any) -> Client:
    """A Client for the command's URL, token and CA."""
    return Client(args.url, token=args.token, ca=args.ca, **options)


def _runner(command: Command) -> Callable[[argparse.Namespace], int]:
    """Run ``command``; a failure becomes one line ``messaging: <message>`` and status 1."""

    def run(args: argparse.Namespace) -> int:
        try:
            return asyncio.run(command(args))
        except (BrokenPipeError, KeyboardInterrupt):
            raise  # the caller handles these: a closed pipe is not an error
        except MessagingError as err:
            return _fail(str(err))
        except Exception as err:  # a bug, but still no traceback for a user
            return _fail(f"unexpected error ({type(err).__name__}: {err})")

    return run


def _fail(message: str) -> int:
    print(f"messaging: {' '.join(message.split())}", file=sys.stderr, flush=True)
    return 1


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}: expected a positive integer")
    return int(text)


def _topic(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"invalid number {text!r}: expected an unsigned integer")
    return int(text)


async def _publish(args: argparse.Namespace) -> int:
    async with _client(args) as client:
        if args.data is not None:
            print(await client.publish(args.topic, args.data.encode(), args.type))
            return 0
        loop = asyncio.get_running_loop()
        while line := await loop.run_in_executor(None, sys.stdin.buffer.readline):
            index = await client.publish(args.topic, line.rstrip(b"\r\n"), args.type)
            print(index, flush=True)
    return 0


def format_message(message: Message, fmt: str) -> str:
    """One output line of ``messaging tail``."""
    try:
        text, encoding = message.data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        text, encoding = "", "binary"
    if fmt == "json":
        record: dict[str, Any] = {"index": message.index, "topic": message.topic,
                                  "type": message.type}
        if encoding == "utf-8":
            record["data"] = text
        else:
            record["data_base64"] = base64.b64encode(message.data).decode()
        return json.dumps(record)
    shown = text if encoding == "utf-8" else "0x" + message.data.hex()
    return f"{message.index}\t{message.type}\t{shown}"


async def _tail(args: argparse.Namespace) -> int:
    if args.consumer is not None and args.start:
        return _fail("give --from or --consumer, not both")
    if args.consumer == "":
        return _fail("--consumer needs a name")
    async with _client(args) as client:
        # With --consumer, commits are explicit (heartbeat_interval 0): only what was printed.
        conn = client.conn(args.topic, heartbeat_interval=0, consumer=args.consumer)
        await conn.open(index=args.start, streaming=args.follow)
        printed = 0
        try:
            async for message in conn:
                print(format_message(message, args.format),
                      flush=args.follow or args.consumer is not None)
                printed += 1
                if args.consumer is not None and printed % args.commit_every == 0:
                    await conn.commit(message.index)
        finally:
            await conn.close()  # commits the last message printed, with --consumer
    return 0


async def _consumers(args: argparse.Namespace) -> int:
    async with _client(args) as client:
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
            print(json.dumps(row))
        return 0
    print(f"{'TOPIC':>8} {'INDEX':>12} {'LAST':>12} {'LAG':>10} {'IDLE':>9}  NAME")
    for c in consumers:
        idle = c.get("idle")
        shown = f"{idle:.1f}s" if isinstance(idle, int | float) else "?"
        if c.get("live") is False:
            shown += "*"
        print(f"{c.get('topic', '?'):>8} {c.get('index', '?'):>12} {c.get('last_index', '?'):>12} "
              f"{c.get('lag', '?'):>10} {shown:>9}  {c.get('name', '?')}")
    return 0


async def _topics(args: argparse.Namespace) -> int:
    async with _client(args) as client:
        topics = await client.topics()
    print(f"{'TOPIC':>8} {'FIRST':>12} {'LAST':>12} {'SIZE':>14} {'SEGMENTS':>8}  SUBSCRIBERS")
    for t in topics:
        subscribers = t.get("subscribers")
        subs = "-"
        if isinstance(subscribers, dict) and subscribers:
            subs = ", ".join(f"{u}@{i}" for u, i in sorted(subscribers.items()))
        print(f"{t.get('id', '?'):>8} {t.get('first_index', '?'):>12} "
              f"{t.get('last_index', '?'):>12} {t.get('size', '?'):>14} "
              f"{t.get('segments', '?'):>8}  {subs}")
    return 0


async def _ping(args: argparse.Namespace) -> int:
    async with _client(args, retry_timeout=3.0) as client:
        for url in await client.ping():
            print(url)
    return 0
