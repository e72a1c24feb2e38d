"""``messaging token create|list|revoke``: make bearer tokens and keep the broker's tokens file.

The file format is :mod:`messaging.http.auth`'s (one ``NAME sha256:HEX SCOPE...`` line per
token). Every change rewrites the file atomically (a temporary file with the same permissions
and owner, fsync, rename, directory fsync) under a lock on its directory, so the broker, which
rereads the file when it changes, sees the old file or the new one, and two commands at once
never lose each other's change. Nothing here ever prints a stored hash.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from messaging.errors import MessagingError, TokensFileError
from messaging.files import fsync_dir, write_all, write_bytes_atomic

if TYPE_CHECKING:
    from messaging.cli.parsing import Parser
    from messaging.http.auth import TokenEntry

# messaging.http.auth (the tokens file's format) is imported by the commands that use it: it
# loads the HTTP server library, which the rest of the CLI never needs.

#: How long a command waits for another one changing the same tokens file.
LOCK_TIMEOUT = 10.0
#: What a change tells the user about the broker picking it up.
RELOAD_NOTE = "the broker rereads it within a few seconds (or at once on SIGHUP)"


def add_token_command(sub: argparse._SubParsersAction[Parser], help_text: str) -> None:
    """Register ``token create``, ``token list`` and ``token revoke``."""
    p = sub.add_parser(
        "token", help=help_text,
        description="Make bearer tokens and keep the broker's --tokens file, which stores only "
        "each token's name, hash and scopes. The broker rereads the file when it changes.")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser(
        "create", help="make a new token",
        description="Make a token. Without --tokens: print the token and the line to add to "
        "the tokens file. With --tokens FILE: add the line to FILE (created 0600 when "
        "missing) and print only the token. With --token-file: write the token to a new "
        "0600 file instead of printing it (clients read it with --token-file). The token is "
        "shown this once; the tokens file keeps only its hash.")
    create.add_argument("--name", required=True, help="who the token is for (shown in logs "
                        "and by token list; one word, unique in the file)")
    create.add_argument("--scope", action="append", required=True, metavar="SCOPE",
                        help="read[=TOPICS], write[=TOPICS], consume[=IDS] or admin; TOPICS "
                        "are ids and stream names, IDS subscriber ids; a trailing * is a "
                        "prefix (repeat for several scopes)")
    create.add_argument("--tokens", type=Path, metavar="FILE",
                        help="add the token to this tokens file (the broker's --tokens)")
    create.add_argument("--token-file", type=Path, metavar="FILE",
                        help="write the token to FILE, a new file (0600), instead of "
                        "printing it")
    create.set_defaults(run=create_token)

    listing = actions.add_parser("list", help="show the tokens of a tokens file",
                                 description="Print the name and scopes of every token in "
                                 "FILE, one a line (never the hashes).")
    listing.add_argument("--tokens", type=Path, metavar="FILE", required=True,
                         help="the broker's tokens file")
    listing.set_defaults(run=list_tokens)

    revoke = actions.add_parser("revoke", help="remove a token from a tokens file",
                                description="Remove the token NAME from FILE; the broker "
                                "refuses it (401) once it has reread the file.")
    revoke.add_argument("name", metavar="NAME", help="the token's name (see token list)")
    revoke.add_argument("--tokens", type=Path, metavar="FILE", required=True,
                        help="the broker's tokens file")
    revoke.set_defaults(run=revoke_token)


def create_token(args: argparse.Namespace) -> int:
    """Make a token; print it, and add its line to ``--tokens`` or print the line."""
    from messaging.http.auth import new_token, parse_scope, token_line

    name: str = args.name
    if not name or any(c.isspace() for c in name) or "#" in name:
        raise MessagingError(f"invalid --name {name!r}: one word, without #")
    try:
        scopes = [parse_scope(text) for text in args.scope]
    except ValueError as err:
        raise MessagingError(str(err)) from err
    token = new_token()
    line = token_line(name, token, scopes)
    path: Path | None = args.tokens
    saved: Path | None = args.token_file
    if saved is not None and saved.exists():
        raise MessagingError(f"--token-file {saved} already exists: give a new file")
    if path is None:
        if saved is None:
            print(f"token: {token}")
        else:
            _save(token, saved)
        print("add this line to the broker's tokens file (or use --tokens FILE):")
        print(line)
        return 0
    _add(path, name, line, token, saved)
    if saved is None:
        print(token, flush=True)
    print(f"added token {name!r} ({' '.join(str(s) for s in scopes)}) to {path}; "
          f"{RELOAD_NOTE}", file=sys.stderr)
    return 0


def _add(path: Path, name: str, line: str, token: str, saved: Path | None) -> None:
    """Add ``line`` to the tokens file (refusing a second token called ``name``), after
    writing ``token`` to ``saved`` when given."""
    with _locked(path):
        text, entries, stat = _read_if_present(path)
        if any(e.name == name for e in entries):
            raise MessagingError(f"{path} already has a token named {name!r}: revoke it "
                                 "first or choose another --name")
        separator = "\n" if text and not text.endswith("\n") else ""
        if saved is not None:
            _save(token, saved)  # before the broker may accept it: the token is never lost
        try:
            _replace(path, text + separator + line + "\n", stat)
        except BaseException:
            if saved is not None:
                saved.unlink(missing_ok=True)  # a token no broker knows
            raise


def _save(token: str, saved: Path) -> None:
    """Write the token to ``saved``, a new file only its owner may read."""
    try:
        fd = os.open(saved, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as err:
        raise MessagingError(f"cannot create --token-file {saved}: "
                             f"{err.strerror or err}") from err
    try:
        try:
            write_all(fd, token.encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(saved.parent)
    except OSError as err:
        saved.unlink(missing_ok=True)
        raise MessagingError(f"cannot write --token-file {saved}: "
                             f"{err.strerror or err}") from err
    print(f"wrote the token to {saved} (0600)", file=sys.stderr)


def list_tokens(args: argparse.Namespace) -> int:
    """Print the name and scopes of every token in ``--tokens``."""
    from messaging.http.auth import read_tokens_file

    _text, entries = read_tokens_file(args.tokens)
    width = max([len("NAME"), *(len(e.name) for e in entries)])
    print(f"{'NAME':<{width}}  SCOPES")
    for entry in entries:
        print(f"{entry.name:<{width}}  {' '.join(str(s) for s in entry.scopes)}")
    return 0


def revoke_token(args: argparse.Namespace) -> int:
    """Remove the token named ``args.name`` from ``--tokens``."""
    from messaging.http.auth import read_tokens_file

    path: Path = args.tokens
    with _locked(path):
        text, entries = read_tokens_file(path)
        stat = _stat(path)
        gone = {e.line for e in entries if e.name == args.name}
        if not gone:
            names = ", ".join(e.name for e in entries) or "none"
            raise MessagingError(f"no token named {args.name!r} in {path} (tokens: {names})")
        kept = [line for number, line in enumerate(text.splitlines(keepends=True), 1)
                if number not in gone]
        _replace(path, "".join(kept), stat)
    print(f"revoked token {args.name!r} in {path}; {RELOAD_NOTE}")
    return 0


def _read_if_present(path: Path) -> tuple[str, list[TokenEntry], os.stat_result | None]:
    """The file's text, tokens and status; an empty file (and no status) when missing."""
    from messaging.http.auth import read_tokens_file

    stat = _stat(path)
    if stat is None:
        return "", [], None
    text, entries = read_tokens_file(path)
    return text, entries, stat


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise TokensFileError(f"cannot read tokens file {path}: {err.strerror or err}") from err


def _replace(path: Path, text: str, like: os.stat_result | None) -> None:
    """Replace the tokens file atomically (same permissions and owner; 0600 when new)."""
    try:
        write_bytes_atomic(path, text.encode(), like=like)
    except OSError as err:
        raise TokensFileError(f"cannot write tokens file {path}: {err.strerror or err}") from err


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on the directory of ``path`` (the file itself is replaced, so
    a lock on it would not be seen by the next command)."""
    directory = path.parent
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as err:
        raise TokensFileError(f"cannot open the directory of tokens file {path}: "
                              f"{err.strerror or err}") from err
    try:
        deadline = time.monotonic() + LOCK_TIMEOUT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TokensFileError(f"another command has been changing {path} for "
                                          f"{LOCK_TIMEOUT:.0f} s; try again") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)
