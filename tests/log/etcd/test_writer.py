"""The etcd log's entries: encoding and decoding the commands of one put."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

import pytest
import zstandard
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from messaging.aio import cancel_and_wait
from messaging.broker.commands import ApplyResult, validate_publish
from messaging.errors import BrokerClosedError, CommitUnknownError, StorageFailedError
from messaging.frames import encode_batch
from messaging.log.etcd import writer as writer_module
from messaging.log.etcd.client import EtcdClient
from messaging.log.etcd.entry import (
    MAX_BODY_BYTES,
    CorruptEntryError,
    decode_entry,
    encode_entry,
)
from messaging.log.etcd.writer import COALESCE_BYTES, COMPRESS_RETRY, ApplyTiming, LogWriter
from tests.examples import examples


def test_log_entry_round_trip() -> None:
    commands = [b"", b"a" * 100, encode_batch(1, [b"x", b"y"])]
    entry = decode_entry(encode_entry(b"12345678", 9, commands))
    assert (entry.node, entry.seq, entry.commands) == (b"12345678", 9, commands)
    value = encode_entry(b"12345678", 9, commands)
    for bad in (value[:-1], value + b"x", b"nope" + value[4:], b""):
        with pytest.raises(ValueError):
            decode_entry(bad)


def _events(count: int) -> list[bytes]:
    """JSON events like the Spark example's, one command each."""
    return [encode_batch(1, [json.dumps({"key": f"sensor-{n % 5}", "value": n * 0.5,
                                         "ts": f"2026-11-21T08:{n % 60:02d}:00+00:00"}).encode()])
            for n in range(count)]


@given(st.lists(st.binary(max_size=3000), max_size=8), st.booleans())
@settings(max_examples=examples(200), deadline=None)
def test_entries_round_trip_compressed_or_not(commands: list[bytes], compress: bool) -> None:
    value = encode_entry(b"node0001", 3, commands, compress=compress, time_ms=1_795_000_000_123)
    entry = decode_entry(value)
    assert (entry.node, entry.seq, entry.commands, entry.time) == (
        b"node0001", 3, commands, 1_795_000_000_123)
    assert decode_entry(encode_entry(b"node0001", 3, commands, compress=False,
                                     time_ms=1_795_000_000_123)) == entry


def test_entries_from_before_times_decode_without_a_time() -> None:
    """A value an older node put (magic MSG1/MSZ1, no time field) still decodes: its
    commands have no time, and the state machine gives them the broker's current one."""
    commands = _events(3)
    body = b"".join(len(c).to_bytes(4, "big") + c for c in commands)
    old = b"MSG1" + b"n" * 8 + (5).to_bytes(8, "big") + (3).to_bytes(4, "big") + body
    entry = decode_entry(old)
    assert (entry.node, entry.seq, entry.commands, entry.time) == (b"n" * 8, 5, commands, None)
    packed = zstandard.ZstdCompressor().compress(body)
    old = b"MSZ1" + b"n" * 8 + (5).to_bytes(8, "big") + (3).to_bytes(4, "big") + packed
    assert decode_entry(old).commands == commands


def test_compression_is_used_only_when_it_pays() -> None:
    json_events = _events(200)
    plain = encode_entry(b"n" * 8, 1, json_events, compress=False)
    packed = encode_entry(b"n" * 8, 1, json_events)
    assert packed[:4] == b"MSZ3" and plain[:4] == b"MSG3"
    assert len(packed) < len(plain) / 3
    noise = [encode_batch(1, [os.urandom(4000)]) for _ in range(20)]
    assert encode_entry(b"n" * 8, 1, noise)[:4] == b"MSG3"  # random bytes: not worth it
    small = _events(1)
    assert encode_entry(b"n" * 8, 1, small)[:4] == b"MSG3"  # under COMPRESS_FROM
    assert decode_entry(packed).commands == decode_entry(plain).commands == json_events


