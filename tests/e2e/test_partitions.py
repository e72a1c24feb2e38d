"""Partitions made from outside: broker nodes and etcd members in network namespaces
(tests/netns.py) whose links are taken down and brought back while publishes go on.

Each test starts its own etcd cluster (its members must listen on the links' addresses) and
its own broker nodes; nothing acknowledged may be lost, and no node may stall.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from aetcd import rpc

from tests.conftest import BrokerProcess, free_port, wait_until
from tests.e2e.test_etcd_log import (
    TOPIC,
    EtcdCluster,
    EtcdMember,
    Load,
    check_log,
    converge,
    diagnostics,
    segments,
)
from tests.e2e.test_groups import GROUPS, TOPICS, TopicLoad, check_everything, group_files
from tests.e2e.test_groups import settled as settled_groups
from tests.netns import Link, Namespace

#: How long a healed node may take to acknowledge a new publish (the issue's bound).
ACK_AFTER_HEAL = 3.0
#: How long after etcd's new leader is elected every node must acknowledge again.
WATCH_MEMBER_CUT = 5.0


@pytest.fixture
async def namespace() -> AsyncIterator[Namespace]:
    """A network namespace, removed at the end."""
    made = Namespace()
    try:
        yield made
    finally:
        made.close()


def etcd_members(tmp: Path, *, client_hosts: tuple[str, ...] = (),
                 isolated: tuple[Namespace, Link, Link] | None = None) -> EtcdCluster:
    """Three etcd members. They serve clients on 127.0.0.1 and ``client_hosts``. With
    ``isolated`` = (namespace, client link, peer link), member m0 runs in that namespace,
    serving clients on the client link and talking to its peers over the peer link (the
    others listen for peers on the peer link's host address)."""
    ports = [(free_port(), free_port()) for _ in range(3)]
    peer_hosts = ["127.0.0.1"] * 3
    if isolated is not None:
        _ns, _client, peer = isolated
        peer_hosts = [peer.ns_ip, peer.host_ip, peer.host_ip]
    initial = ",".join(f"m{i}=http://{peer_hosts[i]}:{p}" for i, (_c, p) in enumerate(ports))
    members = []
    for i, (client_port, peer_port) in enumerate(ports):
        hosts: tuple[str, ...] = ("127.0.0.1", *client_hosts)
        prefix: tuple[str, ...] = ()
        if isolated is not None and i == 0:
            ns, client, _peer = isolated
            hosts, prefix = (client.ns_ip, "127.0.0.1"), tuple(ns.prefix)
        members.append(EtcdMember(f"m{i}", tmp / f"m{i}", initial, client_port, peer_port,
                                  client_hosts=hosts, peer_host=peer_hosts[i], prefix=prefix))
    cluster = EtcdCluster(tmp, size=0)
    cluster.members = members
    return cluster


def start_node(make: Any, tmp: Path, i: int, cluster: str, endpoints: list[str], host: str,
               *extra: str, prefix: list[str] | None = None) -> BrokerProcess:
    """Broker node ``i`` bound to ``host`` (advertised there), run under ``prefix``."""
    port = free_port()
    launcher = [*(prefix or []), sys.executable, "-m", "messaging.cli"]
    # The links' addresses reach only this test's namespace: no tokens needed there.
    proc: BrokerProcess = make(
        tmp / f"node{i}", "--etcd", ",".join(endpoints), "--cluster", cluster,
        "--advertise", f"http://{host}:{port}", "--etcd-compact-every", "20", "--insecure",
        *extra, port=port, host=host, launcher=launcher)
    proc.start()
    return proc


async def identical(datas: list[Path]) -> None:
    files = [await asyncio.to_thread(segments, data) for data in datas]
    assert files[0], "no segment files"
    assert all(other == files[0] for other in files[1:]), "segment files differ between nodes"


async def acknowledged_within(session: aiohttp.ClientSession, url: str, limit: float,
                              data: bytes) -> float:
    """Publish ``data`` to ``url`` until a 200 (each try bounded); the seconds it took."""
    started = time.monotonic()
    for _ in range(200):
        try:
            async with session.post(f"{url}/messaging/messages", params={"topicID": str(TOPIC)},
                                    data=data, timeout=aiohttp.ClientTimeout(total=limit)) as r:
                await r.read()
                if r.status == 200:
                    return time.monotonic() - started
        except (aiohttp.ClientError, TimeoutError):
            pass
        if time.monotonic() - started > limit:
            break
        await asyncio.sleep(0.05)
    raise AssertionError(f"{url} acknowledged nothing within {limit}s")


async def test_a_node_cut_from_etcd_longer_than_its_lease(
        broker_process: Any, tmp_path: Path, namespace: Namespace) -> None:
    """Node 2 lives in a network namespace: the test reaches it over one link, and it reaches
    etcd and its peers over another. That second link goes down for longer than its lease;
    the others compact etcd past it. When the link comes back, every publish it had taken is
    answered within a few seconds (none waits out the 30 s apply timeout), it catches up (its
    watch resumes, or it installs a peer's snapshot if etcd cancelled the watch) and
    acknowledges new publishes within 3 s, and every node holds every acknowledged message
    once, byte for byte alike."""
    client_link, etcd_link = namespace.link(), namespace.link()
    etcd = etcd_members(tmp_path, client_hosts=(etcd_link.host_ip,))
    etcd.ensure_running()
    name = f"p{uuid.uuid4().hex[:8]}"
    try:
        await etcd.wait_healthy()
        local = [m.client_urls[0] for m in etcd.members]
        reachable = [m.client_urls[1] for m in etcd.members]
        nodes = [start_node(broker_process, tmp_path, 0, name, local, etcd_link.host_ip),
                 start_node(broker_process, tmp_path, 1, name, local[1:] + local[:1],
                            etcd_link.host_ip),
                 start_node(broker_process, tmp_path, 2, name, reachable, client_link.ns_ip,
                            prefix=namespace.prefix)]
        urls = [n.url for n in nodes]
        async with aiohttp.ClientSession() as session:
            async def registered(present: bool) -> bool:
                return (urls[2] in (await diagnostics(session, urls[0]))["nodes"]) == present

            await wait_until(lambda: registered(True), 20, "node 2 to register")
            load = Load(urls)
            load.start(session, workers=6)
            await load.until_acked(300, 30, "load before the cut")
            etcd_link.cut()
            load.down.add(urls[2])  # what node 2 took before the cut is all it will have
            await wait_until(lambda: registered(False), 20, "node 2's lease to expire")
            applied = (await diagnostics(session, urls[2]))["applied_revision"]

            async def compacted_past() -> bool:  # the first live node by URL compacts
                done = [(await diagnostics(session, url))["compacted_revision"]
                        for url in urls[:2]]
                return bool(max(done) > applied + 1)

            await wait_until(compacted_past, 30, "etcd compacted past node 2")
            await load.until_acked(100, 30, "load through the other nodes")
            etcd_link.heal()
            healed = time.monotonic()

            async def answered() -> bool:
                d = await diagnostics(session, urls[2])
                return bool(d["waiting"] == 0)

            await wait_until(answered, 8, "every publish node 2 took to be answered")
            took = await acknowledged_within(session, urls[2], ACK_AFTER_HEAL + 5, b"healed")
            since_heal = time.monotonic() - healed
            assert since_heal <= ACK_AFTER_HEAL + 1, (
                f"node 2 acknowledged its first publish {since_heal:.1f}s after the heal")
            assert took <= ACK_AFTER_HEAL, took
            load.down.discard(urls[2])
            await load.until_acked(100, 30, "load after the heal")
            await load.finish()
            stored = await converge(session, urls, len(load.acked) + 1)
            check_log([item for item in stored if item[1] != b"healed"], load)
            await identical([tmp_path / f"node{i}" for i in range(3)])
    finally:
        etcd.stop()


async def test_a_node_of_a_cluster_of_groups_cut_from_etcd_acknowledges_nothing(
        broker_process: Any, tmp_path: Path, namespace: Namespace) -> None:
    """Four groups, two holders each, three nodes; node 2 loses etcd and its peers. While cut
    it acknowledges nothing (it can neither commit nor forward); its groups move to the
    others, which go on; healed, it takes its groups back, and every node serves every
    acknowledged message once, every group's holders byte-identical."""
    client_link, etcd_link = namespace.link(), namespace.link()
    etcd = etcd_members(tmp_path, client_hosts=(etcd_link.host_ip,))
    etcd.ensure_running()
    name = f"p{uuid.uuid4().hex[:8]}"
    groups = ("--groups", str(GROUPS), "--replicas", "2")
    try:
        await etcd.wait_healthy()
        local = [m.client_urls[0] for m in etcd.members]
        reachable = [m.client_urls[1] for m in etcd.members]
        nodes = [start_node(broker_process, tmp_path, 0, name, local, etcd_link.host_ip,
                            *groups),
                 start_node(broker_process, tmp_path, 1, name, local[1:] + local[:1],
                            etcd_link.host_ip, *groups),
                 start_node(broker_process, tmp_path, 2, name, reachable, client_link.ns_ip,
                            *groups, prefix=namespace.prefix)]
        urls = [n.url for n in nodes]
        async with aiohttp.ClientSession() as session:
            await settled_groups(session, urls)
            load = TopicLoad(urls)
            load.start(session, workers=6)
            await wait_until(lambda: _at_least(load, 200), 30, "load before the cut")
            etcd_link.cut()
            load.down.add(urls[2])
            cut_at = time.monotonic()
            acked_while_cut = []
            for k in range(80):  # about 8 s: past node 2's lease
                data = b"cut %d" % k
                await load.publish(session, urls[2], TOPICS[k % len(TOPICS)], data)
                if data in load.acked and time.monotonic() - cut_at > 1.0:
                    acked_while_cut.append(data)
                await asyncio.sleep(0.1)
            assert not acked_while_cut, f"node 2 acknowledged {acked_while_cut} while cut"
            target = len(load.acked) + 100
            await wait_until(lambda: _at_least(load, target), 30, "load through the others")
            etcd_link.heal()
            load.down.discard(urls[2])
            target = len(load.acked) + 100
            await wait_until(lambda: _at_least(load, target), 30, "load after the heal")
            await load.finish()
            holders = await settled_groups(session, urls, timeout=90)
            await check_everything(session, urls, load)
            for group, held in holders.items():
                files = [await asyncio.to_thread(group_files, tmp_path / f"node{urls.index(u)}",
                                                 group) for u in held]
                assert all(f == files[0] for f in files[1:]), f"group {group}: holders differ"
    finally:
        etcd.stop()


async def _at_least(load: TopicLoad, count: int) -> bool:
    return len(load.acked) >= count


async def _member_status(url: str) -> Any:
    async with grpc.aio.insecure_channel(url.removeprefix("http://")) as channel:
        return await rpc.MaintenanceStub(channel).Status(rpc.StatusRequest(), timeout=2)


async def _make_leader(etcd: EtcdCluster, member: EtcdMember) -> None:
    """Move etcd's leadership to ``member`` (a no-op if it leads already)."""
    target = (await _member_status(member.client_url)).header.member_id
    leader = await etcd.leader()
    if leader is member:
        return
    async with grpc.aio.insecure_channel(leader.client_url.removeprefix("http://")) as channel:
        await rpc.MaintenanceStub(channel).MoveLeader(rpc.MoveLeaderRequest(targetID=target),
                                                      timeout=10)

    async def leads() -> bool:
        return await etcd.leader() is member

    await wait_until(leads, 10, f"{member.name} to lead")


async def test_the_watched_etcd_member_cut_from_its_peers(
        broker_process: Any, tmp_path: Path, namespace: Namespace) -> None:
    """etcd member m0, the leader and the first endpoint of every node (so every node puts
    and watches through it), runs in a network namespace; the link to its peers goes down
    while publishes go on. The other two elect a leader; from then on every node must
    acknowledge publishes within 5 s (its watch and its puts move on), nothing acknowledged
    is lost, and after the heal every node holds the same messages."""
    client_link, peer_link = namespace.link(), namespace.link()
    etcd = etcd_members(tmp_path, isolated=(namespace, client_link, peer_link))
    etcd.ensure_running()
    name = f"p{uuid.uuid4().hex[:8]}"
    try:
        await etcd.wait_healthy()
        await _make_leader(etcd, etcd.members[0])
        endpoints = [m.client_url for m in etcd.members]  # m0 first for everyone
        nodes = [start_node(broker_process, tmp_path, i, name, endpoints, "127.0.0.1")
                 for i in range(3)]
        urls = [n.url for n in nodes]
        async with aiohttp.ClientSession() as session:
            load = Load(urls)
            load.start(session, workers=6)
            await load.until_acked(300, 30, "load before the cut")
            peer_link.cut()
            cut = time.monotonic()

            async def new_leader() -> bool:
                for member in etcd.members[1:]:
                    try:
                        status = await _member_status(member.client_url)
                    except grpc.aio.AioRpcError:
                        continue
                    if status.leader and status.leader != (
                            await _member_status(etcd.members[0].client_url)).header.member_id:
                        return True
                return False

            await wait_until(new_leader, 15, "m1 and m2 to elect a leader")
            elected = time.monotonic()
            acks = await asyncio.gather(*(acknowledged_within(
                session, url, WATCH_MEMBER_CUT + 5, b"after the cut %d" % i)
                for i, url in enumerate(urls)))
            assert max(acks) <= WATCH_MEMBER_CUT, (
                f"after the election ({elected - cut:.1f}s after the cut) the nodes took "
                f"{', '.join(f'{a:.1f}' for a in acks)}s to acknowledge a publish")
            await load.until_acked(200, 30, "load while m0 is cut off")
            peer_link.heal()
            await etcd.wait_healthy()
            await load.until_acked(100, 30, "load after the heal")
            await load.finish()
            stored = await converge(session, urls, len(load.acked) + 3)
            check_log([item for item in stored if not item[1].startswith(b"after the cut")],
                      load)
            await identical([tmp_path / f"node{i}" for i in range(3)])
    finally:
        etcd.stop()
