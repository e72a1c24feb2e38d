"""Topic groups end to end: real etcd members and real broker processes on 127.0.0.1.

Four nodes, four groups, two holders per group: every request works through every node,
each group is applied and stored only by its holders (byte-identical), a killed holder's
groups move with nothing acknowledged lost, and a group may live in an etcd cluster of its
own.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from messaging.client.client import Client
from messaging.clock import now_ms
from messaging.config import EtcdSettings
from messaging.frames import decode
from messaging.log.etcd.client import EtcdClient
from messaging.log.etcd.membership import Membership
from messaging.placement import GROUP_SHIFT, NAMED_TOPIC_BASE, group_of_name, group_of_topic
from tests.client.test_conn import collect  # type: ignore[attr-defined]
from tests.conftest import wait_until
from tests.e2e.test_etcd_log import EtcdCluster, Nodes, _range, etcd, etcd_cluster
from tests.raw_server import app_server

__all__ = ["etcd", "etcd_cluster"]  # the module's etcd cluster (fixtures)

GROUPS, REPLICAS, NODES = 4, 2, 4
TOPICS = list(range(1, 17))


def group_nodes(broker_process: Any, tmp_path: Path, etcd: EtcdCluster,
                *extra: str) -> Nodes:
    return Nodes(broker_process, tmp_path, etcd, "--groups", str(GROUPS),
                 "--replicas", str(REPLICAS), *extra)


async def running(broker_process: Any, tmp_path: Path, etcd: EtcdCluster,
                  *extra: str) -> tuple[Nodes, dict[int, list[str]]]:
    """Four nodes started and settled; each group's holders."""
    nodes = group_nodes(broker_process, tmp_path, etcd, *extra)
    await nodes.start(*range(NODES))
    async with aiohttp.ClientSession() as session:
        return nodes, await settled(session, nodes.urls)


async def get_json(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as resp:
        assert resp.status == 200, f"{url}: {resp.status} {await resp.text()}"
        return await resp.json()


async def placement(session: aiohttp.ClientSession, url: str) -> dict[int, list[str]]:
    """Each group's holders as ``url`` sees them."""
    answer = await get_json(session, f"{url}/messaging/groups")
    return {g["group"]: g["holders"] for g in answer["groups"]}


async def settled(session: aiohttp.ClientSession, urls: list[str],
                  timeout: float = 60.0) -> dict[int, list[str]]:
    """Wait until every node agrees on the holders and every holder has caught up."""
    seen: dict[int, list[str]] = {}

    async def agreed() -> bool:
        try:
            views = [await get_json(session, f"{u}/messaging/groups") for u in urls]
        except (aiohttp.ClientError, AssertionError):
            return False
        maps = [{g["group"]: g["holders"] for g in v["groups"]} for v in views]
        if any(m != maps[0] for m in maps) or any(sorted(v["members"]) != sorted(urls)
                                                  for v in views):
            return False
        for url, view in zip(urls, views, strict=True):
            for group in view["groups"]:
                held = url in group["holders"]
                here = group["here"]
                if held != (here is not None) or (held and not here["caught_up"]):
                    return False
        seen.update(maps[0])
        return True

    await wait_until(agreed, timeout=timeout, what="every node agreeing on caught-up holders")
    return seen


@dataclass
class TopicLoad:
    """Publishers over many topics through every node; every answer is recorded."""

    urls: list[str]
    acked: dict[bytes, tuple[int, int]] = field(default_factory=dict)  # data → (topic, index)
    refused: set[bytes] = field(default_factory=set)
    unknown: set[bytes] = field(default_factory=set)
    down: set[str] = field(default_factory=set)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self, session: aiohttp.ClientSession, workers: int = 8) -> None:
        for w in range(workers):
            self.tasks.append(asyncio.ensure_future(self._worker(session, w)))

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.wait_for(asyncio.gather(*self.tasks), 60)

    async def _worker(self, session: aiohttp.ClientSession, w: int) -> None:
        n = 0
        while not self.stop.is_set() and n < 100_000:
            n += 1
            url = self.urls[(w + n) % len(self.urls)]
            if url in self.down:
                await asyncio.sleep(0.01)
                continue
            topic = TOPICS[(w * 7 + n) % len(TOPICS)]
            await self.publish(session, url, topic, f"w{w} n{n}".encode())

    async def publish(self, session: aiohttp.ClientSession, url: str, topic: int,
                      data: bytes) -> None:
        try:
            async with session.post(f"{url}/messaging/messages", params={"topicID": str(topic)},
                                    data=data, timeout=aiohttp.ClientTimeout(total=40)) as resp:
                await resp.read()
                if resp.status == 200:
                    self.acked[data] = (topic, int(resp.headers["X-Broker-Index"]))
                    return
                (self.refused if resp.status == 503 else self.unknown).add(data)
        except aiohttp.ClientConnectorError:
            self.refused.add(data)
        except (aiohttp.ClientError, TimeoutError):
            self.unknown.add(data)
        await asyncio.sleep(0.05)


