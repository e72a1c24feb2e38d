"""The ``messaging`` command: run a broker, publish, tail, list topics, ping."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from messaging.errors import MessagingError
from messaging.server import BrokerConfig, BrokerServer

_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$", re.IGNORECASE)

BROKER_HELP = """\
Run a broker: publishers POST messages, subscribers stream them; every message is stored in
per-topic segment files of checksummed frames under --data.

Durability (--fsync):
  always    (default) a publish is acknowledged only after its frames are fsynced; concurrent
            publishes share one write and one fsync (group commit). Nothing acknowledged is
            lost on a crash or power failure.
  interval  frames are fsynced every 100 ms; a publish is acknowledged once written. A crash
            of the machine (not just the process) can lose the last 100 ms of acknowledged
            messages.
  never     the operating system decides when to write; a machine crash can lose any amount
            of acknowledged messages. For benchmarks and throwaway data only.

Sizes take K/M/G suffixes (binary: 10M = 10 MiB); durations take ms/s/m/h (default s).
"""


def parse_size(text: str) -> int:
    """``10M``, ``10MiB``, ``1g`` or a plain byte count."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: use e.g. 1048576, 10M, 1G")
    number, unit = int(match.group(1)), match.group(2).lower()
    return number << {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}[unit]


def parse_duration(text: str) -> float:
    """``100ms``, ``10s``, ``10m``, ``1h`` or plain seconds."""
    match = _DURATION.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: use e.g. 500ms, 10s, 10m")
    number, unit = float(match.group(1)), (match.group(2) or "s").lower()
    return number * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]


def positive_duration(text: str) -> float:
    """A duration above zero."""
    seconds = parse_duration(text)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: must be above zero")
    return seconds


def positive_int(text: str) -> int:
    """An integer of at least 1 (ASCII digits)."""
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}: expected an integer >= 1")
    return int(text)


def parse_host_port(text: str) -> tuple[str, int]:
    """``HOST:PORT``."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"invalid address {text!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def raft_address(text: str) -> str:
    """A raft ``HOST:PORT``, validated, kept as text."""
    parse_host_port(text)
    return text


def _broker_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("broker", help="run a broker", description=BROKER_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="./data", help="data directory (default ./data)")
    p.add_argument("--bind", type=parse_host_port, default=("127.0.0.1", 8086),
                   help="HTTP address HOST:PORT (default 127.0.0.1:8086)")
    p.add_argument("--fsync", choices=["always", "interval", "never"], default="always",
                   help="durability mode, see above (default always)")
    p.add_argument("--max-segment-size", type=parse_size, default="10M",
                   help="start a new segment file past this size (default 10M)")
    p.add_argument("--max-topic-size", type=parse_size, default="1G",
                   help="retention deletes old segments of topics above this (default 1G)")
    p.add_argument("--max-message-size", type=parse_size, default="1M",
                   help="largest message data accepted (default 1M)")
    p.add_argument("--max-request-size", type=parse_size, default="64M",
                   help="largest batch publish body accepted (default 64M)")
    p.add_argument("--truncation-interval", type=parse_duration, default="10m",
                   help="how often retention runs (default 10m)")
    p.add_argument("--subscriber-timeout", type=parse_duration, default="10m",
                   help="a subscriber silent this long stops holding data back (default 10m)")
    p.add_argument("--header-timeout", type=positive_duration, default="10s",
                   help="close a connection that has not sent a complete request head "
                        "this long after connecting or after its last response (so idle "
                        "kept-alive connections too; default 10s); requests being served, "
                        "uploads and streams are not affected")
    p.add_argument("--max-connections", type=positive_int, default=10_000, metavar="N",
                   help="connections served at once; more are answered 503 and closed "
                        "(default 10000)")
    p.add_argument("--raft-bind", metavar="HOST:PORT", type=raft_address,
                   help="cluster mode: this node's Raft address")
    p.add_argument("--peer", action="append", default=[], metavar="HOST:PORT", type=raft_address,
                   help="cluster mode: another node's Raft address (repeat per peer)")
    p.add_argument("--advertise", metavar="URL",
                   help="the HTTP URL other nodes and clients use for this node")
    p.add_argument("--raft-snapshot-entries", type=int, default=20_000, metavar="N",
                   help="cluster mode: snapshot the broker after N raft entries (default "
                        "20000); a lagging or new node catches up from the latest snapshot")
    p.add_argument("--log-level", default="INFO",
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="default INFO")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="messaging", description="An HTTP messaging broker with durable segmented topics.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _broker_parser(sub)
    from messaging.cli_client import add_client_commands

    add_client_commands(sub)
    return parser


def _config(args: argparse.Namespace) -> BrokerConfig:
    if args.peer and not args.raft_bind:
        raise MessagingError("--peer needs --raft-bind")
    if not args.data.strip():
        # Path("") is the current directory: a broker would scatter its files there.
        raise MessagingError("--data is empty: give the data directory (e.g. --data ./data)")
    host, port = args.bind
    return BrokerConfig(
        data=Path(args.data), host=host, port=port, fsync=args.fsync,
        max_segment_size=args.max_segment_size, max_topic_size=args.max_topic_size,
        max_message_size=args.max_message_size, max_request_size=args.max_request_size,
        truncation_interval=args.truncation_interval,
        subscriber_timeout=args.subscriber_timeout, advertise=args.advertise,
        raft_bind=args.raft_bind, peers=args.peer,
        raft_snapshot_entries=args.raft_snapshot_entries,
        header_timeout=args.header_timeout, max_connections=args.max_connections)


async def run_broker(config: BrokerConfig) -> None:
    """Run until SIGINT or SIGTERM, then shut down cleanly."""
    server = BrokerServer(config)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"messaging broker listening on {server.url} (data {config.data})", flush=True)
    await stop.wait()
    logging.getLogger("messaging").info("shutting down")
    await server.stop()


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when it is installed (faster HTTP handling), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``messaging`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "broker":
        logging.basicConfig(level=args.log_level,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        try:
            config = _config(args)
            with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
                runner.run(run_broker(config))
        except MessagingError as err:
            print(f"messaging broker: error: {err}", file=sys.stderr)
            return 1
        return 0
    try:
        return int(args.run(args))
    except MessagingError as err:
        print(f"messaging {args.command}: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `messaging tail ... | head`): not an error.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
