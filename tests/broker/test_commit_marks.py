"""Commit marks: a group's line in the state journal marks it committed. Opening cuts the
frames of a group whose line never reached the disk, in every topic and across segment rolls
(a batch is all or nothing), drops a line whose frames did not all reach the disk, and keeps
everything a directory of an earlier release holds (it had no marks) while marking it.

Crashes are made in the files: the broker is abandoned without closing (``broker.json`` not
saved again), and the files are cut back to what a crash part-way through the last group can
leave (kill -9 in :mod:`tests.e2e.test_batch_atomicity` and at every system call in
:mod:`tests.e2e.test_exactly_once`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from messaging.broker.broker import Broker
from messaging.frames import decode, encode_batch
from messaging.topic.segment import SEGMENT_SUFFIX
from tests.faults import Faults, inject


def held(broker: Broker) -> dict[int, list[bytes]]:
    """Every topic's messages."""
    out = {}
    for topic in broker.topics():
        with topic.reader(topic.first_index) as reader:
            out[topic.id] = [m.data for m in decode(reader.read_all(), after=0)[0]]
    return out


def abandon(broker: Broker) -> None:
    """Stop using a broker as a crash would: files closed, ``broker.json`` not saved."""
    broker.store.close()
    broker.store.unlock()


def segment_sizes(root: Path) -> dict[Path, int]:
    """Every segment file's size, in write order (topic, then first index)."""
    return {path: path.stat().st_size
            for path in sorted((root / "topics").glob(f"*/*{SEGMENT_SUFFIX}"),
                               key=lambda p: (int(p.parent.name), p.name))}


def tear(root: Path, before: dict[Path, int], after: dict[Path, int], keep: int) -> None:
    """Leave only the first ``keep`` bytes the last group appended to its segments (in
    write order; a segment it created and reached no byte of is removed)."""
    for path, size in after.items():
        start = before.get(path, 0)
        kept = min(size - start, keep)
        keep -= kept
        if kept or start:
            os.truncate(path, start + kept)
        else:
            path.unlink()


def batch(group: int, count: int) -> list[bytes]:
    return [b"g%d-m%d-" % (group, k) + b"x" * 300 for k in range(count)]


@given(counts=st.lists(st.integers(1, 12), min_size=2, max_size=5),
       segment_size=st.sampled_from([700, 1500, 4096]), torn=st.floats(0.0, 0.999),
       line_kept=st.booleans())
@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_torn_last_group_is_cut_whole_across_segments(
        tmp_path_factory: pytest.TempPathFactory, counts: list[int], segment_size: int,
        torn: float, line_kept: bool) -> None:
    """The last group's frames torn anywhere (its journal line lost, as after kill -9 mid
    write; or kept, as after a power loss that took only frames): opening keeps every earlier
    batch whole and none of the last one."""
    root = tmp_path_factory.mktemp("marks")
    broker = Broker.open(root, max_segment_size=segment_size)
    expected: dict[int, list[bytes]] = {}
    for group, count in enumerate(counts[:-1]):
        topic = 1 + group % 2
        broker.write_group([encode_batch(topic, batch(group, count))], durable=True)
        expected.setdefault(topic, []).extend(batch(group, count))
    before = segment_sizes(root)
    journal = root / "catalog.log"
    line_at = journal.stat().st_size
    last = len(counts) - 1
    both = [encode_batch(1, batch(last, counts[-1])), encode_batch(2, batch(last, 1))]
    broker.write_group(both, durable=True)
    after = segment_sizes(root)
    abandon(broker)
    appended = sum(size - before.get(path, 0) for path, size in after.items())
    tear(root, before, after, int(appended * torn))
    if not line_kept:
        os.truncate(journal, line_at)
    reopened = Broker.open(root, max_segment_size=segment_size)
    try:
        assert {t: m for t, m in held(reopened).items() if m} == expected
        reopened.write_group(both, durable=True)  # sent again: stored once, in order
        expected.setdefault(1, []).extend(batch(last, counts[-1]))
        expected.setdefault(2, []).extend(batch(last, 1))
        assert held(reopened) == expected
    finally:
        reopened.close()


def test_frames_without_a_line_go_from_every_segment_they_reached(tmp_path: Path) -> None:
    broker = Broker.open(tmp_path, max_segment_size=1000)
    broker.write_group([encode_batch(1, batch(0, 2))], durable=True)
    before = segment_sizes(tmp_path)
    line_at = (tmp_path / "catalog.log").stat().st_size
    broker.write_group([encode_batch(1, batch(1, 9))], durable=True)  # three more segments
    after = segment_sizes(tmp_path)
    assert len(after) >= len(before) + 2
    abandon(broker)
    os.truncate(tmp_path / "catalog.log", line_at)  # the mark never made it: frames did
    reopened = Broker.open(tmp_path, max_segment_size=1000)
    assert held(reopened) == {1: batch(0, 2)}
    assert segment_sizes(tmp_path) == before
    assert reopened.index == 2
    reopened.close()


def test_a_directory_of_an_earlier_release_keeps_every_frame_and_is_marked(
        tmp_path: Path) -> None:
    """An earlier release wrote no line for plain groups and may have crashed after them:
    those frames were acknowledged, and nothing is cut until the directory is marked."""
    broker = Broker.open(tmp_path)
    broker.write_group([encode_batch(1, [b"a", b"b"])], durable=True)
    broker.write_group([encode_batch(2, [b"c"])], durable=True)
    abandon(broker)
    meta = tmp_path / "broker.json"
    state = json.loads(meta.read_text())
    del state["marks"]
    state["index"] = 0
    meta.write_text(json.dumps(state))  # as the earlier release left it, with no journal
    (tmp_path / "catalog.log").unlink()
    reopened = Broker.open(tmp_path)
    assert held(reopened) == {1: [b"a", b"b"], 2: [b"c"]}
    assert reopened.index == 3
    assert json.loads(meta.read_text())["marks"] is True
    reopened.close()


def test_a_directory_that_cannot_be_marked_still_opens(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A full disk at start-up: the broker opens and serves, says it could not mark the
    directory, and keeps every frame."""
    broker = Broker.open(tmp_path)
    broker.write_group([encode_batch(1, [b"a"])], durable=True)
    abandon(broker)
    (tmp_path / "broker.json").unlink()
    with inject(monkeypatch, Faults(tmp_path, match=lambda p: "broker.json" in p,
                                    write_budget=0)):
        reopened = Broker.open(tmp_path)
    assert held(reopened) == {1: [b"a"]}
    assert "could not save" in caplog.text and "in part" in caplog.text
    assert not (tmp_path / "broker.json").exists()
    reopened.close()
