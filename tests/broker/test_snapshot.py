"""Snapshots of a broker: write one, read it into another broker, get identical topics.

Capturing, streaming and installing them between peers is tests/http/test_snapshot.py.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from messaging.broker import snapshot as snapshot_format
from messaging.broker.broker import Broker
from messaging.broker.commands import heartbeat_command
from messaging.errors import CorruptDataError
from messaging.frames import encode
from tests.broker.test_broker import commit_all, contents
from tests.conftest import apply


def test_snapshot_round_trip_gives_identical_topics(tmp_path: Path) -> None:
    source = Broker.open(tmp_path / "a", max_segment_size=100)
    for i in range(30):
        apply(source, encode(1, i % 3, f"message {i}".encode()))
    apply(source, heartbeat_command(1, 7, "sub"))
    commit_all(source)
    source.topic(0).truncate(0, 2**64)
    snapshot = io.BytesIO()
    snapshot_format.write(source, snapshot)
    target = Broker.open(tmp_path / "b", max_segment_size=100)
    apply(target, encode(1, 99, b"to be replaced"))
    snapshot.seek(0)
    target.install_snapshot(snapshot)
    assert contents(target) == contents(source)
    assert target.index == source.index == 30
    assert target.subscribers(1) == {"sub": 7}
    assert target.topic(0).first_index == source.topic(0).first_index
    for topic in source.topics():
        names = sorted(p.name for p in topic.path.iterdir())
        assert names == sorted(p.name for p in (tmp_path / "b/topics" / str(topic.id)).iterdir())
    apply(target, encode(1, 1, b"after restore"))
    assert target.index == 31
    source.close()
    target.close()


def test_a_snapshot_carries_the_time_indexes_and_refuses_a_damaged_one(tmp_path: Path,
                                                                         ) -> None:
    source = Broker.open(tmp_path / "a", max_segment_size=100)
    base = 1_795_000_000_000
    for i in range(30):  # the time moves every 5 commands: several records per segment
        source.write_group([encode(1, i % 3, f"message {i}".encode())], durable=True,
                           times=[base + (i // 5) * 1000])
    snapshot = io.BytesIO()
    snapshot_format.write(source, snapshot)
    target = Broker.open(tmp_path / "b", max_segment_size=100)
    snapshot.seek(0)
    target.install_snapshot(snapshot)
    assert target.time == source.time == base + 5000
    for topic in source.topics():
        copy = target.topic(topic.id)
        assert copy is not None
        assert copy.times(0, 2**63) == topic.times(0, 2**63)
        assert [copy.index_at_time(base + k * 1000) for k in range(7)] == \
            [topic.index_at_time(base + k * 1000) for k in range(7)]
    target.close()
    reopened = Broker.open(tmp_path / "b", max_segment_size=100)  # and after a restart
    assert reopened.time == base + 5000
    assert reopened.topic(1).times(0, 2**63) == source.topic(1).times(0, 2**63)
    reopened.close()
    # A time index whose record fails its checksum: the snapshot is refused as a whole.
    raw = bytearray(snapshot.getvalue())
    header = bytes(raw).partition(b"\n")[0]
    first_times = json.loads(header)["topics"][0]["segments"][0]
    at = len(header) + 1 + first_times["size"] + 5
    raw[at] ^= 0xFF
    damaged = Broker.open(tmp_path / "c")
    with pytest.raises(CorruptDataError, match="damaged time index"):
        damaged.install_snapshot(io.BytesIO(bytes(raw)))
    assert damaged.topics() == []
    damaged.close()
    source.close()


def test_a_snapshot_of_a_segment_with_unknown_times_installs(tmp_path: Path) -> None:
    """A segment whose time index is damaged goes without one: the copy's times are unknown
    too, and the snapshot is not refused."""
    source = Broker.open(tmp_path / "a", max_segment_size=100)
    for i in range(12):
        source.write_group([encode(1, 1, b"message %02d" % i)], durable=True,
                           times=[1_795_000_000_000 + i * 1000])
    first = source.topic(1).segments()[0]
    source.close()
    path = first.path.with_suffix(".time")
    raw = bytearray(path.read_bytes())
    raw[12] ^= 0xFF
    path.write_bytes(bytes(raw))
    source = Broker.open(tmp_path / "a", max_segment_size=100)
    snapshot = io.BytesIO()
    snapshot_format.write(source, snapshot)
    target = Broker.open(tmp_path / "b", max_segment_size=100)
    snapshot.seek(0)
    target.install_snapshot(snapshot)
    assert target.topic(1).times(0, 2**63) == source.topic(1).times(0, 2**63)
    assert target.topic(1).time_of(first.first_index) is None
    target.close()
    source.close()
