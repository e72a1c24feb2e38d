"""Durable-file helpers: atomic JSON that leaves no temporary file behind, and what a failed
file operation means to a client."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from messaging.errors import DiskFullError, StorageError
from messaging.files import read_json, remove_stale_temporaries, storage_error, write_json_atomic
from tests.faults import Faults, inject


@pytest.mark.parametrize("durable", [True, False])
def test_write_json_atomic_leaves_only_the_target(tmp_path: Path, durable: bool) -> None:
    path = tmp_path / "broker.json"
    write_json_atomic(path, {"format": 1, "subscribers": {}}, durable=durable)
    assert read_json(path) == {"format": 1, "subscribers": {}}
    write_json_atomic(path, {"format": 1, "subscribers": {"1": {"a": 2}}}, durable=durable)
    assert read_json(path) == {"format": 1, "subscribers": {"1": {"a": 2}}}
    assert list(tmp_path.iterdir()) == [path]


def test_a_failed_write_keeps_the_old_content_and_no_temporary_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "broker.json"
    write_json_atomic(path, {"index": 1})
    with inject(monkeypatch, Faults(tmp_path, write_budget=5)) as faults, \
            pytest.raises(OSError) as info:
        write_json_atomic(path, {"index": 2, "padding": "x" * 100})
    assert info.value.errno == errno.ENOSPC and faults.injected >= 1
    assert read_json(path) == {"index": 1}
    assert list(tmp_path.iterdir()) == [path]
    with pytest.raises(TypeError):  # not JSON: refused before any file is made
        write_json_atomic(path, {"index": object()})
    assert list(tmp_path.iterdir()) == [path]


def test_stale_temporaries_of_one_file_are_removed(tmp_path: Path) -> None:
    path = tmp_path / "broker.json"
    write_json_atomic(path, {"index": 1})
    for name in ("broker.json.abc123.tmp", "broker.json.x.tmp", "cluster.json.y.tmp"):
        (tmp_path / name).write_text("{")
    remove_stale_temporaries(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broker.json", "cluster.json.y.tmp"]
    assert read_json(path) == {"index": 1}


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_storage_error_maps_a_full_disk_to_507(code: int) -> None:
    error = storage_error("writing topic 3", OSError(code, os.strerror(code)))
    assert isinstance(error, DiskFullError) and error.status == 507
    assert str(error).startswith("disk full: no space left writing topic 3")


def test_storage_error_maps_other_failures_to_500() -> None:
    error = storage_error("writing topic 3", OSError(errno.EIO, os.strerror(errno.EIO)))
    assert type(error) is StorageError and error.status == 500
    assert str(error) == f"writing topic 3 failed: {os.strerror(errno.EIO)}"
