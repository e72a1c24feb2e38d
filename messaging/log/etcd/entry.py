"""A log entry: the value of one revision of a cluster's log key, encoded and decoded.

An entry carries the commands of one put: a header (magic, the writing node and its batch
number, the command count, the writer's time, and from format 3 a CRC-32C), then each command
with its length, the body compressed with zstd when that pays. Format 4 adds *pointer
entries*, whose body says where in the object store those commands are instead
(:mod:`messaging.log.etcd.pointer`): :func:`resolve` turns one into an ordinary entry once
its bytes are fetched. Which format a node writes is the cluster's
(:mod:`messaging.log.etcd.entry_format`); every older format still decodes.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import zstandard
from crc32c import crc32c

from messaging.clock import now_ms
from messaging.log.etcd.entry_format import ENTRY_VERSION
from messaging.log.etcd.pointer import Pointer, decode_pointer, encode_pointer

# A log entry (the value of one revision): this header, then each command with its length
# (the body). Under _MAGIC_ZSTD the body is one zstd frame; decompressed, it is byte for byte
# the body _MAGIC would carry, so the frames and their CRCs are untouched. The checksum
# covers the header's other fields and the body as stored (compressed or not): a holder
# checks it once per entry, before it decompresses or applies anything.
_ENTRY = struct.Struct(
    ">4s"  # magic
    "8s"   # node id of the writer (random per process), to find its waiters
    "Q"    # the writer's batch sequence number
    "I"    # number of commands
    "q"    # the writer's clock when it formed the entry: its commands' time (ms since epoch)
    "I"    # CRC-32C of the fields before it and of the body as stored
)
_ENTRY_HEAD = struct.Struct(_ENTRY.format[:-1])  # the fields the checksum follows
_CHECKSUM = struct.Struct(">I")
_MAGIC = b"MSG3"
_MAGIC_ZSTD = b"MSZ3"
#: A pointer entry (format 4): the header of format 3, the body a pointer.
_MAGIC_POINTER = b"MSP4"
# Entries of older versions, still read: the same header without the checksum (version 2)
# and without the time either (version 1).
_ENTRY_V2 = struct.Struct(">4s8sQIq")
_MAGICS_V2 = {b"MSG2": False, b"MSZ2": True}
_ENTRY_V1 = struct.Struct(">4s8sQI")
_MAGICS_V1 = {b"MSG1": False, b"MSZ1": True}
_PLAIN_MAGICS = (_MAGIC, b"MSG2")  # what a body that did not compress is written under
_LENGTH = struct.Struct(">I")
#: Bodies shorter than this go uncompressed (a frame's header costs more than it saves).
COMPRESS_FROM = 512
#: A compressed body is used only when at most this share of the plain one (etcd's bandwidth
#: is the cluster's ceiling: save bytes, but random data is not worth a decompression).
COMPRESS_KEEP = 0.9
#: zstd level: level 1 compresses a 1 MiB entry in about a millisecond (bench/cluster/
#: compression.py measures every level's ratio and cost on realistic payloads).
COMPRESS_LEVEL = 1
#: Decompressed bodies are refused above this (an entry never holds more than one put of
#: at most about 1 MiB).
MAX_BODY_BYTES = 4 << 20
_codecs = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    compressor: zstandard.ZstdCompressor | None = getattr(_codecs, "compressor", None)
    if compressor is None:
        compressor = _codecs.compressor = zstandard.ZstdCompressor(level=COMPRESS_LEVEL)
    return compressor


def _decompressor() -> zstandard.ZstdDecompressor:
    decompressor: zstandard.ZstdDecompressor | None = getattr(_codecs, "decompressor", None)
    if decompressor is None:
        decompressor = _codecs.decompressor = zstandard.ZstdDecompressor()
    return decompressor


@dataclass(frozen=True, slots=True)
class LogEntry:
    """The decoded value of one log revision."""

    node: bytes
    seq: int
    commands: list[bytes]
    time: int | None = None  # when the writer formed it (None: an entry from before times)
    #: A pointer entry's: where its commands are (``commands`` is empty until
    #: :func:`resolve` has them).
    pointer: Pointer | None = None


def body_of(commands: Sequence[bytes]) -> bytes:
    """The plain body of an entry of ``commands``: each after its length. An intake object
    holds such bodies, so a pointer's range resolves to the commands an inline entry had."""
    parts = []
    for command in commands:
        parts.append(_LENGTH.pack(len(command)))
        parts.append(command)
    return b"".join(parts)


