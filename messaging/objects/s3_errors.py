"""obstore's exceptions, sorted into the kinds of :mod:`messaging.objects.errors`.

obstore raises a few typed exceptions (``FileNotFoundError`` for 404, ``PermissionDeniedError``
for 403, ``UnauthenticatedError`` for 401, ``AlreadyExistsError``/``PreconditionError`` for a
failed condition) and a ``GenericError`` for the rest, whose message carries what happened: the
HTTP status and S3 error code the store answered (``Server returned non-2xx status code: 503
Service Unavailable: <Error><Code>SlowDown</Code>...``), or the transport's failure
(``HttpError { kind: Connect | Timeout | ... }``). The kind is read from there; the message
our error carries keeps only a short summary, on one line (it becomes an HTTP header).
"""

from __future__ import annotations

import re
from http import HTTPStatus

from obstore.exceptions import PermissionDeniedError, UnauthenticatedError

from messaging.objects.errors import (
    ObjectCorruptError,
    ObjectNotFoundError,
    ObjectStoreError,
    StoreBucketMissingError,
    StoreDeniedError,
    StoreServerError,
    StoreUnavailableError,
    StoreUnreachableError,
)

_STATUS = re.compile(r"status code: (\d{3})")
_CODE = re.compile(r"<Code>([A-Za-z0-9.]+)</Code>")
_TRANSPORT = re.compile(r"HttpError \{\s*kind: (\w+)")
_RETRIES = re.compile(r"after (\d+) retries")
#: What obstore's transport error kinds mean to a reader of our messages.
_TRANSPORT_KINDS = {"Connect": "connection failed", "Timeout": "timed out",
                    "Request": "request failed", "Decode": "answer could not be read",
                    "Interrupted": "connection interrupted"}


def store_error(err: Exception, store: str, name: str) -> ObjectStoreError:
    """The error of our kinds that obstore's ``err`` stands for, on object ``name`` ("" for
    the store as a whole) of the store at URL ``store``."""
    text = str(err)
    status_match = _STATUS.search(text)
    status = int(status_match.group(1)) if status_match else None
    code_match = _CODE.search(text)
    code = code_match.group(1) if code_match else None
    detail = summary(text, status, code)
    if code == "NoSuchBucket":
        return StoreBucketMissingError(store, name, detail)
    if isinstance(err, PermissionDeniedError | UnauthenticatedError) or status in (401, 403):
        return StoreDeniedError(store, name, detail)
    if isinstance(err, FileNotFoundError) or status == 404:
        return ObjectNotFoundError(store, name, detail)
    if status == 416:
        return ObjectCorruptError(store, name, f"shorter than the range asked for ({detail})")
    if status is not None and status >= 500:
        return StoreServerError(store, name, detail)
    if status is None and _TRANSPORT.search(text):
        return StoreUnreachableError(store, name, detail)
    return StoreUnavailableError(store, name, detail)


def summary(text: str, status: int | None, code: str | None) -> str:
    """One short line saying what obstore's message ``text`` says went wrong."""
    retries = _RETRIES.search(text)
    tries = f" (after {retries.group(1)} retries)" if retries else ""
    if status is not None:
        try:
            phrase = f" {HTTPStatus(status).phrase}"
        except ValueError:
            phrase = ""
        return f"HTTP {status}{phrase}" + (f" ({code})" if code else "") + tries
    transport = _TRANSPORT.search(text)
    if transport:
        return _TRANSPORT_KINDS.get(transport.group(1), transport.group(1).lower()) + tries
    first = text.split("\n", 1)[0].strip()
    return first[:200] or "no details"
