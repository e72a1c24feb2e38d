"""The intake lane with real processes: three brokers, three etcd members, SeaweedFS.

Large publishes go to the object store once and etcd carries a pointer; small ones stay
inline; every node applies both into the same files. Faults: a node killed between the
upload and the pointer, and between the pointer and the answer; a holder that cannot fetch;
a damaged object; the store down while publishing.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from messaging.frames import FRAMES_CONTENT_TYPE, encode_batch
from messaging.log.etcd.entry import decode_entry
from messaging.objects.s3 import S3Store
from tests.conftest import wait_until
from tests.e2e.test_etcd_log import (  # noqa: F401  (fixtures used by name)
    TOPIC,
    EtcdCluster,
    Nodes,
    _range,
    check_identical,
    check_log,
    converge,
    diagnostics,
    etcd,
    etcd_cluster,
    groups,
    with_groups,
)
from tests.e2e.test_tiering import s3_env
from tests.objects.conftest import BUCKET, SeaweedFS, seaweedfs  # noqa: F401

pytestmark = pytest.mark.e2e

#: Publishes of at least this many bytes of frames take the intake lane in these tests.
MIN_SIZE = 2048
SMALL = 100
LARGE = 3000


@dataclass
class MixedLoad:
    """Publishers over every node: small and large singles, small and large batches, each
    answer recorded by the data it carried."""

    urls: list[str]
    acked: dict[bytes, int] = field(default_factory=dict)
    refused: set[bytes] = field(default_factory=set)
    unknown: set[bytes] = field(default_factory=set)
    statuses: dict[int, int] = field(default_factory=dict)
    down: set[str] = field(default_factory=set)
    sent_large: int = 0

    async def worker(self, session: aiohttp.ClientSession, w: int, rounds: int) -> None:
        for n in range(rounds):
            url = self.urls[(w + n) % len(self.urls)]
            if url in self.down:
                await asyncio.sleep(0.05)
                continue
            kind = n % 4
            size = LARGE if kind in (0, 2) else SMALL
            count = 1 if kind < 2 else 20
            datas = [f"w{w} n{n} k{k} ".encode().ljust(size if count == 1 else size // 10 * 2,
                                                      b"x") for k in range(count)]
            if kind in (0, 2):
                self.sent_large += 1
            await self.publish(session, url, datas)

    async def publish(self, session: aiohttp.ClientSession, url: str,
                      datas: list[bytes]) -> None:
        if len(datas) == 1:
            body, headers = datas[0], {}
        else:
            body, headers = encode_batch(TOPIC, datas), {"Content-Type": FRAMES_CONTENT_TYPE}
        try:
            async with session.post(f"{url}/messaging/messages", params={"topicID": str(TOPIC)},
                                    data=body, headers=headers,
                                    timeout=aiohttp.ClientTimeout(total=40)) as resp:
                self.statuses[resp.status] = self.statuses.get(resp.status, 0) + 1
                if resp.status == 200:
                    first = int(resp.headers["X-Broker-Index"]) - len(datas) + 1
                    for i, data in enumerate(datas):
                        self.acked[data] = first + i
                    return
                await resp.read()
                (self.refused if resp.status == 503 else self.unknown).update(datas)
        except aiohttp.ClientConnectorError:
            self.refused.update(datas)
        except (aiohttp.ClientError, TimeoutError):
            self.unknown.update(datas)


def store_args(seaweedfs: SeaweedFS, prefix: str, *extra: str) -> list[str]:  # noqa: F811
    return ["--object-store", f"s3://{BUCKET}/{prefix}", "--s3-endpoint", seaweedfs.endpoint,
            "--intake-min-size", str(MIN_SIZE), *extra]


@pytest.fixture
def prefix() -> str:
    return f"intake-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def s3(seaweedfs: SeaweedFS, prefix: str) -> Iterator[S3Store]:  # noqa: F811
    os.environ.update(s3_env())
    yield seaweedfs.store(prefix)


async def intake_state(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    found = await diagnostics(session, url)
    state: dict[str, Any] = found["intake"]
    return state


async def pointer_entries(etcd: EtcdCluster, nodes: Nodes) -> int:
    """How many of the log's current values are pointer entries (the newest only: etcd's
    history of the key is what the watch saw)."""
    value = await _range(etcd.members[0].client_url,
                         f"/messaging/{nodes.name}/log".encode())
    if not value.kvs:
        return 0
    return int(decode_entry(value.kvs[0].value).pointer is not None)


@with_groups
async def test_both_lanes_land_in_the_same_files_on_every_node(
        etcd: EtcdCluster, broker_process, tmp_path: Path,  # noqa: F811
        seaweedfs: SeaweedFS, s3: S3Store, prefix: str) -> None:  # noqa: F811
    nodes = Nodes(broker_process, tmp_path, etcd, *store_args(seaweedfs, prefix))
    await nodes.start(0, 1, 2, env=s3_env())
    await nodes.wait_ready(0, 1, 2)
    load = MixedLoad(nodes.urls)
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(load.worker(session, w, 24) for w in range(6)))
        assert load.statuses == {200: 144}, load.statuses
        stored = await converge(session, nodes.urls, len(load.acked))
        check_log(stored, load)  # type: ignore[arg-type]
        await check_identical(nodes)
        states = [await intake_state(session, u) for u in nodes.urls]
        written = sum(s["objects_written"] for s in states)
        assert 0 < written <= load.sent_large, states
        fetched = [s["reads"]["gets"] for s in states]
        assert all(f >= 1 for f in fetched), states
        objects = await s3.list("intake")
        assert len(objects) == written, (objects, states)
