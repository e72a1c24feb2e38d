"""The arguments every client command shares: an optional broker URL list first, then TOPIC and
the other positionals, the connection options, and what a TOPIC may be (an id or a stream
name) and how messages name it.

The URL list is optional and comes first, so argparse cannot tell ``messaging tail orders``
from ``messaging tail http://host orders`` by position: :func:`place_positionals` decides by
the first word's shape (``scheme://``) once the line is parsed.
"""

from __future__ import annotations

import argparse
import os
from urllib.parse import quote

from messaging.cli.contexts import add_target_options, looks_like_urls
from messaging.errors import MessagingError

#: What a command's TOPIC names: a topic id or a stream's name.
Topic = int | str


def add_positionals(parser: argparse.ArgumentParser, *names: str,
                    optional: bool = False) -> None:
    """``[URL] NAMES...``: the URL list is optional; whether the first word is one is decided
    by its shape (``scheme://``), see :func:`place_positionals`."""
    parser.add_argument("url_arg", metavar="URL", nargs="?",
                        help="broker URLs, comma-separated (default: --url, $MESSAGING_URL, "
                             "the current context, else http://127.0.0.1:8086)")
    for name in names:
        required = name in ("TOPIC", "NAME") and not optional
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
    first = getattr(args, shape[0], None) if shape else None
    if args.url_arg is None and isinstance(first, str) and "://" in first and (
            looks_like_urls(first)):
        raise MessagingError(f"{shape[0].upper()} is missing ({first} is a broker URL)")
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


def stream_path(name: str) -> str:
    """The Durable Streams path of the stream ``name``."""
    return "/v1/stream/" + quote(name, safe="/")


def label(topic: Topic) -> str:
    """How output names ``topic``: ``topic 7`` or ``stream 'orders'``."""
    return f"topic {topic}" if isinstance(topic, int) else f"stream {topic!r}"


def too_large(what: str, size: int, topic: Topic, limit: int | None) -> str:
    """Why ``what`` (``DATA``, ``line 4``) of ``size`` bytes was refused: over the largest
    message ``topic`` takes, its max-message-size (None: a topic that does not exist yet,
    whose limit is the broker's)."""
    shown = (f"max-message-size {limit} bytes" if limit is not None
             else "the broker's --max-message-size")
    return f"{what} is {size} bytes: more than {label(topic)} takes ({shown})"


def new_producer_id() -> str:
    """A producer id of one command's own (a one-message publish, and its retry)."""
    return f"messaging-cli-{os.urandom(12).hex()}"
