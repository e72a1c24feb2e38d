"""Append times: the time index codec, segments written before times existed, and a stateful
model of a broker whose commands carry times (publish with a clock that jumps, stays and steps
back; restart; torn tails; retention by size and by age), checked against the same rule the
broker applies: a topic's time moves to a command's time only when it is at least
TIME_RESOLUTION_MS past the current one, and never back.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from messaging.broker.broker import ApplyResult, Broker
from messaging.broker.commands import heartbeat_command, validate_publish
from messaging.broker.topic_settings import RETENTION_AGE, configure_command
from messaging.errors import MessagingError
from messaging.frames import decode, encode, encode_batch
from messaging.topic.segment import SEGMENT_SUFFIX, segment_name
from messaging.topic.times import (
    RECORD,
    TIME_RESOLUTION_MS,
    TIMES_SUFFIX,
    decode_records,
    encode_record,
)
from messaging.topic.topic import Topic
from tests.examples import examples
from tests.faults import Faults, inject

BASE_MS = 1_795_600_000_000  # 2026-11-26T09:46:40Z: any realistic wall-clock time
TOPICS = (1, 2, 3)
QUIET_TOPIC = 99  # heartbeats name it; nothing is ever published to it
HUGE = 1 << 40


# -- the codec -------------------------------------------------------------------------------


@st.composite
def time_records(draw: st.DrawFn) -> list[tuple[int, int]]:
    """Records as a writer stages them: indexes increasing, times non-decreasing."""
    steps = draw(st.lists(st.tuples(st.integers(1, 1 << 20), st.integers(0, 1 << 30)),
                          max_size=30))
    index, time_ms = draw(st.integers(1, 1 << 40)), draw(st.integers(-(1 << 40), 1 << 50))
    records = []
    for index_step, time_step in steps:
        records.append((index, time_ms))
        index += index_step
        time_ms += time_step
    return records


@settings(max_examples=examples(100), deadline=None)
@given(records=time_records(), garbage=st.binary(max_size=45))
def test_records_round_trip_whole_byte_by_byte_and_with_trailing_garbage(
        records: list[tuple[int, int]], garbage: bytes) -> None:
    data = b"".join(encode_record(i, t) for i, t in records)
    assert len(data) == RECORD.size * len(records)
    assert decode_records(data) == (records, len(data))
    # Every prefix (a file torn anywhere) decodes to the whole records it holds, no more.
    for cut in range(len(data) + 1):
        whole = cut // RECORD.size
        assert decode_records(data[:cut]) == (records[:whole], whole * RECORD.size)
    # Garbage after the records is a torn or damaged tail: never a record of its own unless
    # it happens to be a valid one that follows on (checked, not assumed).
    decoded, used = decode_records(data + garbage)
    assert decoded[:len(records)] == records and used >= len(data)
    assert used == RECORD.size * len(decoded)


@settings(max_examples=examples(100), deadline=None)
@given(records=time_records().filter(bool), data=st.data())
def test_a_damaged_record_ends_the_records(records: list[tuple[int, int]],
                                           data: st.DataObject) -> None:
    raw = bytearray(b"".join(encode_record(i, t) for i, t in records))
    k = data.draw(st.integers(0, len(records) - 1), label="damaged record")
    byte = data.draw(st.integers(0, RECORD.size - 1), label="byte")
    bit = data.draw(st.integers(0, 7), label="bit")
    raw[k * RECORD.size + byte] ^= 1 << bit
    assert decode_records(bytes(raw)) == (records[:k], k * RECORD.size)


def test_records_out_of_order_end_the_records() -> None:
    first = encode_record(10, 5_000)
    for bad in (encode_record(10, 6_000),  # index not above the one before
                encode_record(9, 6_000),
                encode_record(11, 4_999)):  # time below the one before
        assert decode_records(first + bad + encode_record(20, 7_000)) == (
            [(10, 5_000)], RECORD.size)
    assert decode_records(first + encode_record(11, 5_000)) == (
        [(10, 5_000), (11, 5_000)], 2 * RECORD.size)  # the same time again is fine


# -- segments written before times existed ---------------------------------------------------


def legacy_broker(path: Path, count: int = 3, **options: object) -> Broker:
    """A broker whose topic 1 holds ``count`` messages in a segment with no time index, as
    one written before times existed (commands without a time, on a broker with none)."""
    broker = Broker.open(path, max_topic_size=HUGE, **options)
    result = broker.write_group([encode_batch(1, [b"old %d" % k for k in range(count)])],
                                durable=True)[0]
    assert isinstance(result, ApplyResult) and (result.first, result.last) == (1, count)
    assert broker.time == 0
    assert list((path / "topics" / "1").glob("*" + TIMES_SUFFIX)) == []
    return broker


def test_a_legacy_segment_has_unknown_times_and_seek_skips_it(tmp_path: Path) -> None:
    broker = legacy_broker(tmp_path)
    broker.close()
    broker = Broker.open(tmp_path, max_topic_size=HUGE)
    topic = broker.topic(1)
    assert topic.time_of(2) is None and topic.last_time is None
    assert topic.times(0, 100) == [(1, None)]
    assert topic.index_at_time(0) is None  # older than any time: none at or after it
    assert broker.time == 0
    # The next timed append never goes into the legacy segment: it starts a new one.
    stamp = BASE_MS + 5
    result = broker.write_group([encode_batch(1, [b"new 0", b"new 1"])], durable=True,
                                times=[stamp])[0]
    assert isinstance(result, ApplyResult) and (result.first, result.last) == (4, 5)
    firsts = [s.first_index for s in topic.segments()]
    assert firsts == [1, 4]
    assert topic.segments()[0].times is None
    assert (tmp_path / "topics" / "1" / segment_name(4)).with_suffix(TIMES_SUFFIX).exists()
    assert [topic.time_of(i) for i in range(1, 6)] == [None, None, None, stamp, stamp]
    assert topic.times(0, 100) == [(1, None), (4, stamp)]
    assert topic.times(2, 4) == [(2, None), (4, stamp)]
    for moment in (0, stamp - 1, stamp):
        assert topic.index_at_time(moment) == 4
    assert topic.index_at_time(stamp + 1) is None
    broker.close()
    broker = Broker.open(tmp_path, max_topic_size=HUGE)
    assert broker.time == stamp
    assert broker.topic(1).times(0, 100) == [(1, None), (4, stamp)]
    assert broker.topic(1).index_at_time(1) == 4
    broker.close()


def test_age_retention_takes_a_legacy_segment_only_behind_an_old_enough_one(
        tmp_path: Path) -> None:
    broker = legacy_broker(tmp_path, max_segment_size=100)
    topic = broker.topic(1)
    for k in range(4):  # timed segments after it
        broker.write_group([encode_batch(1, [b"x" * 90])], durable=True,
                           times=[BASE_MS + 1000 * k])
    assert len(topic.segments()) >= 3
    broker.retention_age = 1.0
    segments = len(topic.segments())
    # No timed segment is old enough: the oldest has no time, and age retention does not
    # invent one for it.
    assert broker.enforce_retention(wall_ms=BASE_MS + 500) == 0
    assert len(topic.segments()) == segments
    # A timed segment after it is too old: the legacy one, appended before it, is older
    # still, and goes with it (times never decrease along a topic).
    assert broker.enforce_retention(wall_ms=BASE_MS + 10**9) > 0
    assert all(s.times is not None for s in topic.segments())
    assert len(topic.segments()) == 1  # the active one stays
    broker.close()


def test_a_last_segment_whose_time_index_holds_no_record_is_unknown(tmp_path: Path) -> None:
    """A time file damaged from its first record leaves its segment's times unknown (never
    invented); the next timed append starts a new segment."""
    broker = Broker.open(tmp_path)
    broker.write_group([encode_batch(1, [b"a", b"b"])], durable=True, times=[BASE_MS])
    broker.close()
    time_file = tmp_path / "topics" / "1" / (segment_name(1)[:-len(SEGMENT_SUFFIX)]
                                             + TIMES_SUFFIX)
    raw = bytearray(time_file.read_bytes())
    raw[3] ^= 0x40
    time_file.write_bytes(raw)
    broker = Broker.open(tmp_path)
    topic = broker.topic(1)
    assert topic.times(0, 10) == [(1, None)]
    broker.write_group([encode_batch(1, [b"c"])], durable=True,
                       times=[BASE_MS + 5 * TIME_RESOLUTION_MS])
    assert [s.first_index for s in topic.segments()] == [1, 3]
    assert topic.times(0, 10) == [(1, None), (3, BASE_MS + 5 * TIME_RESOLUTION_MS)]
    assert topic.index_at_time(BASE_MS) == 3
    broker.close()


# -- the stateful model ----------------------------------------------------------------------


@dataclass
class Stored:
    index: int
    data: bytes
    time: int


@dataclass
class Model:
    """What the broker must hold: every acknowledged message still kept, with its time."""

    index: int = 0
    time: int = 0  # the broker's time (0: none yet)
    clock: int = BASE_MS  # the writer's wall clock, which may step back
    kept: dict[int, list[Stored]] = field(default_factory=dict)
    topic_age: dict[int, int] = field(default_factory=dict)  # retention-age settings (ms)
    newest_message_time: int = 0

    def advance(self, delta: int) -> int:
        """A command formed ``delta`` ms after the previous one; the messages' time."""
        self.clock += delta
        if self.clock >= self.time + TIME_RESOLUTION_MS:
            self.time = self.clock
        return self.time

    def runs(self, topic: int, start: int, stop: int) -> list[tuple[int, int | None]]:
        """The time runs of the kept messages with indexes start..stop."""
        out: list[tuple[int, int | None]] = []
        for stored in self.kept.get(topic, []):
            if start <= stored.index <= stop and (not out or out[-1][1] != stored.time):
                out.append((stored.index, stored.time))
        return out


