"""Who a Kafka connection is, and what it may do: SASL/PLAIN with the broker's tokens.

With ``--tokens``, a connection must authenticate before anything but ApiVersions and the SASL
exchange: SaslHandshake (v1) with mechanism PLAIN, then SaslAuthenticate whose password is a
broker token (the user name is not checked: the token names its holder). The token's scopes
then apply as over HTTP, a Kafka topic's name being the target: ``read=NAME`` to fetch, list
offsets, see it in Metadata and describe it; ``write=NAME`` to produce to it (and create it,
which ``admin`` may too); ``consume=GROUP`` to be a member of a group and commit its offsets;
``admin`` for everything, deleting topics among it. A topic a token may not use answers
TOPIC_AUTHORIZATION_FAILED, a group GROUP_AUTHORIZATION_FAILED. The token is looked up again
on every request, so one revoked (the tokens file changed) ends its connections at once.

Without ``--tokens`` every connection may do everything, as over HTTP.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Protocol

from messaging.errors import MessagingError


class Principal(Protocol):
    """A token's holder (:class:`messaging.http.auth.Principal` is one)."""

    @property
    def name(self) -> str:
        """The token's name."""
        ...

    def can(self, kind: str, target: str | None = None) -> bool:
        """Whether it holds ``kind`` for ``target``."""
        ...


#: The principal of a token (MessagingError when the token is not valid).
Authenticate = Callable[[str], Principal]


class Everyone:
    """The principal of every connection of a broker without tokens."""

    name = "anyone"

    def can(self, kind: str, target: str | None = None) -> bool:
        """Everything is allowed."""
        return True


EVERYONE = Everyone()
_current: ContextVar[Principal | None] = ContextVar("kafka_principal", default=None)


def allowed(kind: str, target: str | None = None) -> bool:
    """Whether the connection being served may do ``kind`` to ``target``."""
    principal = _current.get()
    return principal is not None and principal.can(kind, target)


def serve_as(principal: Principal | None) -> None:
    """Make ``principal`` the connection's for the requests that follow (in this task)."""
    _current.set(principal)


class AuthenticationError(Exception):
    """A SASL exchange that fails: answered, then the connection is closed."""


def plain_password(auth_bytes: bytes) -> str:
    """The password of a SASL/PLAIN message (``authzid NUL authcid NUL password``)."""
    parts = auth_bytes.split(b"\x00")
    if len(parts) != 3 or not parts[2]:
        raise AuthenticationError("malformed SASL/PLAIN message: expected "
                                  "authzid NUL user NUL password")
    try:
        return parts[2].decode()
    except UnicodeDecodeError as err:
        raise AuthenticationError("the SASL/PLAIN password is not UTF-8") from err


def authenticate(check: Authenticate, password: str) -> Principal:
    """The principal of a token (AuthenticationError with the broker's reason)."""
    try:
        return check(password)
    except MessagingError as err:
        raise AuthenticationError(str(err)) from err
