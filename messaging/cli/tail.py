"""``messaging tail``: print a topic's messages (or a stream's) from where the command line
says — the first kept, the latest, an index, a time, the last N, or a consumer's stored
position — once, or ``--follow``ing new ones through broker restarts and failovers.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import math
from typing import Any

from messaging.aio import cancel_and_wait
from messaging.cli.arguments import label
from messaging.cli.connect import connect, keep_learning, learn_nodes
from messaging.cli.runner import fail, note
from messaging.client.client import Client
from messaging.clock import format_moment
from messaging.errors import NotFoundError
from messaging.failover import DEFAULT_RETRY_TIMEOUT
from messaging.frames import Message
from messaging.json_ids import dumps


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
    if args.since is not None and not args.follow:
        return await _since_start(client, args)
    if args.start in (None, "earliest") and args.last is None:
        return 0  # also --since with --follow: the read itself finds where to start
    try:
        info = await client.topic(args.topic, last=args.last)
    except NotFoundError:
        if args.follow:
            return 0 if args.last is not None or args.start == "latest" else int(args.start)
        note(f"{label(args.topic)} does not exist")
        return None
    last = int(info.get("last_index") or 0)
    if args.last is not None:
        return int(info.get("index") or 0) if last else 0
    if args.start == "latest":
        return last + 1
    start = int(args.start)
    if start > last and not args.follow:
        note(f"{label(args.topic)} ends at index {last}: nothing from index {start} on "
             "(--follow waits for it)")
        return None
    return start


async def _since_start(client: Client, args: argparse.Namespace) -> int | None:
    """``--since`` without ``--follow``: 0 (the read finds where that time starts) when the
    topic has a message appended since, else None, said on standard error."""
    try:
        info = await client.topic(args.topic, at=args.since)
    except NotFoundError:
        note(f"{label(args.topic)} does not exist")
        return None
    if info.get("index") is None:
        last = int(info.get("last_index") or 0)
        note(f"{label(args.topic)} ends at index {last}: nothing appended since "
             f"{format_moment(args.since)} (--follow waits for it)")
        return None
    return 0


async def run_tail(args: argparse.Namespace) -> int:
    """``messaging tail``: print messages until the end, ``--limit``, or (``--follow``) an
    interrupt."""
    if args.consumer == "":
        return fail("--consumer needs a name")
    if args.consumer is None and args.commit_every != 1:
        return fail("--commit-every goes with --consumer NAME")
    retry = args.retry if args.retry is not None else (
        math.inf if args.follow else DEFAULT_RETRY_TIMEOUT)
    async with connect(args, retry_timeout=retry) as client:
        await learn_nodes(client)
        index = 0 if args.consumer is not None else await start_index(client, args)
        if index is None:
            return 0
        # With --consumer, commits are explicit (heartbeat_interval 0): only what was printed.
        timed = args.format == "json" or args.times
        conn = client.conn(args.topic, heartbeat_interval=0,
                           consumer=args.consumer, times=timed)
        if args.follow:  # a long wait says so; a short read fails with one line
            conn.on_wait = lambda err: note(
                f"waiting for the broker ({err}); retrying "
                + ("forever" if math.isinf(retry) else f"for {retry:g} s"))
            conn.on_resume = lambda: note("reading again")
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
