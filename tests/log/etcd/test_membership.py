"""Compaction by the first live node: what it reads, and when it reads nothing."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from messaging.log.etcd.membership import Membership


class FakeEtcd:
    """The two calls compaction makes: ranges (recorded) and compact."""

    def __init__(self, nodes: dict[str, int]) -> None:
        self.nodes = nodes  # URL → registered durable revision (cluster "c")
        self.gets: list[bytes] = []
        self.compacted: list[int] = []

    async def get(self, key: bytes, *, keys_only: bool = False, prefix: bool = False,
                  **_: Any) -> Any:
        self.gets.append(key)
        kvs = [SimpleNamespace(key=b"/messaging/c/nodes/" + url.encode(), value=json.dumps(
            {"url": url, "durable_revision": revision}).encode())
            for url, revision in self.nodes.items()]
        return SimpleNamespace(kvs=kvs)

    async def compact(self, revision: int) -> None:
        self.compacted.append(revision)


async def test_nothing_is_read_while_no_compaction_can_be_due() -> None:
    """The first live node reads every cluster's registrations only once its own durable
    revision is far enough past the last compaction: the least of them cannot be further."""
    etcd = FakeEtcd({"http://a": 1500, "http://b": 1200})
    durable = [500]
    member = Membership(etcd, "c", "http://a", lambda: durable[0],  # type: ignore[arg-type]
                        compact_every=1000)
    member.nodes = {"http://a": {}, "http://b": {}}
    await member.maybe_compact()
    assert etcd.gets == [] and etcd.compacted == []  # 500 - 0 < 1000: nothing can be due
    durable[0] = 1500
    await member.maybe_compact()
    assert etcd.gets and etcd.compacted == [1200]  # the least durable revision of all
    etcd.gets.clear()
    durable[0] = 2100  # 2100 - 1200 < 1000
    await member.maybe_compact()
    assert etcd.gets == [] and etcd.compacted == [1200]
