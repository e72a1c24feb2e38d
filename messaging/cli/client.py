"""The client-side commands of ``messaging``: publish, tail, consumers, topics, ping — their
arguments, and the modules that run them (:mod:`~messaging.cli.quick` and
:mod:`~messaging.cli.publish`, :mod:`~messaging.cli.tail`, :mod:`~messaging.cli.consumers`,
:mod:`~messaging.cli.listings`), imported only when the command runs.

Each takes its brokers as an optional first argument, ``--url`` (a list), ``$MESSAGING_URL``
or a saved context (:mod:`messaging.cli.contexts`), learns the cluster's other nodes from the
first that answers (:mod:`messaging.cli.connect`, whose ``RELEARN_INTERVAL`` is importable from
here too), and fails over between them as the Python client does: refused connections and
503/504 answers go to the next node, publishes are idempotent. Every failure is one line on
standard error, ``messaging: <message>``, and exit status 1 (:mod:`messaging.cli.runner`).
"""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING

from messaging.cli.arguments import add_connection_options, add_positionals
from messaging.cli.connect import RELEARN_INTERVAL
from messaging.cli.runner import runner
from messaging.failover import DEFAULT_RETRY_TIMEOUT

if TYPE_CHECKING:
    from messaging.cli.parsing import Parser

__all__ = ["BATCH_SIZE", "LINGER", "RELEARN_INTERVAL", "add_consumers_command",
           "add_ping_command", "add_publish_command", "add_tail_command", "add_tail_options",
           "add_topics_command"]

#: Lines of standard input gathered into one publish request (at most), and how long the
#: first line of a request waits for more.
BATCH_SIZE = 1000
LINGER = 0.1
#: The message types a publish may give; from 0x8000 up they are the broker's own.
MAX_TYPE = 0x7FFF


def add_publish_command(sub: argparse._SubParsersAction[Parser], help_text: str) -> None:
    """Register ``messaging publish``."""
    p = sub.add_parser(
        "publish", help=help_text,
        description="Publish DATA, or every line of standard input when DATA is omitted: lines "
                    "are gathered into batches (each stored all or nothing, sent again after "
                    "a failover and stored once) and a summary is printed at the end; Ctrl-C "
                    "stops reading and says how many lines were stored. TOPIC is a topic id "
                    "or a stream name.")
    add_positionals(p, "TOPIC", "DATA")
    p.add_argument("--type", type=_message_type, default=1, metavar="TYPE",
                   help=f"message type, 0 to {MAX_TYPE} (default 1)")
    p.add_argument("--batch-size", type=_positive, default=BATCH_SIZE, metavar="N",
                   help=f"lines per request at most (default {BATCH_SIZE}); a request also "
                        "ends at the broker's request size limit")
    p.add_argument("--linger", type=_seconds, default=LINGER, metavar="DURATION",
                   help=f"how long a line waits for more before its batch goes (default "
                        f"{LINGER * 1000:g}ms; for slow writers such as a terminal)")
    p.add_argument("--quiet", action="store_true", help="print nothing when all went well")
    add_connection_options(p)
    p.set_defaults(run=runner("messaging.cli.quick", "publish"), shape=("topic", "data"))


def add_tail_command(sub: argparse._SubParsersAction[Parser], help_text: str) -> None:
    """Register ``messaging tail``."""
    p = sub.add_parser(
        "tail", help=help_text,
        description="Print a topic's messages (TOPIC: a topic id or a stream name) from "
                    "--from (default: the first kept), from --since a time, or the last N; "
                    "--follow keeps waiting for new ones and rides out broker restarts and "
                    "failovers.")
    add_positionals(p, "TOPIC")
    add_tail_options(p)
    add_connection_options(p)
    p.set_defaults(run=runner("messaging.cli.tail", "run_tail"), shape=("topic",))


def add_tail_options(p: argparse.ArgumentParser) -> None:
    """Where ``tail`` starts and stops, and how it prints (``stream tail`` takes them too)."""
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
    p.add_argument("--retry", type=_retry, default=None, metavar="DURATION|forever",
                   help="how long to wait for a broker that is down before giving up (default "
                        f"forever with --follow, else {DEFAULT_RETRY_TIMEOUT:g}s)")
    p.add_argument("--format", choices=["text", "json"], default="text",
                   help="text: index, type, data (UTF-8, else hex); json: one object a line, "
                        "with the append time (ms since the epoch; null if unknown)")
    p.add_argument("--times", action="store_true",
                   help="text: print each message's append time (RFC 3339, UTC) after its "
                        "index")
    p.add_argument("--commit-every", type=_positive, default=1, metavar="N",
                   help="with --consumer: commit after every N messages printed, and at the "
                        "end (default 1)")


def add_consumers_command(sub: argparse._SubParsersAction[Parser], help_text: str) -> None:
    """Register ``messaging consumers``."""
    p = sub.add_parser("consumers", help=help_text,
                       description="List every consumer's stored position (of TOPIC), the "
                                   "topic's last index, the lag (messages after the position) "
                                   "and when it was last seen.")
    add_positionals(p, "TOPIC", optional=True)
    p.add_argument("--reset", metavar="NAME",
                   help="set NAME's position in TOPIC to --to (also backwards)")
    p.add_argument("--to", type=_index, metavar="INDEX", help="the index --reset sets")
    p.add_argument("--delete", metavar="NAME",
                   help="forget NAME (in TOPIC, or in every topic)")
    p.add_argument("--format", choices=["text", "json"], default="text")
    add_connection_options(p)
    p.set_defaults(run=runner("messaging.cli.consumers", "run_consumers"), shape=("topic",))


def add_topics_command(sub: argparse._SubParsersAction[Parser], help_text: str) -> None:
    """Register ``messaging topics``."""
    p = sub.add_parser("topics", help=help_text)
    add_positionals(p)
    add_connection_options(p)
    p.set_defaults(run=runner("messaging.cli.listings", "run_topics"), shape=())


def add_ping_command(sub: argparse._SubParsersAction[Parser], help_text: str) -> None:
    """Register ``messaging ping``."""
    p = sub.add_parser("ping", help=help_text)
    add_positionals(p)
    add_connection_options(p)
    p.set_defaults(run=runner("messaging.cli.listings", "run_ping"), shape=())


def _message_type(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) > MAX_TYPE:
        raise argparse.ArgumentTypeError(
            f"{text} is not a message type: 0 to {MAX_TYPE} (from {MAX_TYPE + 1} up the "
            "types are the broker's own)")
    return int(text)


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
    from messaging.clock import parse_moment  # datetime: only for a command line with --since

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
    from messaging.config import parse_duration  # the one duration parser (only when given)

    value = parse_duration(text)
    if not value < 3600:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: at most 1h")
    return value


def _retry(text: str) -> float:
    if text == "forever":
        return math.inf
    from messaging.config import parse_duration  # the one duration parser (only when given)

    return parse_duration(text)