async def read_topic(session: aiohttp.ClientSession, url: str,
                     topic: int) -> list[tuple[int, bytes]]:
    async with session.get(f"{url}/messaging/messages", params={"topicID": str(topic)}) as resp:
        if resp.status == 404:
            return []
        assert resp.status == 200, await resp.text()
        body = await resp.read()
    messages, used = decode(body, after=0)
    assert used == len(body)
    return [(m.index, m.data) for m in messages]


async def check_everything(session: aiohttp.ClientSession, urls: list[str],
                           load: TopicLoad) -> None:
    """Through every node: every acknowledged message once, at its index, in its topic;
    nothing refused stored."""
    for url in urls:
        stored: dict[bytes, tuple[int, int]] = {}
        for topic in TOPICS:
            for index, data in await read_topic(session, url, topic):
                assert data not in stored, f"{data!r} stored twice (through {url})"
                stored[data] = (topic, index)
        for data, where in load.acked.items():
            assert stored.get(data) == where, (f"acknowledged {data!r} at {where}, through "
                                               f"{url} found at {stored.get(data)}")
        assert not load.refused & stored.keys(), "refused messages were stored"
        assert stored.keys() <= load.acked.keys() | load.unknown


def group_files(data: Path, group: int) -> dict[str, bytes]:
    topics = data / "groups" / str(group) / "topics"
    return {str(f.relative_to(topics)): f.read_bytes() for f in sorted(topics.glob("*/*.seg"))}


async def check_holders_identical(nodes: Nodes, holders: dict[int, list[str]]) -> None:
    """Each group's holders hold byte-identical segment files; no other node keeps any."""
    index_of = {nodes.url(i): i for i in nodes.procs}
    for group, urls in holders.items():
        files = [await asyncio.to_thread(group_files, nodes.data(index_of[u]), group)
                 for u in urls]
        assert files[0], f"group {group}: no segment files"
        assert all(f == files[0] for f in files[1:]), f"group {group}: holders differ"


async def wait_copies_only_on_holders(nodes: Nodes, holders: dict[int, list[str]],
                                      alive: list[int]) -> None:
    """Former holders delete a group's files once its holders are durable past them."""
    async def only_holders() -> bool:
        for i in alive:
            present = {int(p.name) for p in (nodes.data(i) / "groups").iterdir()
                       if p.name.isdigit()}  # (not a copy being deleted)
            expected = {g for g, urls in holders.items() if nodes.url(i) in urls}
            if present != expected:
                return False
        return True

    await wait_until(only_holders, timeout=40, what="group files only on their holders")


# -- tests -----------------------------------------------------------------------------------


async def test_the_number_of_groups_is_fixed_when_the_cluster_is_created(
        etcd: EtcdCluster, broker_process: Any, tmp_path: Path) -> None:
    nodes = group_nodes(broker_process, tmp_path, etcd)
    await nodes.start(0)
    for args in (["--groups", "2"], []):
        done = subprocess.run(
            [sys.executable, "-m", "messaging.cli", "broker", "--data", str(tmp_path / "x"),
             "--bind", "127.0.0.1:0", "--etcd", etcd.endpoints, "--cluster", nodes.name, *args],
            capture_output=True, text=True, timeout=60)
        assert done.returncode != 0
        assert (f"cluster {nodes.name!r} was created with --groups {GROUPS}; this node was "
                f"started with --groups {args[1] if args else 1}") in done.stderr
        assert "Traceback" not in done.stderr
    recorded = await _range(etcd.members[0].client_url, f"/messaging/{nodes.name}/groups".encode())
    assert json.loads(recorded.kvs[0].value) == {"groups": GROUPS}


