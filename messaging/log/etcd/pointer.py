"""A pointer: what a log entry of the intake lane carries instead of its commands.

A large publish in a cluster with an object store does not go through etcd
(:mod:`messaging.log.etcd.intake`): its commands are written to an *intake object* in the
store, laid out exactly as an uncompressed log entry's body (each command after its length),
and the log entry etcd commits holds only where that body is: the object, the byte range, its
CRC-32C and how many commands it holds. A holder fetches the range, checks the checksum, and
applies the commands as it would an inline entry's, so every holder writes the same segment
files whichever lane a message came through.

``logs`` names the command logs whose bodies the object holds (one range each): a node that
applies all of them fetches the object once, whole; a node that applies only some fetches its
ranges.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

#: offset, length, CRC-32C of the range, size of the whole object, commands, name length
_REF = struct.Struct(">QIIQIH")
_SHORT = struct.Struct(">H")
#: An intake object holds at most this many bytes (the intake's window cuts before).
MAX_OBJECT_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class Pointer:
    """Where a log entry's commands are: ``length`` bytes at ``offset`` of object ``name``
    (``size`` bytes in all), ``count`` commands whose bytes have CRC-32C ``checksum``."""

    name: str
    offset: int
    length: int
    checksum: int
    size: int
    count: int
    logs: tuple[str, ...]

    def __post_init__(self) -> None:
        if not 0 <= self.offset <= self.offset + self.length <= self.size:
            raise ValueError(f"pointer to bytes {self.offset}..{self.offset + self.length} of "
                             f"an object of {self.size} bytes")
        if not 0 < self.size <= MAX_OBJECT_BYTES:
            raise ValueError(f"pointer to an object of {self.size} bytes (at most "
                             f"{MAX_OBJECT_BYTES})")

    @property
    def end(self) -> int:
        """Where the range ends (exclusive)."""
        return self.offset + self.length


def encode_pointer(pointer: Pointer) -> bytes:
    """The bytes of a pointer (a pointer entry's body)."""
    name = pointer.name.encode()
    parts = [_REF.pack(pointer.offset, pointer.length, pointer.checksum, pointer.size,
                       pointer.count, len(name)), name, _SHORT.pack(len(pointer.logs))]
    for key in pointer.logs:
        raw = key.encode()
        parts += [_SHORT.pack(len(raw)), raw]
    return b"".join(parts)


def decode_pointer(body: bytes | memoryview) -> Pointer:
    """A pointer from its bytes; ValueError when they are not one."""
    view = memoryview(body)
    try:
        offset, length, checksum, size, count, name_length = _REF.unpack_from(view)
        at = _REF.size
        name = bytes(view[at:at + name_length]).decode()
        at += name_length
        (logs_count,) = _SHORT.unpack_from(view, at)
        at += _SHORT.size
        logs = []
        for _ in range(logs_count):
            (key_length,) = _SHORT.unpack_from(view, at)
            at += _SHORT.size
            logs.append(bytes(view[at:at + key_length]).decode())
            at += key_length
    except (struct.error, UnicodeDecodeError) as err:
        raise ValueError(f"not a pointer: {err}") from err
    if at != len(view) or len(name.encode()) != name_length or not name:
        raise ValueError("not a pointer: its lengths do not add up")
    return Pointer(name, offset, length, checksum, size, count, tuple(logs))
