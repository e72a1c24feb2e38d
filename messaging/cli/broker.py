"""``messaging broker``: its options (every setting of :class:`~messaging.config.BrokerConfig`),
the settings they make with the environment and a config file, and running the broker until
SIGINT or SIGTERM.

Only this command loads the settings module and the server: the other commands never import
them (see :mod:`messaging.cli.main`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from messaging.cli.parsing import Parser
from messaging.config import BrokerConfig, broker_options, load_config, parse_host_port
from messaging.errors import MessagingError

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
In a cluster (--etcd), etcd is the write-ahead log: a publish is acknowledged once etcd
committed it (fsynced on a majority of its members) and this node applied it; the node fsyncs
its own files in groups every --cluster-sync-interval (at checkpoints only under --fsync
never) and rebuilds whatever a crash or power loss took from etcd. Each node reads its
peers' clocks every second: one more than --max-clock-offset from most of them answers
writes 503 (and /readyz says why) until its clock is back, so no clock moves the cluster's
time.

Faults: a full disk answers 507 (reads go on; publishing resumes once space is freed); a
failed write answers 500 and keeps nothing; a failed fsync stops the topic for writes (503)
until a restart re-verifies its files. Nothing from a failed publish ever becomes visible.

Security: without --tokens every request is allowed; that is refused unless --bind is a
loopback address or --insecure is given. --tls-cert/--tls-key serve HTTPS.

Settings come from, by precedence: these options, MESSAGING_<OPTION> environment variables
(MESSAGING_MAX_SEGMENT_SIZE=64M, MESSAGING_BIND=0.0.0.0:8086), a TOML --config file
(max-segment-size = "64M"; see examples/broker.toml), then the defaults shown.

Sizes take K/M/G suffixes (binary: 10M = 10 MiB); durations take ms/s/m/h (default s).
"""


def add_broker_command(sub: argparse._SubParsersAction[Parser], help_text: str) -> None:
    """Register ``messaging broker``."""
    p = sub.add_parser("broker", help=help_text, description=BROKER_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       hint=bind_hint)
    defaults = BrokerConfig()
    # Nothing defaults here: a setting not given comes from the environment, the config file
    # or BrokerConfig (messaging.config.load_config).
    p.add_argument("--bind", type=parse_host_port, default=argparse.SUPPRESS,
                   metavar="HOST:PORT",
                   help=f"HTTP address HOST:PORT (default {defaults.host}:{defaults.port})")
    p.add_argument("--config", type=Path, default=None, metavar="FILE",
                   help="read settings from this TOML file (also $MESSAGING_CONFIG)")
    for name, option, default in broker_options():
        shown = (f" (default {option.show(default)})"
                 if default not in (None, [], False) else "")
        if option.switch:
            p.add_argument(option.flag, dest=name, action="store_true",
                           default=argparse.SUPPRESS, help=option.help)
            continue
        p.add_argument(option.flag, dest=name, type=option.parse or str,
                       default=argparse.SUPPRESS, choices=option.choices,
                       metavar=option.metavar, action="append" if option.repeat else "store",
                       help=option.help + shown)
    p.set_defaults(run=run)


def bind_hint(extras: Sequence[str]) -> str | None:
    """``--port 9000`` and ``--host H`` (as other servers spell them) are ``--bind H:9000``."""
    given: dict[str, str] = {}
    words = list(extras)
    for i, word in enumerate(words):
        flag, equals, value = word.partition("=")
        if flag in ("--port", "--host", "-p"):
            if not equals:
                value = words[i + 1] if i + 1 < len(words) else ""
            given["port" if flag in ("--port", "-p") else "host"] = value
    if not given:
        return None
    defaults = BrokerConfig()
    host = given.get("host") or defaults.host
    port = given.get("port") or str(defaults.port)
    return f"did you mean --bind {host}:{port}?"


def broker_config(args: argparse.Namespace) -> BrokerConfig:
    """The settings of a ``messaging broker`` command line (with the environment and the
    config file), refused at once when they cannot work."""
    explicit = {name: getattr(args, name) for name, _o, _d in broker_options()
                if hasattr(args, name)}
    if hasattr(args, "bind"):
        explicit["host"], explicit["port"] = args.bind
    config_file = args.config or (Path(os.environ["MESSAGING_CONFIG"])
                                  if os.environ.get("MESSAGING_CONFIG") else None)
    config = load_config(explicit, os.environ, config_file)
    if not str(config.data).strip() or config.data == Path():
        # Path("") is the current directory: a broker would scatter its files there.
        raise MessagingError("--data is empty: give the data directory (e.g. --data ./data)")
    config.etcd_settings()  # refuses bad cluster options before anything starts
    from messaging.http.server import check_security  # the server stack: broker only

    check_security(config)
    return config


async def run_broker(config: BrokerConfig) -> None:
    """Run until SIGINT or SIGTERM, then shut down cleanly."""
    from messaging.http.server import BrokerServer

    server = BrokerServer(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # Before start: whoever reads the startup line may stop the broker at once, cleanly.
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    if config.tokens is not None and server.tokens is not None:
        tokens = server.tokens

        def reload_tokens() -> None:
            try:
                tokens.reload()
            except MessagingError as err:
                logging.getLogger("messaging").error("%s; keeping the tokens read before", err)

        loop.add_signal_handler(signal.SIGHUP, reload_tokens)
    # server.start() logged the startup line (messaging.ready: standard output, every level).
    await stop.wait()
    logging.getLogger("messaging").info("shutting down")
    await server.stop()


def run(args: argparse.Namespace) -> int:
    """``messaging broker``: its exit status. A setting that cannot work, or a broker that
    cannot start, is one line on standard error (a JSON line with ``--log-format json``)."""
    from messaging.cli.main import event_loop_factory

    json_lines = False
    try:
        config = broker_config(args)
        from messaging.cli.logging import setup_logging

        setup_logging(config.log_level, config.log_format)
        json_lines = config.log_format == "json"
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            runner.run(run_broker(config))
    except MessagingError as err:
        if json_lines:  # every line of a JSON log is JSON, the last one too
            logging.getLogger("messaging").error("messaging broker: error: %s", err)
        else:
            print(f"messaging broker: error: {err}", file=sys.stderr)
        return 1
    return 0