async def test_each_group_is_applied_and_stored_only_by_its_holders(
        etcd: EtcdCluster, broker_process: Any, tmp_path: Path) -> None:
    nodes, holders = await running(broker_process, tmp_path, etcd)
    async with aiohttp.ClientSession() as session:
        assert all(len(h) == REPLICAS for h in holders.values())
        load = TopicLoad(nodes.urls)
        for k in range(5):  # every topic through every node
            await asyncio.gather(*(load.publish(session, nodes.url((t + k) % NODES), t,
                                                b"t%d k%d" % (t, k)) for t in TOPICS))
        assert len(load.acked) == 5 * len(TOPICS), (load.refused, load.unknown)
        # Forwarded answers name the holder that applied them.
        for t in TOPICS[:4]:
            group = group_of_topic(t, GROUPS)
            for url in nodes.urls:
                async with session.get(f"{url}/messaging/topics/{t}") as resp:
                    assert resp.status == 200
                    assert resp.headers["X-Messaging-Node"] in holders[group]
        await check_everything(session, nodes.urls, load)
        listed = await get_json(session, f"{nodes.url(0)}/messaging/topics")
        assert sorted(row["id"] for row in listed) == TOPICS
        # Apply work is split: a node applies only its groups' messages.
        applied = {}
        for i in range(NODES):
            diagnostics = await get_json(session, f"{nodes.url(i)}/messaging/diagnostics")
            applied[i] = sum(sum(1 for t in TOPICS if group_of_topic(t, GROUPS) == int(g))
                             for g in diagnostics["held"])
        assert sum(applied.values()) == REPLICAS * len(TOPICS)
        await wait_copies_only_on_holders(nodes, holders, list(range(NODES)))
        await check_holders_identical(nodes, holders)


async def test_a_killed_holder_moves_its_groups_and_nothing_is_lost(
        etcd: EtcdCluster, broker_process: Any, tmp_path: Path) -> None:
    nodes, before = await running(broker_process, tmp_path, etcd)
    async with aiohttp.ClientSession() as session:
        load = TopicLoad(nodes.urls)
        load.start(session)
        await wait_until(lambda: _true(len(load.acked) >= 150), timeout=60, what="150 acks")
        # The node holding the most groups is killed with kill -9.
        victim = max(range(NODES), key=lambda i: sum(nodes.url(i) in h
                                                     for h in before.values()))
        load.down.add(nodes.url(victim))
        nodes.kill(victim)
        acked = len(load.acked)
        await wait_until(lambda: _true(len(load.acked) >= acked + 150), timeout=90,
                         what="150 more acks after a holder was killed")
        await load.finish()
        alive = [i for i in range(NODES) if i != victim]
        urls = [nodes.url(i) for i in alive]
        after = await settled(session, urls)
        assert all(nodes.url(victim) not in h and len(h) == REPLICAS for h in after.values())
        moved = [g for g in range(GROUPS) if after[g] != before[g]]
        assert moved, "the killed node held no group"
        await check_everything(session, urls, load)
        await check_holders_identical(nodes, after)


async def test_a_named_stream_lives_in_the_group_of_its_name(
        etcd: EtcdCluster, broker_process: Any, tmp_path: Path) -> None:
    nodes, holders = await running(broker_process, tmp_path, etcd)
    async with aiohttp.ClientSession() as session:
        names = [f"orders-{k}" for k in range(8)]
        for k, name in enumerate(names):
            url = f"{nodes.url(k % NODES)}/v1/stream/{name}"
            async with session.put(url, headers={"Content-Type": "text/plain"}) as resp:
                assert resp.status == 201, await resp.text()
                assert resp.headers["X-Messaging-Node"] in holders[group_of_name(name, GROUPS)]
                assert resp.headers["Location"].startswith(nodes.url(k % NODES))
            async with session.post(url, data=f"first of {name}",
                                    headers={"Content-Type": "text/plain"}) as resp:
                assert resp.status == 204, await resp.text()
        for name in names:
            for url in nodes.urls:
                async with session.get(f"{url}/v1/stream/{name}") as resp:
                    assert resp.status == 200
                    assert await resp.text() == f"first of {name}"
        # A stream's topic id names its group: native reads of it find it from any node.
        listed = await get_json(session, f"{nodes.url(0)}/messaging/topics")
        ids = [int(row["id"]) for row in listed if int(row["id"]) >= NAMED_TOPIC_BASE]
        assert len(ids) == len(names)
        assert {(i - NAMED_TOPIC_BASE) >> GROUP_SHIFT for i in ids} == \
               {group_of_name(n, GROUPS) for n in names}
        for topic in ids:
            assert len(await read_topic(session, nodes.url(3), topic)) == 1
        await check_lookups(session, nodes.url(0), holders, names[0], ids[0])


