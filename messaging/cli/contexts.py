"""Where the client commands connect: broker URL lists, tokens and CAs, and named contexts.

A context names a cluster the way ``kubectl``/``rpk``/``nats`` contexts do: its broker URLs, a
token file and a CA file, saved in ``contexts.json`` in the user's config directory
(``$MESSAGING_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/messaging``, else
``~/.config/messaging``), readable by the user only (0600; the directory 0700). The file
holds paths to secrets, never the secrets themselves.

A command's brokers come from, by precedence (the command line first, then the
environment, then saved settings): a URL given as its first argument or with ``--url``
(repeatable, comma-separated; a bare ``HOST:PORT`` is ``http://HOST:PORT``), the context
named by ``--context``, ``$MESSAGING_URL``, the context named by ``$MESSAGING_CONTEXT``, the
current context (``messaging context use``), then ``http://127.0.0.1:8086`` (what ``make
run`` starts). The token: ``--token``,
``--token-file``, the context's token file when ``--context`` names it,
``$MESSAGING_TOKEN``, the context's token file. The CA likewise: ``--ca``, ``$MESSAGING_CA``,
the context's.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from messaging.errors import ClientConfigError, InvalidURLError, MessagingError
from messaging.failover import base_url, unique
from messaging.files import read_json, write_json_atomic

if TYPE_CHECKING:
    from messaging.cli.parsing import Parser

#: The broker a command talks to when nothing names one: where ``make run`` listens.
DEFAULT_URL = "http://127.0.0.1:8086"
CONTEXTS_FILE = "contexts.json"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: A broker given without a scheme, as ``rpk`` and ``nats`` take them: ``HOST:PORT`` (a name,
#: an IPv4 address or a bracketed IPv6 address, and a port), taken as ``http://HOST:PORT``.
_HOST_PORT = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])"
                        r":[0-9]{1,5}")


def config_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The directory of the user's messaging settings."""
    env = os.environ if environ is None else environ
    if env.get("MESSAGING_CONFIG_DIR"):
        return Path(env["MESSAGING_CONFIG_DIR"])
    if env.get("XDG_CONFIG_HOME"):
        return Path(env["XDG_CONFIG_HOME"]) / "messaging"
    return Path(env.get("HOME") or Path.home()) / ".config" / "messaging"


def parse_urls(texts: Iterable[str]) -> list[str]:
    """Broker URLs from arguments that may each be a comma-separated list; ``HOST:PORT``
    without a scheme is ``http://HOST:PORT``."""
    urls = [part.strip() for text in texts for part in text.split(",") if part.strip()]
    return unique(base_url(with_scheme(url)) for url in urls)


def with_scheme(url: str) -> str:
    """``url``, with ``http://`` in front when it is a bare ``HOST:PORT``."""
    return f"http://{url}" if _HOST_PORT.fullmatch(url) else url


def looks_like_urls(text: str) -> bool:
    """Whether a positional argument is a URL list rather than a topic: ``scheme://...``, or
    only ``HOST:PORT`` words (``127.0.0.1:8086,127.0.0.1:8087``)."""
    if "://" in text:
        return True
    parts = [part.strip() for part in text.split(",")]
    return all(_HOST_PORT.fullmatch(part) for part in parts)


@dataclass
class Context:
    """A named cluster: where it is and how to authenticate to it."""

    urls: list[str]
    token_file: str | None = None
    ca: str | None = None

    def saved(self) -> dict[str, Any]:
        """The context as stored in the file."""
        return {"urls": self.urls, "token_file": self.token_file, "ca": self.ca}


@dataclass
class Contexts:
    """The contexts file: every context and the current one."""

    path: Path
    contexts: dict[str, Context] = field(default_factory=dict)
    current: str | None = None

    @classmethod
    def load(cls, directory: Path | None = None) -> Contexts:
        """Read the file (an empty set when there is none)."""
        path = (directory or config_dir()) / CONTEXTS_FILE
        if not path.exists():
            return cls(path)
        try:
            data = read_json(path)
        except OSError as err:
            raise ClientConfigError(f"cannot read {path}: {(err.strerror or str(err)).lower()}"
                                    ) from err
        except ValueError as err:
            raise ClientConfigError(f"{path} is not JSON ({err}): fix or remove it") from err
        try:
            contexts = {name: Context(parse_urls(c["urls"]), c.get("token_file"), c.get("ca"))
                        for name, c in data["contexts"].items()}
            current = data.get("current")
        except (KeyError, TypeError, AttributeError, InvalidURLError) as err:
            raise ClientConfigError(f"{path} is not a contexts file ({err}): fix or remove it"
                                    ) from err
        return cls(path, contexts, current if current in contexts else None)

    def save(self) -> None:
        """Write the file atomically, readable by the user only."""
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_json_atomic(self.path, {
                "current": self.current,
                "contexts": {name: c.saved() for name, c in sorted(self.contexts.items())}})
        except OSError as err:
            raise ClientConfigError(f"cannot write {self.path}: "
                                    f"{(err.strerror or str(err)).lower()}") from err

    def get(self, name: str) -> Context:
        """The context called ``name``; a one-line error listing the known ones otherwise."""
        found = self.contexts.get(name)
        if found is None:
            known = ", ".join(sorted(self.contexts)) or "none yet: messaging context add NAME"
            raise ClientConfigError(f"no context {name!r} (known: {known})")
        return found


