"""Reading a stream through its fork lineage (messaging.broker.stream_reads), on a real broker.

Forks whose boundary lies inside one append (a byte sub-offset, also inside an append that was
cut into several frames because it was bigger than the message size; a JSON sub-offset, which
counts messages), forks of forks, and reads that resume from every offset an earlier read
returned: the pieces read must always concatenate to the stream's whole content, and the offset
tokens must sort as the positions they name.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from messaging.broker.broker import Broker
from messaging.broker.catalog import APPEND_END, Position, parse_token, token
from messaging.broker.stream_reads import Item, body, next_append, read, resolve_sub_offset
from messaging.errors import BadRequestError
from tests.broker.test_catalog import append, create, delete, fork_op, ok, pieces
from tests.examples import examples


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    """A broker on a fresh data directory, closed at the end."""
    opened = Broker.open(tmp_path / "data")
    yield opened
    opened.close()


def tail(broker: Broker, name: str) -> Position:
    """The stream's committed tail position."""
    return broker.catalog.streams[name].tail


def fork_at(broker: Broker, name: str, source: str, anchor: Position, sub: int,
            content_type: str | None = None) -> Position:
    """Create ``name`` forking ``source`` ``sub`` bytes (or JSON messages) past ``anchor``, as
    the HTTP layer does: resolve the sub-offset on the source, then create through the log."""
    stream = broker.catalog.streams[source]
    at = resolve_sub_offset(broker, broker.catalog, stream, anchor, sub)
    create(broker, name, content_type,
           fork=fork_op(source, at, sub, offset=token(anchor)))
    assert tail(broker, name) == at
    return at


def read_in_chunks(broker: Broker, name: str, after: Position = (0, 0), limit: int = 1,
                   ) -> list[Item]:
    """Everything after ``after``, read ``limit`` bytes at a time, each read resuming from
    the position the previous one ended at (bounded)."""
    stream = broker.catalog.streams[name]
    found: list[Item] = []
    for _ in range(10_000):
        got = read(broker, broker.catalog, stream, after, limit)
        if not got:
            return found
        found.extend(got)
        after = got[-1].position
    raise AssertionError("a read never ended")


def check_reads(broker: Broker, name: str, expected: bytes) -> None:
    """The stream reads as ``expected`` in one go, a byte at a time, and from every offset a
    read returned; positions strictly increase, as do their tokens, ending at the tail."""
    stream = broker.catalog.streams[name]
    whole = read(broker, broker.catalog, stream, (0, 0))
    assert b"".join(i.data for i in whole) == expected
    chunks = read_in_chunks(broker, name)
    assert b"".join(i.data for i in chunks) == expected
    positions = [i.position for i in chunks]
    assert positions == sorted(set(positions)), "positions must strictly increase"
    tokens = [token(p) for p in positions]
    assert tokens == sorted(set(tokens))
    if chunks:
        assert positions[-1] == stream.tail
    done = 0
    for item in chunks:
        done += len(item.data)
        rest = read(broker, broker.catalog, stream, item.position)
        assert expected[:done] + b"".join(i.data for i in rest) == expected, item.position
        # parse_token(token(p)) is p: a client that resumes from the token gets the same.
        assert parse_token(token(item.position)) == item.position


# -- byte sub-offsets ---------------------------------------------------------------------------


def test_byte_sub_offset_forks_inside_a_split_append(broker: Broker) -> None:
    big = b"ABCDEFGHIJ"  # one append of 10 bytes, cut in messages of 4, 4 and 2 bytes
    create(broker, "src", messages=[b"head-"])
    anchor = tail(broker, "src")
    ok(append(broker, "src", *pieces(big, 4)))
    after_big = tail(broker, "src")
    ok(append(broker, "src", b"-tail"))
    frames = next_append(broker, broker.catalog, broker.catalog.streams["src"], anchor)
    assert [i.data for i in frames] == [b"ABCD", b"EFGH", b"IJ"]
    assert frames[-1].type == APPEND_END and frames[-1].position == after_big

    positions = []
    for sub in range(len(big) + 1):
        name = f"fork-{sub}"
        at = fork_at(broker, name, "src", anchor, sub)
        positions.append(at)
        check_reads(broker, name, b"head-" + big[:sub])
        ok(append(broker, name, b"own-1"))
        ok(append(broker, name, *pieces(b"own-two", 3)))
        check_reads(broker, name, b"head-" + big[:sub] + b"own-1own-two")
    # Fork points inside the append sort between the anchor and the append's end.
    assert positions[0] == anchor and positions[-1] == after_big
    assert positions == sorted(set(positions))
    assert [token(p) for p in positions] == sorted(token(p) for p in positions)
    # The source is untouched by its forks.
    check_reads(broker, "src", b"head-" + big + b"-tail")

    with pytest.raises(BadRequestError):
        resolve_sub_offset(broker, broker.catalog, broker.catalog.streams["src"], anchor,
                           len(big) + 1)