async def check_lookups(session: aiohttp.ClientSession, url: str, holders: dict[int, list[str]],
                        name: str, stream_id: int) -> None:
    """``GET /messaging/groups`` with ``name`` or ``topicID`` answers that lookup alone (one
    JSON line), an id below 2^53 as a number and a stream's id as a string."""
    lookups: list[tuple[dict[str, str], dict[str, Any], int]] = [
        ({"name": name}, {"name": name}, group_of_name(name, GROUPS)),
        ({"name": "not-yet"}, {"name": "not-yet"}, group_of_name("not-yet", GROUPS)),
        ({"topicID": name}, {"name": name}, group_of_name(name, GROUPS)),
        ({"topicID": "7"}, {"topic": 7}, group_of_topic(7, GROUPS)),
        ({"topicID": str(stream_id)}, {"topic": str(stream_id)},
         group_of_topic(stream_id, GROUPS))]
    for query, looked_up, group in lookups:
        async with session.get(f"{url}/messaging/groups", params=query) as resp:
            assert resp.status == 200, await resp.text()
            body = await resp.read()
        assert body.endswith(b"}\n") and body.count(b"\n") == 1, body
        assert json.loads(body) == {"lookup": {**looked_up, "group": group,
                                               "holders": holders[group]}}, query
    for bad in ("", "a\x01b", str(2**64)):
        async with session.get(f"{url}/messaging/groups", params={"topicID": bad}) as resp:
            assert resp.status == 400, bad
            assert "/v1/stream/NAME" in resp.headers["X-Broker-Error"] or bad == "", bad


async def test_a_group_in_an_etcd_cluster_of_its_own(
        etcd: EtcdCluster, broker_process: Any, tmp_path: Path) -> None:
    (tmp_path / "etcd-b").mkdir()
    other = EtcdCluster(tmp_path / "etcd-b", size=1)
    other.ensure_running()
    try:
        await other.wait_healthy()
        nodes = group_nodes(broker_process, tmp_path, etcd, "--group-etcd",
                            f"1={other.endpoints}")
        await nodes.start(*range(3))
        async with aiohttp.ClientSession() as session:
            await settled(session, nodes.urls)
            load = TopicLoad(nodes.urls)
            await asyncio.gather(*(load.publish(session, nodes.url(t % 3), t, b"t%d" % t)
                                   for t in TOPICS))
            assert len(load.acked) == len(TOPICS)
            await check_everything(session, nodes.urls, load)
            view = await get_json(session, f"{nodes.url(0)}/messaging/groups")
            assert view["groups"][1]["etcd"] == [other.endpoints]
            assert view["groups"][0]["etcd"] == etcd.endpoints.split(",")
        key = f"/messaging/{nodes.name}~g1/log".encode()
        assert (await _range(other.members[0].client_url, key)).kvs, "group 1 not in etcd B"
        assert not (await _range(etcd.members[0].client_url, key)).kvs
        key0 = f"/messaging/{nodes.name}~g0/log".encode()
        assert (await _range(etcd.members[0].client_url, key0)).kvs
    finally:
        other.stop()


async def test_a_wrong_group_flag_is_one_line() -> None:
    for args, message in ((["--groups", "4", "--group-etcd", "7=http://127.0.0.1:1"],
                           "invalid --group-etcd '7=http://127.0.0.1:1': there are groups 0 "
                           "to 3 (--groups 4)"),
                          (["--groups", "0"], "invalid number '0'")):
        done = subprocess.run(
            [sys.executable, "-m", "messaging.cli", "broker", "--bind", "127.0.0.1:0",
             "--etcd", "http://127.0.0.1:1", "--cluster", "c", *args],
            capture_output=True, text=True, timeout=60)
        assert done.returncode != 0
        assert message in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


async def _true(value: bool) -> bool:
    return value


class OwnEtcd:
    """A one-member etcd cluster of a test's own: compaction there depends only on it (the
    module's etcd holds the logs of earlier tests' groups, whose nodes are gone, and etcd
    is never compacted past a group log that no node applies)."""

    def __init__(self, tmp: Path) -> None:
        (tmp / "own-etcd").mkdir()
        self.cluster = EtcdCluster(tmp / "own-etcd", size=1)

    async def __aenter__(self) -> EtcdCluster:
        self.cluster.ensure_running()
        await self.cluster.wait_healthy()
        return self.cluster

    async def __aexit__(self, *exc: object) -> None:
        self.cluster.stop()


