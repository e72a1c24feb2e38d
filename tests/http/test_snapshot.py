"""Snapshots between peers: capture, stream, verify, install (no merging, no partial state)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from messaging.broker.broker import Broker
from messaging.broker.commands import heartbeat_command
from messaging.broker.snapshot import SnapshotStream
from messaging.errors import CorruptDataError, DataDirectoryError
from messaging.frames import encode
from tests.broker.test_broker import commit_all, contents
from tests.conftest import apply


def snapshot_bytes(broker: Broker, **extra: Any) -> bytes:
    stream = SnapshotStream.capture(broker, extra)
    try:
        return b"".join(iter(lambda: stream.read(1000), b""))
    finally:
        stream.close()


@pytest.fixture
def source(tmp_path: Path) -> Iterator[Broker]:
    broker = Broker.open(tmp_path / "a", max_segment_size=200)
    for i in range(40):
        apply(broker, encode(1, i % 3, f"message {i}".encode()))
    apply(broker, heartbeat_command(1, 7, "sub"))
    commit_all(broker)
    broker.topic(0).truncate(0, 2**64)
    yield broker
    broker.close()


def test_install_replaces_everything(source: Broker, tmp_path: Path) -> None:
    data = snapshot_bytes(source, cluster="c", revision=12)
    target = Broker.open(tmp_path / "b", max_segment_size=200)
    apply(target, encode(1, 99, b"local only: must not survive"))
    header = target.install_snapshot(io.BytesIO(data))
    assert (header["cluster"], header["revision"]) == ("c", 12)
    assert contents(target) == contents(source)
    assert target.topic(99) is None
    assert target.index == source.index == 40
    assert target.subscribers(1) == {"sub": 7}
    for topic in source.topics():
        theirs = {p.name: p.read_bytes() for p in topic.path.iterdir()}
        ours = {p.name: p.read_bytes() for p in (tmp_path / "b/topics" / str(topic.id)).iterdir()}
        assert ours == theirs
    assert apply(target, encode(1, 1, b"after")).first == 41
    target.close()


@pytest.mark.parametrize("damage", ["flip", "truncate", "name"])
def test_a_damaged_snapshot_changes_nothing(source: Broker, tmp_path: Path,
                                            damage: str) -> None:
    data = bytearray(snapshot_bytes(source, cluster="c", revision=12))
    if damage == "flip":
        data[-5] ^= 0x01
    elif damage == "truncate":
        del data[-5:]
    else:
        data = bytearray(bytes(data).replace(b".seg", b".bad", 1))
    target = Broker.open(tmp_path / "b")
    apply(target, encode(1, 99, b"kept"))
    before = contents(target)
    with pytest.raises((CorruptDataError, DataDirectoryError)):
        target.install_snapshot(io.BytesIO(bytes(data)))
    assert contents(target) == before
    assert not (tmp_path / "b" / "topics.restore").exists()
    target.close()


def test_accept_may_refuse_before_anything_changes(source: Broker, tmp_path: Path) -> None:
    data = snapshot_bytes(source, cluster="other", revision=3)
    target = Broker.open(tmp_path / "b")
    apply(target, encode(1, 99, b"kept"))

    def accept(header: dict[str, Any]) -> None:
        if header["cluster"] != "c":
            raise DataDirectoryError("wrong cluster")

    with pytest.raises(DataDirectoryError, match="wrong cluster"):
        target.install_snapshot(io.BytesIO(data), accept)
    assert target.topic(99) is not None
    target.close()
