"""The etcd log's entries: encoding and decoding the commands of one put."""

from __future__ import annotations

import pytest

from messaging.frames import encode_batch
from messaging.log.etcd.writer import decode_entry, encode_entry


def test_log_entry_round_trip() -> None:
    commands = [b"", b"a" * 100, encode_batch(1, [b"x", b"y"])]
    entry = decode_entry(encode_entry(b"12345678", 9, commands))
    assert (entry.node, entry.seq, entry.commands) == (b"12345678", 9, commands)
    value = encode_entry(b"12345678", 9, commands)
    for bad in (value[:-1], value + b"x", b"nope" + value[4:], b""):
        with pytest.raises(ValueError):
            decode_entry(bad)