def topic_in(group: int) -> int:
    return next(t for t in range(1, 10_000) if group_of_topic(t, GROUPS) == group)


async def status_of(session: aiohttp.ClientSession, url: str, topic: int,
                    data: bytes) -> int:
    try:
        async with session.post(f"{url}/messaging/messages", params={"topicID": str(topic)},
                                data=data, timeout=aiohttp.ClientTimeout(total=20)) as resp:
            await resp.read()
            return resp.status
    except aiohttp.ClientConnectorError:
        return 0


async def compacted_past(session: aiohttp.ClientSession, urls: list[str], revision: int) -> None:
    async def compacted() -> bool:
        best = 0
        for url in urls:
            held = (await get_json(session, f"{url}/messaging/diagnostics"))["held"]
            best = max([best, *(d["compacted_revision"] for d in held.values())])
        return best >= revision

    await wait_until(compacted, timeout=40, what=f"etcd compacted past revision {revision}")


async def test_all_holders_of_a_group_killed_after_compaction(
        broker_process: Any, tmp_path: Path) -> None:
    """The group's writes are refused (503) until its former holders return; groups that kept
    a holder go on; nothing acknowledged is lost."""
    async with OwnEtcd(tmp_path) as etcd, aiohttp.ClientSession() as session:
        nodes = group_nodes(broker_process, tmp_path, etcd, "--etcd-compact-every", "1")
        await nodes.start(*range(NODES))
        holders = await settled(session, nodes.urls)
        load = TopicLoad(nodes.urls)
        for k in range(3):
            await asyncio.gather(*(load.publish(session, nodes.url(t % NODES), t,
                                                b"t%d k%d" % (t, k)) for t in TOPICS))
        assert len(load.acked) == 3 * len(TOPICS)
        views = [await get_json(session, f"{u}/messaging/diagnostics") for u in nodes.urls]
        last = max(d["applied_revision"] for v in views for d in v["held"].values())
        await compacted_past(session, nodes.urls, last)
        group = 0
        victims = [nodes.urls.index(u) for u in holders[group]]
        for i in victims:
            nodes.kill(i)
        alive = [i for i in range(NODES) if i not in victims]
        urls = [nodes.url(i) for i in alive]
        kept = [g for g in range(GROUPS) if set(holders[g]) - set(holders[group])]
        await asyncio.sleep(7)  # the victims' leases expire; their groups move
        for url in urls:  # the new holders cannot catch up: etcd compacted, no peer has it
            view = (await get_json(session, f"{url}/messaging/groups"))["groups"][group]
            assert url in view["holders"] and view["here"]["caught_up"] is False
        for _ in range(3):
            assert await status_of(session, urls[0], topic_in(group), b"refused") == 503
            for g in kept:
                assert await status_of(session, urls[0], topic_in(g), b"g%d" % g) == 200
        # The former holders return: they replay from their checkpoints; the others catch up.
        # (Both: placement hashes the nodes' URLs, so one alone may come back holding other
        # groups, and a second group both victims held would then wait for the other.)
        await nodes.start(*victims)
        back = [*alive, *victims]
        await settled(session, [nodes.url(i) for i in sorted(back)])
        await load.publish(session, urls[0], topic_in(group), b"after")
        assert b"after" in load.acked
        for url in [nodes.url(i) for i in back]:
            stored = {data for t in TOPICS for _, data in await read_topic(session, url, t)}
            assert set(load.acked) <= stored
            assert b"refused" not in stored


