"""Both stores through the same tests: a directory (``file://``) and S3 on a real SeaweedFS
server (marked e2e: it starts a process). Each test has a store of its own (a directory, or
a prefix of its own in the session's bucket)."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import pytest

from messaging.errors import MessagingError
from messaging.objects import (
    FileStore,
    ObjectConflictError,
    ObjectCorruptError,
    ObjectInfo,
    ObjectNameError,
    ObjectNotFoundError,
    ObjectStore,
    StoreBucketMissingError,
    StoreUnavailableError,
    verify_object,
)
from messaging.objects.checksum import Digest
from messaging.objects.naming import name_segment_object
from tests.objects.conftest import SeaweedFS, overwrite_behind

NAME = "7/segment.seg"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def test_put_if_absent_creates_then_accepts_the_same_bytes_and_refuses_others(
        store: ObjectStore) -> None:
    first = await store.put_if_absent(NAME, b"frames of segment 1")
    assert (first.name, first.size, first.sha256, first.created) == (
        NAME, 19, sha(b"frames of segment 1"), True)
    again = await store.put_if_absent(NAME, b"frames of segment 1")
    assert again.created is False and again.sha256 == first.sha256
    with pytest.raises(ObjectConflictError) as info:
        await store.put_if_absent(NAME, b"other frames, same name")
    assert info.value.status == 500
    assert store.url in str(info.value) and NAME in str(info.value)
    assert await store.get_range(NAME, 0, 19) == b"frames of segment 1"  # left alone


async def test_put_new_creates_then_accepts_the_same_bytes_and_refuses_others(
        store: ObjectStore) -> None:
    data = os.urandom(300_000)  # hashed in a thread
    assert await store.put_new("intake/n-1-0", data) is True
    assert await store.put_new("intake/n-1-0", data) is False
    with pytest.raises(ObjectConflictError):
        await store.put_new("intake/n-1-0", data[:-1] + b"x")
    assert await store.get_range("intake/n-1-0", 0, len(data)) == data


@pytest.mark.e2e
async def test_put_new_reads_back_when_the_etag_is_not_the_md5(
        seaweedfs: SeaweedFS, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store whose ETag is not the MD5 of the bytes (encryption, another store's kind):
    the object is read back instead, and kept when it holds the bytes sent."""
    from messaging.objects import s3

    store = seaweedfs.store()
    monkeypatch.setattr(s3, "_md5", lambda data: "0" * 32)
    reads: list[tuple[int, int]] = []
    real = store.get_range

    async def counted(name: str, start: int, end: int) -> bytes:
        reads.append((start, end))
        return await real(name, start, end)

    monkeypatch.setattr(store, "get_range", counted)
    assert await store.put_new("intake/n-2-0", b"sent bytes") is True
    assert reads == [(0, 10)]


async def test_concurrent_uploads_of_the_same_bytes_make_one_object(store: ObjectStore) -> None:
    data = os.urandom(100_000)
    results = await asyncio.gather(*(store.put_if_absent(NAME, data) for _ in range(4)))
    assert sorted(result.created for result in results) == [False, False, False, True]
    assert await store.list() == [ObjectInfo(NAME, len(data))]


async def test_ranged_reads_return_exactly_the_bytes_asked_for(store: ObjectStore,
                                                               tmp_path: Path) -> None:
    data = bytes(range(256)) * 4
    source = tmp_path / "segment"
    source.write_bytes(data)
    stored = await store.put_if_absent(NAME, source)
    assert (stored.size, stored.sha256) == (1024, sha(data))
    assert await store.size(NAME) == 1024
    for start, end in [(0, 1024), (0, 1), (1023, 1024), (100, 612), (512, 512)]:
        assert await store.get_range(NAME, start, end) == data[start:end]
    for start, end in [(1000, 1025), (1024, 2000), (2000, 3000)]:
        with pytest.raises(ObjectCorruptError) as info:  # the object is shorter than asked
            await store.get_range(NAME, start, end)
        assert NAME in str(info.value) and info.value.status == 500
    with pytest.raises(ValueError):
        await store.get_range(NAME, 10, 5)


async def test_list_names_and_sizes_under_a_prefix(store: ObjectStore) -> None:
    for name, size in [("1/b.seg", 3), ("1/a.seg", 2), ("10/c.seg", 5), ("2/x/y.time", 1)]:
        await store.put_if_absent(name, b"x" * size)
    assert await store.list("1") == [ObjectInfo("1/a.seg", 2), ObjectInfo("1/b.seg", 3)]
    assert await store.list("2") == [ObjectInfo("2/x/y.time", 1)]
    assert [info.name for info in await store.list()] == [
        "1/a.seg", "1/b.seg", "10/c.seg", "2/x/y.time"]
    assert await store.list("3") == []


