"""The in-memory tail: what a follower finds at each position, against a plain model, and
that snapshots handed out never change."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from messaging.topic.segment import Segment
from messaging.topic.tail import EMPTY_TAIL, Tail, TailBuffer, TailChunk
from tests.examples import examples

BUDGET = 100

#: One commit: (bytes, a gap before it, a new segment).
COMMITS = st.lists(st.tuples(st.integers(1, 130), st.booleans(), st.booleans()),
                   min_size=1, max_size=60)


def segment(n: int) -> Segment:
    return Segment(Path(f"/nowhere/{n:020d}.seg"), n)


def model_after(kept: list[TailChunk], at: Segment, position: int,
                ) -> tuple[bytes, TailChunk] | None:
    """What a follower at ``position`` of ``at`` should get: a linear walk of the chunks."""
    for i, chunk in enumerate(kept):
        if chunk.segment is at and chunk.start <= position < chunk.end:
            data = bytes(chunk.data[position - chunk.start:])
            last = chunk
            for newer in kept[i + 1:]:
                if newer.start != last.end:
                    break
                data += bytes(newer.data)
                last = newer
            return data, last
    return None


def found(tail: Tail, at: Segment, position: int) -> tuple[bytes, TailChunk] | None:
    result = tail.after(at, position)
    if result is None:
        return None
    parts, first, last = result
    assert first.segment is at and first.start <= position < first.end
    return b"".join(parts), last


@settings(max_examples=examples(200), deadline=None)
@given(commits=COMMITS, probes=st.lists(st.integers(-5, 9000), max_size=30))
def test_a_follower_finds_what_a_linear_walk_of_the_kept_chunks_finds(
        commits: list[tuple[int, bool, bool]], probes: list[int]) -> None:
    buffer = TailBuffer(BUDGET)
    kept: list[TailChunk] = []  # the model: newest chunks of one segment within the budget
    seg, position = segment(1), 0
    snapshots: list[tuple[Tail, list[TailChunk]]] = []
    for n, (size, gap, roll) in enumerate(commits):
        if roll:
            seg, position = segment(n + 2), 0
        position += 7 if gap else 0
        chunk = TailChunk(seg, position, bytearray([n % 256]) * size, n + 1, n)
        position = chunk.end
        tail = buffer.push(chunk)
        if size > BUDGET:
            kept = []
        else:
            kept = [c for c in kept if c.segment is seg] + [chunk]
            while sum(len(c.data) for c in kept) > BUDGET:
                kept.pop(0)
        assert list(tail) == kept
        snapshots.append((tail, list(kept)))
    for tail, chunks in snapshots:  # later pushes left every earlier snapshot as it was
        assert list(tail) == chunks
        for at in {c.segment for c in chunks} | {seg}:
            for probe in probes:
                assert found(tail, at, probe) == model_after(chunks, at, probe)
            for c in chunks:
                assert found(tail, at, c.start) == model_after(chunks, at, c.start)


def test_chunks_that_left_are_let_go_in_amortised_constant_time() -> None:
    buffer = TailBuffer(1000)
    seg = segment(1)
    tail = EMPTY_TAIL
    for n in range(20_000):
        tail = buffer.push(TailChunk(seg, n * 10, bytearray(10), n + 1, n + 1))
        # the lists hold at most twice what the tail keeps (here 100 chunks)
        assert buffer.held <= 2 * len(tail) + 1
    assert len(tail) == 100
    assert found(tail, seg, 19_999 * 10 + 3) == (bytes(7), [*tail][-1])
    assert tail.after(seg, 20_000 * 10) is None  # caught up: nothing after the end


def test_a_chunk_over_the_budget_empties_the_tail() -> None:
    buffer = TailBuffer(100)
    seg = segment(1)
    buffer.push(TailChunk(seg, 0, bytearray(50), 1, 1))
    assert len(buffer.push(TailChunk(seg, 50, bytearray(101), 2, 2))) == 0
    tail = buffer.push(TailChunk(seg, 151, bytearray(10), 3, 3))
    assert tail.after(seg, 50) is None  # the big one is for the files
    assert found(tail, seg, 151) == (bytes(10), next(iter(tail)))
