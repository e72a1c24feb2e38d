"""Pointer entries: the codec, and resolving one into the entry it stands for."""

from __future__ import annotations

import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from messaging.log.etcd.entry import (
    CorruptEntryError,
    body_of,
    decode_entry,
    encode_entry,
    encode_pointer_entry,
    is_pointer_entry,
    resolve,
)
from messaging.log.etcd.pointer import Pointer, decode_pointer, encode_pointer

names = st.from_regex(r"intake/[0-9a-f]{12}-[0-9]{12}-[0-9a-f]{8}", fullmatch=True)
keys = st.lists(st.from_regex(r"/messaging/[a-z0-9~]{1,20}/log", fullmatch=True),
                min_size=1, max_size=8)


@given(name=names, logs=keys, commands=st.lists(st.binary(min_size=1, max_size=300),
                                                  min_size=1, max_size=20),
       before=st.integers(0, 1 << 20), after=st.integers(0, 1 << 20))
def test_a_pointer_entry_resolves_to_the_inline_entry_of_its_commands(
        name: str, logs: list[str], commands: list[bytes], before: int, after: int) -> None:
    body = body_of(commands)
    pointer = Pointer(name, before, len(body), crc32c(body), before + len(body) + after,
                      len(commands), tuple(logs))
    assert decode_pointer(encode_pointer(pointer)) == pointer
    value = encode_pointer_entry(b"node0001", 9, pointer, time_ms=1_795_000_000_000)
    assert is_pointer_entry(value)
    entry = decode_entry(value)
    assert entry.pointer == pointer and entry.commands == []
    inline = decode_entry(encode_entry(b"node0001", 9, commands, time_ms=1_795_000_000_000))
    assert not is_pointer_entry(encode_entry(b"node0001", 9, commands))
    assert resolve(entry, body) == inline


def test_bytes_other_than_the_pointer_names_are_refused() -> None:
    commands = [b"one", b"two"]
    body = body_of(commands)
    pointer = Pointer("intake/a-1-0", 0, len(body), crc32c(body), len(body), 2, ("/k",))
    entry = decode_entry(encode_pointer_entry(b"n" * 8, 1, pointer))
    other = body_of([b"one", b"twX"])
    with pytest.raises(CorruptEntryError, match="do not match the pointer"):
        resolve(entry, other)
    with pytest.raises(CorruptEntryError, match="do not match the pointer"):
        resolve(entry, body[:-1])


def test_a_damaged_pointer_entry_is_refused_by_its_checksum() -> None:
    pointer = Pointer("intake/a-1-0", 0, 10, 7, 10, 1, ("/k",))
    value = bytearray(encode_pointer_entry(b"n" * 8, 1, pointer))
    value[-2] ^= 1
    with pytest.raises(CorruptEntryError):
        decode_entry(bytes(value))


@pytest.mark.parametrize("fields", [
    {"offset": 5, "length": 10, "size": 12},  # past the object's end
    {"offset": 0, "length": 0, "size": 0},  # an empty object
    {"offset": 0, "length": 1, "size": 65 << 20},  # larger than any intake object
])
def test_a_pointer_outside_its_object_is_not_one(fields: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        Pointer("intake/a-1-0", fields["offset"], fields["length"], 0, fields["size"], 1,
                ("/k",))


@pytest.mark.parametrize("cut", [1, 5, 30])
def test_truncated_pointer_bytes_are_not_a_pointer(cut: int) -> None:
    raw = encode_pointer(Pointer("intake/a-1-0", 0, 10, 7, 10, 1, ("/k", "/l")))
    with pytest.raises(ValueError, match="not a pointer"):
        decode_pointer(raw[:-cut])
    with pytest.raises(ValueError, match="not a pointer"):
        decode_pointer(raw + b"x")
