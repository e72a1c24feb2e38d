"""The frame codec, fed all at once, one byte at a time, and with trailing garbage."""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from messaging.broker.commands import Command, stamp_index, validate_publish
from messaging.errors import ChecksumError, CorruptFrameError
from messaging.frames import (
    HEADER_SIZE,
    BatchDecoder,
    FrameScan,
    Message,
    decode,
    decode_one,
    decode_slices,
    decode_verified,
    encode,
    encode_batch,
    encode_many,
    scan,
)
from tests.examples import examples

messages = st.builds(
    Message,
    index=st.integers(0, 2**64 - 1),
    type=st.integers(0, 0xFFFF),
    topic=st.integers(0, 2**64 - 1),
    data=st.binary(max_size=512),
)


def increasing(msgs: list[Message]) -> list[Message]:
    return [Message(i + 1, m.type, m.topic, m.data) for i, m in enumerate(msgs)]


def test_header_layout_matches_design() -> None:
    frame = encode(7, 0x0102030405060708, b"hi", index=42)
    assert HEADER_SIZE == 26
    assert struct.unpack(">Q", frame[0:8])[0] == 42
    assert struct.unpack(">H", frame[12:14])[0] == 7
    assert struct.unpack(">Q", frame[14:22])[0] == 0x0102030405060708
    assert struct.unpack(">I", frame[22:26])[0] == 2
    assert struct.unpack(">I", frame[8:12])[0] == crc32c(frame[12:])


@given(messages)
def test_round_trip(message: Message) -> None:
    assert decode_one(encode(message.type, message.topic, message.data, message.index)) == message


@settings(max_examples=examples(5), deadline=None)
@given(st.sampled_from([0, 1, 1000, 1 << 20]))
def test_round_trip_up_to_one_mebibyte(size: int) -> None:
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    assert decode_one(encode(1, 2, data, 3)).data == data


@given(st.lists(messages, max_size=20))
def test_decode_all_at_once(msgs: list[Message]) -> None:
    msgs = increasing(msgs)
    buffer = encode_many(msgs)
    decoded, used = decode(buffer, after=0)
    assert decoded == msgs
    assert used == len(buffer)


def batched(decoder: BatchDecoder, pieces: list[bytes]) -> list[Message]:
    """Feed ``pieces`` and decode the batches' messages, checking each batch's fields."""
    out: list[Message] = []
    for piece in pieces:
        for batch in decoder.feed(piece):
            got = batch.messages()
            assert (len(got), got[0].index, got[-1].index) == (batch.count, batch.first,
                                                                batch.last)
            if batch.offsets is not None:
                assert list(batch.offsets) == [sum(HEADER_SIZE + len(m.data) for m in got[:k])
                                               for k in range(len(got))]
            out.extend(got)
    return out


@given(st.lists(messages, max_size=12), st.sampled_from([None, 1, 3]), st.booleans())
def test_batch_decoder_whole_and_one_byte_at_a_time(msgs: list[Message],
                                                    max_count: int | None,
                                                    offsets: bool) -> None:
    msgs = increasing(msgs)
    buffer = encode_many(msgs)
    whole = BatchDecoder(after=0, max_count=max_count, offsets=offsets)
    assert batched(whole, [buffer]) == msgs
    whole.finish()
    bytewise = BatchDecoder(after=0, max_count=max_count, offsets=offsets)
    assert batched(bytewise, [bytes([b]) for b in buffer]) == msgs
    assert bytewise.pending == 0
    bytewise.finish()


@given(st.lists(messages, min_size=1, max_size=8), st.binary(min_size=1, max_size=64))
def test_batch_decoder_with_trailing_garbage(msgs: list[Message], garbage: bytes) -> None:
    msgs = increasing(msgs)
    decoder = BatchDecoder(after=0, max_length=1 << 20)
    try:
        out = batched(decoder, [encode_many(msgs) + garbage])
        decoder.finish()  # garbage is never a clean end: incomplete or corrupt
    except CorruptFrameError:
        return
    raise AssertionError(f"trailing garbage accepted: {out}")


@given(st.lists(messages, min_size=1, max_size=8), st.binary(min_size=1, max_size=HEADER_SIZE - 1))
def test_trailing_partial_bytes_are_remaining_not_errors(msgs: list[Message], tail: bytes) -> None:
    buffer = encode_many(msgs) + tail
    decoded, used = decode(buffer)
    assert decoded == msgs
    assert used == len(buffer) - len(tail)


