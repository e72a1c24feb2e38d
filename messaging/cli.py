"""The ``messaging`` command: run a broker, publish, tail, list topics, ping."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from messaging.config import BrokerConfig, broker_options, parse_host_port
from messaging.errors import MessagingError
from messaging.server import BrokerServer

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

Faults: a full disk answers 507 (reads go on; publishing resumes once space is freed); a
failed write answers 500 and keeps nothing; a failed fsync stops the topic for writes (503)
until a restart re-verifies its files. Nothing from a failed publish ever becomes visible.

Sizes take K/M/G suffixes (binary: 10M = 10 MiB); durations take ms/s/m/h (default s).
"""


def _broker_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("broker", help="run a broker", description=BROKER_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = BrokerConfig()
    p.add_argument("--bind", type=parse_host_port, default=(defaults.host, defaults.port),
                   metavar="HOST:PORT",
                   help=f"HTTP address HOST:PORT (default {defaults.host}:{defaults.port})")
    for name, option, default in broker_options():
        shown = f" (default {option.show(default)})" if default not in (None, []) else ""
        p.add_argument(option.flag, dest=name, type=option.parse or str, default=default,
                       choices=option.choices, metavar=option.metavar,
                       action="append" if option.repeat else "store",
                       help=option.help + shown)
    p.add_argument("--log-level", default="INFO", type=str.upper,
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
    if not str(args.data).strip() or args.data == Path():
        # Path("") is the current directory: a broker would scatter its files there.
        raise MessagingError("--data is empty: give the data directory (e.g. --data ./data)")
    host, port = args.bind
    config = BrokerConfig(host=host, port=port,
                          etcd_password=os.environ.get("MESSAGING_ETCD_PASSWORD"),
                          **{name: getattr(args, name) for name, _o, _d in broker_options()})
    config.etcd_settings()  # refuses bad cluster options before anything starts
    return config


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
