"""What only the directory store has: temporary files, links instead of renames, and the
directory playing the bucket."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from messaging.objects import FileStore, ObjectInfo, ObjectNotFoundError, StoreServerError
from messaging.objects.checksum import THREAD_AT, digest_bytes, digest_of
from tests.faults import Faults, inject


async def test_uploads_leave_no_temporary_file(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    await store.put_if_absent("3/a.seg", b"abc")
    await store.put_if_absent("3/a.seg", b"abc")
    assert sorted(p.name for p in (tmp_path / "3").iterdir()) == ["a.seg"]
    assert (tmp_path / "3" / "a.seg").read_bytes() == b"abc"


async def test_a_crash_leftover_is_not_an_object(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    await store.put_if_absent("3/a.seg", b"abc")
    (tmp_path / "3" / ".b.seg.x1.tmp").write_bytes(b"half")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "c.seg").write_bytes(b"c")
    assert await store.list() == [ObjectInfo("3/a.seg", 3)]


async def test_many_uploads_at_once_race_for_one_name(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    results = await asyncio.gather(*(store.put_if_absent(f"{i % 3}/n.seg", b"same")
                                     for i in range(12)))
    assert sum(result.created for result in results) == 3
    assert [info.name for info in await store.list()] == ["0/n.seg", "1/n.seg", "2/n.seg"]


async def test_a_directory_is_not_an_object(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    await store.put_if_absent("3/x/a.seg", b"abc")
    with pytest.raises(ObjectNotFoundError):
        await store.size("3/x")
    with pytest.raises(ObjectNotFoundError):
        await store.get_range("3/x", 0, 1)


def test_the_url_is_the_directory(tmp_path: Path) -> None:
    assert FileStore(tmp_path).url == tmp_path.as_uri()
    assert repr(FileStore(tmp_path)) == f"FileStore({tmp_path.as_uri()})"


async def test_digests_of_bytes_and_files_agree(tmp_path: Path) -> None:
    for data in (b"", b"small", os.urandom(THREAD_AT + 1)):
        path = tmp_path / "f"
        path.write_bytes(data)
        assert await digest_of(data) == await digest_of(path) == digest_bytes(data)


async def test_a_full_disk_is_a_server_error_and_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileStore(tmp_path)
    with inject(monkeypatch, Faults(tmp_path, write_budget=100)), \
            pytest.raises(StoreServerError, match="No space left") as info:
        await store.put_if_absent("3/a.seg", b"x" * 1000)
    assert info.value.status == 503 and "3/a.seg" in str(info.value)
    assert await store.list() == []
    assert [p.name for p in (tmp_path / "3").iterdir()] == []  # no temporary file either
    assert (await store.put_if_absent("3/a.seg", b"x" * 1000)).created


async def test_a_failed_fsync_is_a_server_error(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileStore(tmp_path)
    with inject(monkeypatch, Faults(tmp_path, sync_failures=1)), \
            pytest.raises(StoreServerError, match="Input/output error"):
        await store.put_if_absent("3/a.seg", b"frames")
    assert await store.list() == []
