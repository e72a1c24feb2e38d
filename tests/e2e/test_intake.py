"""The intake lane with real processes: three brokers, three etcd members, SeaweedFS.

Large publishes go to the object store once and etcd carries a pointer; small ones stay
inline; every node applies both into the same files. Faults: a node killed between the
upload and the pointer, and between the pointer and the answer; a holder that cannot fetch;
a damaged object; the store down while publishing.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from messaging.frames import encode_batch
from messaging.log.etcd.intake import MARKER
from messaging.objects import ObjectInfo
from messaging.objects.s3 import S3Store
from tests.conftest import wait_until
from tests.e2e.test_etcd_log import (  # noqa: F401  (fixtures used by name)
    TOPIC,
    EtcdCluster,
    Load,
    Nodes,
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
class MixedLoad(Load):
    """Publishers over every node: small and large singles, small and large batches, each
    answer recorded by the data it carried (see Load)."""

    sent_large: int = 0

    async def worker(self, session: aiohttp.ClientSession, w: int, rounds: int,
                     tag: str = "") -> None:
        for n in range(rounds):
            url = self.urls[(w + n) % len(self.urls)]
            if url in self.down:
                await asyncio.sleep(0.05)
                continue
            kind = n % 4
            size = LARGE if kind in (0, 2) else SMALL
            count = 1 if kind < 2 else 20
            datas = [f"{tag}w{w} n{n} k{k} ".encode().ljust(size if count == 1 else size // 10 * 2,
                                                            b"x") for k in range(count)]
            if kind in (0, 2):
                self.sent_large += 1
            await self._publish(session, url, datas, single=count == 1)


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


async def lane_open(nodes: Nodes, which: list[int] | None = None) -> None:
    """Wait until every node's lane is open (before, large publishes go inline: the cluster
    writes entry format 4 once every node reads it, and each node must have seen every
    other announce the same store)."""
    async with aiohttp.ClientSession() as session:
        async def open_everywhere() -> bool:
            urls = nodes.urls if which is None else [nodes.url(i) for i in which]
            states = [await diagnostics(session, u) for u in urls]
            return all(s.get("entry_format") == 4 and s.get("intake_open") for s in states)

        await wait_until(open_everywhere, timeout=20, what="every node's lane open")


@with_groups
async def test_both_lanes_land_in_the_same_files_on_every_node(
        etcd: EtcdCluster, broker_process, tmp_path: Path,  # noqa: F811
        seaweedfs: SeaweedFS, s3: S3Store, prefix: str) -> None:  # noqa: F811
    nodes = Nodes(broker_process, tmp_path, etcd, *store_args(seaweedfs, prefix))
    await nodes.start(0, 1, 2, env=s3_env())
    await nodes.wait_ready(0, 1, 2)
    await lane_open(nodes)
    load = MixedLoad(nodes.urls)
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(load.worker(session, w, 24) for w in range(6)))
        assert load.statuses == {200: 144}, load.statuses
        stored = await converge(session, nodes.urls, len(load.acked))
        check_log(stored, load)
        await check_identical(nodes)
        states = [await intake_state(session, u) for u in nodes.urls]
        written = sum(s["objects_written"] for s in states)
        assert 0 < written <= load.sent_large, states
        fetched = [s["reads"]["gets"] for s in states]
        assert all(f >= 1 for f in fetched), states
        objects = await intake_objects(s3)
        assert len(objects) == written, (objects, states)
        figures = await intake_figures(session, nodes)
        assert sum(f["messaging_intake_objects_total"] for f in figures) >= written
        assert sum(f["messaging_intake_bytes_total"] for f in figures) \
            >= load.sent_large * LARGE
        for f in figures:
            assert f["messaging_intake_fetched_objects_total"] >= 1, f
            assert f["messaging_intake_gets_total"] >= f["messaging_intake_fetched_objects_total"]
        # Each object's ticket closed by its writer once its pointers were committed.
        async def closed() -> bool:
            versions = await ticket_versions(etcd, nodes)
            return len(versions) == written and set(versions) == {2}

        await wait_until(closed, timeout=10, what="every ticket closed by its writer")
        # One commit latency per large publish; one window fill per object.
        assert sum(f["messaging_intake_pointer_commit_seconds_count"] for f in figures) \
            == load.sent_large
        assert sum(f["messaging_intake_window_fill_count"] for f in figures) == written


async def intake_figures(session: aiohttp.ClientSession, nodes: Nodes) -> list[dict[str, float]]:
    """Each node's intake figures (in a cluster of groups, summed over its groups)."""
    from messaging.placement import group_of_topic

    figures = []
    for url in nodes.urls:
        params = ({"group": str(group_of_topic(TOPIC, nodes.groups))} if nodes.groups > 1
                  else {})
        async with session.get(f"{url}/metrics", params=params) as resp:
            assert resp.status == 200, await resp.text()
            text = await resp.text()
        found: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("messaging_intake_") and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                found[name.split("{")[0]] = found.get(name.split("{")[0], 0) + float(value)
        figures.append(found)
    return figures


