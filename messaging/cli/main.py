"""The ``messaging`` command: run a broker, publish, tail, list topics, ping, and the rest.

Every command's module is imported only when that command runs: the parser is built with a
full parser for the command on the command line and a one-line entry for each other
(:func:`build_parser`), so ``messaging --version`` loads no HTTP library and ``messaging
publish`` no server code. ``completion`` builds them all, as do callers of
:func:`build_parser` that name no commands.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING

from messaging import __version__
from messaging.cli.parsing import Parser
from messaging.errors import MessagingError

if TYPE_CHECKING:
    import asyncio

#: Every command: its one-line help, and the module and function that add its parser (as
#: ``add(sub, help)``), imported when the command is used.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "broker": ("run a broker", "messaging.cli.broker", "add_broker_command"),
    "token": ("make, list and revoke bearer tokens", "messaging.cli.tokens",
              "add_token_command"),
    "completion": ("print a shell completion script (bash or zsh)", "messaging.cli.completion",
                   "add_completion_command"),
    "publish": ("publish messages", "messaging.cli.client", "add_publish_command"),
    "tail": ("print a topic's messages", "messaging.cli.client", "add_tail_command"),
    "consumers": ("list, reset or delete stored consumer positions", "messaging.cli.client",
                  "add_consumers_command"),
    "topics": ("list topics", "messaging.cli.client", "add_topics_command"),
    "ping": ("check a broker and list the cluster's URLs", "messaging.cli.client",
             "add_ping_command"),
    "topic": ("create, configure, describe or delete a topic", "messaging.cli.topic",
              "add_topic_command"),
    "stream": ("create, delete, describe or read a named (Durable Streams) stream",
               "messaging.cli.stream", "add_stream_command"),
    "context": ("save and pick clusters to talk to", "messaging.cli.contexts",
                "add_context_command"),
}


def build_parser(commands: Collection[str] | None = None) -> Parser:
    """The argument parser of ``messaging``: the full parser of each of ``commands`` (every
    command when None) and a one-line entry for each other one."""
    parser = Parser(prog="messaging",
                    description="An HTTP messaging broker with durable segmented topics.")
    parser.add_argument("--version", action="version", version=f"messaging {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, module, function) in COMMANDS.items():
        if commands is None or name in commands:
            add: Callable[..., None] = getattr(importlib.import_module(module), function)
            add(sub, help_text)
        else:
            sub.add_parser(name, help=help_text, add_help=False)
    return parser


def command_of(argv: Sequence[str]) -> str | None:
    """The command a command line names: its first word that is not an option (the
    top-level options, ``--help`` and ``--version``, take no value)."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


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
    words = sys.argv[1:] if argv is None else list(argv)
    command = command_of(words)
    args = build_parser([command] if command is not None else []).parse_args(words)
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
