"""obstore's exceptions sorted into our kinds, from messages of the shape obstore gives (the
same shapes the e2e tests meet from a real server)."""

from __future__ import annotations

import pytest
from obstore.exceptions import GenericError, PermissionDeniedError, UnauthenticatedError

from messaging.objects import (
    ObjectCorruptError,
    ObjectNotFoundError,
    ObjectStoreError,
    StoreBucketMissingError,
    StoreDeniedError,
    StoreServerError,
    StoreUnavailableError,
    StoreUnreachableError,
)
from messaging.objects.s3_errors import store_error

STORE, NAME = "s3://objects/pre", "7/a.seg"


def status_message(status: str, body: str = "", retries: str = "") -> str:
    return (f"Generic S3 error: Error performing GET http://127.0.0.1:1/objects/pre/7/a.seg in "
            f"1.2ms{retries} - Server returned non-2xx status code: {status}: {body}\n\n"
            "Debug source:\nGeneric {\n    store: \"S3\",\n}")


def transport_message(kind: str) -> str:
    return ("Generic S3 error: Error performing HEAD http://127.0.0.1:1/objects/pre/7/a.seg in "
            "2.05s, after 1 retries, max_retries: 1, retry_timeout: 3s  - HTTP error: error "
            "sending request\n\nDebug source:\nGeneric {\n    inner: Http(\n        HttpError {\n"
            f"            kind: {kind},\n            source: reqwest::Error {{ }},\n")


XML = '<?xml version="1.0"?>\n<Error><Code>{}</Code><Message>m</Message></Error>'


@pytest.mark.parametrize(("error", "kind", "detail"), [
    (FileNotFoundError(status_message("404 Not Found", XML.format("NoSuchKey"))),
     ObjectNotFoundError, "HTTP 404 Not Found (NoSuchKey)"),
    (FileNotFoundError(status_message("404 Not Found", XML.format("NoSuchBucket"))),
     StoreBucketMissingError, "HTTP 404 Not Found (NoSuchBucket)"),
    (GenericError(status_message("404 Not Found", XML.format("NoSuchBucket"))),
     StoreBucketMissingError, "HTTP 404 Not Found (NoSuchBucket)"),
    (PermissionDeniedError(status_message("403 Forbidden", XML.format(
        "SignatureDoesNotMatch"))), StoreDeniedError, "HTTP 403 Forbidden (SignatureDoesNotMatch)"),
    (GenericError(status_message("403 Forbidden", XML.format("InvalidAccessKeyId"))),
     StoreDeniedError, "HTTP 403 Forbidden (InvalidAccessKeyId)"),
    (UnauthenticatedError("unauthenticated"), StoreDeniedError, "unauthenticated"),
    (GenericError(status_message("503 Service Unavailable", XML.format("SlowDown"),
                                 ", after 3 retries")),
     StoreServerError, "HTTP 503 Service Unavailable (SlowDown) (after 3 retries)"),
    (GenericError(status_message("500 Internal Server Error")), StoreServerError,
     "HTTP 500 Internal Server Error"),
    (GenericError(status_message("416 Range Not Satisfiable", XML.format("InvalidRange"))),
     ObjectCorruptError, "shorter than the range asked for"),
    (GenericError(transport_message("Connect")), StoreUnreachableError,
     "connection failed (after 1 retries)"),
    (GenericError(transport_message("Timeout")), StoreUnreachableError,
     "timed out (after 1 retries)"),
    (GenericError(status_message("400 Bad Request", XML.format("InvalidArgument"))),
     StoreUnavailableError, "HTTP 400 Bad Request (InvalidArgument)"),
    (GenericError("something new\nwith details"), StoreUnavailableError, "something new"),
])
def test_kinds(error: Exception, kind: type[ObjectStoreError], detail: str) -> None:
    mapped = store_error(error, STORE, NAME)
    assert type(mapped) is kind
    assert detail in mapped.detail
    message = str(mapped)
    assert message.startswith(f"object {NAME} in store {STORE}: {kind.kind}: ")
    assert "\n" not in message and "Debug source" not in message and "<?xml" not in message