@pytest.fixture
async def store_proxy(seaweedfs: SeaweedFS) -> Any:  # noqa: F811
    """A proxy in front of SeaweedFS's S3 port, to take the store away and give it back."""
    from tests.proxy import FaultProxy

    port = int(seaweedfs.endpoint.rsplit(":", 1)[1])
    proxy = await FaultProxy(port).start()
    yield proxy
    await proxy.stop()


async def node_2_through(proxy: Any, make: Any, tmp_path: Path,
                         etcd: EtcdCluster, seaweedfs: SeaweedFS,  # noqa: F811
                         prefix: str) -> Nodes:
    """Three nodes with the lane open, node 2 reaching the store through ``proxy``."""
    nodes = Nodes(make, tmp_path, etcd, "--object-store", f"s3://{BUCKET}/{prefix}",
                  "--intake-min-size", str(MIN_SIZE))
    await nodes.start(0, 1, env={**s3_env(), "MESSAGING_S3_ENDPOINT": seaweedfs.endpoint})
    await nodes.start(2, env={**s3_env(), "MESSAGING_S3_ENDPOINT": proxy.url})
    await nodes.wait_ready(0, 1, 2)
    await lane_open(nodes)
    return nodes


async def ready_text(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with session.get(f"{url}/readyz") as resp:
        return resp.status, await resp.text()


async def test_a_holder_that_cannot_fetch_holds_its_apply_then_catches_up(
        etcd: EtcdCluster, broker_process, tmp_path: Path,  # noqa: F811
        seaweedfs: SeaweedFS, s3: S3Store, prefix: str, store_proxy: Any) -> None:  # noqa: F811
    """Node 2 reaches the store through a proxy that is cut: it stops applying before the
    first pointer it cannot fetch, says why in /readyz and diagnostics, never skips it, and
    applies everything once the store is back, into the same files as the others."""
    nodes = await node_2_through(store_proxy, broker_process, tmp_path, etcd, seaweedfs, prefix)
    load = MixedLoad(nodes.urls[:2])
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(load.worker(session, w, 8) for w in range(2)))
        await converge(session, nodes.urls, len(load.acked))
        await store_proxy.sever()
        before = len(load.acked)
        await asyncio.gather(*(load.worker(session, w, 8, "cut ") for w in range(2)))
        assert load.statuses == {200: 32}, load.statuses
        await converge(session, nodes.urls[:2], len(load.acked))

        async def held() -> bool:
            status, text = await ready_text(session, nodes.url(2))
            return status == 503 and "cannot be fetched now" in text

        await wait_until(held, timeout=40, what="node 2 to say it cannot fetch")
        state = await diagnostics(session, nodes.url(2))
        assert "intake object intake/" in state["apply_error"], state["apply_error"]
        assert state["failure"] is None
        # Nothing after the pointer it waits for was applied, nothing was skipped.
        async with session.get(f"{nodes.url(2)}/messaging/messages",
                               params={"topicID": str(TOPIC)},
                               headers={"X-Messaging-Forwarded": "a test"}) as resp:
            if resp.status == 200:
                from messaging.frames import decode

                held_messages, _used = decode(await resp.read(), after=0)
                assert before <= len(held_messages) < len(load.acked)
        store_proxy.refuse = False
        stored = await converge(session, nodes.urls, len(load.acked), timeout=60)
        check_log(stored, load)
        await check_identical(nodes)
        await nodes.wait_ready(2)


