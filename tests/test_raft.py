"""A replicated cluster of real broker processes on 127.0.0.1."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from messaging.client import Client
from messaging.errors import MessagingError, PublishOutcomeUnknownError
from messaging.message import decode
from tests.conftest import BrokerProcess, cli, free_port, wait_until


class Cluster:
    """Nodes with their own data directories, HTTP ports and raft ports."""

    def __init__(self, make, tmp: Path, size: int, *extra: str) -> None:
        self.make = make
        self.tmp = tmp
        self.extra = list(extra)
        self.raft = [f"127.0.0.1:{free_port()}" for _ in range(size)]
        self.nodes: list[BrokerProcess] = []

    def start_node(self, i: int, members: list[str]) -> BrokerProcess:
        port = free_port()
        peers = [arg for member in members if member != self.raft[i]
                 for arg in ("--peer", member)]
        node: BrokerProcess = self.make(self.tmp / f"node{i}", "--raft-bind", self.raft[i], *peers,
                         "--advertise", f"http://127.0.0.1:{port}", *self.extra, port=port)
        node.start()
        if i < len(self.nodes):
            self.nodes[i] = node
        else:
            self.nodes.append(node)
        return node

    def start(self) -> Cluster:
        for i in range(len(self.raft)):
            self.start_node(i, self.raft)
        return self

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]


async def diagnostics(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(f"{url}/messaging/diagnostics") as resp:
        result: dict[str, Any] = await resp.json()
        return result


async def leader_of(session: aiohttp.ClientSession, urls: list[str]) -> str | None:
    for url in urls:
        try:
            d = await diagnostics(session, url)
        except aiohttp.ClientError:
            continue
        if d["role"] == "leader" and len(d["urls"]) >= 1:
            return url
    return None


async def wait_for_leader(session: aiohttp.ClientSession, urls: list[str],
                          registered: int) -> str:
    found: list[str] = []

    async def ready() -> bool:
        leader = await leader_of(session, urls)
        if leader is None:
            return False
        d = await diagnostics(session, leader)
        if len(d["urls"]) < registered:
            return False
        found.append(leader)
        return True

    await wait_until(ready, timeout=30, what="a leader with every node registered")
    return found[-1]


async def topic_contents(session: aiohttp.ClientSession, url: str, topic: int) -> list:
    async with session.get(f"{url}/messaging/messages", params={"topicID": str(topic)}) as resp:
        body = await resp.read()
    return [(m.index, m.data) for m in decode(body, after=0)[0]]


async def converged(session: aiohttp.ClientSession, urls: list[str], topic: int,
                    count: int) -> list:
    contents: list = []

    async def same() -> bool:
        contents[:] = [await topic_contents(session, u, topic) for u in urls]
        return len(contents[0]) >= count and all(c == contents[0] for c in contents)

    await wait_until(same, timeout=30, what=f"{len(urls)} nodes holding the same {count}")
    result: list = contents[0]
    return result


async def test_publish_through_a_follower_replicates_identically(broker_process,
                                                                 tmp_path: Path) -> None:
    cluster = Cluster(broker_process, tmp_path, 3).start()
    async with aiohttp.ClientSession() as session:
        leader = await wait_for_leader(session, cluster.urls, 3)
        follower = next(u for u in cluster.urls if u != leader)
        async with session.post(f"{follower}/messaging/messages", params={"topicID": "1"},
                                data=b"x", allow_redirects=False) as resp:
            assert resp.status == 307
            assert resp.headers["Location"] == f"{leader}/messaging/messages?topicID=1"
        async with Client(follower) as client:
            assert await client.publish(1, b"first") == 1
            assert client.leader == leader
            first, last = await client.publish_batch(2, [b"m%d" % i for i in range(500)])
            assert (first, last) == (2, 501)
            await client.publish(1, b"last")
            assert sorted(await client.ping()) == sorted(cluster.urls)
        async with Client(follower) as client:  # heartbeats go to the leader, replicated
            await client.heartbeat(2, 250, "reporter-a")

            async def replicated() -> bool:
                topics = [await client_topics(session, u) for u in cluster.urls]
                return all(t.get("reporter-a") == 250 for t in topics)

            await wait_until(replicated, timeout=15, what="the heartbeat on every node")
        ones = await converged(session, cluster.urls, 1, 2)
        assert ones == [(1, b"first"), (502, b"last")]
        await converged(session, cluster.urls, 2, 500)
        d = await diagnostics(session, follower)
        assert d["role"] == "follower" and d["leader"] == leader and d["term"] >= 1
        assert d["commit_index"] >= 3 and len(d["peers"]) == 2
    for topic in ("1", "2"):
        files = [sorted((n.data / "topics" / topic).glob("*.seg")) for n in cluster.nodes]
        contents = [[f.read_bytes() for f in fs] for fs in files]
        assert contents[0] == contents[1] == contents[2]


async def client_topics(session: aiohttp.ClientSession, url: str) -> dict[str, int]:
    async with session.get(f"{url}/messaging/topics/2") as resp:
        if resp.status != 200:
            return {}
        subscribers: dict[str, int] = (await resp.json())["subscribers"]
        return subscribers


async def test_no_leader_answers_503(broker_process, tmp_path: Path) -> None:
    cluster = Cluster(broker_process, tmp_path, 3)
    lonely = cluster.start_node(0, cluster.raft)  # its two peers never start: no quorum
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{lonely.url}/messaging/messages", params={"topicID": "1"},
                                data=b"x") as resp:
            assert resp.status == 503
            assert "no leader" in resp.headers["X-Broker-Error"]
        async with session.get(f"{lonely.url}/messaging/messages",
                               params={"topicID": "1"}) as resp:
            assert resp.status == 404  # reads are still served (topic 1 never existed)
        d = await diagnostics(session, lonely.url)
        assert d["leader"] is None and d["role"] == "follower"


async def publish_until(client: Client, stop: asyncio.Event, acked: list, unknown: list) -> None:
    n = 0
    while not stop.is_set() and n < 5000:
        n += 1
        datas = [f"batch {n} message {k}".encode() for k in range(10)]
        try:
            first, last = await client.publish_batch(1, datas)
        except PublishOutcomeUnknownError:
            unknown.extend(datas)
            continue
        except MessagingError:
            await asyncio.sleep(0.05)
            continue
        acked.extend(zip(range(first, last + 1), datas, strict=True))


async def test_leader_killed_under_load_loses_nothing(broker_process, tmp_path: Path) -> None:
    cluster = Cluster(broker_process, tmp_path, 3).start()
    async with aiohttp.ClientSession() as session:
        leader = await wait_for_leader(session, cluster.urls, 3)
        acked: list = []
        unknown: list = []
        stop = asyncio.Event()
        async with Client(cluster.urls, retry_timeout=20) as client:
            load = asyncio.ensure_future(publish_until(client, stop, acked, unknown))
            await wait_until(lambda: _true(len(acked) > 200), what="load before the kill")
            killed = cluster.urls.index(leader)
            cluster.nodes[killed].kill()
            before = len(acked)
            survivors = [u for i, u in enumerate(cluster.urls) if i != killed]
            await wait_until(lambda: _true(len(acked) > before + 200), timeout=30,
                             what="publishing to continue on a new leader")
            stop.set()
            await asyncio.wait_for(load, 30)
        new_leader = await leader_of(session, survivors)
        assert new_leader is not None and new_leader != leader
        expected = len(acked)
        contents = await converged(session, survivors, 1, expected)
        stored = dict(contents)
        assert len(stored) == len(contents)  # no index twice
        for index, data in acked:
            assert stored.get(index) == data, f"acknowledged index {index} lost"
        datas = [d for _, d in contents]
        assert len(datas) == len(set(datas))  # no message stored twice
        assert set(datas) <= {d for _, d in acked} | set(unknown)

        cluster.start_node(killed, cluster.raft)  # restart the killed node: it catches up
        await converged(session, cluster.urls, 1, len(contents))


async def _true(value: bool) -> bool:
    return value


async def test_join_catches_up_from_a_snapshot_and_leave(broker_process, tmp_path: Path) -> None:
    cluster = Cluster(broker_process, tmp_path, 4, "--raft-snapshot-entries", "20")
    for i in range(3):
        cluster.start_node(i, cluster.raft[:3])
    async with aiohttp.ClientSession() as session:
        await wait_for_leader(session, cluster.urls, 3)
        async with Client(cluster.urls) as client:
            for n in range(60):
                await client.publish_batch(1, [f"{n}-{k}".encode() for k in range(5)])

            async def compacted() -> bool:
                return all((n.data / "raft" / "snapshot").exists() for n in cluster.nodes)

            await wait_until(compacted, timeout=30, what="log compaction on every node")
            newcomer = cluster.start_node(3, cluster.raft)
            async with session.post(f"{cluster.urls[0]}/messaging/cluster/join",
                                    params={"addr": cluster.raft[3]}) as resp:
                assert resp.status in (200, 307), await resp.text()
            if resp.status == 307:
                async with session.post(resp.headers["Location"]) as redirected:
                    assert redirected.status == 200, await redirected.text()
            contents = await converged(session, cluster.urls, 1, 300)
            assert len(contents) == 300
            d = await diagnostics(session, newcomer.url)
            assert d["snapshots_restored"] >= 1
            await wait_until(lambda: _registered(session, cluster.urls[0], newcomer.url),
                             what="the newcomer's URL to be registered")

            result = await asyncio.to_thread(cli, "cluster", "leave", cluster.urls[0],
                                             cluster.raft[3])
            assert result.returncode == 0, result.stderr
            leader = await wait_for_leader(session, cluster.urls[:3], 3)
            d = await diagnostics(session, leader)
            assert cluster.raft[3] not in d["peers"]
            assert newcomer.url not in d["urls"].values()
            await client.publish(1, b"after leave")
            await converged(session, cluster.urls[:3], 1, 301)


async def _registered(session: aiohttp.ClientSession, url: str, wanted: str) -> bool:
    leader = await leader_of(session, [url]) or url
    return wanted in (await diagnostics(session, leader))["urls"].values()


@pytest.mark.parametrize("args", [["--peer", "127.0.0.1:1"], ["--raft-bind", "nope"]])
def test_cluster_flag_errors(args: list[str]) -> None:
    result = cli("broker", "--bind", "127.0.0.1:0", *args)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