@dataclass(frozen=True)
class Target:
    """What a client command connects to, and with what."""

    urls: list[str]
    token: str | None
    ca: Path | None
    #: Where the URLs came from, for messages ("--url", "context prod", "the default").
    source: str
    #: Where the token came from ("--token-file t", "$MESSAGING_TOKEN", ...; None: no token).
    token_source: str | None = None


def add_target_options(parser: argparse.ArgumentParser) -> None:
    """``--url``, ``--context``, ``--token``, ``--token-file``, ``--ca``."""
    group = parser.add_argument_group("connection")
    group.add_argument("--url", action="append", default=[], metavar="URL[,URL...]",
                       help="broker URLs (repeat or comma-separate; default $MESSAGING_URL, "
                            f"the current context, else {DEFAULT_URL}); the cluster's other "
                            "nodes are learned from the first that answers")
    group.add_argument("--context", default=None, metavar="NAME",
                       help="use this saved context (default $MESSAGING_CONTEXT, else the "
                            "current one: messaging context use NAME)")
    group.add_argument("--token", default=None,
                       help="bearer token (default $MESSAGING_TOKEN, else the context's)")
    group.add_argument("--token-file", type=Path, default=None, metavar="FILE",
                       help="read the bearer token from FILE")
    group.add_argument("--ca", type=Path, default=None, metavar="FILE",
                       help="CA file that signed the broker's certificate (https URLs; "
                            "default $MESSAGING_CA, the context's, else the system's CAs)")


def resolve(args: argparse.Namespace, environ: Mapping[str, str] | None = None,
            directory: Path | None = None) -> Target:
    """The URLs, token and CA a command uses (see the module docstring for precedence)."""
    env = os.environ if environ is None else environ
    given = [args.url_arg] if getattr(args, "url_arg", None) else []
    given += getattr(args, "url", [])
    flagged = getattr(args, "context", None) or None  # --context: the command line wins
    context: Context | None = None
    context_name = flagged or env.get("MESSAGING_CONTEXT") or None
    if flagged is not None or not (given or env.get("MESSAGING_URL")):
        contexts = Contexts.load(directory)
        name = context_name or contexts.current
        if name is not None:
            context = contexts.get(name)
            context_name = name
    try:
        if given:
            urls, source = parse_urls(given), "--url"
        elif flagged is not None and context is not None:
            urls, source = context.urls, f"context {context_name}"
        elif env.get("MESSAGING_URL"):
            urls, source = parse_urls([env["MESSAGING_URL"]]), "$MESSAGING_URL"
        elif context is not None:
            urls, source = context.urls, f"context {context_name}"
        else:
            urls, source = [DEFAULT_URL], "the default"
    except InvalidURLError as err:
        raise ClientConfigError(str(err)) from err
    token, token_source = _token(args, env, context, context_name, flagged is not None)
    ca = getattr(args, "ca", None) or (context.ca if flagged and context else None) or (
        env.get("MESSAGING_CA") or (context.ca if context is not None else None))
    return Target(urls, token, Path(ca) if ca else None, source, token_source)


def _token(args: argparse.Namespace, env: Mapping[str, str], context: Context | None,
           context_name: str | None, flagged: bool) -> tuple[str | None, str | None]:
    """The token a command sends and where it came from (see the module docstring)."""
    token = getattr(args, "token", None)
    if token is not None:
        return token, "--token"
    token_file = getattr(args, "token_file", None)
    if token_file is not None:
        return read_token(Path(token_file)), f"--token-file {token_file}"
    saved = (f"the token file of context {context_name} ({context.token_file})"
             if context is not None and context.token_file else None)
    if flagged and context is not None and context.token_file:
        return read_token(Path(context.token_file)), saved
    if env.get("MESSAGING_TOKEN"):
        return env["MESSAGING_TOKEN"], "$MESSAGING_TOKEN"
    if context is not None and context.token_file:
        return read_token(Path(context.token_file)), saved
    return None, None


