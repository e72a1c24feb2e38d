"""Segment object names: what they say, parsed back exactly, and nothing else accepted."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from messaging.objects import ObjectNameError, SegmentObjectName, parse_object_name
from messaging.objects.naming import MAX_INDEX, name_segment_object
from messaging.objects.store import check_name

SHA = hashlib.sha256(b"frames").hexdigest()


def test_a_name_says_topic_indexes_checksum_and_kind() -> None:
    name = SegmentObjectName(7, 1, 9000, SHA)
    assert name.name == f"7/00000000000000000001-00000000000000009000-{SHA}.seg"
    times = SegmentObjectName(7, 1, 9000, SHA, "time")
    assert times.name == f"7/00000000000000000001-00000000000000009000-{SHA}.time"
    assert parse_object_name(name.name) == name
    assert parse_object_name(times.name) == times
    check_name(name.name)  # every store can hold it


@given(topic=st.integers(0, MAX_INDEX), first=st.integers(1, MAX_INDEX),
       span=st.integers(0, MAX_INDEX), sha=st.binary(min_size=1, max_size=8),
       kind=st.sampled_from(["seg", "time"]))
def test_names_parse_back_to_what_made_them(topic: int, first: int, span: int, sha: bytes,
                                            kind: str) -> None:
    last = min(MAX_INDEX, first + span)
    name = SegmentObjectName(topic, first, last, hashlib.sha256(sha).hexdigest(),
                             kind)  # type: ignore[arg-type]
    assert parse_object_name(name.name) == name


@pytest.mark.parametrize("name", [
    f"07/00000000000000000001-00000000000000000002-{SHA}.seg",  # topic not canonical
    f"7/0000000000000000001-00000000000000000002-{SHA}.seg",  # 19 digits
    f"7/00000000000000000001-00000000000000000002-{SHA.upper()}.seg",
    f"7/00000000000000000001-00000000000000000002-{SHA[:-1]}.seg",
    f"7/00000000000000000001-00000000000000000002-{SHA}.tmp",
    f"7/00000000000000000001-00000000000000000002-{SHA}.seg.tmp",
    f"prefix/7/00000000000000000001-00000000000000000002-{SHA}.seg",
    f"/7/00000000000000000001-00000000000000000002-{SHA}.seg",
    f"7/00000000000000000002-00000000000000000001-{SHA}.seg",  # last below first
    f"7/00000000000000000000-00000000000000000001-{SHA}.seg",  # index 0
    f"7/99999999999999999999-99999999999999999999-{SHA}.seg",  # past u64
    f"18446744073709551616/00000000000000000001-00000000000000000002-{SHA}.seg",
    "7/00000000000000000001.seg",
    "",
])
def test_other_names_are_refused(name: str) -> None:
    with pytest.raises(ObjectNameError):
        parse_object_name(name)


def test_impossible_names_cannot_be_made() -> None:
    for topic, first, last, sha in [(-1, 1, 2, SHA), (1, 0, 2, SHA), (1, 3, 2, SHA),
                                    (1, 1, MAX_INDEX + 1, SHA), (1, 1, 2, "abc")]:
        with pytest.raises(ObjectNameError):
            SegmentObjectName(topic, first, last, sha)


async def test_naming_a_file_hashes_it(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000005.seg"
    path.write_bytes(b"frames" * 1000)
    name, digest = await name_segment_object(2, 5, 99, path)
    assert digest.size == 6000
    assert digest.sha256 == name.sha256 == hashlib.sha256(b"frames" * 1000).hexdigest()
    assert name.name.startswith("2/00000000000000000005-00000000000000000099-")
    times, _ = await name_segment_object(2, 5, 99, path, "time")
    assert times.name.endswith(".time")