def _with_body(value: bytes, body: bytes) -> bytes:
    """``value``'s header (its magic, node, sequence, count, time) over another body, with
    the checksum that makes it whole: a well-formed entry of what the body holds."""
    return value[:32] + crc32c(body, crc32c(value[:32])).to_bytes(4, "big") + body


def test_damaged_or_oversized_compressed_entries_are_refused() -> None:
    packed = encode_entry(b"n" * 8, 1, _events(200))
    body = packed[36:]
    for bad in (packed[:-3], packed[:40], _with_body(packed, body[:-3]),
                _with_body(packed, b"\0" * 8 + body[8:])):
        with pytest.raises(ValueError):
            decode_entry(bad)
    huge = zstandard.ZstdCompressor().compress(b"\0" * (MAX_BODY_BYTES + 1))
    with pytest.raises(ValueError, match="claims"):
        decode_entry(_with_body(packed, huge))


@given(st.lists(st.binary(max_size=300), min_size=1, max_size=6), st.booleans(),
       st.data())
@settings(max_examples=examples(200), deadline=None)
def test_any_damage_to_an_entry_is_refused(commands: list[bytes], compress: bool,
                                           data: st.DataObject) -> None:
    """One flipped bit anywhere after an entry's magic (its header's fields, its checksum,
    its body) is caught by the checksum: the entry is refused, never decoded into other
    commands or given to other waiters."""
    value = bytearray(encode_entry(b"node0001", 7, commands, compress=compress))
    at = data.draw(st.integers(4, len(value) - 1), label="byte")
    value[at] ^= 1 << data.draw(st.integers(0, 7), label="bit")
    with pytest.raises(CorruptEntryError, match="checksum does not match"):
        decode_entry(bytes(value))


def test_entries_from_before_checksums_still_decode() -> None:
    """A value a node of the previous version put (MSG2/MSZ2: no checksum) still decodes."""
    commands = _events(40)
    for compress in (False, True):
        value = encode_entry(b"n" * 8, 5, commands, compress=compress, time_ms=1234)
        old = (b"MSZ2" if value[:4] == b"MSZ3" else b"MSG2") + value[4:32] + value[36:]
        entry = decode_entry(old)
        assert (entry.node, entry.seq, entry.commands, entry.time) == (b"n" * 8, 5, commands,
                                                                       1234)


def test_an_entry_of_a_newer_version_is_named_as_such() -> None:
    value = encode_entry(b"n" * 8, 5, _events(2))
    with pytest.raises(ValueError, match=r"unknown magic b'MSG9' \(written by a newer version"):
        decode_entry(b"MSG9" + value[4:])


@pytest.mark.parametrize("version", [2, 3])
async def test_after_an_entry_that_did_not_compress_only_every_sixteenth_tries(
        version: int) -> None:
    """Incompressible payloads cost no zstd work on every put: after a miss, compression is
    tried again only every COMPRESS_RETRY-th entry, and from a hit on, every entry; in
    either entry format a writer may be told to write."""
    writer = LogWriter(cast(EtcdClient, None), b"/log", b"n" * 8, lambda _response: None)
    assert writer.entry_version == 2  # until the cluster's active format is known
    writer.entry_version = version
    plain, packed = b"MSG%d" % version, b"MSZ%d" % version
    noise = [encode_batch(1, [os.urandom(4000)]) for _ in range(4)]
    json_events = _events(50)
    assert (await writer.encode_value(1, json_events))[:4] == packed
    assert (await writer.encode_value(2, noise))[:4] == plain  # a miss
    magics = [(await writer.encode_value(3 + k, json_events))[:4] for k in range(COMPRESS_RETRY)]
    assert magics == [plain] * (COMPRESS_RETRY - 1) + [packed]
    assert (await writer.encode_value(99, json_events))[:4] == packed  # compressing again
    assert decode_entry(await writer.encode_value(100, json_events)).commands == json_events