async def test_delete_removes_the_object_and_is_idempotent(store: ObjectStore) -> None:
    await store.put_if_absent(NAME, b"abc")
    await store.put_if_absent("7/other.seg", b"def")
    await store.delete(NAME)
    await store.delete(NAME)
    assert await store.list("7") == [ObjectInfo("7/other.seg", 3)]
    for read in (lambda: store.size(NAME), lambda: store.get_range(NAME, 0, 1)):
        with pytest.raises(ObjectNotFoundError) as info:
            await read()
        assert NAME in str(info.value) and store.url in str(info.value)
    assert (await store.put_if_absent(NAME, b"new")).created  # the name is free again


async def test_verification_catches_bytes_changed_behind_the_store(
        store: ObjectStore, request: pytest.FixtureRequest) -> None:
    data = b"0123456789" * 100
    stored = await store.put_if_absent(NAME, data)
    expected = Digest(stored.size, stored.sha256)
    await verify_object(store, NAME, expected)
    flipped = bytearray(data)
    flipped[500] ^= 0x01
    await overwrite_behind(request, store, NAME, bytes(flipped))
    with pytest.raises(ObjectCorruptError) as info:
        await verify_object(store, NAME, expected)
    assert info.value.status == 500 and NAME in str(info.value) and "SHA-256" in str(info.value)
    with pytest.raises(ObjectConflictError):  # a retried upload does not take it as its own
        await store.put_if_absent(NAME, data)
    await overwrite_behind(request, store, NAME, data[:-1])
    with pytest.raises(ObjectCorruptError, match="999 bytes stored, 1000 expected"):
        await verify_object(store, NAME, expected)


async def test_an_upload_that_does_not_verify_is_corrupt_and_removed(store: ObjectStore) -> None:
    with pytest.raises(ObjectCorruptError) as info:
        await store.put_if_absent(NAME, b"what was sent", sha256="0" * 64)
    assert NAME in str(info.value)
    with pytest.raises(ObjectNotFoundError):
        await store.size(NAME)
    assert (await store.put_if_absent(NAME, b"what was sent")).created


async def test_a_large_object_round_trips(store: ObjectStore, tmp_path: Path) -> None:
    data = os.urandom(12 << 20)  # past the 8 MiB verification reads and obstore's 5 MiB parts
    source = tmp_path / "00000000000000000001.seg"
    source.write_bytes(data)
    name, digest = await name_segment_object(3, 1, 9000, source)
    stored = await store.put_if_absent(name.name, source, sha256=digest.sha256)
    assert (stored.size, stored.sha256, stored.created) == (len(data), sha(data), True)
    assert await store.list("3") == [ObjectInfo(name.name, len(data))]
    edge = 8 << 20
    assert await store.get_range(name.name, edge - 10, edge + 10) == data[edge - 10:edge + 10]
    assert await store.get_range(name.name, len(data) - 3, len(data)) == data[-3:]


async def test_names_that_are_not_ours_are_refused(store: ObjectStore) -> None:
    for name in ("", "/7/a.seg", "7//a.seg", "../a.seg", "7/../a.seg", ".hidden", "7/.a.tmp",
                 "a b", "7/a.seg/", "x" * 600):
        with pytest.raises(ObjectNameError):
            await store.put_if_absent(name, b"x")
        with pytest.raises(ObjectNameError):
            await store.get_range(name, 0, 1)
    with pytest.raises(ObjectNameError):
        await store.list("../")


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.e2e)])
def missing_bucket(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "file":
        return FileStore(tmp_path / "not-made")
    server: SeaweedFS = request.getfixturevalue("seaweedfs")
    return server.store(bucket="no-such-bucket")


async def test_a_missing_bucket_is_its_own_kind_for_every_operation(
        missing_bucket: ObjectStore) -> None:
    store = missing_bucket
    operations = {"put": lambda: store.put_if_absent(NAME, b"x"),
                  "get": lambda: store.get_range(NAME, 0, 1), "size": lambda: store.size(NAME),
                  "list": lambda: store.list("7"), "delete": lambda: store.delete(NAME)}
    for what, operation in operations.items():
        with pytest.raises(StoreBucketMissingError) as info:
            await operation()
        error: MessagingError = info.value
        assert isinstance(error, StoreUnavailableError), what
        assert error.status == 503 and error.headers() == {"Retry-After": "5"}, what
        assert store.url in str(error), what
        assert (NAME in str(error)) == (what != "list"), what