async def test_a_damaged_intake_object_stops_every_node_with_a_clear_error(
        etcd: EtcdCluster, broker_process, tmp_path: Path,  # noqa: F811
        seaweedfs: SeaweedFS, s3: S3Store, prefix: str) -> None:  # noqa: F811
    """A pointer whose object holds other bytes than it names (their checksum): every node
    stops applying at it, says which object and why, and applies nothing after it."""
    import grpc
    from aetcd import rpc
    from crc32c import crc32c

    from messaging.log.etcd.entry import body_of, encode_entry, encode_pointer_entry
    from messaging.log.etcd.pointer import Pointer

    nodes = Nodes(broker_process, tmp_path, etcd, *store_args(seaweedfs, prefix))
    await nodes.start(0, 1, env=s3_env())
    await nodes.wait_ready(0, 1)
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{nodes.url(0)}/messaging/messages",
                                params={"topicID": str(TOPIC)}, data=b"before") as resp:
            assert resp.status == 200, await resp.text()
        body = body_of([encode_batch(TOPIC, [b"meant"])])
        stored = body_of([encode_batch(TOPIC, [b"other"])])
        name = "intake/damaged-000000000001-00000000"
        await s3.put_if_absent(name, stored)
        pointer = Pointer(name, 0, len(body), crc32c(body), len(stored), 1,
                          (f"/messaging/{nodes.name}/log",))
        key = f"/messaging/{nodes.name}/log".encode()
        async with grpc.aio.insecure_channel(
                etcd.members[0].client_url.removeprefix("http://")) as channel:
            kv = rpc.KVStub(channel)
            revision = (await kv.Put(rpc.PutRequest(
                key=key, value=encode_pointer_entry(os.urandom(8), 1, pointer)),
                timeout=5)).header.revision
            await kv.Put(rpc.PutRequest(key=key, value=encode_entry(
                os.urandom(8), 1, [encode_batch(TOPIC, [b"after"])])), timeout=5)

        async def stopped(url: str) -> bool:
            return (await diagnostics(session, url))["failure"] is not None

        for url in nodes.urls:
            await wait_until(functools.partial(stopped, url), timeout=30,
                             what=f"{url} to stop")
            failure = (await diagnostics(session, url))["failure"]
            assert f"revision {revision} of /messaging/{nodes.name}/log" in failure, failure
            assert f"intake object {name} bytes 0..{len(body)} do not match the pointer" \
                in failure, failure
            status, text = await ready_text(session, url)
            assert status == 503 and "stopped applying" in text
            async with session.get(f"{url}/messaging/diagnostics") as resp:
                assert resp.status == 200


async def test_the_store_down_answers_large_publishes_503_in_time(
        etcd: EtcdCluster, broker_process, tmp_path: Path,  # noqa: F811
        seaweedfs: SeaweedFS, s3: S3Store, prefix: str, store_proxy: Any) -> None:  # noqa: F811
    """With the store gone a large publish is answered 503 with Retry-After, naming the
    store, within --object-store-timeout (default 10 s); a small one still goes through
    etcd; once the store is back large publishes are taken again; nothing refused is
    stored."""
    import time

    nodes = Nodes(broker_process, tmp_path, etcd, "--object-store", f"s3://{BUCKET}/{prefix}",
                  "--intake-min-size", str(MIN_SIZE))
    await nodes.start(0, 1, env={**s3_env(), "MESSAGING_S3_ENDPOINT": store_proxy.url})
    await nodes.wait_ready(0, 1)
    await lane_open(nodes)
    async with aiohttp.ClientSession() as session:
        url = nodes.url(0)

        async def large(n: int) -> tuple[int, dict[str, str]]:
            async with session.post(f"{url}/messaging/messages",
                                    params={"topicID": str(TOPIC)},
                                    data=f"large {n} ".encode().ljust(LARGE, b"x")) as resp:
                await resp.read()
                return resp.status, dict(resp.headers)

        assert (await large(0))[0] == 200
        await store_proxy.sever()
        started = time.monotonic()
        status, headers = await large(1)
        took = time.monotonic() - started
        assert status == 503, (status, headers)
        assert took < 15, took
        assert "Retry-After" in headers, headers
        assert f"s3://{BUCKET}/{prefix}" in headers["X-Broker-Error"], headers
        assert "not committed" in headers["X-Broker-Error"], headers
        async with session.post(f"{url}/messaging/messages", params={"topicID": str(TOPIC)},
                                data=b"small") as resp:
            assert resp.status == 200, await resp.text()
        store_proxy.refuse = False
        assert (await large(2))[0] == 200
        stored = await converge(session, nodes.urls, 3)
        assert [d[:7] for _i, d in stored] == [b"large 0", b"small", b"large 2"]