def test_entries_of_format_2_are_what_the_previous_release_reads() -> None:
    """Format 2 (no checksum) is written byte for byte as the previous release wrote it, so
    its nodes read what new ones put during a rolling upgrade; other formats are refused."""
    commands = _events(30)
    for compress in (False, True):
        new = encode_entry(b"n" * 8, 5, commands, compress=compress, time_ms=77)
        old = encode_entry(b"n" * 8, 5, commands, compress=compress, time_ms=77, version=2)
        assert old == old[:3] + b"2" + new[4:32] + new[36:] and old[:3] == new[:3]
        assert decode_entry(old) == decode_entry(new)
    with pytest.raises(ValueError, match="formats 2 to 4, not 1"):
        encode_entry(b"n" * 8, 5, commands, version=1)


class FakeEtcd:
    """Puts that wait for the test's go-ahead; every put's commands are recorded."""

    def __init__(self) -> None:
        self.puts: list[list[bytes]] = []
        self.go = asyncio.Event()
        self.revision = 0

    async def check_quorum(self, key: bytes) -> Any:
        return SimpleNamespace(header=SimpleNamespace(revision=self.revision), kvs=[])

    async def put(self, key: bytes, value: bytes, **options: Any) -> int:
        self.puts.append(decode_entry(value).commands)
        await self.go.wait()
        self.revision += 1
        return self.revision


async def _until(predicate: Callable[[], bool]) -> None:
    for _ in range(500):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