async def test_a_node_added_after_compaction_takes_groups_from_snapshots(
        broker_process: Any, tmp_path: Path) -> None:
    async with OwnEtcd(tmp_path) as etcd, aiohttp.ClientSession() as session:
        nodes = group_nodes(broker_process, tmp_path, etcd, "--etcd-compact-every", "1")
        await nodes.start(0, 1, 2)
        await settled(session, nodes.urls)
        load = TopicLoad(nodes.urls)
        for k in range(3):
            await asyncio.gather(*(load.publish(session, nodes.url(t % 3), t,
                                                b"t%d k%d" % (t, k)) for t in TOPICS))
        views = [await get_json(session, f"{u}/messaging/diagnostics") for u in nodes.urls]
        last = max(d["applied_revision"] for v in views for d in v["held"].values())
        await compacted_past(session, nodes.urls, last)
        await nodes.start(3)
        after = await settled(session, nodes.urls)
        taken = [g for g, urls in after.items() if nodes.url(3) in urls]
        assert taken, "the new node took no group"
        diagnostics = await get_json(session, f"{nodes.url(3)}/messaging/diagnostics")
        assert all(diagnostics["held"][str(g)]["snapshots_installed"] == 1 for g in taken)
        await check_everything(session, nodes.urls, load)
        for t in TOPICS:
            if group_of_topic(t, GROUPS) in taken:
                async with session.get(f"{nodes.url(0)}/messaging/topics/{t}") as resp:
                    assert resp.status == 200
        await wait_copies_only_on_holders(nodes, after, list(range(NODES)))
        await check_holders_identical(nodes, after)


async def test_a_groups_etcd_losing_quorum_stops_only_its_groups(
        etcd: EtcdCluster, broker_process: Any, tmp_path: Path) -> None:
    async with OwnEtcd(tmp_path) as other, aiohttp.ClientSession() as session:
        nodes = group_nodes(broker_process, tmp_path, etcd, "--group-etcd",
                            f"1={other.endpoints}")
        await nodes.start(*range(3))
        await settled(session, nodes.urls)
        assert await status_of(session, nodes.url(0), topic_in(1), b"before") == 200
        other.stop()
        for _ in range(3):
            for g in range(GROUPS):
                status = await status_of(session, nodes.url(g % 3), topic_in(g), b"x")
                assert status == (200 if g != 1 else 503), (g, status)
        other.ensure_running()
        await other.wait_healthy()

        async def back() -> bool:
            return await status_of(session, nodes.url(0), topic_in(1), b"back") == 200

        await wait_until(back, timeout=30, what="group 1 taking writes again")
        data = [d for _, d in await read_topic(session, nodes.url(2), topic_in(1))]
        assert data[0] == b"before" and data[-1] == b"back"


async def test_the_client_goes_straight_to_a_holder_and_follows_moves(
        etcd: EtcdCluster, broker_process: Any, tmp_path: Path) -> None:
    nodes, holders = await running(broker_process, tmp_path, etcd)
    async with Client([nodes.url(0)], retry_timeout=30) as client:
        for t in TOPICS:
            index = await client.publish(t, b"first %d" % t)
            response = await client.request("GET", f"/messaging/topics/{t}")
            assert response.url in holders[group_of_topic(t, GROUPS)]
            assert response.headers["X-Messaging-Node"] == response.url  # not forwarded
            conn = client.conn(t)
            await conn.open(index=index - 1)
            assert [m.data for m in await collect(conn, 1)] == [b"first %d" % t]
            await conn.close()
        victim = max(range(NODES), key=lambda i: sum(nodes.url(i) in h for h in holders.values()))
        nodes.kill(victim)
        for t in TOPICS:  # failover to the other holder, then the map moves on
            await client.publish(t, b"second %d" % t)

        async def map_moved() -> bool:
            for t in TOPICS:
                response = await client.request("GET", f"/messaging/topics/{t}")
                if response.headers["X-Messaging-Node"] != response.url:
                    return False
            return nodes.url(victim) not in {u for t in TOPICS
                                             for u in client.brokers.order(False, t)[:REPLICAS]}

        await wait_until(map_moved, timeout=40, what="the client's map to leave the dead node")


async def test_spark_reads_topics_of_every_group(etcd: EtcdCluster, broker_process: Any,
                                                 tmp_path: Path, spark: Any) -> None:
    from tests.e2e.test_spark import drain  # pyspark: only for this test

    nodes, _ = await running(broker_process, tmp_path, etcd)
    topics = TOPICS[:8]
    async with Client(nodes.urls) as client:
        for t in topics:
            await client.publish_batch(t, [b"t%d m%d" % (t, k) for k in range(5)])
    spec = ",".join(map(str, topics))
    rows, _ = await asyncio.to_thread(drain, spark, nodes.url(0), spec, tmp_path / "c1",
                                      startingIndex="earliest")
    assert sorted((t, d) for t, _, _, d in rows) == sorted(
        (t, b"t%d m%d" % (t, k)) for t in topics for k in range(5))
    # "latest" on a topic with nothing yet starts past its group's index: the next
    # message of that topic is read, nothing before it.
    fresh = 1000 + next(t for t in range(100) if group_of_topic(1000 + t, GROUPS) == 0)
    rows, _ = await asyncio.to_thread(drain, spark, nodes.url(1), str(fresh), tmp_path / "c2",
                                      startingIndex="latest")
    assert rows == []
    async with Client(nodes.urls) as client:
        await client.publish(fresh, b"the first of a fresh topic")
    rows, _ = await asyncio.to_thread(drain, spark, nodes.url(1), str(fresh), tmp_path / "c2",
                                      startingIndex="latest")
    assert [d for _, _, _, d in rows] == [b"the first of a fresh topic"]


