"""Snapshots of a broker: write one, read it into another broker, get identical topics.

Capturing, streaming and installing them between peers is tests/http/test_snapshot.py.
"""

from __future__ import annotations

import io
from pathlib import Path

from messaging.broker import snapshot as snapshot_format
from messaging.broker.broker import Broker
from messaging.broker.commands import heartbeat_command
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
