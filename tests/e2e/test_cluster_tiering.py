"""Object storage in a cluster on etcd: one node uploads for each log, every node learns the
manifest through the log and reads the store; when the uploader dies another takes over."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import aiohttp

from tests.conftest import wait_until
from tests.e2e.test_etcd_log import (  # noqa: F401  (fixtures used by name)
    TOPIC,
    EtcdCluster,
    Nodes,
    converge,
    etcd,
    etcd_cluster,
    groups,
    with_groups,
)
from tests.e2e.test_tiering import s3_env
from tests.objects.conftest import BUCKET, SeaweedFS, seaweedfs  # noqa: F401


async def publish(session: aiohttp.ClientSession, url: str, first: int, count: int) -> None:
    for k in range(first, first + count):
        async with session.post(f"{url}/messaging/messages", params={"topicID": str(TOPIC)},
                                data=f"{k:05d}".encode() * 20) as resp:
            assert resp.status == 200, await resp.text()


async def store_state(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    """The object store part of the diagnostics of TOPIC's group on a node."""
    async with session.get(f"{url}/messaging/diagnostics",
                           params={"topicID": str(TOPIC)}) as resp:
        assert resp.status == 200, await resp.text()
        found: dict[str, Any] = await resp.json()
    return dict(found.get("broker", found)["object_store"])


async def topic(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(f"{url}/messaging/topics/{TOPIC}") as resp:
        assert resp.status == 200, await resp.text()
        info: dict[str, Any] = await resp.json()
        return info


@with_groups
async def test_one_uploader_every_node_reads_the_store(
        etcd: EtcdCluster, broker_process, tmp_path: Path,  # noqa: F811
        seaweedfs: SeaweedFS) -> None:  # noqa: F811
    prefix = f"cluster-{uuid.uuid4().hex[:8]}"
    nodes = Nodes(broker_process, tmp_path, etcd, "--object-store", f"s3://{BUCKET}/{prefix}",
                  "--s3-endpoint", seaweedfs.endpoint, "--max-segment-size", "1K",
                  "--local-retention-size", "2K", "--truncation-interval", "200ms")
    await nodes.start(0, 1, 2, env=s3_env())
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        await publish(session, nodes.url(0), 0, 150)

        async def offloaded(count: int) -> bool:
            infos = [await topic(session, u) for u in nodes.urls]
            return all(i["offloaded_segments"] >= count and i["size"] <= 4096 for i in infos)

        await wait_until(lambda: offloaded(10), timeout=60, what="segments offloaded")
        # Exactly one uploader once the nodes' membership views agree (a node that has not
        # yet seen another may believe itself first for a moment: harmless, see the uploader).
        states: list[dict[str, Any]] = []

        async def one_uploader() -> bool:
            states[:] = [await store_state(session, u) for u in nodes.urls]
            return sum(1 for s in states if s["uploader"]) == 1

        await wait_until(one_uploader, timeout=20, what="exactly one uploader")
        uploaders = [i for i, s in enumerate(states) if s["uploader"]]
        assert len(uploaders) == 1, states
        # Manifests are learnt through the log: the same everywhere once every node has
        # applied the last offload, which on a loaded machine is not at the same moment.
        manifests: set[tuple[int, int]] = set()

        async def one_manifest() -> bool:
            infos = [await topic(session, u) for u in nodes.urls]
            manifests.clear()
            manifests.update((t["offloaded_segments"], t["offloaded_through"]) for t in infos)
            return len(manifests) == 1

        await wait_until(one_manifest, timeout=30, what="every node's manifest the same")
        stored = await converge(session, nodes.urls, 150)
        assert [d for _i, d in stored] == [f"{k:05d}".encode() * 20 for k in range(150)]
        # The uploader dies: another node takes over and offloads what comes next.
        dead = uploaders[0]
        nodes.kill(dead)
        alive = [u for i, u in enumerate(nodes.urls) if i != dead]
        before = (await topic(session, alive[0]))["offloaded_through"]
        await publish(session, alive[0], 150, 100)

        async def taken_over() -> bool:
            infos = [await topic(session, u) for u in alive]
            return all(i["offloaded_through"] > before + 50 for i in infos)

        await wait_until(taken_over, timeout=90, what="another node uploading")
        stored = await converge(session, alive, 250)
        assert [d for _i, d in stored] == [f"{k:05d}".encode() * 20 for k in range(250)]
