"""How a client command runs and ends: its positionals placed, its module imported (only now:
see :mod:`messaging.cli.main`), its coroutine run, and any failure turned into one line on
standard error, ``messaging: <message>``, and exit status 1.

A failure whose cure is an option of the command says which (:func:`explain`): a token the
broker refuses names ``--token-file``, a certificate it cannot verify ``--ca``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from messaging.cli.arguments import place_positionals
from messaging.errors import ConnectionFailedError, MessagingError

if TYPE_CHECKING:
    import ssl

#: A client command: its parsed arguments in; its exit status out, or the coroutine that
#: makes it (run in an event loop of its own).
Command = Callable[[argparse.Namespace], int | Coroutine[Any, Any, int]]


def runner(module: str, name: str) -> Callable[[argparse.Namespace], int]:
    """Run the command ``name`` of ``module`` (imported when it runs); a failure becomes one
    line ``messaging: <message>`` and status 1."""

    def run(args: argparse.Namespace) -> int:
        try:
            place_positionals(args)
            command: Command = getattr(importlib.import_module(module), name)
            outcome = command(args)
            if isinstance(outcome, Coroutine):
                import asyncio  # a command settled without a loop never loads it

                return asyncio.run(outcome)
            return outcome
        except (BrokenPipeError, KeyboardInterrupt):
            raise  # the caller handles these: a closed pipe is not an error
        except MessagingError as err:
            return fail(explain(err, args))
        except Exception as err:  # a bug, but still no traceback for a user
            return fail(f"unexpected error ({type(err).__name__}: {err})")

    return run


def explain(err: MessagingError, args: argparse.Namespace) -> str:
    """``err``'s message, and which option would cure it when that is the command line's
    part: the token (``--token-file``) or the CA (``--ca``). ``args.target`` is what the
    command connected with (:func:`messaging.cli.connect.connect` keeps it there)."""
    target = getattr(args, "target", None)
    if err.status == 401:
        source = target.token_source if target is not None else None
        if source is None:
            return ("the broker requires a token: give one with --token-file FILE (or --token, "
                    "$MESSAGING_TOKEN, a context's token file)")
        return (f"the broker refused the token from {source} ({err}): give a valid one with "
                "--token-file FILE")
    refused = _certificate_refusal(err) if isinstance(err, ConnectionFailedError) else None
    if refused is None:
        return str(err)
    code, reason = getattr(refused, "verify_code", None), getattr(refused, "verify_message", "")
    if code == _HOSTNAME_MISMATCH:
        return f"{err} ({reason})"  # a certificate for another name: no CA cures that
    ca = target.ca if target is not None else None
    why = "; ".join(filter(None, [reason, f"CA file {ca}" if ca is not None else ""]))
    return (f"{err}{f' ({why})' if why else ''}: give the CA that signed the broker's "
            "certificate with --ca FILE")


#: OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH: a certificate for another name (no CA cures it).
_HOSTNAME_MISMATCH = 62


def _certificate_refusal(err: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate verification that made a connection fail, if one did: the innermost
    among the causes of ``err`` (the one OpenSSL raised, with its reason)."""
    import ssl  # the HTTP client that failed has loaded it already

    found: ssl.SSLCertVerificationError | None = None
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, ssl.SSLCertVerificationError):
            found = cause
        cause = cause.__cause__ or cause.__context__
    return found


def fail(message: str) -> int:
    """Say ``message`` (:func:`note`); the exit status of a failed command."""
    note(message)
    return 1


def note(message: str) -> None:
    """One line on standard error, ``messaging: <message>`` (its whitespace folded)."""
    print(f"messaging: {' '.join(message.split())}", file=sys.stderr, flush=True)