# A command of a publish group: ("one" | "batch" | "known" | "mixed", topic, sizes, delta).
deltas = st.one_of(
    st.integers(TIME_RESOLUTION_MS, 100_000),  # the clock moved on
    st.integers(0, TIME_RESOLUTION_MS - 1),  # within the resolution: the same time
    st.integers(-5_000, -1),  # the clock stepped back
    st.sampled_from([TIME_RESOLUTION_MS - 1, TIME_RESOLUTION_MS, TIME_RESOLUTION_MS + 1]),
)
commands = st.tuples(st.sampled_from(["one", "batch", "known", "mixed"]),
                     st.sampled_from(TOPICS),
                     st.lists(st.integers(0, 60), min_size=1, max_size=6),
                     deltas)


def _is_time_file(path: str) -> bool:
    return path.endswith(TIMES_SUFFIX)


def _is_segment_file(path: str) -> bool:
    return path.endswith(SEGMENT_SUFFIX)


#: Faults a group may meet in one topic's folder, on the first matching call (tests/faults.py).
FAULTS: dict[str, Callable[[Path], Faults]] = {
    "time write fails": lambda root: Faults(root, match=_is_time_file, write_budget=0,
                                            write_errno=errno.EIO),
    "time write is short": lambda root: Faults(root, match=_is_time_file, write_budget=7),
    "time fsync fails": lambda root: Faults(root, match=_is_time_file, sync_failures=1),
    "frames write is short": lambda root: Faults(root, match=_is_segment_file,
                                                 write_budget=30),
    "frames fsync fails": lambda root: Faults(root, match=_is_segment_file, sync_failures=1),
}