async def test_redirecting_instead_of_forwarding(etcd: EtcdCluster, broker_process: Any,
                                                 tmp_path: Path) -> None:
    nodes, holders = await running(broker_process, tmp_path, etcd, "--group-requests",
                                   "redirect")
    async with aiohttp.ClientSession() as session:
        for t in TOPICS[:4]:
            held = holders[group_of_topic(t, GROUPS)]
            other = next(u for u in nodes.urls if u not in held)
            async with session.post(f"{other}/messaging/messages", params={"topicID": str(t)},
                                    data=b"x", allow_redirects=False) as resp:
                assert resp.status == 307
                assert resp.headers["Location"] == f"{held[0]}/messaging/messages?topicID={t}"
            async with session.post(f"{other}/messaging/messages", params={"topicID": str(t)},
                                    data=b"y") as resp:  # followed: the body is sent again
                assert resp.status == 200 and resp.headers["X-Messaging-Node"] in held
            assert [d for _, d in await read_topic(session, other, t)] == [b"y"]


async def test_a_node_watches_every_group_it_holds_on_one_stream(
        etcd: EtcdCluster, broker_process: Any, tmp_path: Path) -> None:
    """A node alone holds all four groups: their logs' watches share one watch stream at
    etcd (one stream, four watchers; each log had a stream of its own before), and each group
    still gets its own revisions: a message published to a topic of every group is read
    back."""
    before = await watch_gauges(etcd)
    nodes = group_nodes(broker_process, tmp_path, etcd)
    await nodes.start(0)
    async with aiohttp.ClientSession() as session:
        await wait_until(lambda: holds_every_group(session, nodes.url(0)), timeout=30,
                         what="the node holding every group")
        during = await watch_gauges(etcd)
        for group in range(GROUPS):
            async with session.post(f"{nodes.url(0)}/messaging/messages",
                                    params={"topicID": str(topic_in(group))},
                                    data=b"g%d" % group) as resp:
                assert resp.status == 200, await resp.text()
            assert [d for _, d in await read_topic(session, nodes.url(0),
                                                   topic_in(group))] == [b"g%d" % group]
    assert (during[0] - before[0], during[1] - before[1]) == (1, GROUPS)


async def test_a_node_reads_the_quorum_once_a_tick_for_all_its_groups(
        etcd: EtcdCluster, broker_process: Any, tmp_path: Path) -> None:
    """A node alone holds all four groups: their monitors' quorum reads (each twice a second)
    and their membership steps' node lists reach etcd as one read-only transaction a tick,
    not as a range read per group, and their registrations share one lease kept alive once a
    second."""
    nodes = group_nodes(broker_process, tmp_path, etcd)
    await nodes.start(0)
    async with aiohttp.ClientSession() as session:
        await wait_until(lambda: holds_every_group(session, nodes.url(0)), timeout=30,
                         what="the node holding every group")
        diagnostics = f"{nodes.url(0)}/messaging/diagnostics"
        before = await etcd_calls(etcd), (await get_json(session, diagnostics))["etcd"]
        await asyncio.sleep(3.0)
        after = await etcd_calls(etcd), (await get_json(session, diagnostics))["etcd"]
    [share_before], [share] = before[1], after[1]
    assert share["watch_stream"]["watches"] == GROUPS and share["watch_stream"]["opened"] == 1
    requests = share["quorum_reads"]["requests"] - share_before["quorum_reads"]["requests"]
    keys = share["quorum_reads"]["keys_read"] - share_before["quorum_reads"]["keys_read"]
    # in 3 s the four monitors read the quorum 24 times (every 0.5 s) and the four membership
    # steps their node lists 12 times (every second): gathered, a few requests a second
    assert 30 <= keys <= 42 and requests <= 12, (requests, keys)
    # one lease for every group's registration, kept alive about once a second
    keep_alives = share["lease"]["keep_alives"] - share_before["lease"]["keep_alives"]
    assert 2 <= keep_alives <= 4 and share["lease"]["grants"] == 1, share["lease"]
    # etcd answered them as transactions; the range reads left are the node's member list
    # and the like (the monitors alone made 24 range reads in 3 s, the memberships 12). etcd's
    # counters are read before the node's: a request the node sent in between is counted by
    # it alone.
    txns, ranges = after[0][0] - before[0][0], after[0][1] - before[0][1]
    assert txns >= requests - 1 and ranges < 12, (txns, requests, ranges)


