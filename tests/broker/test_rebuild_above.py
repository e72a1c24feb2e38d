"""A cluster node's files are the applied copy of etcd's log (Broker.rebuild_above).

At start-up every frame above the node's checkpoint is cut (it is applied again from the log,
with the same indexes and times), and from then on a group's time records are fsynced with
the frames they cover, before them, instead of once per group. Faults are injected at the
system-call boundary (tests/faults.py).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from messaging.broker.broker import ApplyResult, Broker
from messaging.errors import StorageFailedError
from messaging.frames import decode, encode_batch
from messaging.topic.segment import SEGMENT_SUFFIX
from messaging.topic.times import TIMES_SUFFIX
from tests.faults import Faults, fd_path, inject

T0 = 1_795_600_000_000
SEGMENT = 400


def groups() -> list[tuple[list[bytes], list[int]]]:
    """Commands (as a node's log carries them) and their times: topics 1 and 2 from the
    start, topic 3 only in the last groups, segments rolling on the way."""
    out = []
    for g in range(12):
        topics = [1, 2] + ([3] if g >= 9 else [])
        out.append(([encode_batch(t, [b"g%d-t%d-%d" % (g, t, k) for k in range(4)])
                     for t in topics], [T0 + 1000 * g] * len(topics)))
    return out


def apply(broker: Broker, group: tuple[list[bytes], list[int]]) -> None:
    commands, times = group
    results = broker.write_group(commands, durable=False, times=times)
    assert all(isinstance(r, ApplyResult) for r in results), results


def files(path: Path) -> dict[str, bytes]:
    """Every segment and time file under the data directory, by relative path."""
    return {str(f.relative_to(path)): f.read_bytes() for f in sorted(path.rglob("*"))
            if f.suffix in (SEGMENT_SUFFIX, TIMES_SUFFIX)}


def test_times_are_fsynced_with_the_frames_and_before_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broker = Broker.open(tmp_path, max_segment_size=SEGMENT)
    broker.rebuild_above(0)
    synced: list[str] = []
    real = os.fdatasync

    def recording(fd: int) -> None:
        synced.append(fd_path(fd))
        real(fd)

    monkeypatch.setattr(os, "fdatasync", recording)
    for group in groups()[:6]:
        apply(broker, group)
    assert synced == [], "a group of a cluster node fsynced on its own"
    broker.sync([1, 2])
    times = [k for k, p in enumerate(synced) if p.endswith(TIMES_SUFFIX)]
    frames = [k for k, p in enumerate(synced) if p.endswith(SEGMENT_SUFFIX)]
    assert times and frames and max(times) < min(frames), synced
    assert {Path(p).parent.name for p in synced} == {"1", "2"}
    monkeypatch.undo()
    broker.close()


def test_a_failed_fsync_of_deferred_times_stops_the_topic(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broker = Broker.open(tmp_path, max_segment_size=SEGMENT)
    broker.rebuild_above(0)
    for group in groups()[:3]:
        apply(broker, group)
    with inject(monkeypatch, Faults(tmp_path, match=lambda p: p.endswith(TIMES_SUFFIX),
                                    sync_failures=1, sync_errno=errno.EIO)) as faults:
        with pytest.raises(StorageFailedError, match="fsync failed"):
            broker.sync([1])
        assert faults.injected == 1
    topic = broker.store[1]
    assert topic.failure is not None
    results = broker.write_group(groups()[3][0][:1], durable=False, times=[T0 + 100])
    assert isinstance(results[0], StorageFailedError)
    broker.close()


def test_a_restart_cuts_what_the_checkpoint_does_not_cover_and_replays_it_identically(
        tmp_path: Path) -> None:
    """Frames (and their times) above the checkpoint's index are cut, a topic made only
    above it goes, and applying the same groups again ends with the same files."""
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    for path in (whole, cut):
        broker = Broker.open(path, max_segment_size=SEGMENT)
        broker.rebuild_above(0)
        for group in groups():
            apply(broker, group)
        broker.close()
    expected = files(whole)
    checkpoint_index = 6 * 8  # through group 6: topics 1 and 2 only
    broker = Broker.open(cut, max_segment_size=SEGMENT)
    broker.rebuild_above(checkpoint_index)
    assert sorted(broker.store.ids()) == [1, 2]
    for topic in broker.topics():
        assert topic.last_index <= checkpoint_index
        with topic.reader(topic.first_index) as reader:
            messages, _used = decode(reader.read_all(), after=0)
        assert messages and messages[-1].index <= checkpoint_index
        assert topic.last_time == T0 + 1000 * 5
    broker.index, broker.time = checkpoint_index, T0 + 1000 * 5
    for group in groups()[6:]:
        apply(broker, group)
    broker.close()
    assert files(cut) == expected
