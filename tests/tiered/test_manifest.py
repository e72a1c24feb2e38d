"""The manifest: offload and expire as a model, its JSON form, and the topic commands."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from messaging.broker.topic_settings import (
    EXPIRE,
    OFFLOAD,
    TopicEntry,
    expire_command,
    offload_command,
    parse_topic_command,
)
from messaging.errors import CorruptFrameError
from messaging.frames import decode_one
from messaging.tiered.manifest import Manifest, SegmentObject
from tests.examples import examples

SHA = "ab" * 32


def obj(first: int, last: int, size: int = 100, last_time: int | None = None) -> SegmentObject:
    return SegmentObject(first, last, size, last - first + 1, SHA, None, 0, last_time)


def test_offload_needs_the_offloaded_index_its_uploader_saw() -> None:
    manifest = Manifest()
    first = manifest.offload(obj(1, 10), after=0)
    assert first is not None and first.offloaded == 10
    assert first.offload(obj(1, 10), after=0) is None  # recorded already
    assert first.offload(obj(11, 20), after=5) is None  # chosen against another state
    second = first.offload(obj(11, 20), after=10)
    assert second is not None and [o.first for o in second.objects] == [1, 11]
    assert second.find(0) == obj(1, 10) and second.find(15) == obj(11, 20)
    assert second.find(21) is None
    assert second.first_index == 1 and second.covered == 20 and second.size == 200


def test_expire_drops_whole_objects_and_is_never_undone() -> None:
    manifest = Manifest((obj(1, 10), obj(11, 20), obj(21, 30)), 30, 0)
    expired = manifest.expire(15)
    assert expired is not None
    assert [o.first for o in expired.objects] == [11, 21]  # 11-20 straddles: kept
    assert expired.first_index == 16 and expired.expired == 15
    assert expired.expire(15) is None and expired.expire(3) is None
    assert manifest.dropped(expired) == [obj(1, 10)]
    gone = expired.expire(40)
    assert gone is not None and not gone.objects and gone.covered == 40
    assert gone.offload(obj(31, 35), after=30) is None  # below what expired
    assert gone.offload(obj(41, 50), after=30) is not None


@settings(max_examples=examples(200))
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 30), st.integers(0, 3)),
                max_size=30))
def test_model(steps: list[tuple[bool, int, int]]) -> None:
    """Any sequence of records and expiries keeps the objects ordered, apart and above what
    expired; ``covered`` never goes back; the JSON form round-trips."""
    manifest = Manifest()
    covered = 0
    for is_offload, length, skew in steps:
        if is_offload:
            first = manifest.covered + 1 + skew
            changed = manifest.offload(obj(first, first + length), manifest.offloaded)
            assert changed is not None
        else:
            changed = manifest.expire(max(manifest.covered - skew * 5, 1))
        if changed is not None:
            manifest = changed
        assert manifest.covered >= covered
        covered = manifest.covered
        lasts = [o.last for o in manifest.objects]
        assert lasts == sorted(lasts)
        assert all(a.last < b.first for a, b in zip(manifest.objects, manifest.objects[1:],
                                                    strict=False))
        assert all(o.last > manifest.expired for o in manifest.objects)
        assert Manifest.restore(json.loads(json.dumps(manifest.saved()))) == manifest


def test_an_entry_keeps_its_manifest_through_settings_and_saves_it() -> None:
    manifest = Manifest((obj(1, 10, last_time=5),), 10, 0)
    entry = TopicEntry({"max-topic-size": 10}).with_manifest(manifest)
    configured = entry.configured({"max-topic-size": None})
    assert configured.manifest == manifest and not configured.empty
    assert TopicEntry.restore(json.loads(json.dumps(entry.saved()))) == entry


def test_the_commands_round_trip() -> None:
    marked = SegmentObject(5, 9, 100, 5, SHA, SHA, 40, 7, ((7, 50, 2), (8, 70, 3)))
    command = decode_one(offload_command(3, marked, after=4))
    op = parse_topic_command(3, bytes(command.data))
    assert op.kind == OFFLOAD and op.object == marked and op.after == 4
    assert marked.mark_at_index(6) == (5, 0, 0) and marked.mark_at_index(7) == (7, 50, 2)
    assert marked.mark_at_index(100) == (8, 70, 3) and marked.mark_at_ordinal(2) == (7, 50, 2)
    op = parse_topic_command(3, bytes(decode_one(expire_command(3, 42)).data))
    assert op.kind == EXPIRE and op.through == 42


@pytest.mark.parametrize("data", [
    {"op": "offload", "object": [5, 4, 100, 1, SHA, None, 0, None, []], "after": 0},  # last<first
    {"op": "offload", "object": [1, 4, 100, 1, "xyz", None, 0, None, []], "after": 0},  # checksum
    {"op": "offload", "object": [1, 4, 0, 1, SHA, None, 0, None, []], "after": 0},  # empty
    {"op": "offload", "object": [1, 4, 100, 4, SHA, None, 0, None, [[9, 50, 2]]],
     "after": 0},  # a mark outside the object
    {"op": "offload", "object": [1, 4, 100, 4, SHA, None, 0, None, [[3, 60, 2], [2, 50, 1]]],
     "after": 0},  # marks out of order
    {"op": "offload", "object": [1, 4, 100], "after": 0},
    {"op": "expire", "through": 0},
    {"op": "expire"},
])
def test_invalid_commands_are_corrupt(data: dict[str, object]) -> None:
    with pytest.raises(CorruptFrameError):
        parse_topic_command(3, json.dumps(data).encode())