def encode_entry(node: bytes, seq: int, commands: Sequence[bytes], *,
                 compress: bool = True, time_ms: int | None = None,
                 version: int = ENTRY_VERSION) -> bytes:
    """One log value holding ``commands`` (each a buffer of frames), its body compressed
    when ``compress`` and it pays (see COMPRESS_FROM and COMPRESS_KEEP), stamped with
    ``time_ms`` (default: the clock now): the time every node gives its commands. In entry
    format ``version`` (3 or 4, with its checksum: format 4 differs only by its pointer
    entries; or 2, which an older release reads: see :mod:`messaging.log.etcd.entry_format`)."""
    if version not in (2, 3, 4):
        raise ValueError(f"this node writes log entry formats 2 to 4, not {version}")
    if time_ms is None:
        time_ms = now_ms()
    body = body_of(commands)
    zstd = False
    if compress and len(body) >= COMPRESS_FROM:
        packed = _compressor().compress(body)
        if len(packed) <= len(body) * COMPRESS_KEEP:
            body, zstd = packed, True
    if version == 2:
        return _ENTRY_V2.pack(b"MSZ2" if zstd else b"MSG2", node, seq, len(commands),
                              time_ms) + body
    return _sealed(_MAGIC_ZSTD if zstd else _MAGIC, node, seq, len(commands), time_ms, body)


def encode_pointer_entry(node: bytes, seq: int, pointer: Pointer, *,
                         time_ms: int | None = None) -> bytes:
    """A pointer entry (format 4) of ``pointer.count`` commands stored where ``pointer``
    says, stamped with ``time_ms`` (default: the clock now) as :func:`encode_entry` does."""
    return _sealed(_MAGIC_POINTER, node, seq, pointer.count,
                   now_ms() if time_ms is None else time_ms, encode_pointer(pointer))


def is_pointer_entry(value: bytes) -> bool:
    """Whether a log value is a pointer entry (read from its magic alone: nothing is
    checked)."""
    return value[:4] == _MAGIC_POINTER


def _sealed(magic: bytes, node: bytes, seq: int, count: int, time_ms: int,
            body: bytes) -> bytes:
    """An entry's header, its checksum over the rest of the header and the body, the body."""
    head = _ENTRY_HEAD.pack(magic, node, seq, count, time_ms)
    return head + _CHECKSUM.pack(crc32c(body, crc32c(head))) + body


def entry_writer(value: bytes) -> bytes:
    """The node id that wrote a log value, read from its header alone (every format carries
    it at the same place; b"" for a value too short to be an entry, which decoding refuses).
    Nothing is checked: the applier only uses it to tell this node's puts from the others'."""
    return bytes(value[4:12]) if len(value) >= _ENTRY_V1.size else b""


class CorruptEntryError(ValueError):
    """A log value whose checksum does not match its body: it is never applied."""