@given(st.lists(messages, min_size=1, max_size=8), st.binary(min_size=HEADER_SIZE, max_size=64))
def test_trailing_garbage_is_incomplete_or_corrupt(msgs: list[Message], garbage: bytes) -> None:
    buffer = encode_many(msgs) + garbage
    try:
        decoded, used = decode(buffer, max_length=1 << 20)
    except CorruptFrameError:
        return
    assert decoded[: len(msgs)] == msgs
    assert used >= len(buffer) - len(garbage)


@given(messages, st.data())
def test_any_flipped_bit_in_checksummed_bytes_is_detected(message: Message, data) -> None:
    frame = bytearray(encode(message.type, message.topic, message.data, message.index))
    bit = data.draw(st.integers(8 * 8, len(frame) * 8 - 1))
    frame[bit // 8] ^= 1 << (bit % 8)
    try:
        decoded, _ = decode(frame, max_length=1 << 20)
    except CorruptFrameError:
        return
    # A flipped length bit may make the frame look incomplete; it never yields a message.
    assert decoded == []


def test_checksum_error_is_distinct() -> None:
    frame = bytearray(encode(1, 1, b"hello", 1))
    frame[-1] ^= 0xFF
    with pytest.raises(ChecksumError):
        decode(frame)


def test_impossible_length_is_corrupt_not_incomplete() -> None:
    frame = bytearray(encode(1, 1, b"x", 1))
    struct.pack_into(">I", frame, 22, 0xFFFFFFFF)
    with pytest.raises(CorruptFrameError):
        decode(frame)


def test_index_must_increase() -> None:
    buffer = encode(1, 1, b"a", 5) + encode(1, 1, b"b", 5)
    with pytest.raises(CorruptFrameError, match="does not follow"):
        decode(buffer, after=0)
    assert scan(buffer, after=0).error is not None


def test_stamp_index_keeps_the_checksum_valid() -> None:
    frame = bytearray(encode_batch(9, [b"a", b"bc"]))
    stamp_index(frame, 0, 100)
    stamp_index(frame, HEADER_SIZE + 1, 101)
    decoded, _ = decode(frame, after=0)
    assert [(m.index, m.data, m.topic) for m in decoded] == [(100, b"a", 9), (101, b"bc", 9)]


@given(st.lists(messages, max_size=30), st.integers(0, 40), st.integers(0, 2**64))
def test_scan_agrees_with_decode(msgs: list[Message], max_count: int, stop: int) -> None:
    msgs = increasing(msgs)
    buffer = encode_many(msgs)
    result = scan(buffer, after=0, stop_index=stop, max_count=max_count, mark_every=64)
    expected = [m for m in msgs if m.index < stop][:max_count]
    assert result.count == len(expected)
    assert result.error is None
    assert result.end == sum(HEADER_SIZE + len(m.data) for m in expected)
    if expected:
        assert (result.first_index, result.last_index) == (expected[0].index, expected[-1].index)
        assert result.marks[0] == (expected[0].index, 0, 0)


def test_decoder_hands_out_good_frames_before_damage() -> None:
    decoder = BatchDecoder(after=0)
    good = encode(1, 1, b"ok", 1)
    bad = bytearray(encode(1, 1, b"no", 2))
    bad[-1] ^= 1
    assert [b.messages() for b in decoder.feed(good + bad)] == [[Message(1, 1, 1, b"ok")]]
    with pytest.raises(ChecksumError):
        decoder.feed(b"")
    with pytest.raises(ChecksumError):
        decoder.finish()


def test_decoder_rejects_indexes_that_do_not_increase() -> None:
    decoder = BatchDecoder(after=5)
    with pytest.raises(CorruptFrameError, match="does not follow 5"):
        decoder.feed(encode(1, 1, b"old", 5))


def _outcome(check: Callable[[], Command]) -> tuple[str, object]:
    """What a validation gives: the command's offsets, topic and bytes, or the error's type."""
    try:
        command = check()
    except CorruptFrameError as err:
        return "error", type(err)
    return "ok", (list(command.offsets), command.topic, bytes(command))


@settings(max_examples=examples(300), deadline=None)
@given(count=st.integers(1, 60), length=st.integers(0, 40), topic=st.integers(0, 3),
       given_topic=st.sampled_from([None, 0, 1]), damage=st.data())
def test_uniform_fast_path_agrees_with_the_walk(count: int, length: int, topic: int,
                                                given_topic: int | None,
                                                damage: st.DataObject) -> None:
    """Frames of one size are checked with strided slices; whatever a body holds (a flipped
    byte in any field, an internal type, another topic, a cut), the answer is the walk's."""
    body = bytearray(encode_batch(topic, [bytes([k % 251]) * length for k in range(count)]))
    if damage.draw(st.booleans()):
        at = damage.draw(st.integers(0, len(body) - 1))
        body[at] ^= damage.draw(st.sampled_from([0x01, 0x80, 0xFF]))
    if damage.draw(st.booleans()):
        del body[damage.draw(st.integers(0, len(body) - 1)):]
    data = bytes(body)
    if not data:
        return
    fast = _outcome(lambda: validate_publish(data, topic=given_topic, max_length=32))
    walk = _outcome(lambda: validate_publish(data, topic=given_topic, max_length=32,
                                             uniform_fast=False))
    assert fast == walk
    if fast[0] == "ok" and count >= 16 and len(data) == count * (HEADER_SIZE + length):
        assert validate_publish(data, topic=given_topic, max_length=32).stride


def test_uniform_internal_type_is_refused() -> None:
    """A broker-internal type in any frame of a uniform body is refused, as in the walk."""
    frames = [encode(1, 5, b"x" * 10) for _ in range(20)]
    frames[13] = encode(0x8001, 5, b"x" * 10)
    with pytest.raises(CorruptFrameError, match="reserved"):
        validate_publish(b"".join(frames), topic=5)


@settings(max_examples=examples(300), deadline=None)
@given(count=st.integers(1, 60), length=st.integers(0, 40), after=st.sampled_from([None, 0, 5]),
       damage=st.data())
def test_uniform_scan_agrees_with_the_walk(count: int, length: int, after: int | None,
                                           damage: st.DataObject) -> None:
    """A scan takes whole frames of one size with strided checks; whatever the bytes hold (a
    flipped byte, indexes out of order, a cut inside a frame) it finds what the per-frame
    walk finds (asking for offsets makes the scan walk)."""
    buffer = bytearray(encode_batch(3, [bytes([k % 7]) * length for k in range(count)]))
    for k in range(count):
        stamp_index(buffer, k * (HEADER_SIZE + length), 5 + k + 1)
    if damage.draw(st.booleans()):
        at = damage.draw(st.integers(0, len(buffer) - 1))
        buffer[at] ^= damage.draw(st.sampled_from([0x01, 0x80, 0xFF]))
    if damage.draw(st.booleans()):
        del buffer[damage.draw(st.integers(0, len(buffer) - 1)):]

    def summary(result: FrameScan) -> tuple[object, ...]:
        return (result.count, result.end, result.first_index, result.last_index,
                result.incomplete, type(result.error))

    fast = scan(buffer, after=after, max_length=32)
    walk = scan(buffer, after=after, max_length=32, offsets=array("q"))
    assert summary(fast) == summary(walk)
    assert decode_verified(bytes(buffer[:fast.end])) == decode(buffer[:fast.end])[0]


@settings(max_examples=examples(300), deadline=None)
@given(msgs=st.lists(messages, max_size=150), uniform=st.integers(-1, 40),
       size=st.sampled_from([1, 3, 64]))
@pytest.mark.e2e  # slow: over a third of a second
def test_decode_slices_agree_with_decode(msgs: list[Message], uniform: int, size: int) -> None:
    """Frames of one size (the struct-per-frame path) or of many (the walk), in slices of
    ``size``: together the slices are what ``decode`` finds, each starting where its first
    frame does."""
    if uniform >= 0:  # every frame the same length
        msgs = [m._replace(data=bytes([k % 251]) * uniform) for k, m in enumerate(msgs)]
    buffer = b"".join(encode(m.type, m.topic, m.data, m.index) for m in msgs)
    expected = decode(buffer)[0]
    slices = list(decode_slices(buffer, size))
    assert [m for _at, ms in slices for m in ms] == expected == msgs
    assert all(0 < len(ms) <= size for _at, ms in slices)
    at = 0
    for start, ms in slices:
        assert start == at
        assert decode(buffer[start:])[0][:len(ms)] == ms
        at += sum(HEADER_SIZE + len(m.data) for m in ms)
    assert decode_verified(buffer) == msgs
    assert all(type(m.data) is bytes for m in decode_verified(buffer))
