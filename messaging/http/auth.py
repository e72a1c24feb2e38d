"""Bearer tokens with scopes: who may read, write, consume as whom, or administer.

A tokens file has one token per line, ``NAME sha256:HEX SCOPE...`` (``#`` starts a comment);
only the SHA-256 of a token is stored, never the token. A scope is ``KIND`` (everything) or
``KIND=TARGET[,TARGET...]``:

- ``read=...``, ``write=...``: topic ids (``7``) and stream names or name prefixes
  (``chat``, ``chat/*``: see :func:`matches`); ``read`` also lists topics and consumers,
  pings and reads diagnostics (without paths).
- ``consume=...``: subscriber (consumer) ids, or prefixes (``reporter-*``), that the token
  may heartbeat as; nobody can move another consumer's position.
- ``admin``: retention, resetting and deleting consumers, deleting streams, diagnostics
  with paths, metrics, snapshots.

Every route declares the kind of scope it needs with :func:`requires` (or that it is
:data:`OPEN`); the HTTP layer checks the declaration before the handler runs, so a token
without any scope of that kind is refused before a parameter is read. Handlers then check
the targets (topic id, stream name, consumer id) right after parsing them.

``messaging token create --name N --scope read=1,2 --tokens FILE`` makes a token and adds its
line; ``messaging token list`` and ``messaging token revoke`` show and remove them. The broker
rereads the file on SIGHUP and when it changes (:mod:`messaging.http.token_watch`).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from aiohttp import web

from messaging.errors import ForbiddenError, TokensFileError, UnauthorizedError
from messaging.files import FileVersion, file_version

log = logging.getLogger(__name__)

KINDS = ("read", "write", "consume", "admin")
HASH_PREFIX = "sha256:"
#: What a route that anyone may call declares (no token needed, none looked at).
OPEN = "open"
#: The handler attribute :func:`requires` sets.
_SCOPE_ATTRIBUTE = "required_scope"

H = TypeVar("H", bound=Callable[..., Any])
#: A route's declaration: one kind (or OPEN), or a kind per HTTP method.
Declaration = str | Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Scope:
    """One kind of access, to everything (``targets`` None) or to the targets listed."""

    kind: str
    targets: tuple[str, ...] | None = None

    def allows(self, target: str | None) -> bool:
        """Whether this scope covers ``target`` (a topic id, stream name or consumer id)."""
        if self.targets is None:
            return True
        if target is None:
            return False
        return any(matches(t, target) for t in self.targets)

    def __str__(self) -> str:
        return self.kind if self.targets is None else f"{self.kind}={','.join(self.targets)}"


def matches(pattern: str, target: str) -> bool:
    """Whether a scope's target ``pattern`` covers ``target`` (a topic id, stream name or
    consumer id): the same text; with a trailing ``*``, every target that starts with what
    comes before it (``chat*``: ``chat``, ``chats``, ``chat/a``); and ``NAME/*`` covers
    ``NAME`` itself too, as well as everything under ``NAME/`` (``chat/*``: ``chat`` and
    ``chat/room``, not ``chats``)."""
    if not pattern.endswith("*"):
        return target == pattern
    prefix = pattern[:-1]
    return target.startswith(prefix) or (prefix.endswith("/") and target == prefix[:-1])


def parse_scope(text: str) -> Scope:
    """``KIND`` or ``KIND=TARGET,...`` (raises ValueError with a reason)."""
    kind, sep, rest = text.strip().partition("=")
    kind = kind.strip().lower()
    if kind not in KINDS:
        raise ValueError(f"unknown scope {text!r}: expected one of {', '.join(KINDS)}, "
                         "optionally =TARGET,...")
    if not sep:
        return Scope(kind)
    targets = tuple(t.strip() for t in rest.split(",") if t.strip())
    if not targets:
        raise ValueError(f"scope {text!r} lists no targets")
    if kind == "admin":
        raise ValueError("admin takes no targets")
    return Scope(kind, targets)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request comes from: a token's name and scopes."""

    name: str
    scopes: tuple[Scope, ...] = field(default_factory=tuple)

    def can(self, kind: str, target: str | None = None) -> bool:
        """Whether the principal holds ``kind`` for ``target`` (admin holds everything)."""
        return any(s.kind == "admin" or (s.kind == kind and s.allows(target))
                   for s in self.scopes)

    def holds(self, kind: str) -> bool:
        """Whether the principal holds any scope of ``kind``, whatever its targets (or admin)."""
        return any(s.kind in ("admin", kind) for s in self.scopes)

    def require(self, kind: str, target: str | None = None, what: str = "") -> None:
        """Raise :class:`ForbiddenError` unless :meth:`can`."""
        if not self.can(kind, target):
            where = f" on {what}" if what else (f" on {target}" if target else "")
            raise ForbiddenError(f"token {self.name!r} has no {kind} scope{where}")


def requires(declaration: Declaration) -> Callable[[H], H]:
    """Declare the scope kind a route handler needs: ``read``, ``write``, ``consume``,
    ``admin`` or :data:`OPEN`; or a mapping from HTTP method to one of those, for a handler
    that serves several methods (a method it does not list is answered 405).
    """
    kinds = (declaration,) if isinstance(declaration, str) else tuple(declaration.values())
    for kind in kinds:
        if kind not in (*KINDS, OPEN):
            raise ValueError(f"unknown scope kind {kind!r}: expected one of "
                             f"{', '.join((*KINDS, OPEN))}")
    value: Declaration = (declaration if isinstance(declaration, str)
                          else MappingProxyType({m.upper(): k for m, k in declaration.items()}))

    def declare(handler: H) -> H:
        setattr(handler, _SCOPE_ATTRIBUTE, value)
        return handler

    return declare


def declared_scope(handler: Callable[..., Any]) -> Declaration | None:
    """What a route handler declared with :func:`requires` (None: nothing)."""
    value: Declaration | None = getattr(handler, _SCOPE_ATTRIBUTE, None)
    return value


#: The principal of every request when authentication is off (loopback, no tokens file).
ANYONE = Principal("anonymous", (Scope("admin"),))
#: Where the HTTP layer keeps who sent a request.
PRINCIPAL = web.RequestKey("principal", Principal)


def principal_of(request: web.BaseRequest) -> Principal:
    """Who sent the request (set by the HTTP layer; everyone when auth is off)."""
    principal: Principal = request.get(PRINCIPAL, ANYONE)
    return principal


def hash_token(token: str) -> str:
    """What a tokens file stores of a token."""
    return HASH_PREFIX + hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A new random token (256 bits)."""
    return "msg_" + secrets.token_urlsafe(32)


def token_line(name: str, token: str, scopes: list[Scope]) -> str:
    """The tokens-file line of a token."""
    return f"{name} {hash_token(token)} {' '.join(str(s) for s in scopes)}"


@dataclass(frozen=True, slots=True)
class TokenEntry:
    """One token of a tokens file: its name, the hash of its secret, its scopes, and the line
    (counted from 1) it is on."""

    name: str
    digest: str
    scopes: tuple[Scope, ...]
    line: int


def parse_tokens(text: str, source: str) -> list[TokenEntry]:
    """The tokens of a tokens file's ``text``, in file order (``source`` names the file in
    errors); raises :class:`TokensFileError` naming the first bad line."""
    entries: list[TokenEntry] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) < 3 or not parts[1].startswith(HASH_PREFIX):
            raise TokensFileError(f"{source}:{number}: expected NAME sha256:HEX SCOPE...")
        try:
            scopes = tuple(parse_scope(p) for p in parts[2:])
        except ValueError as err:
            raise TokensFileError(f"{source}:{number}: {err}") from err
        entries.append(TokenEntry(parts[0], parts[1].lower(), scopes, number))
    return entries


def read_tokens_file(path: Path) -> tuple[str, list[TokenEntry]]:
    """The text of the tokens file at ``path`` and its tokens (blocking; raises
    :class:`TokensFileError` when it cannot be read or a line is bad)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else err
        raise TokensFileError(f"cannot read tokens file {path}: {reason}") from err
    return text, parse_tokens(text, str(path))


class Tokens:
    """The tokens of a tokens file, by hash; :meth:`reload` rereads it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._by_hash: dict[str, Principal] = {}
        #: The version of the file the tokens were read from (taken before reading it).
        self.version: FileVersion | None = None
        self.reload()

    def reload(self) -> None:
        """Read the file; on any error keep the tokens read before (and raise)."""
        version = file_version(self.path)
        _text, entries = read_tokens_file(self.path)
        self._by_hash = {e.digest: Principal(e.name, e.scopes) for e in entries}
        self.version = version
        log.info("read %d tokens from %s", len(self._by_hash), self.path)

    def __len__(self) -> int:
        return len(self._by_hash)

    def principal(self, authorization: str | None) -> Principal:
        """The principal of an ``Authorization`` header (401 without a valid token)."""
        if not authorization:
            raise UnauthorizedError("authentication required: send Authorization: Bearer "
                                    "<token>")
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise UnauthorizedError("authentication required: send Authorization: Bearer "
                                    "<token>")
        digest = hash_token(token.strip())
        for stored, principal in self._by_hash.items():
            if hmac.compare_digest(stored, digest):
                return principal
        raise UnauthorizedError("invalid token")