@pytest.mark.e2e  # slow: over a third of a second
async def test_commands_wait_for_the_put_on_its_way_unless_it_is_slow_or_they_are_big(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """While a put is on its way to etcd, new commands wait and then go in one put; a second
    put goes out at once only for COALESCE_BYTES of commands, or once the first is slow."""
    monkeypatch.setattr(writer_module, "PUT_SLOW_MIN", 0.5)  # slow: from 0.5 s on
    etcd = FakeEtcd()
    writer = LogWriter(cast(EtcdClient, etcd), b"/log", b"n" * 8, lambda _response: None)
    running = asyncio.create_task(writer.run())
    try:
        writer.submit(b"first")
        await _until(lambda: len(etcd.puts) == 1)
        small = [writer.submit(b"small %d" % k) for k in range(5)]
        await asyncio.sleep(0.1)
        assert len(etcd.puts) == 1  # held behind the put on its way
        writer.submit(b"B" * COALESCE_BYTES)
        await _until(lambda: len(etcd.puts) == 2)  # big enough for a put of its own
        assert etcd.puts[1][:5] == [b"small %d" % k for k in range(5)]
        writer.submit(b"late")
        await _until(lambda: len(etcd.puts) == 3)  # both on their way for over 0.5 s: slow
        assert etcd.puts[2] == [b"late"]
        assert not any(future.done() for future in small)
    finally:
        etcd.go.set()
        await cancel_and_wait(running)
        await writer.cancel_puts()


async def test_failed_publishes_stop_counting_as_waiting_while_their_puts_are_on_their_way(
        ) -> None:
    """A node that stops applying answers every publish at once: ``waiting`` drops to 0
    though the puts carrying them have not been answered by etcd yet."""
    etcd = FakeEtcd()
    writer = LogWriter(cast(EtcdClient, etcd), b"/log", b"n" * 8, lambda _response: None)
    running = asyncio.create_task(writer.run())
    try:
        sent = writer.submit(b"sent")
        await _until(lambda: len(etcd.puts) == 1)
        queued = [writer.submit(b"queued %d" % k) for k in range(3)]
        assert writer.waiting() == 4
        writer.fail_waiting(CommitUnknownError("unknown"), StorageFailedError("stopped"))
        assert writer.waiting() == 0
        assert writer.diagnostics()["puts_in_flight"] == 1  # etcd has not answered it
        with pytest.raises(CommitUnknownError):
            await sent
        for future in queued:
            with pytest.raises(StorageFailedError):
                await future
    finally:
        etcd.go.set()
        await cancel_and_wait(running)
        await writer.cancel_puts()


async def test_a_group_taken_just_before_the_node_stopped_is_refused_not_sent() -> None:
    """The node stops applying between the writer taking a group for a put and the put's
    task starting: the group is refused at once and never sent (nothing would answer it for
    APPLY_TIMEOUT), and so is whatever is submitted afterwards."""
    etcd = FakeEtcd()
    etcd.go.set()
    writer = LogWriter(cast(EtcdClient, etcd), b"/log", b"n" * 8, lambda _response: None)
    running = asyncio.create_task(writer.run())
    try:
        await asyncio.sleep(0)  # the writer waits for commands
        taken = writer.submit(b"taken")
        await asyncio.sleep(0)  # the writer takes it and creates the put's task, not run yet
        assert writer.diagnostics()["puts_in_flight"] == 1 and not taken.done()
        writer.fail_waiting(CommitUnknownError("unknown"), StorageFailedError("stopped"))
        with pytest.raises(StorageFailedError):
            await asyncio.wait_for(taken, 1)
        later = writer.submit(b"later")
        with pytest.raises(StorageFailedError):
            await asyncio.wait_for(later, 1)
        await _until(lambda: writer.diagnostics()["puts_in_flight"] == 0)
        assert etcd.puts == [] and writer.waiting() == 0
    finally:
        await cancel_and_wait(running)
        await writer.cancel_puts()


async def test_publishes_waiting_for_one_put_go_as_they_are_and_each_gets_its_answer(
        ) -> None:
    """Single publishes of one topic waiting for the same put go to etcd in one entry, each
    its own command, in the order they were taken (the broker stages them as one: see
    messaging.broker.coalesce), and each publisher gets the answer to its own command."""
    etcd = FakeEtcd()
    etcd.go.set()
    writer = LogWriter(cast(EtcdClient, etcd), b"/log", b"n" * 8, lambda _response: None)
    publishes = [validate_publish(encode_batch(7, [b"m%d" % k] * (k + 1))) for k in range(3)]
    running = asyncio.create_task(writer.run())
    try:
        futures = [writer.submit(p) for p in publishes] + [writer.submit(b"other")]
        await _until(lambda: len(etcd.puts) == 1)
        assert etcd.puts[0] == [*publishes, b"other"]
        answers = [ApplyResult(11, 11, frozenset({7})), ApplyResult(12, 13, frozenset({7})),
                   ApplyResult(14, 16, frozenset({7})), ApplyResult(0, 0, frozenset())]
        writer.answer(b"n" * 8, 1, answers, ApplyTiming(0.0, 0.0, 0.0))
        assert [await asyncio.wait_for(f, 1) for f in futures] == answers
    finally:
        await cancel_and_wait(running)
        await writer.cancel_puts()


async def test_pointer_puts_waiting_for_a_slot_are_refused_when_the_writer_closes() -> None:
    """Every put slot busy (etcd slow), a pointer put waits for one; the node closes: the
    publishers of the put that never left hear the broker is shutting down (none hangs),
    those of the puts on their way that the outcome is unknown."""
    from messaging.log.etcd.pointer import Pointer

    etcd = FakeEtcd()
    writer = LogWriter(cast(EtcdClient, etcd), b"/log", b"n" * 8, lambda _response: None)
    running = asyncio.create_task(writer.run())
    try:
        slots = writer_module.MAX_PUTS_IN_FLIGHT
        sent = [writer.submit(b"B" * writer_module.MAX_PUT_BYTES) for _ in range(slots)]
        await _until(lambda: len(etcd.puts) == slots)
        pointer = Pointer("intake/n-1-0", 0, 4, 0, 4, 2, ("/log",))
        waiting = writer.submit_pointer(pointer, [b"a", b"b"], b"/ticket")
        await asyncio.sleep(0.05)
        assert not any(f.done() for f in waiting)
        await cancel_and_wait(running)
        await writer.cancel_puts()
        for future in waiting:
            with pytest.raises(BrokerClosedError):
                await asyncio.wait_for(future, 1)
        for future in sent:
            with pytest.raises(CommitUnknownError):
                await asyncio.wait_for(future, 1)
    finally:
        etcd.go.set()
        await cancel_and_wait(running)
        await writer.cancel_puts()
