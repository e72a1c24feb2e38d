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

from messaging.broker.broker import ApplyResult, Broker
from messaging.broker.recovery import LINES_FIRST
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


# -- lines first (--fsync always on one node) ----------------------------------------------

def _group(kind: str, group: int, count: int) -> list[bytes]:
    """A group's commands: ``lone`` single-message publishes (to topics 1 and 2 in turn), a
    ``batch`` to topic 1, or ``both``: a batch to topic 1 and a message to topic 2."""
    if kind == "lone":
        return [encode_batch(1 + k % 2, batch(group, count)[k:k + 1]) for k in range(count)]
    if kind == "batch":
        return [encode_batch(1, batch(group, count))]
    return [encode_batch(1, batch(group, count)), encode_batch(2, batch(group, 1))]


def _expect(kind: str, group: int, count: int) -> dict[int, list[bytes]]:
    messages = batch(group, count)
    if kind == "lone":
        out: dict[int, list[bytes]] = {}
        for k, message in enumerate(messages):
            out.setdefault(1 + k % 2, []).append(message)
        return out
    if kind == "batch":
        return {1: messages}
    return {1: messages, 2: batch(group, 1)}


def _merge(into: dict[int, list[bytes]], more: dict[int, list[bytes]]) -> None:
    for topic, messages in more.items():
        into.setdefault(topic, []).extend(messages)


@given(groups=st.lists(st.tuples(st.sampled_from(["lone", "batch", "both"]),
                                 st.integers(1, 6)), min_size=2, max_size=6),
       segment_size=st.sampled_from([700, 1500, 4096]), torn=st.floats(0.0, 1.0),
       line_kept=st.booleans())
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_lines_first_a_crash_keeps_whole_messages_and_no_part_of_a_batch(
        tmp_path_factory: pytest.TempPathFactory, groups: list[tuple[str, int]],
        segment_size: int, torn: float, line_kept: bool) -> None:
    """Lines first: groups of single-message publishes write no line, others write theirs
    before their frames. The last group's frames torn anywhere: a batch goes whole (its line,
    durable first, says how far its frames must reach) unless every byte made it; of lone
    messages, each whole one stays and the torn one goes. Earlier groups all stay."""
    root = tmp_path_factory.mktemp("first")
    broker = Broker.open(root, max_segment_size=segment_size, lines_first=True)
    expected: dict[int, list[bytes]] = {}
    for group, (kind, count) in enumerate(groups[:-1]):
        assert all(isinstance(r, ApplyResult)
                   for r in broker.write_group(_group(kind, group, count), durable=True))
        _merge(expected, _expect(kind, group, count))
    journal = root / "catalog.log"
    line_at = journal.stat().st_size if journal.exists() else 0
    before = segment_sizes(root)
    last = len(groups) - 1
    kind, count = groups[-1]
    broker.write_group(_group(kind, last, count), durable=True)
    lined = journal.exists() and journal.stat().st_size > line_at
    assert lined == (kind != "lone" and count > 1)
    after = segment_sizes(root)
    abandon(broker)
    appended = sum(size - before.get(path, 0) for path, size in after.items())
    keep = int(appended * torn)
    tear(root, before, after, keep)
    if lined and not keep and not line_kept:
        os.truncate(journal, line_at)  # the crash came before its line was durable
    reopened = Broker.open(root, max_segment_size=segment_size)  # marks say: lines first
    try:
        if keep == appended:
            _merge(expected, _expect(kind, last, count))
        elif not lined:  # whole frames stay: in write order (topic 1's, then topic 2's)
            written = sorted(((topic, message) for topic, messages
                              in _expect(kind, last, count).items() for message in messages),
                             key=lambda item: item[0])
            size = len(encode_batch(1, batch(last, 1)))
            for topic, message in written[:keep // size]:
                _merge(expected, {topic: [message]})
        assert {t: m for t, m in held(reopened).items() if m} == expected
        assert json.loads((root / "broker.json").read_text())["marks"] is True  # reopened so
    finally:
        reopened.close()


def test_lines_first_lone_messages_write_no_line_and_survive_a_switch_of_modes(
        tmp_path: Path) -> None:
    """One fsync for a single message: no journal line. A broker then opened the other way
    (--fsync interval) keeps those messages, and marks the directory for its own way; opened
    lines first again, it keeps what that wrote too."""
    broker = Broker.open(tmp_path, lines_first=True)
    for k in range(3):
        broker.write_group([encode_batch(1, [b"one %d" % k])], durable=True)
    assert not (tmp_path / "catalog.log").exists() or \
        (tmp_path / "catalog.log").stat().st_size == 0
    abandon(broker)
    assert json.loads((tmp_path / "broker.json").read_text())["marks"] == LINES_FIRST
    after_way = Broker.open(tmp_path)
    assert held(after_way) == {1: [b"one 0", b"one 1", b"one 2"]}
    assert after_way.index == 3
    after_way.write_group([encode_batch(1, [b"later"])], durable=False)
    abandon(after_way)
    assert json.loads((tmp_path / "broker.json").read_text())["marks"] is True
    first_way = Broker.open(tmp_path, lines_first=True)
    assert held(first_way) == {1: [b"one 0", b"one 1", b"one 2", b"later"]}
    first_way.close()


def test_lines_first_falls_back_when_the_directory_cannot_be_marked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """broker.json says every group has a line after its frames (the next start cuts frames
    no line covers) and cannot be rewritten: a broker asked for lines first writes every
    group's line after its frames instead, so nothing it acknowledges is cut."""
    broker = Broker.open(tmp_path)
    broker.write_group([encode_batch(1, [b"a"])], durable=True)
    abandon(broker)
    with inject(monkeypatch, Faults(tmp_path, match=lambda p: "broker.json" in p,
                                    write_budget=0)):
        reopened = Broker.open(tmp_path, lines_first=True)
    assert not reopened.lines_first and "could not save" in caplog.text
    reopened.write_group([encode_batch(1, [b"b"])], durable=True)
    abandon(reopened)
    again = Broker.open(tmp_path)
    assert held(again) == {1: [b"a", b"b"]}
    again.close()