class TimesMachine(RuleBasedStateMachine):
    """A broker driven through write_group with explicit command times."""

    @initialize(segment_size=st.integers(200, 400))
    def setup(self, segment_size: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="times-model-"))
        self.options = {"max_segment_size": segment_size, "max_topic_size": HUGE}
        self.broker = Broker.open(self.dir, **self.options)
        self.model = Model()
        self.serial = 0

    def teardown(self) -> None:
        if hasattr(self, "broker"):
            self.broker.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- rules ------------------------------------------------------------------------------

    def _payload(self, size: int) -> bytes:
        self.serial += 1
        return (b"%d:" % self.serial + os.urandom(size))[: max(size, 1) + 8]

    def _build(self, group: list[tuple[str, int, list[int], int]],
               ) -> tuple[list[bytes], list[int], list[list[tuple[int, bytes]]], list[int]]:
        """The commands of a group, their times, their messages and those messages' times
        (the model's time moves as the broker's must; the caller keeps or undoes it)."""
        built: list[bytes] = []
        times: list[int] = []
        expected: list[list[tuple[int, bytes]]] = []
        stamps: list[int] = []
        for kind, topic, sizes, delta in group:
            datas = [self._payload(size) for size in sizes]
            if kind == "one":
                frames = [(topic, datas[0])]
                built.append(encode(1, topic, datas[0]))
            elif kind == "batch":
                frames = [(topic, d) for d in datas]
                built.append(encode_batch(topic, datas))
            elif kind == "known":  # validated as the HTTP layer does: offsets known
                frames = [(topic, d) for d in datas]
                built.append(validate_publish(encode_batch(topic, datas), topic=topic))
            else:  # one command over several topics
                frames = [(TOPICS[(topic + k) % len(TOPICS)], d) for k, d in enumerate(datas)]
                built.append(b"".join(encode(1, t, d) for t, d in frames))
            times.append(self.model.clock + delta)
            stamps.append(self.model.advance(delta))
            expected.append(frames)
        return built, times, expected, stamps

    @rule(group=st.lists(commands, min_size=1, max_size=3), durable=st.booleans())
    def publish(self, group: list[tuple[str, int, list[int], int]], durable: bool) -> None:
        built, times, expected, stamps = self._build(group)
        results = self.broker.write_group(built, durable=durable, times=times)
        self._acknowledged(results, expected, stamps)

    def _acknowledged(self, results: list[ApplyResult | MessagingError],
                      expected: list[list[tuple[int, bytes]]], stamps: list[int]) -> None:
        for result, frames, stamp in zip(results, expected, stamps, strict=True):
            assert isinstance(result, ApplyResult), result
            assert (result.first, result.last) == (self.model.index + 1,
                                                   self.model.index + len(frames))
            for topic, data in frames:
                self.model.index += 1
                self.model.kept.setdefault(topic, []).append(Stored(self.model.index, data,
                                                                    stamp))
                self.model.newest_message_time = max(self.model.newest_message_time, stamp)

    @rule(group=st.lists(commands, min_size=1, max_size=3),
          fault=st.sampled_from(sorted(FAULTS)), where=st.sampled_from(TOPICS))
    def failed_publish(self, group: list[tuple[str, int, list[int], int]], fault: str,
                       where: int) -> None:
        """A group whose write or fsync fails at the system-call boundary in topic ``where``
        keeps nothing (its time included); a failed fsync stops that topic until a
        restart."""
        time_before = self.model.time
        built, times, expected, stamps = self._build(group)
        with pytest.MonkeyPatch.context() as patch, \
                inject(patch, FAULTS[fault](self.dir / "topics" / str(where))) as faults:
            results = self.broker.write_group(built, durable=True, times=times)
        if not faults.injected:  # the group never made that call: it went through
            self._acknowledged(results, expected, stamps)
            return
        assert all(isinstance(r, MessagingError) for r in results), results
        self.model.time = time_before
        stopped = [t.id for t in self.broker.topics() if t.failure is not None]
        if stopped:
            assert "fsync" in fault and stopped == [where]
            self.restart(forget_time=False)

    @rule(delta=deltas)
    def heartbeat(self, delta: int) -> None:
        """A command that holds no message still moves the broker's time."""
        times = [self.model.clock + delta]
        self.model.advance(delta)
        result = self.broker.write_group([heartbeat_command(QUIET_TOPIC, 1, "watcher")],
                                         durable=True, times=times)[0]
        assert isinstance(result, ApplyResult) and result.count == 0

    @rule(forget_time=st.booleans())
    def restart(self, forget_time: bool) -> None:
        """Close and open again; ``forget_time``: broker.json does not say the time (saved
        before the last commands, or before times existed): it is recovered from the
        topics' time indexes."""
        self.broker.close()
        if forget_time:
            meta = self.dir / "broker.json"
            state = json.loads(meta.read_text())
            state.pop("time", None)
            meta.write_text(json.dumps(state))
            self.model.time = self.model.newest_message_time
        self.broker = Broker.open(self.dir, **self.options)

    @rule(data=st.data(),
          damage=st.sampled_from(["seg garbage", "seg partial frame", "time garbage",
                                  "time partial record", "both garbage",
                                  "time and frames of a lost group",
                                  "lost roll, time only", "lost roll, partial frame"]))
    def torn_tail(self, data: st.DataObject, damage: str) -> None:
        """What a crash in the middle of a group leaves, or a damaged tail: after a restart
        it is cut back and every acknowledged message is there with its time."""
        holding = sorted(t for t, kept in self.model.kept.items() if kept)
        if not holding:
            return
        topic = data.draw(st.sampled_from(holding), label="topic")
        self.broker.close()
        folder = self.dir / "topics" / str(topic)
        last_seg = sorted(folder.glob("*" + SEGMENT_SUFFIX))[-1]
        last_time = last_seg.with_suffix(TIMES_SUFFIX)
        next_index = self.model.index + 1
        later = max(self.model.newest_message_time, self.model.time) + data.draw(
            st.integers(0, 10_000), label="time of the lost group")
        frame = encode(1, topic, b"never acknowledged", index=next_index)
        cut = data.draw(st.integers(1, len(frame) - 1), label="torn frame length")
        garbage = data.draw(st.binary(min_size=1, max_size=40), label="garbage")
        record = encode_record(next_index, later)
        if damage == "seg garbage":
            _append(last_seg, garbage)
        elif damage == "seg partial frame":
            _append(last_seg, frame[:cut])
        elif damage == "time garbage":
            _append(last_time, garbage)
        elif damage == "both garbage":
            _append(last_seg, garbage)
            _append(last_time, garbage)
        elif damage == "time partial record":
            _append(last_time, record[:data.draw(st.integers(1, RECORD.size - 1))])
        elif damage == "time and frames of a lost group":
            # Its record was written and fsynced before its frames, which the crash tore.
            _append(last_time, record)
            _append(last_seg, frame[:cut])
        else:
            # The lost group rolled: the new segment's time index made it, its frames did not.
            new_seg = folder / segment_name(next_index)
            new_seg.with_suffix(TIMES_SUFFIX).write_bytes(record)
            if damage == "lost roll, partial frame":
                new_seg.write_bytes(frame[:cut])
        self.broker = Broker.open(self.dir, **self.options)
        for path in sorted(folder.iterdir()):
            assert path.suffix in (SEGMENT_SUFFIX, TIMES_SUFFIX) or path.name == "tombstone"
            if path.suffix == TIMES_SUFFIX:
                raw = path.read_bytes()
                assert decode_records(raw)[1] == len(raw), f"{path.name} kept a torn tail"
                assert path.with_suffix(SEGMENT_SUFFIX).exists()
        assert not (folder / segment_name(next_index)).exists()

    @rule(mode=st.sampled_from(["size", "age", "topic age"]), data=st.data())
    def retention(self, mode: str, data: st.DataObject) -> None:
        broker, model = self.broker, self.model
        wall_ms = model.clock + data.draw(st.integers(-100_000, 100_000), label="wall")
        if mode == "size":
            broker.max_topic_size = data.draw(st.integers(0, 2_000), label="max topic size")
        elif mode == "age":
            age_ms = data.draw(st.integers(1, 200_000), label="age")
            broker.retention_age = age_ms / 1000
            wall_ms = self._wall_near_a_time(data, age_ms, wall_ms)
        else:
            topic = data.draw(st.sampled_from(TOPICS), label="topic")
            age_ms = data.draw(st.integers(0, 200_000), label="topic's age")  # 0: off
            delta = data.draw(deltas, label="delta")
            times = [model.clock + delta]
            model.advance(delta)
            result = broker.write_group([configure_command(topic, {RETENTION_AGE: age_ms})],
                                        durable=True, times=times)[0]
            assert isinstance(result, ApplyResult), result
            model.topic_age[topic] = age_ms
            wall_ms = self._wall_near_a_time(data, age_ms, wall_ms)
        expected = {t.id: self._expected_retention(t, wall_ms) for t in broker.topics()}
        try:
            broker.enforce_retention(wall_ms=wall_ms)
        finally:
            broker.max_topic_size = HUGE
            broker.retention_age = None
        for topic_id, first_kept in expected.items():
            if first_kept is None:
                continue
            model.kept[topic_id] = [s for s in model.kept[topic_id] if s.index >= first_kept]
            assert broker.topic(topic_id).first_index <= model.kept[topic_id][0].index

    def _wall_near_a_time(self, data: st.DataObject, age_ms: int, default: int) -> int:
        """A wall clock that puts the age limit exactly at, just before or just after a
        kept message's time."""
        stamps = sorted({s.time for kept in self.model.kept.values() for s in kept})
        if not stamps:
            return default
        stamp = data.draw(st.sampled_from(stamps), label="limit near")
        return stamp + age_ms + data.draw(st.integers(-1, 1), label="off by")

    def _expected_retention(self, topic: Topic, wall_ms: int) -> int | None:
        """The first index retention keeps (None: it deletes nothing), by the same rule as
        Topic.truncate, with the newest time of each segment taken from the model."""
        broker = self.broker
        age_ms = self.model.topic_age.get(topic.id)
        if age_ms is None and broker.retention_age is not None:
            age_ms = round(broker.retention_age * 1000)
        older_than = wall_ms - age_ms if age_ms else None
        segments = topic.segments()
        total = sum(s.size for s in segments)
        if total <= broker.max_topic_size and older_than is None:
            return None
        kept = self.model.kept.get(topic.id, [])
        doomed = 0
        for oldest, following in itertools.pairwise(segments):
            inside = [s.time for s in kept if oldest.first_index <= s.index
                      < following.first_index]
            assert inside, f"segment {oldest.path.name} holds no kept message"
            too_old = older_than is not None and inside[-1] < older_than
            if total <= broker.max_topic_size and not too_old:
                break
            doomed += 1
            total -= oldest.size
        return segments[doomed].first_index if doomed else None

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def times_match_the_model(self) -> None:
        if not hasattr(self, "broker"):
            return
        broker, model = self.broker, self.model
        assert broker.index == model.index
        assert broker.time == model.time
        for topic_id in TOPICS:
            kept = model.kept.get(topic_id, [])
            topic = broker.store.get(topic_id)
            if topic is None:
                assert not kept
                continue
            self._check_messages(topic, kept)
            self._check_times(topic, kept)
            self._check_seek(topic, kept)
            self._check_files(topic)

    def _check_messages(self, topic: Topic, kept: list[Stored]) -> None:
        with topic.reader(topic.first_index) as reader:
            messages, _used = decode(reader.read_all(), after=0)
        assert [(m.index, m.data) for m in messages] == [(s.index, s.data) for s in kept]

    def _check_times(self, topic: Topic, kept: list[Stored]) -> None:
        got = [topic.time_of(s.index) for s in kept]
        assert got == [s.time for s in kept]
        assert all(a is not None and b is not None and a <= b
                   for a, b in itertools.pairwise(got)), "times decrease in index order"
        assert topic.last_time == (kept[-1].time if kept else None)
        assert topic.times(0, HUGE) == self.model.runs(topic.id, 0, HUGE)
        if not kept:
            return
        first, last = kept[0].index, kept[-1].index
        middle = kept[len(kept) // 2].index
        for start, stop in ((first, last), (first, middle), (middle, last), (middle, middle),
                            (middle - 1, middle + 1), (first - 1, first), (last, last + 10)):
            self._check_runs(topic, kept, start, stop)

    def _check_runs(self, topic: Topic, kept: list[Stored], start: int, stop: int) -> None:
        runs = topic.times(start, stop)
        inside = [s for s in kept if start <= s.index <= stop]
        if not inside:
            return
        firsts = [first for first, _ in runs]
        assert firsts == sorted(set(firsts)), runs
        assert all(a[1] != b[1] for a, b in itertools.pairwise(runs)), runs
        assert firsts[0] <= inside[0].index and firsts[-1] <= stop, runs
        for stored in inside:
            covering = [time_ms for first, time_ms in runs if first <= stored.index][-1]
            assert covering == stored.time, (stored.index, runs)
        if start <= kept[0].index:
            assert runs == self.model.runs(topic.id, start, stop)

    def _check_seek(self, topic: Topic, kept: list[Stored]) -> None:
        stamps = sorted({s.time for s in kept})
        moments = {0, BASE_MS - 1}
        for stamp in stamps:
            moments.update((stamp - 1, stamp, stamp + 1))
        for moment in sorted(moments):
            expected = next((s.index for s in kept if s.time >= moment), None)
            assert topic.index_at_time(moment) == expected, moment

    def _check_files(self, topic: Topic) -> None:
        for segment in topic.segments():
            times_file = segment.path.with_suffix(TIMES_SUFFIX)
            raw = times_file.read_bytes()
            records, used = decode_records(raw)
            assert used == len(raw), f"{times_file.name} holds bytes past its records"
            assert records and records[0][0] == segment.first_index
            assert records[-1][0] <= segment.committed_last_index or not segment.indexed


def _append(path: Path, data: bytes) -> None:
    with path.open("ab") as f:
        f.write(data)


TimesMachine.TestCase.settings = settings(
    max_examples=examples(30), stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# Seconds even at a quarter of its examples: left out of the unit run, like other slow tests.
test_times_state_machine = pytest.mark.e2e(TimesMachine.TestCase)

