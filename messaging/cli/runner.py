"""How a client command runs and ends: its positionals placed, its coroutine run, and any
failure turned into one line on standard error, ``messaging: <message>``, and exit status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from messaging.cli.arguments import place_positionals
from messaging.errors import MessagingError

#: A client command: its parsed arguments in, its exit status out.
Command = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]


def runner(command: Command) -> Callable[[argparse.Namespace], int]:
    """Run ``command``; a failure becomes one line ``messaging: <message>`` and status 1."""

    def run(args: argparse.Namespace) -> int:
        try:
            place_positionals(args)
            return asyncio.run(command(args))
        except (BrokenPipeError, KeyboardInterrupt):
            raise  # the caller handles these: a closed pipe is not an error
        except MessagingError as err:
            return fail(str(err))
        except Exception as err:  # a bug, but still no traceback for a user
            return fail(f"unexpected error ({type(err).__name__}: {err})")

    return run


def fail(message: str) -> int:
    """Say ``message`` (:func:`note`); the exit status of a failed command."""
    note(message)
    return 1


def note(message: str) -> None:
    """One line on standard error, ``messaging: <message>`` (its whitespace folded)."""
    print(f"messaging: {' '.join(message.split())}", file=sys.stderr, flush=True)
