"""What can go wrong with an object store, as a few kinds of :class:`MessagingError`.

Every store (S3 through obstore, a directory through ``file://``) maps its own failures onto
these kinds, so the code above them decides by kind, never by library: a store that is
unreachable, answers 5xx, refuses the credentials or has no bucket is *unavailable* (503 with
``Retry-After`` for a read that needs it: the data is there, the store is not); an object that
is missing, holds other bytes than its name promises, or is shorter than asked is a fault of
the data (500, naming the object, never delivered). Each message names the store (its URL)
and the object.
"""

from __future__ import annotations

import math

from messaging.errors import MessagingError

#: Seconds a reader is told to wait before asking again when the store is unavailable.
RETRY_AFTER_S = 5.0


class ObjectStoreError(MessagingError):
    """An operation on an object store failed; ``store`` is its URL, ``name`` the object's
    name inside it ("" for the store as a whole)."""

    status = 500
    #: What went wrong, in a few words; the first part of every message of this kind.
    kind = "failed"

    def __init__(self, store: str, name: str, detail: str = "") -> None:
        what = f"object {name} in store {store}" if name else f"object store {store}"
        super().__init__(f"{what}: {self.kind}" + (f": {detail}" if detail else ""))
        self.store = store
        self.name = name
        self.detail = detail


class StoreUnavailableError(ObjectStoreError):
    """The store cannot be used right now; the objects in it are not known to be harmed.

    Uploads wait and try again; a read that needs the store answers 503 with
    ``Retry-After``. Raised as it is when a failure fits none of the kinds below.
    """

    status = 503
    kind = "store unavailable"

    def __init__(self, store: str, name: str, detail: str = "",
                 retry_after: float = RETRY_AFTER_S) -> None:
        super().__init__(store, name, detail)
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        """When to try again."""
        return {"Retry-After": str(max(1, math.ceil(self.retry_after)))}


class StoreUnreachableError(StoreUnavailableError):
    """No answer: connection refused or reset, name not resolved, or too slow (timed out)."""

    kind = "store unreachable"


class StoreServerError(StoreUnavailableError):
    """The store answered with a server error (5xx), or its disk failed (``file://``)."""

    kind = "store server error"


class StoreDeniedError(StoreUnavailableError):
    """The store refused the credentials (wrong key or secret, expired token) or they lack a
    permission the operation needs."""

    kind = "access denied"


class StoreBucketMissingError(StoreUnavailableError):
    """The bucket does not exist (for ``file://``: the store's directory does not)."""

    kind = "no such bucket"


class ObjectNotFoundError(ObjectStoreError):
    """The object is not in the store (deleted behind the broker's back, or never there)."""

    kind = "no such object"


class ObjectConflictError(ObjectStoreError):
    """An upload found an object of the same name holding other bytes: it is left alone."""

    kind = "already exists with other bytes"


class ObjectCorruptError(ObjectStoreError):
    """The object's bytes are not what its name and size promise (checksum mismatch, wrong
    size, shorter than a range asked for): never delivered."""

    kind = "corrupt"


class ObjectNameError(MessagingError):
    """A name no object of this package can have (see :func:`messaging.objects.store.check_name`
    and :mod:`messaging.objects.naming`): a bug in the caller, or an object that is not ours."""

    status = 500

    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"invalid object name {name!r}: {why}")
        self.name = name