async def etcd_calls(etcd: EtcdCluster) -> tuple[int, int]:
    """Txn and Range calls etcd's members answered so far (their gRPC counters)."""
    txns = ranges = 0
    async with aiohttp.ClientSession() as session:
        for member in etcd.members:
            async with session.get(f"{member.client_url}/metrics") as resp:
                text = await resp.text()
            for line in text.splitlines():
                if not line.startswith("grpc_server_handled_total{"):
                    continue
                labels, _, value = line.rpartition(" ")
                if 'grpc_service="etcdserverpb.KV"' not in labels:
                    continue
                if 'grpc_method="Txn"' in labels:
                    txns += int(float(value))
                elif 'grpc_method="Range"' in labels:
                    ranges += int(float(value))
    return txns, ranges


async def holds_every_group(session: aiohttp.ClientSession, url: str) -> bool:
    """Whether the node at ``url`` holds every group and has caught up in each."""
    view = await get_json(session, f"{url}/messaging/groups")
    return all(g["here"] is not None and g["here"]["caught_up"] for g in view["groups"])


async def watch_gauges(etcd: EtcdCluster) -> tuple[int, int]:
    """Watch streams and watchers open at every etcd member together (etcd's gauges)."""
    streams = watchers = 0
    async with aiohttp.ClientSession() as session:
        for member in etcd.members:
            async with session.get(f"{member.client_url}/metrics") as resp:
                text = await resp.text()
            for line in text.splitlines():
                name, _, value = line.partition(" ")
                if name == "etcd_debugging_mvcc_watch_stream_total":
                    streams += int(float(value))
                elif name == "etcd_debugging_mvcc_watcher_total":
                    watchers += int(float(value))
    return streams, watchers


async def test_a_node_checks_its_clock_once_for_all_its_groups(
        etcd: EtcdCluster, broker_process: Any, tmp_path: Path) -> None:
    """A node holding four groups reads each member's clock once a check interval, not once
    per group log: a member that only answers ``/healthz`` (registered in the cluster's
    member list, so every group has two holders: the node and it) is asked about once a
    second."""
    asked: list[float] = []

    async def healthz(_request: web.Request) -> web.Response:
        asked.append(time.monotonic())
        return web.json_response({"status": "ok", "version": "x", "time_ms": now_ms()})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    nodes = group_nodes(broker_process, tmp_path, etcd)
    async with app_server(app) as peer:
        client = EtcdClient(EtcdSettings(tuple(etcd.endpoints.split(",")), nodes.name))
        member = Membership(client, nodes.name, peer, lambda: 0, 1 << 62, kind="members")

        async def registered() -> None:
            for _ in range(120):  # bounded: the test ends well within it
                await member.register()
                await asyncio.sleep(1.0)

        keeping = asyncio.create_task(registered())
        try:
            await asyncio.sleep(0.5)
            await nodes.start(0)
            async with aiohttp.ClientSession() as session:
                async def holds_every_group() -> bool:
                    view = await get_json(session, f"{nodes.url(0)}/messaging/groups")
                    return (sorted(view["members"]) == sorted([nodes.url(0), peer])
                            and all(g["here"] is not None for g in view["groups"]))

                await wait_until(holds_every_group, timeout=30, what="the node holding all")
                before = len(asked)
                await asyncio.sleep(3.0)
                during = len(asked) - before
                assert 2 <= during <= 5, f"{during} clock readings in 3 s (one a second)"
                clock = (await get_json(session, f"{nodes.url(0)}/messaging/diagnostics"))
        finally:
            keeping.cancel()
            await asyncio.gather(keeping, return_exceptions=True)
            await member.leave()
            await client.close()
        assert peer in json.dumps(clock), clock