@dataclass
class ProducerLoad(Load):
    """Idempotent producers over every node: each message is sent with its producer's next
    sequence number until a node answers it (stored, or a duplicate of what was), whatever
    failed before (a node killed with the upload or the pointer on its way)."""

    duplicates: int = 0

    async def producer(self, session: aiohttp.ClientSession, w: int, count: int) -> None:
        pid = f"p{w}-{uuid.uuid4().hex[:6]}"
        for seq in range(count):
            data = f"p{w} s{seq} ".encode().ljust(SMALL if seq % 3 == 0 else LARGE, b"y")
            headers = {"Producer-Id": pid, "Producer-Epoch": "0", "Producer-Seq": str(seq)}
            for attempt in range(400):
                url = self.urls[(w + seq + attempt) % len(self.urls)]
                if url in self.down:
                    continue
                try:
                    async with session.post(f"{url}/messaging/messages",
                                            params={"topicID": str(TOPIC)}, data=data,
                                            headers=headers,
                                            timeout=aiohttp.ClientTimeout(total=40)) as resp:
                        self.statuses[resp.status] = self.statuses.get(resp.status, 0) + 1
                        text = await resp.text()
                        if resp.status == 200:
                            self.acked[data] = int(resp.headers["X-Broker-Index"])
                            self.duplicates += "Producer-Duplicate" in resp.headers or \
                                "X-Broker-Duplicate" in resp.headers
                            break
                        assert resp.status in (503, 504), (resp.status, text)
                except (aiohttp.ClientError, TimeoutError):
                    pass
                await asyncio.sleep(0.05)
            else:
                raise AssertionError(f"{data[:12]!r} was never answered")


async def ticket_versions(etcd: EtcdCluster, nodes: Nodes) -> list[int]:  # noqa: F811
    """The version of every intake ticket of the cluster (1: open, 2: closed)."""
    import grpc
    from aetcd import rpc

    from messaging.log.etcd.client import prefix_end

    key = f"/messaging/{nodes.name}/intake/".encode()
    async with grpc.aio.insecure_channel(
            etcd.members[0].client_url.removeprefix("http://")) as channel:
        response = await rpc.KVStub(channel).Range(rpc.RangeRequest(
            key=key, range_end=prefix_end(key), keys_only=True), timeout=5)
    return [int(kv.version) for kv in response.kvs]


async def intake_tickets(etcd: EtcdCluster, nodes: Nodes) -> int:  # noqa: F811
    import grpc
    from aetcd import rpc

    from messaging.log.etcd.client import prefix_end

    key = f"/messaging/{nodes.name}/intake/".encode()
    async with grpc.aio.insecure_channel(
            etcd.members[0].client_url.removeprefix("http://")) as channel:
        response = await rpc.KVStub(channel).Range(rpc.RangeRequest(
            key=key, range_end=prefix_end(key), count_only=True), timeout=5)
    return int(response.count)


@with_groups
async def test_kill_9_of_receiving_nodes_loses_nothing_and_the_sweep_deletes_every_object(
        etcd: EtcdCluster, broker_process, tmp_path: Path,  # noqa: F811
        seaweedfs: SeaweedFS, s3: S3Store, prefix: str) -> None:  # noqa: F811
    """Idempotent producers publish mostly large messages through every node while nodes
    are killed with SIGKILL, each with intake objects on their way (uploaded or not, their
    pointers committed or not, their publishers answered or not): every message is stored
    exactly once at the index it was answered with, every node ends with the same files, and
    every intake object, referenced or orphaned, is deleted once its ticket is older than
    the grace and etcd is compacted past its closing."""
    nodes = Nodes(broker_process, tmp_path, etcd,
                  *store_args(seaweedfs, prefix, "--object-sweep-grace", "2s",
                              "--etcd-compact-every", "10"))
    await nodes.start(0, 1, 2, env=s3_env())
    await nodes.wait_ready(0, 1, 2)
    await lane_open(nodes)
    load = ProducerLoad(nodes.urls)
    async with aiohttp.ClientSession() as session:
        producers = [asyncio.ensure_future(load.producer(session, w, 45)) for w in range(6)]
        for victim, after in ((0, 30), (1, 90), (0, 150)):
            await wait_until(functools.partial(answered, load, after), timeout=60,
                             what=f"{after} answered")
            load.down.add(nodes.url(victim))
            nodes.kill(victim)
            await asyncio.sleep(0.5)
            await nodes.start(victim, env=s3_env())
            await nodes.wait_ready(victim)
            load.down.discard(nodes.url(victim))
        await asyncio.wait_for(asyncio.gather(*producers), 120)
        assert len(load.acked) == 6 * 45, len(load.acked)
        stored = await converge(session, nodes.urls, len(load.acked), timeout=60)
        check_log(stored, load)
        await check_identical(nodes)
        assert await intake_objects(s3), "no intake object was written"

        async def all_swept() -> bool:
            async with session.post(f"{nodes.url(0)}/messaging/messages",
                                    params={"topicID": str(TOPIC + 1)}, data=b"tick") as resp:
                await resp.read()  # revisions move, so compaction does
            return not await intake_objects(s3) and not await intake_tickets(etcd, nodes)

        await wait_until(all_swept, timeout=90, what="every intake object and ticket deleted")
        # Deleted objects are never needed again: a node restarted now replays or installs.
        nodes.kill(2)
        await nodes.start(2, env=s3_env())
        await nodes.wait_ready(2)
        stored = await converge(session, nodes.urls, len(load.acked), timeout=60)
        check_log(stored, load)


