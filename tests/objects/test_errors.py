"""The error kinds: statuses, Retry-After, and messages that name the store and the object."""

from __future__ import annotations

import pytest

from messaging.errors import MessagingError
from messaging.objects import (
    ObjectConflictError,
    ObjectCorruptError,
    ObjectNameError,
    ObjectNotFoundError,
    ObjectStoreError,
    StoreBucketMissingError,
    StoreDeniedError,
    StoreServerError,
    StoreUnavailableError,
    StoreUnreachableError,
)


@pytest.mark.parametrize("kind", [StoreUnavailableError, StoreUnreachableError,
                                  StoreServerError, StoreDeniedError, StoreBucketMissingError])
def test_an_unavailable_store_is_503_with_retry_after(kind: type[StoreUnavailableError]) -> None:
    error = kind("s3://b/p", "7/a.seg", "HTTP 503", retry_after=2.5)
    assert isinstance(error, MessagingError) and isinstance(error, StoreUnavailableError)
    assert error.status == 503 and error.headers() == {"Retry-After": "3"}
    assert str(error) == f"object 7/a.seg in store s3://b/p: {kind.kind}: HTTP 503"
    assert (error.store, error.name, error.detail) == ("s3://b/p", "7/a.seg", "HTTP 503")
    assert kind("s3://b/p", "", retry_after=0.1).headers() == {"Retry-After": "1"}


@pytest.mark.parametrize("kind", [ObjectNotFoundError, ObjectConflictError, ObjectCorruptError])
def test_damaged_or_missing_data_is_500_naming_the_object(kind: type[ObjectStoreError]) -> None:
    error = kind("file:///srv/o", "7/a.seg")
    assert not isinstance(error, StoreUnavailableError)
    assert error.status == 500 and error.headers() == {}
    assert str(error) == f"object 7/a.seg in store file:///srv/o: {kind.kind}"


def test_a_whole_store_error_names_the_store() -> None:
    assert str(StoreDeniedError("s3://b", "", "HTTP 403")) == (
        "object store s3://b: access denied: HTTP 403")


def test_name_errors() -> None:
    error = ObjectNameError("../x", "no")
    assert error.status == 500 and str(error) == "invalid object name '../x': no"