def decode_entry(value: bytes) -> LogEntry:
    """The commands of a log value (compressed or not); ValueError if it is not one
    (:class:`CorruptEntryError` if its checksum does not match its body)."""
    if len(value) < _ENTRY_V1.size:
        raise ValueError(f"{len(value)} bytes is too short for a log entry")
    magic = bytes(value[:4])
    time_ms: int | None = None
    if magic in (_MAGIC, _MAGIC_ZSTD, _MAGIC_POINTER):
        if len(value) < _ENTRY.size:
            raise ValueError(f"{len(value)} bytes is too short for a log entry")
        _magic, node, seq, count, time_ms, checksum = _ENTRY.unpack_from(value)
        offset = _ENTRY.size
        compressed = magic == _MAGIC_ZSTD
        view = memoryview(value)
        actual = crc32c(view[offset:], crc32c(view[:_ENTRY_HEAD.size]))
        if actual != checksum:
            raise CorruptEntryError(f"its checksum does not match: {checksum:#010x} in the "
                                    f"header, {actual:#010x} computed over its "
                                    f"{len(value)} bytes")
        if magic == _MAGIC_POINTER:
            pointer = decode_pointer(view[offset:])
            if pointer.count != count:
                raise ValueError(f"a pointer entry of {count} commands points at "
                                 f"{pointer.count}")
            return LogEntry(node, seq, [], time_ms, pointer)
    elif magic in _MAGICS_V2:
        if len(value) < _ENTRY_V2.size:
            raise ValueError(f"{len(value)} bytes is too short for a log entry")
        _magic, node, seq, count, time_ms = _ENTRY_V2.unpack_from(value)
        offset = _ENTRY_V2.size
        compressed = _MAGICS_V2[magic]
    elif magic in _MAGICS_V1:
        _magic, node, seq, count = _ENTRY_V1.unpack_from(value)
        offset = _ENTRY_V1.size
        compressed = _MAGICS_V1[magic]
    else:
        raise ValueError(f"unknown magic {magic!r} (written by a newer version of messaging, "
                         "or not a log entry)")
    if compressed:
        try:
            size = zstandard.frame_content_size(memoryview(value)[offset:])
        except zstandard.ZstdError as err:
            raise ValueError(f"compressed log entry has no valid frame: {err}") from err
        if not 0 <= size <= MAX_BODY_BYTES:
            raise ValueError(f"compressed log entry claims {size} bytes (at most "
                             f"{MAX_BODY_BYTES})")
        try:
            value = _decompressor().decompress(memoryview(value)[offset:],
                                               max_output_size=MAX_BODY_BYTES)
        except zstandard.ZstdError as err:
            raise ValueError(f"compressed log entry does not decompress: {err}") from err
        offset = 0
    return LogEntry(node, seq, _split(value, offset, count), time_ms)


def _split(value: bytes, offset: int, count: int) -> list[bytes]:
    """The ``count`` commands of a plain body that starts at ``offset`` and ends the value."""
    view = memoryview(value)
    commands = []
    for _ in range(count):
        if offset + _LENGTH.size > len(value):
            raise ValueError("truncated log entry")
        (length,) = _LENGTH.unpack_from(value, offset)
        offset += _LENGTH.size
        if offset + length > len(value):
            raise ValueError("truncated log entry")
        commands.append(bytes(view[offset:offset + length]))
        offset += length
    if offset != len(value):
        raise ValueError(f"{len(value) - offset} bytes after the last command")
    return commands


def resolve(entry: LogEntry, body: bytes) -> LogEntry:
    """A pointer entry with its commands, given the bytes its pointer names;
    :class:`CorruptEntryError` when they are not those (their checksum), ValueError when
    they do not hold its commands."""
    pointer = entry.pointer
    if pointer is None:
        return entry
    actual = crc32c(body)
    if len(body) != pointer.length or actual != pointer.checksum:
        raise CorruptEntryError(
            f"intake object {pointer.name} bytes {pointer.offset}..{pointer.end} do not match "
            f"the pointer: {len(body)} bytes with checksum {actual:#010x}, expected "
            f"{pointer.length} with {pointer.checksum:#010x}")
    return LogEntry(entry.node, entry.seq, _split(body, 0, pointer.count), entry.time)


def compressed(value: bytes) -> bool:
    """Whether an entry's body went compressed (what a writer learns from trying)."""
    return bytes(value[:4]) not in _PLAIN_MAGICS