async def answered(load: ProducerLoad, count: int) -> bool:
    return len(load.acked) >= count


async def test_the_lane_opens_only_while_every_node_reads_the_store(
        etcd: EtcdCluster, broker_process, tmp_path: Path,  # noqa: F811
        seaweedfs: SeaweedFS, s3: S3Store, prefix: str) -> None:  # noqa: F811
    """Node 2 runs without an object store: large publishes stay inline while it is live.
    With it gone the lane opens; started again without a store it holds its apply before the
    first pointer, saying how to fix it, and the lane closes again; started with the store it
    catches up. A node with ``--intake-min-size 0`` writes no object but reads them."""
    # No compaction meanwhile: node 2, started again, must replay the pointers it missed.
    keep = ["--etcd-compact-every", "1000000"]
    nodes = Nodes(broker_process, tmp_path, etcd, "--object-store", f"s3://{BUCKET}/{prefix}",
                  "--intake-min-size", str(MIN_SIZE), "--s3-endpoint", seaweedfs.endpoint,
                  *keep)
    await nodes.start(0, 1, env=s3_env())
    nodes.extra = ["--intake-min-size", "0", *keep]  # node 2, as started below: no store
    await nodes.start(2, env=s3_env())
    await nodes.wait_ready(0, 1, 2)
    load = MixedLoad(nodes.urls[:2])
    async with aiohttp.ClientSession() as session:
        await asyncio.sleep(1.5)  # every node's registration read: format 4 already
        await asyncio.gather(*(load.worker(session, w, 8, "closed ") for w in range(2)))
        assert await written(session, nodes.urls[:2]) == 0
        nodes.kill(2)
        await wait_until(functools.partial(lane_used, session, nodes, load), timeout=30,
                         what="the lane open once node 2's registration lapsed")
        await nodes.start(2, env=s3_env())

        async def held() -> bool:
            status, text = await ready_text(session, nodes.url(2))
            return status == 503 and "this node has no object store; restart it with the " \
                "cluster's --object-store" in text

        await wait_until(held, timeout=30, what="node 2 held, saying why")
        await asyncio.sleep(1.5)
        so_far = await written(session, nodes.urls[:2])
        await asyncio.gather(*(load.worker(session, w, 4, "again ") for w in range(2)))
        assert await written(session, nodes.urls[:2]) == so_far  # closed again: inline
        nodes.kill(2)
        nodes.extra = ["--object-store", f"s3://{BUCKET}/{prefix}", "--intake-min-size", "0",
                       "--s3-endpoint", seaweedfs.endpoint, *keep]
        await nodes.start(2, env=s3_env())
        stored = await converge(session, nodes.urls, len(load.acked), timeout=60)
        check_log(stored, load)
        await check_identical(nodes)
        await lane_open(nodes, [0, 1])  # node 2 reads the store again (but writes none)
        before = await written(session, nodes.urls)
        await asyncio.gather(*(load.worker(session, w, 4, "open ") for w in range(3)))
        after = [(await intake_state(session, u))["objects_written"] for u in nodes.urls]
        assert sum(after) > before and after[2] == 0, after  # node 2 takes none: size 0
        stored = await converge(session, nodes.urls, len(load.acked), timeout=60)
        check_log(stored, load)


