"""``messaging stream create|delete|head|tail``: named streams (the Durable Streams protocol at
``/v1/stream/{name}``, see the README's "Durable Streams") from the command line.

``create`` makes a stream with a content type and a TTL (or an expiry time), as ``PUT`` does;
a stream that exists with the same settings is left as it is, one with others is an error.
``delete`` removes it (an admin token); ``head`` prints its metadata; ``tail`` prints its
messages as ``messaging tail`` does, with the same options (``--follow`` waits for more and
rides out restarts). Appends are ``messaging publish URL NAME [DATA]``.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from messaging.cli.arguments import add_connection_options, add_positionals, stream_path
from messaging.cli.client import add_tail_options
from messaging.cli.runner import runner
from messaging.errors import MessagingError
from messaging.headers import (
    CONTENT_TYPE_HEADER,
    STREAM_CLOSED_HEADER,
    STREAM_EXPIRES_AT_HEADER,
    STREAM_NEXT_OFFSET_HEADER,
    STREAM_TTL_HEADER,
)

if TYPE_CHECKING:
    from messaging.cli.parsing import Parser

#: What ``create`` gives a stream when ``--content-type`` is not given (the protocol's).
DEFAULT_CONTENT_TYPE = "application/octet-stream"


def add_stream_command(sub: argparse._SubParsersAction[Parser], help_text: str) -> None:
    """Register ``messaging stream create|delete|head|tail``."""
    stream = sub.add_parser(
        "stream", help=help_text,
        description="Named streams, as the Durable Streams protocol serves them at "
                    "/v1/stream/NAME: create one, delete it, show its metadata, or print its "
                    "messages. Append with: messaging publish [URL] NAME [DATA].")
    actions = stream.add_subparsers(dest="action", required=True, metavar="ACTION")

    p = actions.add_parser(
        "create", help="create a stream (left as it is if it exists alike)",
        description="Create the stream NAME (PUT /v1/stream/NAME). One that exists with the "
                    "same settings is left as it is; one with other settings is an error.")
    add_positionals(p, "NAME")
    p.add_argument("--content-type", default=DEFAULT_CONTENT_TYPE, metavar="TYPE",
                   help=f"the media type of its messages (default {DEFAULT_CONTENT_TYPE}; "
                        "application/json stores one message per array element)")
    expiry = p.add_mutually_exclusive_group()
    expiry.add_argument("--ttl", type=_ttl, metavar="DURATION",
                        help="delete it after this long without a read or a write: 3600s, "
                             "90m, 12h, 7d (whole seconds)")
    expiry.add_argument("--expires-at", metavar="TIME",
                        help="delete it at this RFC 3339 time (2026-12-31T23:59:59Z)")
    add_connection_options(p)
    p.set_defaults(run=runner(__name__, "run_create"), shape=("name",))

    p = actions.add_parser("delete", help="delete a stream (admin)",
                           description="Delete the stream NAME (DELETE /v1/stream/NAME); "
                                       "forks that still read it keep it, soft-deleted.")
    add_positionals(p, "NAME")
    add_connection_options(p)
    p.set_defaults(run=runner(__name__, "run_delete"), shape=("name",))

    p = actions.add_parser("head", help="show a stream's metadata",
                           description="Print the stream's content type, next offset, TTL, "
                                       "expiry and whether it is closed (HEAD "
                                       "/v1/stream/NAME).")
    add_positionals(p, "NAME")
    p.add_argument("--format", choices=["text", "json"], default="text")
    add_connection_options(p)
    p.set_defaults(run=runner(__name__, "run_head"), shape=("name",))

    p = actions.add_parser(
        "tail", help="print a stream's messages",
        description="Print the stream's messages as messaging tail prints a topic's: from "
                    "--from (default: the first), from --since a time, or the last N; "
                    "--follow keeps waiting for new ones and rides out broker restarts.")
    add_positionals(p, "NAME")
    add_tail_options(p)
    add_connection_options(p)
    p.set_defaults(run=runner(__name__, "run_tail"), shape=("name",))


def _ttl(text: str) -> int:
    """A ``--ttl`` in whole seconds."""
    from messaging.config import parse_duration

    seconds = parse_duration(text)
    if seconds < 0 or seconds != int(seconds):
        raise argparse.ArgumentTypeError(f"invalid --ttl {text!r}: whole seconds (90s, 15m)")
    return int(seconds)


def stream_name(text: str) -> str:
    """A stream's name as the command line gives it (:class:`MessagingError` if it cannot
    be one)."""
    if not text or text != text.strip() or any(c in text for c in "?#") or len(text) > 1024:
        raise MessagingError(f"invalid stream name {text!r}")
    return text


async def run_create(args: argparse.Namespace) -> int:
    """``messaging stream create``: PUT the stream; say whether it was made or found."""
    from messaging.cli.connect import connect

    name = stream_name(args.name)
    headers = {CONTENT_TYPE_HEADER: args.content_type}
    if args.ttl is not None:
        headers[STREAM_TTL_HEADER] = str(args.ttl)
    if args.expires_at is not None:
        headers[STREAM_EXPIRES_AT_HEADER] = args.expires_at
    async with connect(args) as client:
        response = await client.request("PUT", stream_path(name), data=b"", headers=headers,
                                        write=True)
    shown = response.headers.get(CONTENT_TYPE_HEADER, args.content_type)
    if response.status == 201:
        print(f"created stream {name!r} ({shown})")
    else:
        print(f"stream {name!r} exists ({shown}), as asked")
    return 0


async def run_delete(args: argparse.Namespace) -> int:
    """``messaging stream delete``: DELETE the stream (not retried once sent)."""
    from messaging.cli.connect import connect

    name = stream_name(args.name)
    async with connect(args) as client:
        await client.request("DELETE", stream_path(name), write=True, idempotent=False)
    print(f"deleted stream {name!r}")
    return 0


async def run_head(args: argparse.Namespace) -> int:
    """``messaging stream head``: the stream's metadata."""
    name = stream_name(args.name)
    found = await _head(args, name)
    ttl = found.get(STREAM_TTL_HEADER.lower())
    described: dict[str, Any] = {
        "name": name,
        "content_type": found.get(CONTENT_TYPE_HEADER.lower()),
        "next_offset": found.get(STREAM_NEXT_OFFSET_HEADER.lower()),
        "ttl": int(ttl) if ttl is not None and ttl.isdigit() else None,
        "expires_at": found.get(STREAM_EXPIRES_AT_HEADER.lower()),
        "closed": found.get(STREAM_CLOSED_HEADER.lower(), "").lower() == "true",
    }
    if args.format == "json":
        print(json.dumps(described))
        return 0
    print(f"stream {name!r}")
    for key, value in described.items():
        if key == "name":
            continue
        if key == "ttl" and value is not None:
            value = f"{value} s"
        elif key == "closed":
            value = "yes" if value else "no"
        print(f"  {key.replace('_', '-'):<14} {'-' if value is None else value}")
    return 0


async def run_tail(args: argparse.Namespace) -> int:
    """``messaging stream tail``: ``messaging tail`` of the stream."""
    from messaging.cli.tail import run_tail as tail

    name = stream_name(args.name)
    if name.isascii() and name.isdigit():
        raise MessagingError(f"stream {name!r}: a name of digits only reads as a topic id "
                             f"here; read it with GET /v1/stream/{name}")
    await _head(args, name)  # "stream 'x' not found" rather than a topic id's error
    args.topic = name
    return await tail(args)


async def _head(args: argparse.Namespace, name: str) -> dict[str, str]:
    """The stream's metadata headers (names in lower case)."""
    from messaging.cli.connect import connect

    async with connect(args) as client:
        response = await client.request("HEAD", stream_path(name))
    return {key.lower(): value for key, value in response.headers.items()}
