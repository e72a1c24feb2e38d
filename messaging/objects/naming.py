"""The names of a closed segment's objects: what they hold, readable from the name alone.

As Gazette names its fragments, a name says which topic, which indexes and which bytes::

    <topic id>/<first index, 20 digits>-<last index, 20 digits>-<SHA-256, 64 hex>.seg
    <topic id>/<first index, 20 digits>-<last index, 20 digits>-<SHA-256, 64 hex>.time

relative to the store's prefix (``s3://bucket/PREFIX/7/000…1-000…9-ab12….seg``). The first
is the segment's frames, the second its time index (``<first>.time`` on disk, see
:mod:`messaging.topic.times`), beside it under the same indexes; each carries the SHA-256 of
its own bytes, so every object can be verified from its name alone and the same name always
means the same bytes (an upload retried is idempotent). Anything else in a store is not
ours: :func:`parse_object_name` refuses it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from messaging.objects.checksum import Digest, digest_of
from messaging.objects.errors import ObjectNameError

#: What an object of a segment holds: its frames or its time index.
ObjectKind = Literal["seg", "time"]
SEGMENT_KIND: ObjectKind = "seg"
TIMES_KIND: ObjectKind = "time"
MAX_INDEX = (1 << 64) - 1
_NAME = re.compile(r"(0|[1-9][0-9]*)/([0-9]{20})-([0-9]{20})-([0-9a-f]{64})\.(seg|time)")


@dataclass(frozen=True, slots=True)
class SegmentObjectName:
    """What an object name says: topic, first and last index, SHA-256, and kind."""

    topic: int
    first_index: int
    last_index: int
    sha256: str
    kind: ObjectKind = SEGMENT_KIND

    def __post_init__(self) -> None:
        if not 0 <= self.topic <= MAX_INDEX:
            raise ObjectNameError(str(self), f"topic {self.topic} is not a u64")
        if not 1 <= self.first_index <= self.last_index <= MAX_INDEX:
            raise ObjectNameError(str(self), f"indexes {self.first_index}..{self.last_index} "
                                  "are not 1 <= first <= last < 2**64")
        if not re.fullmatch(r"[0-9a-f]{64}", self.sha256):
            raise ObjectNameError(str(self), "the checksum is not 64 lowercase hex digits")
        if self.kind not in (SEGMENT_KIND, TIMES_KIND):
            raise ObjectNameError(str(self), f"kind {self.kind!r} is neither seg nor time")

    @property
    def name(self) -> str:
        """The object's name in a store."""
        return (f"{self.topic}/{self.first_index:020d}-{self.last_index:020d}-"
                f"{self.sha256}.{self.kind}")

    def __str__(self) -> str:
        return (f"{self.topic}/{self.first_index}-{self.last_index}-{self.sha256}."
                f"{self.kind}")


def parse_object_name(name: str) -> SegmentObjectName:
    """What the object name ``name`` says, or ObjectNameError for any other name."""
    match = _NAME.fullmatch(name)
    if match is None:
        raise ObjectNameError(name, "not <topic>/<first:020d>-<last:020d>-<sha256>.seg|.time")
    topic, first, last, sha256, kind = match.groups()
    parsed = SegmentObjectName(int(topic), int(first), int(last), sha256,
                               SEGMENT_KIND if kind == SEGMENT_KIND else TIMES_KIND)
    if parsed.name != name:  # pragma: no cover (the pattern admits only canonical names)
        raise ObjectNameError(name, "not in canonical form")
    return parsed


async def name_segment_object(topic: int, first_index: int, last_index: int, path: Path,
                              kind: ObjectKind = SEGMENT_KIND,
                              ) -> tuple[SegmentObjectName, Digest]:
    """The name of the object that will hold the file at ``path`` (a closed segment, or its
    time index), and the file's digest (to pass on to ``put_if_absent``); the file is read
    and hashed in a thread."""
    digest = await digest_of(path)
    return SegmentObjectName(topic, first_index, last_index, digest.sha256, kind), digest