PROBES = itertools.count(100)


async def lane_used(session: aiohttp.ClientSession, nodes: Nodes, load: MixedLoad) -> bool:
    """Publish a round through nodes 0 and 1; whether it wrote an intake object."""
    before = await written(session, nodes.urls[:2])
    await load.worker(session, next(PROBES), 2, "probe ")
    return await written(session, nodes.urls[:2]) > before


async def written(session: aiohttp.ClientSession, urls: list[str]) -> int:
    """Intake objects the nodes at ``urls`` wrote since they started."""
    return sum([int((await intake_state(session, u))["objects_written"]) for u in urls])


async def test_a_held_holder_past_which_etcd_was_compacted_installs_a_peers_snapshot(
        etcd: EtcdCluster, broker_process, tmp_path: Path,  # noqa: F811
        seaweedfs: SeaweedFS, s3: S3Store, prefix: str, store_proxy: Any) -> None:  # noqa: F811
    """Node 2 cannot reach the store and holds its apply at a pointer; etcd is compacted past
    it (by an operator: a held node's durable revision holds our own compaction back): node
    2 gives up what it held, installs a peer's snapshot (which covers it) and serves the same
    data as the others, the store still out of its reach, and follows what comes next."""
    import grpc
    from aetcd import rpc

    nodes = await node_2_through(store_proxy, broker_process, tmp_path, etcd, seaweedfs, prefix)
    load = MixedLoad(nodes.urls[:2])
    async with aiohttp.ClientSession() as session:
        await store_proxy.sever()
        await asyncio.gather(*(load.worker(session, w, 4, "held ") for w in range(2)))

        async def held() -> bool:
            status, text = await ready_text(session, nodes.url(2))
            return status == 503 and "cannot be fetched now" in text

        await wait_until(held, timeout=40, what="node 2 held at a pointer")
        async with grpc.aio.insecure_channel(
                etcd.members[0].client_url.removeprefix("http://")) as channel:
            kv = rpc.KVStub(channel)
            now = (await kv.Range(rpc.RangeRequest(key=b"/"), timeout=5)).header.revision
            await kv.Compact(rpc.CompactionRequest(revision=now), timeout=10)
        for n in range(100):  # small, inline: what comes after
            async with session.post(f"{nodes.url(n % 2)}/messaging/messages",
                                    params={"topicID": str(TOPIC)},
                                    data=f"after {n}".encode()) as resp:
                assert resp.status == 200, await resp.text()
                load.acked[f"after {n}".encode()] = int(resp.headers["X-Broker-Index"])
        stored = await converge(session, nodes.urls, len(load.acked), timeout=90)
        check_log(stored, load)
        state = await diagnostics(session, nodes.url(2))
        assert state["snapshots_installed"] >= 1, state
        assert "dropped" in (tmp_path / "node2.log").read_text()
        await nodes.wait_ready(2)


async def test_a_receiving_node_killed_between_its_upload_and_its_pointer(
        etcd: EtcdCluster, broker_process, tmp_path: Path,  # noqa: F811
        seaweedfs: SeaweedFS, s3: S3Store, prefix: str, store_proxy: Any) -> None:  # noqa: F811
    """Node 0 reaches the store through a proxy that stops passing answers: its object is in
    the store, its pointer not committed, when it is killed. The publisher's retry through
    another node (same producer sequence) is stored once; the object no pointer names is
    deleted by the sweep after the grace."""
    keep = ["--object-sweep-grace", "2s", "--etcd-compact-every", "10"]
    nodes = Nodes(broker_process, tmp_path, etcd, "--object-store", f"s3://{BUCKET}/{prefix}",
                  "--intake-min-size", str(MIN_SIZE), *keep)
    await nodes.start(0, env={**s3_env(), "MESSAGING_S3_ENDPOINT": store_proxy.url})
    await nodes.start(1, 2, env={**s3_env(), "MESSAGING_S3_ENDPOINT": seaweedfs.endpoint})
    await nodes.wait_ready(0, 1, 2)
    await lane_open(nodes)
    data = b"orphaned ".ljust(LARGE, b"o")
    producer = {"Producer-Id": "orphan", "Producer-Epoch": "0", "Producer-Seq": "0"}
    async with aiohttp.ClientSession() as session:
        store_proxy.hold_responses = True

        first = asyncio.ensure_future(post_as(session, nodes.url(0), data, producer))
        await wait_until(functools.partial(stored_count, s3, 1), timeout=20,
                         what="node 0's object in the store")
        orphans = {o.name for o in await intake_objects(s3)}
        nodes.kill(0)
        with pytest.raises(aiohttp.ClientError):
            await first
        retried = await post_as(session, nodes.url(1), data, producer)
        assert retried.status == 200
        index = int(retried.headers["X-Broker-Index"])
        stored = await converge(session, nodes.urls[1:], 1)
        assert stored == [(index, data)]
        store_proxy.hold_responses = False
        await nodes.start(0, env={**s3_env(), "MESSAGING_S3_ENDPOINT": store_proxy.url})
        assert await converge(session, nodes.urls, 1) == stored

        async def orphan_gone() -> bool:
            async with session.post(f"{nodes.url(1)}/messaging/messages",
                                    params={"topicID": str(TOPIC + 1)}, data=b"tick") as resp:
                await resp.read()  # revisions move, so compaction does
            return not orphans & {o.name for o in await intake_objects(s3)}

        await wait_until(orphan_gone, timeout=60, what="the orphaned object swept")


