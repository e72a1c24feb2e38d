"""Spark executors reading offloaded ranges straight from the object store.

With the ``objectStore`` option (and the store's credentials in the executors' environment,
the standard AWS way, or the ``s3AccessKeyId``/``s3SecretAccessKey`` options), a partition's
part below the broker's local segments is read from the store itself: the broker is not in
the path of a historical backfill. The broker only names the objects (``GET
/messaging/topics/{id}?objects=true``, one small request); the bytes come from ranged GETs
of the store, starting at the object's mark nearest below the partition's start, and pass
through the same verification as a broker's answer (every frame's CRC, index order). What is
not in the store (the topic's local part) is read through the broker as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from messaging.errors import MessagingError
from messaging.frames import scan
from messaging.json_ids import parse_u64
from messaging.objects.s3_config import S3Settings
from messaging.objects.store import ObjectStore
from messaging.objects.url import parse_store_url


@dataclass(frozen=True)
class StoreAccess:
    """How an executor reaches the object store (carried in each partition)."""

    url: str
    endpoint: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    region: str | None = None

    def open(self) -> ObjectStore:
        """The store (credentials from these options, else the environment)."""
        settings = S3Settings(access_key_id=self.access_key_id,
                              secret_access_key=self.secret_access_key, region=self.region)
        return parse_store_url(self.url, self.endpoint,
                               settings=settings if self.url.startswith("s3://") else None)


@dataclass(frozen=True)
class StoredRange:
    """One object holding part of a partition's range."""

    name: str
    first: int
    last: int
    size: int
    marks: tuple[tuple[int, int, int], ...]

    def position_of(self, index: int) -> int:
        """The byte where reading for ``index`` may start (the mark nearest below)."""
        position = 0
        for mark_index, mark_position, _ordinal in self.marks:
            if mark_index > index:
                break
            position = mark_position
        return position


def stored_ranges(info: dict[str, Any], topic: int, start: int, end: int,
                  ) -> list[StoredRange]:
    """The objects (from ``GET /messaging/topics/{id}?objects=true``) holding indexes of
    ``start`` <= index < ``end`` below the topic's local segments, in order."""
    local_first = parse_u64(info.get("local_first_index") or 0, f"topic {topic}")
    found = []
    for item in info.get("objects") or []:
        first = parse_u64(item["first"], f"topic {topic}")
        last = parse_u64(item["last"], f"topic {topic}")
        if last < start or first >= end or (local_first and first >= local_first):
            continue
        found.append(StoredRange(str(item["name"]), first, last, int(item["size"]),
                                 tuple((int(i), int(p), int(o)) for i, p, o in
                                       item.get("marks") or [])))
    return found


def read_stored(store: ObjectStore, ranges: list[StoredRange], start: int, end: int,
                ) -> Iterator[tuple[bytes, int]]:
    """The frames of ``start`` <= index < ``end`` the objects hold, in order: runs of whole
    frames and the last index of each (the caller verifies them). Each object is read from
    its mark nearest below ``start`` through its end (or ``end``)."""
    for stored in ranges:
        begin = stored.position_of(start)
        data = asyncio.run(store.get_range(stored.name, begin, stored.size))
        offset = 0
        if start > stored.first:
            skipped = scan(data, verify=False, stop_index=start)
            if skipped.error is not None:
                raise _damaged(store, stored, begin + skipped.end, skipped.error)
            offset = skipped.end
        kept = scan(data, start=offset, verify=False, stop_index=end)
        if kept.error is not None or kept.incomplete:
            raise _damaged(store, stored, begin + kept.end, kept.error or "a frame is cut off")
        if kept.count:
            yield data[offset:kept.end], kept.last_index
            start = kept.last_index + 1
        if kept.stopped:
            return


def _damaged(store: ObjectStore, stored: StoredRange, at: int,
             error: object) -> MessagingError:
    return MessagingError(f"object {stored.name} in {store.url} is damaged at byte {at}: "
                          f"{error}")