def test_sub_offset_from_the_start_and_at_the_tail(broker: Broker) -> None:
    create(broker, "src", messages=pieces(b"0123456", 2))
    fork_at(broker, "f", "src", (0, 0), 3)
    check_reads(broker, "f", b"012")
    end = tail(broker, "src")
    assert resolve_sub_offset(broker, broker.catalog, broker.catalog.streams["src"], end,
                              0) == end
    with pytest.raises(BadRequestError):  # nothing follows the tail
        resolve_sub_offset(broker, broker.catalog, broker.catalog.streams["src"], end, 1)


def test_fork_of_a_fork_with_sub_offsets_at_both_levels(broker: Broker) -> None:
    create(broker, "a", messages=[b"abc"])
    anchor_a = tail(broker, "a")
    ok(append(broker, "a", *pieces(b"defgh", 2)))
    ok(append(broker, "a", b"ij"))
    fork_at(broker, "b", "a", anchor_a, 3)  # abc + def
    check_reads(broker, "b", b"abcdef")
    ok(append(broker, "b", b"KL"))
    anchor_b = tail(broker, "b")
    ok(append(broker, "b", *pieces(b"MNOPQ", 2)))
    check_reads(broker, "b", b"abcdefKLMNOPQ")

    fork_at(broker, "c", "b", anchor_b, 4)  # abcdef KL MNOP
    check_reads(broker, "c", b"abcdefKLMNOP")
    ok(append(broker, "c", *pieces(b"rstuv", 2)))
    check_reads(broker, "c", b"abcdefKLMNOPrstuv")

    # A fork of the fork at the fork's own fork point (inside a's append)...
    fork_point = broker.catalog.streams["b"].fork
    assert fork_point is not None
    fork_at(broker, "d", "b", fork_point.at, 0)
    check_reads(broker, "d", b"abcdef")
    # ...and inside the range the fork inherited: only what the fork itself holds counts.
    fork_at(broker, "e", "b", anchor_a, 2)
    check_reads(broker, "e", b"abcde")
    with pytest.raises(BadRequestError):  # b holds only 3 bytes of a's append
        resolve_sub_offset(broker, broker.catalog, broker.catalog.streams["b"], anchor_a, 4)
    ok(append(broker, "e", b"E"))
    check_reads(broker, "e", b"abcdeE")

    # Later appends to a source never show in its forks.
    ok(append(broker, "a", b"late"))
    ok(append(broker, "b", b"late"))
    check_reads(broker, "c", b"abcdefKLMNOPrstuv")
    check_reads(broker, "d", b"abcdef")
    check_reads(broker, "e", b"abcdeE")


def test_reads_survive_reopen_and_soft_deleted_sources(tmp_path: Path) -> None:
    broker = Broker.open(tmp_path / "data")
    create(broker, "a", messages=[b"abc"])
    anchor = tail(broker, "a")
    ok(append(broker, "a", *pieces(b"defgh", 2)))
    fork_at(broker, "b", "a", anchor, 4)
    ok(append(broker, "b", b"XY"))
    ok(delete(broker, "a"))
    broker.close()
    broker = Broker.open(tmp_path / "data")
    try:
        assert broker.catalog.streams["a"].deleted
        check_reads(broker, "b", b"abcdefgXY")
    finally:
        broker.close()


# -- JSON sub-offsets ---------------------------------------------------------------------------


def json_values(broker: Broker, name: str, after: Position = (0, 0)) -> list[object]:
    """A JSON stream read as the catch-up body would carry it."""
    stream = broker.catalog.streams[name]
    value = json.loads(body(stream, read(broker, broker.catalog, stream, after)))
    assert isinstance(value, list)
    return value