async def post_as(session: aiohttp.ClientSession, url: str, data: bytes,
                  producer: dict[str, str]) -> aiohttp.ClientResponse:
    """One publish of ``data`` to TOPIC with ``producer``'s headers; the (read) response."""
    async with session.post(f"{url}/messaging/messages", params={"topicID": str(TOPIC)},
                            data=data, headers=producer) as resp:
        await resp.read()
        return resp


async def intake_objects(store: S3Store) -> list[ObjectInfo]:
    """The intake objects in the store (its marker aside)."""
    return [o for o in await store.list("intake") if o.name != MARKER]


async def stored_count(store: S3Store, at_least: int) -> bool:
    return len(await intake_objects(store)) >= at_least


async def test_a_receiving_node_killed_between_its_pointer_and_its_answer(
        etcd: EtcdCluster, broker_process, tmp_path: Path,  # noqa: F811
        seaweedfs: SeaweedFS, s3: S3Store, prefix: str) -> None:  # noqa: F811
    """Node 0 is killed while it applies its own pointer (held at the segment write by a
    fault point: etcd committed the pointer, the publisher not answered yet). The retry
    through another node with the same producer sequence is answered as a duplicate with
    the index the message has everywhere; node 0, restarted, ends with the same files."""
    from tests.e2e.test_etcd_log import FAULTPOINT
    from tests.e2e.test_exactly_once import wait_for_trace

    nodes = Nodes(broker_process, tmp_path, etcd, *store_args(seaweedfs, prefix))
    arm, trace = tmp_path / "arm", tmp_path / "trace"
    await nodes.start(1, 2, env=s3_env())
    await nodes.start(0, launcher=FAULTPOINT, env={
        **s3_env(), "FAULT_ROOT": str(nodes.data(0)), "FAULT_ARM": str(arm),
        "FAULT_HOLD": "write:.seg", "FAULT_TRACE": str(trace), "FAULT_SKIP": "cluster.json"})
    await nodes.wait_ready(0, 1, 2)
    await lane_open(nodes)
    data = b"held ".ljust(LARGE, b"h")
    producer = {"Producer-Id": "held", "Producer-Epoch": "0", "Producer-Seq": "0"}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{nodes.url(1)}/messaging/messages",
                                params={"topicID": str(TOPIC)}, data=b"before") as resp:
            assert resp.status == 200
        await converge(session, nodes.urls, 1)
        arm.touch()

        first = asyncio.ensure_future(post_as(session, nodes.url(0), data, producer))
        await wait_for_trace(trace, "held write")
        nodes.kill(0)
        with pytest.raises(aiohttp.ClientError):
            await first
        arm.unlink()
        retried = await post_as(session, nodes.url(1), data, producer)
        assert retried.status == 200
        assert retried.headers.get("Producer-Duplicate") == "true" \
            or retried.headers.get("X-Broker-Duplicate") == "true", dict(retried.headers)
        stored = await converge(session, nodes.urls[1:], 2)
        assert [d for _i, d in stored] == [b"before", data]
        assert stored[1][0] == int(retried.headers["X-Broker-Index"])
        await nodes.start(0, env=s3_env())
        assert await converge(session, nodes.urls, 2) == stored
        await check_identical(nodes)