def read_token(path: Path) -> str:
    """The token a token file holds (its first non-empty line)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ClientConfigError(f"cannot read token file {path}: "
                                f"{(err.strerror or str(err)).lower()}") from err
    except UnicodeDecodeError as err:
        raise ClientConfigError(f"token file {path} is not text") from err
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            return line.strip().removeprefix("token:").strip()
    raise ClientConfigError(f"token file {path} holds no token")


# -- messaging context ... ------------------------------------------------------------------


def add_context_command(sub: argparse._SubParsersAction[Parser], help_text: str) -> None:
    """Register ``messaging context add|use|list|show|remove``."""
    p = sub.add_parser(
        "context", help=help_text,
        description="A context names a cluster: its broker URLs, a token file and a CA file. "
                    "Client commands use the current context when no URL is given. Saved in "
                    f"{config_dir() / CONTEXTS_FILE} (readable by you only; "
                    "$MESSAGING_CONFIG_DIR moves it).")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = actions.add_parser("add", help="save a context (replacing one of that name)")
    add.add_argument("name", metavar="NAME")
    add.add_argument("--url", action="append", required=True, metavar="URL[,URL...]",
                     help="the cluster's broker URLs (repeat or comma-separate)")
    add.add_argument("--token-file", type=Path, metavar="FILE",
                     help="a file holding the token (its path is saved, not the token)")
    add.add_argument("--ca", type=Path, metavar="FILE", help="CA file for https brokers")
    add.add_argument("--use", action="store_true",
                     help="also make it the current context (the first context added always "
                          "becomes the current one)")
    add.set_defaults(run=_add)
    use = actions.add_parser("use", help="make a context the current one")
    use.add_argument("name", metavar="NAME")
    use.set_defaults(run=_use)
    show = actions.add_parser("show", help="print a context (default: the current one)")
    show.add_argument("name", metavar="NAME", nargs="?")
    show.set_defaults(run=_show)
    listing = actions.add_parser("list", help="list the contexts (* marks the current one)")
    listing.set_defaults(run=_list)
    remove = actions.add_parser("remove", help="forget a context")
    remove.add_argument("name", metavar="NAME")
    remove.set_defaults(run=_remove)


def _check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise MessagingError(f"invalid context name {name!r}: letters, digits, '.', '_', '-' "
                             "(up to 64, starting with a letter or digit)")
    return name


def _existing(path: Path | None, what: str) -> str | None:
    if path is None:
        return None
    if not path.is_file():
        raise MessagingError(f"{what} {path} does not exist")
    return str(path.resolve())


def _add(args: argparse.Namespace) -> int:
    contexts = Contexts.load()
    name = _check_name(args.name)
    try:
        urls = parse_urls(args.url)
    except InvalidURLError as err:
        raise MessagingError(str(err)) from err
    if args.token_file is not None:
        read_token(args.token_file)  # refuse a file that holds none now, not at first use
    contexts.contexts[name] = Context(urls, _existing(args.token_file, "token file"),
                                      _existing(args.ca, "CA file"))
    if args.use or contexts.current is None:
        contexts.current = name
    contexts.save()
    current = " (current)" if contexts.current == name else ""
    print(f"context {name}{current}: {', '.join(urls)}")
    return 0


def _use(args: argparse.Namespace) -> int:
    contexts = Contexts.load()
    contexts.get(args.name)
    contexts.current = args.name
    contexts.save()
    print(f"using context {args.name}")
    return 0


def _show(args: argparse.Namespace) -> int:
    contexts = Contexts.load()
    name = args.name or contexts.current
    if name is None:
        raise MessagingError("no current context: messaging context use NAME")
    context = contexts.get(name)
    print(f"name:       {name}{' (current)' if name == contexts.current else ''}")
    print(f"urls:       {', '.join(context.urls)}")
    print(f"token file: {context.token_file or '-'}")
    print(f"ca:         {context.ca or '-'}")
    return 0


def _list(_args: argparse.Namespace) -> int:
    contexts = Contexts.load()
    for name, context in sorted(contexts.contexts.items()):
        mark = "*" if name == contexts.current else " "
        print(f"{mark} {name}\t{', '.join(context.urls)}")
    return 0


def _remove(args: argparse.Namespace) -> int:
    contexts = Contexts.load()
    contexts.get(args.name)
    del contexts.contexts[args.name]
    if contexts.current == args.name:
        contexts.current = None
    contexts.save()
    print(f"removed context {args.name}")
    return 0