def test_json_sub_offsets_count_messages(broker: Broker) -> None:
    create(broker, "src", "application/json", [b"1"])
    anchor = tail(broker, "src")
    batch = [b'{"a":1}', b'{"b":[2]}', b'"c"', b"[4]"]
    ok(append(broker, "src", *batch, content_type="application/json"))
    ok(append(broker, "src", b"null", content_type="application/json"))
    values = [1, {"a": 1}, {"b": [2]}, "c", [4], None]
    assert json_values(broker, "src") == values

    for sub in range(len(batch) + 1):
        name = f"f{sub}"
        fork_at(broker, name, "src", anchor, sub)
        stream = broker.catalog.streams[name]
        assert stream.json and stream.content_type == "application/json"
        assert json_values(broker, name) == values[:1 + sub]
        ok(append(broker, name, b'{"own":true}', content_type="application/json"))
        expected = [*values[:1 + sub], {"own": True}]
        assert json_values(broker, name) == expected
        # Resuming from every position a read returned gives the rest as a JSON array.
        got = read_in_chunks(broker, name)
        assert [json.loads(i.data) for i in got] == expected
        for k, item in enumerate(got):
            assert json_values(broker, name, item.position) == expected[k + 1:]
    with pytest.raises(BadRequestError):
        resolve_sub_offset(broker, broker.catalog, broker.catalog.streams["src"], anchor,
                           len(batch) + 1)
    assert json_values(broker, "src") == values
    empty = broker.catalog.streams["src"]
    assert body(empty, []) == b"[]"


# -- properties ---------------------------------------------------------------------------------


positions_strategy = st.tuples(st.integers(0, 10**20 - 1), st.integers(0, 10**10 - 1))


@given(positions_strategy, positions_strategy)
def test_tokens_sort_as_positions_sort(a: Position, b: Position) -> None:
    ta, tb = token(a), token(b)
    assert (ta < tb) == (a < b) and (ta == tb) == (a == b)
    assert parse_token(ta) == a and parse_token(tb) == b
    assert not any(c in ta for c in ",&=?/") and ta not in ("-1", "now")


@given(st.text(alphabet="0123456789_-+ x\u00b2\u0663", max_size=32))
def test_parse_token_refuses_what_is_not_a_token(text: str) -> None:
    position = parse_token(text)
    if position is not None:
        assert re.fullmatch(r"[0-9]{1,20}_[0-9]{1,20}", text)
        assert position == tuple(int(part) for part in text.split("_"))
    else:
        assert not re.fullmatch(r"[0-9]{1,20}_[0-9]{1,20}", text)


@st.composite
def lineage_cases(draw: st.DrawFn) -> tuple[int, list[bytes], int, int, list[bytes]]:
    """Message size, source appends, anchor (after that many appends), sub-offset, fork
    appends."""
    size = draw(st.integers(1, 5))
    appends = draw(st.lists(st.binary(min_size=1, max_size=12), min_size=0, max_size=5))
    anchor = draw(st.integers(0, len(appends)))
    sub = draw(st.integers(0, len(appends[anchor]))) if anchor < len(appends) else 0
    own = draw(st.lists(st.binary(min_size=1, max_size=9), max_size=3))
    return size, appends, anchor, sub, own


@settings(max_examples=examples(40), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(lineage_cases())
def test_fork_reads_match_the_model(case: tuple[int, list[bytes], int, int, list[bytes]],
                                    ) -> None:
    size, appends, anchor_after, sub, own = case
    directory = Path(tempfile.mkdtemp(prefix="stream-reads-"))
    broker = Broker.open(directory)
    try:
        create(broker, "src")
        tails = [tail(broker, "src")]
        for data in appends:
            ok(append(broker, "src", *pieces(data, size), durable=False))
            tails.append(tail(broker, "src"))
        check_reads(broker, "src", b"".join(appends))
        fork_at(broker, "fork", "src", tails[anchor_after], sub)
        expected = b"".join(appends[:anchor_after])
        if anchor_after < len(appends):
            expected += appends[anchor_after][:sub]
        check_reads(broker, "fork", expected)
        for data in own:
            ok(append(broker, "fork", *pieces(data, size), durable=False))
        check_reads(broker, "fork", expected + b"".join(own))
        # A fork of the fork at its tail, from the fork's start.
        fork_at(broker, "again", "fork", tail(broker, "fork"), 0)
        fork_at(broker, "start", "fork", (0, 0), 0)
        check_reads(broker, "again", expected + b"".join(own))
        check_reads(broker, "start", b"")
    finally:
        broker.close()
        shutil.rmtree(directory, ignore_errors=True)
