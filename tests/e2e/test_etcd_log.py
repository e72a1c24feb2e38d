"""EtcdLog end to end: three real etcd members and real broker processes on 127.0.0.1.

One etcd cluster serves the whole module; every test uses a cluster name of its own and
leaves etcd whole (members it stopped are restarted). Load comes from concurrent plain-HTTP
publishers that record every answer: acknowledged (index known), refused (503 or no
connection: never sent, so it must never appear) and unknown (504 or a broken response).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from aetcd import rpc

from messaging.cli.client import RELEARN_INTERVAL
from messaging.client.client import Client
from messaging.frames import FRAMES_CONTENT_TYPE, decode, encode_batch
from messaging.log.etcd.client import prefix_end
from messaging.log.etcd.entry import encode_entry
from messaging.placement import group_of_name, group_of_topic
from tests.conftest import BrokerProcess, cli, free_port, wait_until
from tests.faultpoint import read_trace

TOPIC = 7


# -- etcd ------------------------------------------------------------------------------------


class EtcdMember:
    """One etcd process with its own data directory; stopped by PID.

    It serves clients on 127.0.0.1 and on ``client_hosts`` (the first one is advertised),
    talks to its peers on ``peer_host``, and runs under ``prefix`` (a network namespace's)."""

    def __init__(self, name: str, data: Path, cluster: str, client_port: int,
                 peer_port: int, *, client_hosts: tuple[str, ...] = ("127.0.0.1",),
                 peer_host: str = "127.0.0.1", prefix: tuple[str, ...] = ()) -> None:
        self.name = name
        self.data = data
        self.cluster = cluster
        self.client_urls = [f"http://{host}:{client_port}" for host in client_hosts]
        self.client_url = self.client_urls[0]
        self.peer_url = f"http://{peer_host}:{peer_port}"
        self.prefix = list(prefix)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        etcd = shutil.which("etcd")
        assert etcd is not None
        with (self.data.parent / f"{self.name}.log").open("ab") as out:
            self.proc = subprocess.Popen(
                [*self.prefix, etcd, "--name", self.name, "--data-dir", str(self.data),
                 "--listen-client-urls", ",".join(self.client_urls),
                 "--advertise-client-urls", self.client_url,
                 "--listen-peer-urls", self.peer_url,
                 "--initial-advertise-peer-urls", self.peer_url,
                 "--initial-cluster", self.cluster, "--initial-cluster-state", "new",
                 "--initial-cluster-token", "messaging-tests", "--snapshot-count", "2000",
                 "--logger", "zap", "--log-level", "warn"],
                stdout=out, stderr=out)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: int = signal.SIGKILL) -> None:
        if self.running():
            assert self.proc is not None
            os.kill(self.proc.pid, sig)
            self.proc.wait(15)


class EtcdCluster:
    def __init__(self, tmp: Path, size: int = 3) -> None:
        ports = [(free_port(), free_port()) for _ in range(size)]
        initial = ",".join(f"m{i}=http://127.0.0.1:{p}" for i, (_c, p) in enumerate(ports))
        self.members = [EtcdMember(f"m{i}", tmp / f"m{i}", initial, c, p)
                        for i, (c, p) in enumerate(ports)]

    @property
    def endpoints(self) -> str:
        return ",".join(m.client_url for m in self.members)

    def ensure_running(self) -> None:
        for member in self.members:
            if not member.running():
                member.start()

    async def wait_healthy(self, timeout: float = 30.0) -> None:
        async def healthy() -> bool:
            for member in self.members:
                try:
                    await _range(member.client_url, b"/health-check")
                except grpc.aio.AioRpcError:
                    return False
            return True

        await wait_until(healthy, timeout=timeout, what="every etcd member serving reads")

    async def leader(self) -> EtcdMember:
        for member in self.members:
            if not member.running():
                continue
            try:
                status = await _status(member.client_url)
            except grpc.aio.AioRpcError:
                continue
            if status.leader and status.leader == status.header.member_id:
                return member
        raise AssertionError("no etcd leader")

    def stop(self) -> None:
        for member in self.members:
            member.stop()


async def _range(url: str, key: bytes) -> Any:
    async with grpc.aio.insecure_channel(url.removeprefix("http://")) as channel:
        return await rpc.KVStub(channel).Range(rpc.RangeRequest(key=key), timeout=2,
                                               metadata=(("hasleader", "true"),))


async def _status(url: str) -> Any:
    async with grpc.aio.insecure_channel(url.removeprefix("http://")) as channel:
        return await rpc.MaintenanceStub(channel).Status(rpc.StatusRequest(), timeout=2)


@pytest.fixture(scope="module")
def etcd_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """Three etcd members for the module (``--snapshot-count 2000``)."""
    if shutil.which("etcd") is None:
        pytest.fail("etcd is required for the cluster tests: apt-get install etcd-server "
                    "(3.4.22+) or put etcd 3.5.6+ on PATH")
    version = subprocess.run(["etcd", "--version"], capture_output=True, text=True,
                             timeout=30).stdout
    found = re.search(r"etcd Version: (\d+)\.(\d+)\.(\d+)", version)
    assert found, f"cannot tell etcd's version from {version!r}"
    major, minor, patch = map(int, found.groups())
    if (major, minor) < (3, 4) or (3, 4, 0) <= (major, minor, patch) < (3, 4, 22) \
            or (3, 5, 0) <= (major, minor, patch) < (3, 5, 6):
        pytest.fail(f"etcd {major}.{minor}.{patch} is not safe to test against: use 3.4.22+ "
                    "or 3.5.6+ (3.5.0-3.5.5 have known data-inconsistency bugs)")
    yield from serving(EtcdCluster(tmp_path_factory.mktemp("etcd")))


def serving(cluster: EtcdCluster) -> Iterator[EtcdCluster]:
    """Start ``cluster``, yield it once it serves, stop it afterwards (for a fixture)."""
    cluster.ensure_running()
    try:
        asyncio.run(cluster.wait_healthy())
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
async def etcd(etcd_cluster: EtcdCluster) -> EtcdCluster:
    """The module's etcd cluster, with every member running and serving."""
    etcd_cluster.ensure_running()
    await etcd_cluster.wait_healthy()
    return etcd_cluster


# -- broker nodes ----------------------------------------------------------------------------


#: The topic groups of the clusters the running test starts (set by the ``groups`` fixture):
#: the tests marked ``with_groups`` run once with one group and once with four.
@dataclass
class _Groups:
    count: int = 1
    clusters: list[str] = field(default_factory=list)


_GROUPS = _Groups()


@pytest.fixture(autouse=True)
async def groups(request: pytest.FixtureRequest, etcd_cluster: EtcdCluster) -> AsyncIterator[int]:
    """How many groups the test's clusters have (``indirect`` parametrization; 1 without).

    Afterwards the keys of every cluster of groups the test made are deleted: etcd is never
    compacted past the log of a group that no node applies, and later tests compact."""
    count = int(getattr(request, "param", 1))
    _GROUPS.count, _GROUPS.clusters = count, []
    yield count
    for name in _GROUPS.clusters:
        await _delete_prefix(etcd_cluster, f"/messaging/{name}".encode())
    _GROUPS.count, _GROUPS.clusters = 1, []


#: Run a test once with one group and once with four (every node holds all four).
with_groups = pytest.mark.parametrize("groups", [1, 4], indirect=True, ids=["g1", "g4"])


async def _delete_prefix(etcd: EtcdCluster, prefix: bytes) -> None:
    for member in etcd.members:
        if not member.running():
            continue
        async with grpc.aio.insecure_channel(member.client_url.removeprefix("http://")) as ch:
            await rpc.KVStub(ch).DeleteRange(rpc.DeleteRangeRequest(
                key=prefix, range_end=prefix_end(prefix)), timeout=5)
        return


class Nodes:
    """Broker processes of one etcd-backed cluster, each with a fixed port and data dir."""

    def __init__(self, make: Any, tmp: Path, etcd: EtcdCluster, *extra: str) -> None:
        self.make = make
        self.tmp = tmp
        self.etcd = etcd
        self.name = f"t{uuid.uuid4().hex[:10]}"
        self.groups = _GROUPS.count
        self.extra = list(extra)
        if self.groups > 1:
            self.extra[:0] = ["--groups", str(self.groups)]
            _GROUPS.clusters.append(self.name)
        self.ports: list[int] = []
        self.procs: dict[int, BrokerProcess] = {}

    def data(self, i: int) -> Path:
        return self.tmp / f"node{i}"

    def url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.ports[i]}"

    @property
    def urls(self) -> list[str]:
        return [self.url(i) for i in range(len(self.ports))]

    def _start(self, i: int, **options: Any) -> BrokerProcess:
        # Each node talks to a different etcd member first, so that any member's death
        # breaks some node's connection and watch.
        members = self.etcd.members[i % 3:] + self.etcd.members[:i % 3]
        endpoints = ",".join(m.client_url for m in members)
        proc: BrokerProcess = self.make(
            self.data(i), "--etcd", endpoints, "--cluster", self.name,
            "--advertise", self.url(i), *self.extra, port=self.ports[i], **options)
        self.procs[i] = proc
        proc.start()
        return proc

    async def start(self, *indexes: int, **options: Any) -> None:
        """Start nodes (``options``: a launcher and environment, see BrokerProcess)."""
        while len(self.ports) <= max(indexes):
            self.ports.append(free_port())
        await asyncio.gather(*(asyncio.to_thread(self._start, i, **options) for i in indexes))

    def kill(self, i: int) -> None:
        self.procs[i].kill()

    async def wait_ready(self, *indexes: int, within: float = 60.0) -> None:
        """Wait until each node answers ``/readyz`` with 200 (caught up, taking writes): a
        node that listens may still be replaying, and answers 503 until it is done."""
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            for i in indexes:
                async def ready(url: str = self.url(i)) -> bool:
                    try:
                        async with session.get(f"{url}/readyz") as resp:
                            return resp.status == 200
                    except (aiohttp.ClientError, TimeoutError):
                        return False

                await wait_until(ready, timeout=within, what=f"node {i} ready")


async def diagnostics(session: aiohttp.ClientSession, url: str,
                      stream: str | None = None) -> dict[str, Any]:
    """A node's diagnostics; on a node of a cluster of groups, those of the group of TOPIC
    (or of the named ``stream``)."""
    async with session.get(f"{url}/messaging/diagnostics") as resp:
        result: dict[str, Any] = await resp.json()
    held = result.get("held")
    if held is not None:
        count = len(result["groups"])
        group = (group_of_name(stream, count) if stream is not None
                 else group_of_topic(TOPIC, count))
        result.update(held[str(group)])
    return result


# -- load ------------------------------------------------------------------------------------


@dataclass
class Load:
    """Concurrent publishers spread over the nodes; every answer is recorded."""

    urls: list[str]
    acked: dict[bytes, int] = field(default_factory=dict)
    refused: set[bytes] = field(default_factory=set)
    unknown: set[bytes] = field(default_factory=set)
    statuses: dict[int, int] = field(default_factory=dict)
    #: Nodes not to publish to: hammering a dead node's port from 127.0.0.1 ends in a TCP
    #: self-connect that then holds the port its restart needs.
    down: set[str] = field(default_factory=set)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self, session: aiohttp.ClientSession, workers: int = 6) -> None:
        for w in range(workers):
            self.tasks.append(asyncio.ensure_future(self._worker(session, w)))

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.wait_for(asyncio.gather(*self.tasks), 30)

    async def _worker(self, session: aiohttp.ClientSession, w: int) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            url = self.urls[(w + n) % len(self.urls)]
            if url in self.down:
                await asyncio.sleep(0.01)
                continue
            if n % 3:
                datas = [f"w{w} n{n}".encode()]
                await self._publish(session, url, datas, single=True)
            else:
                datas = [f"w{w} n{n} k{k}".encode() for k in range(20)]
                await self._publish(session, url, datas, single=False)

    async def _publish(self, session: aiohttp.ClientSession, url: str, datas: list[bytes],
                       single: bool) -> None:
        if single:
            body, headers = datas[0], {}
        else:
            body, headers = encode_batch(TOPIC, datas), {"Content-Type": FRAMES_CONTENT_TYPE}
        sent = False
        try:
            async with session.post(f"{url}/messaging/messages", params={"topicID": str(TOPIC)},
                                    data=body, headers=headers,
                                    timeout=aiohttp.ClientTimeout(total=40)) as resp:
                sent = True
                self.statuses[resp.status] = self.statuses.get(resp.status, 0) + 1
                if resp.status == 200:
                    first = int(resp.headers["X-Broker-Index"]) - len(datas) + 1
                    for i, data in enumerate(datas):
                        self.acked[data] = first + i
                    return
                await resp.read()
                (self.refused if resp.status == 503 else self.unknown).update(datas)
        except aiohttp.ClientConnectorError:
            self.refused.update(datas)  # never connected: never sent
            await asyncio.sleep(0.5)
        except (aiohttp.ClientError, TimeoutError):
            self.unknown.update(datas)
        if not sent or resp.status != 200:
            await asyncio.sleep(0.05)

    async def until_acked(self, more: int, timeout: float, what: str) -> None:
        target = len(self.acked) + more
        await wait_until(lambda: _true(len(self.acked) >= target), timeout=timeout, what=what)


async def _true(value: bool) -> bool:
    return value


# -- checks ----------------------------------------------------------------------------------


#: Asks a node of a cluster of groups to answer from its own data, never from a peer's (it
#: answers 503 while it has not caught up); a node with one group always does.
LOCAL_ONLY = {"X-Messaging-Forwarded": "a test"}


async def contents(session: aiohttp.ClientSession, url: str) -> list[tuple[int, bytes]]:
    async with session.get(f"{url}/messaging/messages", params={"topicID": str(TOPIC)},
                           headers=LOCAL_ONLY) as resp:
        if resp.status == 404:
            return []
        if resp.status == 503:
            raise aiohttp.ClientResponseError(resp.request_info, (), status=503,
                                              message="not caught up")
        assert resp.status == 200, await resp.text()
        body = await resp.read()
    messages, used = decode(body, after=0)
    assert used == len(body)
    return [(m.index, m.data) for m in messages]


async def converge(session: aiohttp.ClientSession, urls: list[str], at_least: int,
                   timeout: float = 30.0) -> list[tuple[int, bytes]]:
    """Wait until every node holds the same messages (at least ``at_least`` of them)."""
    seen: list[list[tuple[int, bytes]]] = []

    async def same() -> bool:
        try:
            seen[:] = [await contents(session, u) for u in urls]
        except aiohttp.ClientError:
            return False
        return len(seen[0]) >= at_least and all(c == seen[0] for c in seen)

    await wait_until(same, timeout=timeout,
                     what=f"{len(urls)} nodes holding the same >= {at_least} messages")
    return seen[0]


def check_log(stored: list[tuple[int, bytes]], load: Load) -> None:
    """Every acknowledged message once at its index; nothing refused; nothing invented."""
    by_data: dict[bytes, int] = {}
    for index, data in stored:
        assert data not in by_data, f"{data!r} stored twice (indexes {by_data[data]}, {index})"
        by_data[data] = index
    for data, index in load.acked.items():
        assert by_data.get(data) == index, f"acknowledged {data!r} at {index}, " \
                                           f"stored at {by_data.get(data)}"
    stored_refused = load.refused & by_data.keys()
    assert not stored_refused, f"{len(stored_refused)} refused messages were stored"
    assert by_data.keys() <= load.acked.keys() | load.unknown


def topic_folder(data: Path, topic: int = TOPIC) -> Path:
    """Where a node keeps a topic (in its group's directory in a cluster of groups)."""
    if _GROUPS.count > 1:
        group = group_of_topic(topic, _GROUPS.count)
        return data / "groups" / str(group) / "topics" / str(topic)
    return data / "topics" / str(topic)


def segments(data: Path) -> dict[str, bytes]:
    """The topic's segment files and their time indexes, by name."""
    folder = topic_folder(data)
    return {f.name: f.read_bytes() for f in sorted(folder.iterdir())
            if f.suffix in (".seg", ".time")}


async def check_identical(nodes: Nodes, which: list[int] | None = None) -> None:
    indexes = which if which is not None else list(range(len(nodes.procs)))
    files = [await asyncio.to_thread(segments, nodes.data(i)) for i in indexes]
    assert files[0], "no segment files"
    for other in files[1:]:
        assert other == files[0], "segment or time files differ between nodes"


FAULTPOINT = [sys.executable, str(Path(__file__).resolve().parents[1] / "faultpoint.py")]


async def start_with_node2_faulted(nodes: Nodes, tmp_path: Path, **fault: str) -> Path:
    """Nodes 0 and 1, and node 2 under tests/faultpoint.py with ``FAULT_<NAME>=value`` for
    each of ``fault``; returns the file that arms it (it does not exist yet)."""
    work = tmp_path / "faults"
    work.mkdir()
    arm = work / "arm"
    await nodes.start(0, 1)
    await nodes.start(2, launcher=FAULTPOINT, env={
        "FAULT_ROOT": str(nodes.data(2)), "FAULT_ARM": str(arm), "FAULT_SKIP": "cluster.json",
        **{f"FAULT_{name.upper()}": value for name, value in fault.items()}})
    return arm


async def settled(session: aiohttp.ClientSession, nodes: Nodes, load: Load,
                  which: list[int] | None = None) -> list[tuple[int, bytes]]:
    indexes = which if which is not None else list(range(len(nodes.procs)))
    urls = [nodes.url(i) for i in indexes]
    stored = await converge(session, urls, len(load.acked))
    check_log(stored, load)
    await check_identical(nodes, indexes)
    return stored


# -- tests -----------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [["--etcd", "http://127.0.0.1:1"],
                                  ["--cluster", "c"],
                                  ["--etcd", "nope", "--cluster", "c"],
                                  ["--etcd", "http://127.0.0.1:1", "--cluster", "a/b"]])
def test_cluster_flag_errors(args: list[str]) -> None:
    result = cli("broker", "--bind", "127.0.0.1:0", *args, timeout=30)
    assert result.returncode != 0
    assert "error" in result.stderr and "Traceback" not in result.stderr


def test_refuses_topics_without_checkpoint(etcd_cluster: EtcdCluster, tmp_path: Path) -> None:
    (tmp_path / "data" / "topics" / "1").mkdir(parents=True)
    result = cli("broker", "--data", str(tmp_path / "data"), "--bind", "127.0.0.1:0",
                 "--etcd", etcd_cluster.endpoints, "--cluster", "refuse", timeout=30)
    assert result.returncode == 1
    assert "no cluster.json" in result.stderr and "Traceback" not in result.stderr


@with_groups
async def test_three_nodes_concurrent_publishes(etcd: EtcdCluster, broker_process,
                                                tmp_path: Path) -> None:
    nodes = Nodes(broker_process, tmp_path, etcd)
    await nodes.start(0, 1, 2)
    async with aiohttp.ClientSession() as session:
        load = Load(nodes.urls)
        load.start(session)
        await load.until_acked(1500, 30, "1500 acknowledged messages")
        await load.finish()
        assert load.statuses.get(200, 0) == sum(load.statuses.values()), load.statuses
        await settled(session, nodes, load)
        d = await diagnostics(session, nodes.url(0))
        assert d["mode"] == "etcd" and d["watch"]["live"] and d["quorum"]
        assert d["groups"] >= 1 and d["lag"] >= 0

        async def everyone_listed() -> bool:
            async with session.get(f"{nodes.url(1)}/messaging/ping") as resp:
                return sorted((await resp.json())["urls"]) == sorted(nodes.urls)

        await wait_until(everyone_listed, timeout=10, what="every node in /messaging/ping")
        # A publish larger than one etcd request is refused clearly.
        big = encode_batch(TOPIC, [b"x" * 1_000_000, b"y" * 500_000])
        async with session.post(f"{nodes.url(0)}/messaging/messages",
                                params={"topicID": str(TOPIC)}, data=io.BytesIO(big),
                                headers={"Content-Type": FRAMES_CONTENT_TYPE}) as resp:
            assert resp.status == 413
            assert "in cluster mode a publish is limited to" in resp.headers["X-Broker-Error"]


@with_groups
async def test_coalesced_puts_keep_each_connections_order(etcd: EtcdCluster, broker_process,
                                                          tmp_path: Path) -> None:
    """Many connections publish at once, each one message after the other on its own
    connection, so that puts coalesce several connections' publishes and several puts are
    on their way together: every connection's messages are stored in the order it sent
    them, at the indexes it was told, on every node."""
    nodes = Nodes(broker_process, tmp_path, etcd)
    await nodes.start(0, 1, 2)
    told: dict[bytes, int] = {}

    async def connection(w: int) -> list[int]:
        indexes = []
        connector = aiohttp.TCPConnector(limit=1)
        async with aiohttp.ClientSession(connector=connector) as session:
            for n in range(40):
                data = b"c%d m%d" % (w, n)
                async with session.post(f"{nodes.url(w % 3)}/messaging/messages",
                                        params={"topicID": str(TOPIC)}, data=data) as resp:
                    assert resp.status == 200, await resp.text()
                    indexes.append(int(resp.headers["X-Broker-Index"]))
                told[data] = indexes[-1]
        return indexes

    for indexes in await asyncio.gather(*(connection(w) for w in range(12))):
        assert indexes == sorted(indexes) and len(set(indexes)) == len(indexes)
    async with aiohttp.ClientSession() as session:
        stored = await converge(session, nodes.urls, len(told))
        for url in nodes.urls:  # each node timed the 4 × 40 publishes it answered
            budget = (await diagnostics(session, url))["publish_budget"]
            assert budget["publishes"] == 160, budget
            assert budget["total"]["p50_ms"] >= budget["put"]["p50_ms"] > 0, budget
    assert {data: index for index, data in stored} == told
    for w in range(12):
        mine = [data for _index, data in stored if data.startswith(b"c%d " % w)]
        assert mine == [b"c%d m%d" % (w, n) for n in range(40)]


async def test_a_publish_too_large_for_its_topic_fails_alone_in_a_coalesced_put(
        etcd: EtcdCluster, broker_process, tmp_path: Path) -> None:
    """Publishes that go to etcd in one put and apply together: the one over its topic's
    max-message-size is answered 413, and every other one is stored (none shares its
    error)."""
    nodes = Nodes(broker_process, tmp_path, etcd)
    await nodes.start(0, 1)
    url = nodes.url(0)
    async with aiohttp.ClientSession() as session:
        async with session.put(f"{url}/messaging/topics/{TOPIC}",
                               json={"max-message-size": 100}) as resp:
            assert resp.status == 201, await resp.text()

        async def connection(w: int) -> list[tuple[bytes, int]]:
            answers = []
            for n in range(20):
                data = b"c%d m%d " % (w, n) * (30 if n % 5 == 2 else 1)
                async with session.post(f"{url}/messaging/messages",
                                        params={"topicID": str(TOPIC)}, data=data) as resp:
                    answers.append((data, resp.status))
                    if resp.status == 413:
                        assert "max-message-size of 100" in resp.headers["X-Broker-Error"]
            return answers

        answers = [a for one in await asyncio.gather(*(connection(w) for w in range(10)))
                   for a in one]
        assert {status for data, status in answers if len(data) > 100} == {413}
        assert {status for data, status in answers if len(data) <= 100} == {200}
        stored = await converge(session, nodes.urls[:2], 160)
    assert sorted(data for _index, data in stored) == sorted(
        data for data, status in answers if status == 200)


@with_groups
async def test_a_read_through_any_node_sees_what_another_acknowledged(
        etcd: EtcdCluster, broker_process, tmp_path: Path) -> None:
    """Reads that answer once pass a read barrier: right after node 0 acknowledged a publish
    (or a stream's append), a read through node 1 sees it, though node 1 applies a stream of
    revisions other nodes made only every 2 s (its apply linger): the first after a quiet
    spell at once, the next ones up to 2 s late without the barrier. The same holds for the
    topic's row, the listing of topics and a named stream's catch-up read."""
    nodes = Nodes(broker_process, tmp_path, etcd, "--cluster-apply-linger", "2s")
    await nodes.start(0, 1)
    await nodes.wait_ready(0, 1)
    stream = f"{nodes.url(1)}/v1/stream/barrier-{nodes.name}"
    async with aiohttp.ClientSession() as session:
        async with session.put(stream.replace(nodes.url(1), nodes.url(0)),
                               headers={"Content-Type": "text/plain"}) as resp:
            assert resp.status == 201, await resp.text()
        for k in range(4):
            data = b"m%d" % k
            async with session.post(f"{nodes.url(0)}/messaging/messages",
                                    params={"topicID": str(TOPIC)}, data=data) as resp:
                assert resp.status == 200, await resp.text()
                index = int(resp.headers["X-Broker-Index"])
            async with session.get(f"{nodes.url(1)}/messaging/messages",
                                   params={"topicID": str(TOPIC), "index": str(index)}) as resp:
                assert resp.status == 200, await resp.text()
                messages, _used = decode(await resp.read())
            assert [m.data for m in messages] == [data], f"publish {k}"
            async with session.get(f"{nodes.url(1)}/messaging/topics/{TOPIC}") as resp:
                assert (await resp.json())["last_index"] == index, f"topic row after {k}"
            async with session.get(f"{nodes.url(1)}/messaging/topics") as resp:
                rows = {row["id"]: row for row in await resp.json()}
            assert rows[TOPIC]["last_index"] == index, f"listing after {k}"
            async with session.post(stream.replace(nodes.url(1), nodes.url(0)), data=data,
                                    headers={"Content-Type": "text/plain"}) as resp:
                assert resp.status in (200, 204), await resp.text()
            async with session.get(stream, params={"offset": "-1"}) as resp:
                assert resp.status == 200, await resp.text()
                assert (await resp.read()).endswith(data), f"stream append {k}"
            async with session.head(f"{nodes.url(1)}/messaging/messages",
                                    params={"topicID": str(TOPIC)}) as resp:
                assert int(resp.headers["X-Broker-Index"]) == index, f"HEAD after {k}"
            async with session.get(f"{nodes.url(1)}/messaging/times",
                                   params={"topicID": str(TOPIC), "index": str(index)}) as resp:
                assert (await resp.json())["through"] == index, f"times after {k}"
            for name in (f"c{k}", f"s{k}"):
                async with session.put(f"{nodes.url(0)}/messaging/consumers/{name}",
                                       params={"topicID": str(TOPIC),
                                               "index": str(index)}) as resp:
                    assert resp.status == 200, await resp.text()
            async with session.get(f"{nodes.url(1)}/messaging/messages",
                                   params={"topicID": str(TOPIC), "consumer": f"s{k}",
                                           "streaming": "true"}) as resp:
                # a stream from a stored position starts right after it
                assert resp.headers["X-Broker-Consumer-Index"] == str(index), f"stream s{k}"
            async with session.get(f"{nodes.url(1)}/messaging/consumers",
                                   params={"name": f"c{k}"}) as resp:
                positions = [row["index"] for row in await resp.json()]
            assert positions == [index], f"consumer c{k} through node 1: {positions}"


@with_groups
async def test_a_publish_is_answered_without_waiting_for_an_fsync(
        etcd: EtcdCluster, broker_process, tmp_path: Path) -> None:
    """etcd is the write-ahead log: node 2's fdatasync of its segments is held (at the system
    call), yet a publish through it is answered once etcd committed it and node 2 applied it.
    Node 2's durable revision (its checkpoint: what etcd may be compacted to) stays behind
    until the fsync returns, then catches up."""
    nodes = Nodes(broker_process, tmp_path, etcd, "--cluster-sync-interval", "1h")
    arm = await start_with_node2_faulted(nodes, tmp_path, hold="fdatasync:.seg")
    async with aiohttp.ClientSession() as session:
        async def publish(url: str, data: bytes) -> int:
            async with session.post(f"{url}/messaging/messages", params={"topicID": str(TOPIC)},
                                    data=data) as resp:
                assert resp.status == 200, await resp.text()
                return int(resp.headers["X-Broker-Index"])

        await publish(nodes.url(2), b"before")
        arm.touch()
        await asyncio.wait_for(publish(nodes.url(2), b"held"), 10)  # no fsync on its path
        stored = await converge(session, nodes.urls, 2)
        assert [data for _index, data in stored] == [b"before", b"held"]
        held = await diagnostics(session, nodes.url(2))
        assert held["durable_revision"] < held["applied_revision"], held
        arm.unlink()
        await publish(nodes.url(0), b"after")

        async def durable() -> bool:
            now = await diagnostics(session, nodes.url(2))
            return bool(now["durable_revision"] >= held["applied_revision"])

        await wait_until(durable, timeout=30, what="node 2's checkpoint to pass the held fsync")
        await converge(session, nodes.urls, 3)


@with_groups
async def test_node_killed_under_load_catches_up(etcd: EtcdCluster, broker_process,
                                                 tmp_path: Path) -> None:
    nodes = Nodes(broker_process, tmp_path, etcd)
    await nodes.start(0, 1, 2)
    async with aiohttp.ClientSession() as session:
        load = Load(nodes.urls)
        load.start(session)
        await load.until_acked(300, 30, "load before the kill")
        load.down.add(nodes.url(1))
        nodes.kill(1)
        await load.until_acked(500, 30, "load while a node is down")
        await nodes.start(1)
        load.down.clear()
        await load.until_acked(300, 30, "load after the restart")
        await load.finish()
        await settled(session, nodes, load)


@with_groups
async def test_all_nodes_killed_at_once(etcd: EtcdCluster, broker_process,
                                        tmp_path: Path) -> None:
    nodes = Nodes(broker_process, tmp_path, etcd)
    await nodes.start(0, 1, 2)
    async with aiohttp.ClientSession() as session:
        load = Load(nodes.urls)
        load.start(session)
        await load.until_acked(800, 30, "load before the kill")
        load.down.update(nodes.urls)
        for proc in nodes.procs.values():
            assert proc.proc is not None
            os.kill(proc.proc.pid, signal.SIGKILL)
        for i in range(3):
            nodes.kill(i)
        await load.finish()
        await nodes.start(0, 1, 2)
        stored = await settled(session, nodes, load)
        # Publishing goes on from the same indexes.
        async with session.post(f"{nodes.url(2)}/messaging/messages",
                                params={"topicID": str(TOPIC)}, data=b"after") as resp:
            assert resp.status == 200
            assert int(resp.headers["X-Broker-Index"]) > stored[-1][0]


@with_groups
async def test_etcd_leader_killed_under_load(etcd: EtcdCluster, broker_process,
                                             tmp_path: Path) -> None:
    nodes = Nodes(broker_process, tmp_path, etcd)
    await nodes.start(0, 1, 2)
    async with aiohttp.ClientSession() as session:
        load = Load(nodes.urls)
        load.start(session)
        await load.until_acked(300, 30, "load before the kill")
        leader = await etcd.leader()
        leader.stop(signal.SIGKILL)
        killed_at = time.monotonic()
        await load.until_acked(300, 30, "publishing to resume through the survivors")
        resumed = time.monotonic() - killed_at
        await load.finish()
        print(f"resumed after {resumed:.1f}s; answers {load.statuses}; "
              f"{len(load.acked)} acknowledged, {len(load.unknown)} unknown")
        await settled(session, nodes, load)
        assert resumed < 20, resumed
    leader.start()


@with_groups
async def test_quorum_lost_and_regained(etcd: EtcdCluster, broker_process,
                                        tmp_path: Path) -> None:
    nodes = Nodes(broker_process, tmp_path, etcd)
    await nodes.start(0, 1, 2)
    async with aiohttp.ClientSession() as session:
        load = Load(nodes.urls)
        load.start(session, workers=3)
        await load.until_acked(200, 30, "load before quorum is lost")
        for member in etcd.members[1:]:
            member.stop(signal.SIGKILL)

        async def refused_at_once() -> bool:
            started = time.monotonic()
            async with session.post(f"{nodes.url(0)}/messaging/messages",
                                    params={"topicID": str(TOPIC)}, data=b"probe") as resp:
                await resp.read()
                if resp.status == 200:
                    load.acked[b"probe"] = int(resp.headers["X-Broker-Index"])
                    return False
                load.unknown.add(b"probe")  # a 504 may still commit once quorum is back
                return resp.status == 503 and time.monotonic() - started < 2.0

        await wait_until(refused_at_once, timeout=30, what="a quick 503 without quorum")
        assert (await diagnostics(session, nodes.url(1)))["quorum"] is False
        assert set(load.statuses) <= {200, 503, 504}, load.statuses
        for member in etcd.members[1:]:
            member.start()
        await load.until_acked(200, 40, "publishing to resume with quorum back")
        await load.finish()
        await settled(session, nodes, load)


@with_groups
async def test_node_stopped_longer_than_its_lease(etcd: EtcdCluster, broker_process,
                                                  tmp_path: Path) -> None:
    nodes = Nodes(broker_process, tmp_path, etcd)
    await nodes.start(0, 1, 2)
    async with aiohttp.ClientSession() as session:
        load = Load(nodes.urls[:2])
        load.start(session, workers=4)
        await load.until_acked(200, 30, "load before the stop")

        async def listed() -> bool:
            d = await diagnostics(session, nodes.url(0))
            return nodes.url(2) in d["nodes"]

        await wait_until(listed, timeout=10, what="the node to be registered")
        stopped = nodes.procs[2].proc
        assert stopped is not None
        os.kill(stopped.pid, signal.SIGSTOP)
        try:
            async def gone() -> bool:
                d = await diagnostics(session, nodes.url(0))
                return nodes.url(2) not in d["nodes"]

            await wait_until(gone, timeout=20, what="the stopped node's lease to expire")
            await load.until_acked(300, 30, "load while the node is stopped")
        finally:
            os.kill(stopped.pid, signal.SIGCONT)

        await wait_until(listed, timeout=20, what="the node to register again")
        await load.finish()
        await settled(session, nodes, load)


async def compacted_under_load(session: aiohttp.ClientSession, nodes: Nodes) -> Load:
    """Publish through the running nodes until etcd is compacted past the log's start (a
    node starting afresh must then install a snapshot); the finished load."""
    load = Load(nodes.urls)
    load.start(session, workers=4)
    first_revision = 0

    async def compacted() -> bool:
        nonlocal first_revision
        ds = [await diagnostics(session, url) for url in nodes.urls]
        first_revision = first_revision or ds[0]["last_entry_applied"]
        done = max(d["compacted_revision"] for d in ds)  # the first URL compacts
        return bool(first_revision and done > first_revision + 1)

    await wait_until(compacted, timeout=40, what="etcd compaction past the log's start")
    await load.finish()
    return load


@with_groups
async def test_node_added_after_compaction_installs_a_snapshot(
        etcd: EtcdCluster, broker_process, tmp_path: Path) -> None:
    nodes = Nodes(broker_process, tmp_path, etcd, "--etcd-compact-every", "50",
                  "--max-segment-size", "64K")
    await nodes.start(0, 1)
    async with aiohttp.ClientSession() as session:
        load = await compacted_under_load(session, nodes)
        await nodes.start(2)
        await settled(session, nodes, load)
        d = await diagnostics(session, nodes.url(2))
        assert d["snapshots_installed"] == 1
        assert d["watch"]["live"]
        async with session.post(f"{nodes.url(2)}/messaging/messages",
                                params={"topicID": str(TOPIC)}, data=b"after") as resp:
            assert resp.status == 200
        load.acked[b"after"] = int(resp.headers["X-Broker-Index"])
        await settled(session, nodes, load)


@with_groups
async def test_publishes_a_snapshot_install_covers_are_answered_promptly(
        etcd: EtcdCluster, broker_process, tmp_path: Path) -> None:
    """A node that must install a snapshot (etcd compacted past it) takes publishes the moment
    it listens; the puts they make are committed before its watch learns of the compaction,
    and the snapshot it installs covers them. None may wait out the 30 s apply timeout (nor
    hold a put slot that long): each is answered promptly, as applied or as a 504 that the
    idempotent client's retry turns into the duplicate answer, and is stored once."""
    nodes = Nodes(broker_process, tmp_path, etcd, "--etcd-compact-every", "50")
    await nodes.start(0, 1)
    async with aiohttp.ClientSession() as session:
        load = await compacted_under_load(session, nodes)
        await nodes.start(2)

        async def publish(k: int) -> tuple[float, int]:
            started = time.monotonic()
            async with Client(nodes.url(2), producer_id=f"p{k}", retry_timeout=20) as client:
                index = await client.publish(TOPIC, b"taken at start %d" % k)
            return time.monotonic() - started, index

        answers = await asyncio.gather(*(publish(k) for k in range(16)))
        slowest = max(took for took, _index in answers)
        assert slowest < 10, f"a publish took {slowest:.1f}s (the apply timeout is 30 s)"
        for k, (_took, index) in enumerate(answers):
            load.acked[b"taken at start %d" % k] = index
        d = await diagnostics(session, nodes.url(2))
        assert d["snapshots_installed"] == 1
        await settled(session, nodes, load)


@with_groups
async def test_a_failed_fsync_stops_the_node_and_a_restart_recovers(
        etcd: EtcdCluster, broker_process, tmp_path: Path) -> None:
    """Node 2's fdatasync of a segment fails (EIO, injected at the system call) while it
    applies a batch of revisions under load. The batch is all or nothing: the node stops
    applying at once (publishes through it are refused with 503, those waiting for it are
    answered 504 at once, none waits out the 30 s apply timeout), the others go on, and
    restarted it replays from its checkpoint and holds exactly what they hold."""
    nodes = Nodes(broker_process, tmp_path, etcd)
    arm = await start_with_node2_faulted(nodes, tmp_path, fail="fdatasync:.seg")
    async with aiohttp.ClientSession() as session:
        load = Load(nodes.urls)
        load.start(session, workers=6)
        await load.until_acked(200, 30, "load before the fault")
        arm.touch()

        async def stopped() -> bool:
            return (await diagnostics(session, nodes.url(2)))["failure"] is not None

        await wait_until(stopped, timeout=20, what="node 2 to stop applying")

        async def answered() -> bool:
            d = await diagnostics(session, nodes.url(2))
            return bool(d["waiting"] == 0)

        await wait_until(answered, timeout=5, what="node 2's waiting publishes to be answered")
        async with session.post(f"{nodes.url(2)}/messaging/messages",
                                params={"topicID": str(TOPIC)}, data=b"refused") as resp:
            if _GROUPS.count == 1:
                assert resp.status == 503
                assert "stopped applying" in resp.headers["X-Broker-Error"]
            else:  # the node forwards what its stopped group cannot take to a holder
                assert resp.status == 200
                assert resp.headers["X-Messaging-Node"] != nodes.url(2)
                load.acked[b"refused"] = int(resp.headers["X-Broker-Index"])
        load.down.add(nodes.url(2))
        await load.until_acked(200, 30, "load through the other nodes")
        arm.unlink()
        nodes.kill(2)
        await nodes.start(2)
        load.down.discard(nodes.url(2))
        await load.until_acked(100, 30, "load after the restart")
        await load.finish()
        assert load.statuses.get(200), load.statuses
        await settled(session, nodes, load)


async def test_compressed_and_plain_entries_replay_identically(
        etcd: EtcdCluster, broker_process, tmp_path: Path) -> None:
    """A log mixing entries from before compression and checksums (plain, written here as
    an older node wrote them) and compressed ones: every node applies both alike, a node
    restarted from its checkpoint and a new node replaying the whole log end byte for byte
    the same."""
    nodes = Nodes(broker_process, tmp_path, etcd)
    await nodes.start(0, 1)
    key = f"/messaging/{nodes.name}/log".encode()
    events = [json.dumps({"key": f"sensor-{n % 5}", "value": n, "ts": f"08:{n % 60:02d}"})
              .encode() for n in range(400)]
    load = Load(nodes.urls)
    async with aiohttp.ClientSession() as session:
        for round_ in range(4):
            batch = events[round_ * 100:(round_ + 1) * 100]
            if round_ % 2:
                async with session.post(f"{nodes.url(round_ % 2)}/messaging/messages",
                                        params={"topicID": str(TOPIC)},
                                        data=encode_batch(TOPIC, batch),
                                        headers={"Content-Type": FRAMES_CONTENT_TYPE}) as resp:
                    assert resp.status == 200, await resp.text()
                    first = int(resp.headers["X-Broker-Index"]) - len(batch) + 1
            else:
                value = encode_entry(os.urandom(8), 1, [encode_batch(TOPIC, batch)],
                                     compress=False)
                value = b"MSG2" + value[4:32] + value[36:]  # as the previous version put it
                async with grpc.aio.insecure_channel(
                        etcd.members[0].client_url.removeprefix("http://")) as channel:
                    await rpc.KVStub(channel).Put(rpc.PutRequest(key=key, value=value),
                                                  timeout=5)
                stored = await converge(session, nodes.urls[:1], len(load.acked) + len(batch))
                first = stored[-len(batch)][0]
            load.acked.update({data: first + i for i, data in enumerate(batch)})
        await settled(session, nodes, load)
        nodes.kill(1)
        await nodes.start(1, 2)  # node 1 from its checkpoint, node 2 from the log's start
        await settled(session, nodes, load)


async def test_a_damaged_entry_stops_every_node_and_is_never_skipped(
        etcd: EtcdCluster, broker_process, tmp_path: Path) -> None:
    """A log value whose checksum does not match (one bit flipped in its body), followed by
    a good entry: both nodes stop applying at the damaged revision and say so (diagnostics,
    ``/readyz``, the 503 of a publish and of a read), neither applies the entry after it, and
    a restarted node replays up to it and stops there again: the damaged revision is never
    skipped."""
    nodes = Nodes(broker_process, tmp_path, etcd)
    await nodes.start(0, 1)
    await nodes.wait_ready(0, 1)
    key = f"/messaging/{nodes.name}/log".encode()
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{nodes.url(0)}/messaging/messages",
                                params={"topicID": str(TOPIC)},
                                data=encode_batch(TOPIC, [b"before-%d" % n for n in range(10)]),
                                headers={"Content-Type": FRAMES_CONTENT_TYPE}) as resp:
            assert resp.status == 200, await resp.text()
        before = await converge(session, nodes.urls, 10)
        damaged = bytearray(encode_entry(os.urandom(8), 1, [encode_batch(TOPIC, [b"damaged"])],
                                         compress=False))
        damaged[-3] ^= 0x10
        good = encode_entry(os.urandom(8), 1, [encode_batch(TOPIC, [b"after"])])
        async with grpc.aio.insecure_channel(
                etcd.members[0].client_url.removeprefix("http://")) as channel:
            kv = rpc.KVStub(channel)
            revision = (await kv.Put(rpc.PutRequest(key=key, value=bytes(damaged)),
                                     timeout=5)).header.revision
            await kv.Put(rpc.PutRequest(key=key, value=good), timeout=5)

        async def stopped(i: int) -> bool:
            return (await diagnostics(session, nodes.url(i)))["failure"] is not None

        for i in (0, 1):
            await wait_until(functools.partial(stopped, i), timeout=20,
                             what=f"node {i} to stop")
            failure = (await diagnostics(session, nodes.url(i)))["failure"]
            assert f"revision {revision} of /messaging/{nodes.name}/log is not a log entry " \
                   "this node can read (its checksum does not match" in failure, failure
            assert "nothing of it was skipped or applied" in failure, failure
            async with session.get(f"{nodes.url(i)}/readyz") as resp:
                assert resp.status == 503
                assert "stopped applying" in await resp.text()
            async with session.post(f"{nodes.url(i)}/messaging/messages",
                                    params={"topicID": str(TOPIC)}, data=b"refused") as resp:
                assert resp.status == 503
                assert "stopped applying" in resp.headers["X-Broker-Error"]
            async with session.get(f"{nodes.url(i)}/messaging/messages",
                                   params={"topicID": str(TOPIC)}) as resp:
                assert resp.status == 503  # its data no longer moves on: read elsewhere
                assert "stopped applying" in resp.headers["X-Broker-Error"]
            assert await applied_entries(session, nodes.url(i), revision) == before
        nodes.kill(1)
        await nodes.start(1)
        await wait_until(lambda: stopped(1), timeout=30, what="node 1 to stop again")
        assert f"revision {revision} " in (await diagnostics(session, nodes.url(1)))["failure"]
        assert await applied_entries(session, nodes.url(1), revision) == before


async def applied_entries(session: aiohttp.ClientSession, url: str,
                          damaged: int) -> list[tuple[int, bytes]]:
    """What a node that stopped at revision ``damaged`` applied: nothing from it on (its
    diagnostics), and its messages as a stream from the first index reads them (a stream
    needs no read barrier, which a stopped node refuses)."""
    assert (await diagnostics(session, url))["last_entry_applied"] < damaged
    async with session.get(f"{url}/messaging/messages",
                           params={"topicID": str(TOPIC), "streaming": "true"},
                           timeout=aiohttp.ClientTimeout(total=None, sock_read=1.0)) as resp:
        assert resp.status == 200, await resp.text()
        body = b""
        with contextlib.suppress(TimeoutError):
            async for chunk in resp.content.iter_any():
                body += chunk
    messages, used = decode(body, after=0)
    assert used == len(body)
    return [(m.index, m.data) for m in messages]


#: The last commit before log entries carried a checksum (entry format 3): the release a
#: cluster is upgraded from in the test below.
PREVIOUS_RELEASE = "499b0b4"


async def _format_in_etcd(etcd: EtcdCluster, cluster: str) -> tuple[bytes | None, bytes]:
    """The cluster's recorded entry format (None: none) and the magic of its newest entry."""
    recorded = await _range(etcd.members[0].client_url, f"/messaging/{cluster}/format".encode())
    log_value = await _range(etcd.members[0].client_url, f"/messaging/{cluster}/log".encode())
    return (recorded.kvs[0].value if recorded.kvs else None), log_value.kvs[0].value[:4]


async def test_a_rolling_upgrade_from_the_previous_release(
        etcd: EtcdCluster, broker_process, tmp_path: Path) -> None:
    """Three nodes of the previous release (a git worktree) are upgraded one at a time
    under load: while any old node is live every node writes the entry format it reads (2),
    so no acknowledged publish is lost or skipped by anyone; once all three run this code the
    cluster moves to format 4 by itself (its inline entries are laid out as format 3's); the
    files end byte-identical. A node too old for
    the recorded format refuses to start, in one line naming both formats."""
    from bench.harness.checkouts import worktree

    with worktree(PREVIOUS_RELEASE, tmp_path) as tree:
        # -P: the working directory (this checkout) does not come before PYTHONPATH.
        launcher = [sys.executable, "-P", "-m", "messaging.cli"]
        env = {"PYTHONPATH": str(tree)}
        old: dict[str, Any] = {"launcher": launcher, "env": env}
        imported = subprocess.run([sys.executable, "-P", "-c",
                                   "import messaging; print(messaging.__file__)"],
                                  capture_output=True, text=True, timeout=60,
                                  env={**os.environ, **env}).stdout.strip()
        assert imported == str(tree / "messaging" / "__init__.py"), imported
        nodes = Nodes(broker_process, tmp_path, etcd)
        await nodes.start(0, 1, 2, **old)
        await nodes.wait_ready(0, 1, 2)
        async with aiohttp.ClientSession() as session:
            load = Load(nodes.urls)
            load.start(session, workers=4)
            await load.until_acked(100, 30, "load on the previous release")
            for i in range(3):
                load.down.add(nodes.url(i))
                assert nodes.procs[i].terminate() == 0
                await nodes.start(i)  # this code
                await nodes.wait_ready(i)
                load.down.discard(nodes.url(i))
                await load.until_acked(100, 30, f"load after node {i}'s upgrade")
                if i < 2:  # old nodes still live: nobody writes what they cannot read
                    recorded, magic = await _format_in_etcd(etcd, nodes.name)
                    assert recorded is None and magic in (b"MSG2", b"MSZ2"), (recorded, magic)

            async def format_4() -> bool:
                recorded, magic = await _format_in_etcd(etcd, nodes.name)
                return recorded == b"4" and magic in (b"MSG3", b"MSZ3")

            await wait_until(format_4, timeout=20, what="the cluster writing entry format 4")
            await load.until_acked(100, 30, "load in format 4")
            await load.finish()
            assert load.statuses.get(200), load.statuses
            await settled(session, nodes, load)
        async with grpc.aio.insecure_channel(
                etcd.members[0].client_url.removeprefix("http://")) as channel:
            await rpc.KVStub(channel).Put(rpc.PutRequest(
                key=f"/messaging/{nodes.name}/format".encode(), value=b"5"), timeout=5)
        nodes.kill(2)
        refused = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "messaging.cli", "broker", "--data",
                             str(nodes.data(2)), "--bind", f"127.0.0.1:{nodes.ports[2]}",
                             "--etcd", etcd.endpoints, "--cluster", nodes.name,
                             "--advertise", nodes.url(2)],
            capture_output=True, text=True, timeout=60)
        assert refused.returncode != 0
        assert (f"cluster {nodes.name!r} writes log entries of format 5; this node reads "
                "formats up to 4") in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr


@pytest.mark.parametrize("fsync", ["always", "interval"])
async def test_in_process_node_never_blocks_the_loop(etcd: EtcdCluster, start_server,
                                                     fsync: str) -> None:
    """Publishing, heartbeats, snapshots and shutdown, all under blockbuster."""
    cluster = f"t{uuid.uuid4().hex[:10]}"
    server = await start_server(etcd=etcd.endpoints, cluster=cluster, fsync=fsync)
    base = server.url
    async with aiohttp.ClientSession() as session:
        for i in range(20):
            async with session.post(f"{base}/messaging/messages", params={"topicID": "3"},
                                    data=f"m{i}".encode()) as resp:
                assert resp.status == 200, await resp.text()
                assert int(resp.headers["X-Broker-Index"]) == i + 1
        async with session.post(f"{base}/messaging/heartbeat",
                                params={"topicID": "3", "index": "5", "url": "sub"}) as resp:
            assert resp.status == 200
        async with session.get(f"{base}/messaging/snapshot",
                               params={"cluster": cluster}) as resp:
            assert resp.status == 200
            header = json.loads((await resp.read()).split(b"\n", 1)[0])
        assert header["cluster"] == cluster and header["revision"] > 0
        assert header["index"] == 20 and header["subscribers"] == {"3": {"sub": 5}}
        async with session.get(f"{base}/messaging/snapshot", params={"cluster": "x"}) as resp:
            assert resp.status == 400
        d = await diagnostics(session, base)
        assert d["applied_revision"] >= header["revision"] and d["index"] == 20


async def _alarm(url: str, action: int) -> None:
    async with grpc.aio.insecure_channel(url.removeprefix("http://")) as channel:
        await rpc.MaintenanceStub(channel).Alarm(
            rpc.AlarmRequest(action=action, memberID=0, alarm=rpc.NOSPACE), timeout=5)


@with_groups
async def test_nospace_alarm_answers_507(etcd: EtcdCluster, broker_process,
                                         tmp_path: Path) -> None:
    nodes = Nodes(broker_process, tmp_path, etcd)
    await nodes.start(0)
    url = etcd.members[0].client_url
    async with aiohttp.ClientSession() as session:
        async def publish() -> aiohttp.ClientResponse:
            async with session.post(f"{nodes.url(0)}/messaging/messages",
                                    params={"topicID": str(TOPIC)}, data=b"x") as resp:
                await resp.read()
                return resp

        assert (await publish()).status == 200
        await _alarm(url, rpc.AlarmRequest.ACTIVATE)
        try:
            resp = await publish()
            assert resp.status == 507
            assert "NOSPACE" in resp.headers["X-Broker-Error"]
            assert (await diagnostics(session, nodes.url(0)))["alarm"] == "NOSPACE"
        finally:
            await _alarm(url, rpc.AlarmRequest.DEACTIVATE)
        assert (await publish()).status == 200
        assert (await diagnostics(session, nodes.url(0)))["alarm"] is None


@with_groups
async def test_graceful_stop_checkpoints_and_leaves(etcd: EtcdCluster, broker_process,
                                                    tmp_path: Path) -> None:
    nodes = Nodes(broker_process, tmp_path, etcd)
    await nodes.start(0, 1)
    async with aiohttp.ClientSession() as session:
        load = Load(nodes.urls)
        load.start(session, workers=4)
        await load.until_acked(300, 30, "some load")
        await load.finish()
        await settled(session, nodes, load)
        applied = (await diagnostics(session, nodes.url(1)))["last_entry_applied"]
        assert await asyncio.to_thread(nodes.procs[1].terminate) == 0
        checkpoint = json.loads((topic_folder(nodes.data(1)).parent.parent /
                                 "cluster.json").read_text())
        assert checkpoint["cluster"].split("~")[0] == nodes.name
        assert checkpoint["revision"] >= applied
        log_text = nodes.procs[1].log.read_text()
        assert "Traceback" not in log_text and " ERROR " not in log_text

        async def left() -> bool:  # its lease was revoked on the way out, not left to expire
            return nodes.url(1) not in (await diagnostics(session, nodes.url(0)))["nodes"]

        await wait_until(left, timeout=3, what="the stopped node to leave the node list")
        await nodes.start(1)
        async with session.post(f"{nodes.url(1)}/messaging/messages",
                                params={"topicID": str(TOPIC)}, data=b"after") as resp:
            assert resp.status == 200
            load.acked[b"after"] = int(resp.headers["X-Broker-Index"])
        await settled(session, nodes, load)


# -- Durable Streams through the cluster -------------------------------------------------------


async def _stream(session: aiohttp.ClientSession, method: str, url: str, name: str,
                  body: bytes = b"", **headers: str) -> tuple[int, dict[str, str], bytes]:
    """One request on ``/v1/stream/{name}`` of node ``url``: status, headers, body."""
    async with session.request(method, f"{url}/v1/stream/{name}", data=body,
                               headers={k.replace("_", "-"): v for k, v in headers.items()},
                               ) as resp:
        return resp.status, dict(resp.headers), await resp.read()


async def _streams_agree(session: aiohttp.ClientSession, urls: list[str],
                         names: list[str]) -> bool:
    """Whether every node answers the same status, tail, closure and content per stream."""
    for name in names:
        seen = set()
        for url in urls:
            status, headers, _ = await _stream(session, "HEAD", url, name)
            _, _, body = await _stream(session, "GET", url, name)
            seen.add((status, headers.get("Stream-Next-Offset"), headers.get("Stream-Closed"),
                      body if status == 200 else b""))
        if len(seen) != 1:
            return False
    return True


@with_groups
async def test_durable_streams_through_any_node(etcd: EtcdCluster, broker_process,
                                                tmp_path: Path) -> None:
    """Streams created, appended (idempotently), forked, closed and deleted through any node
    read the same on every node, through a kill -9 and a node that joins from a snapshot."""
    nodes = Nodes(broker_process, tmp_path, etcd, "--etcd-compact-every", "50")
    await nodes.start(0, 1)
    a, b = nodes.url(0), nodes.url(1)
    # A fork is kept in its source's group: with several groups, a name in text's group.
    fork = next(f"fork{k}" for k in range(1000)
                if group_of_name(f"fork{k}", _GROUPS.count) == group_of_name("text", _GROUPS.count))
    names = ["text", "json", fork]
    async with aiohttp.ClientSession() as session:
        assert (await _stream(session, "PUT", a, "text", b"first;",
                              Content_Type="text/plain"))[0] == 201
        first_entry = (await diagnostics(session, a, "text"))["last_entry_applied"]
        assert (await _stream(session, "PUT", b, "text", Content_Type="text/plain"))[0] == 200
        assert (await _stream(session, "PUT", b, "json", b"[1,2]",
                              Content_Type="application/json"))[0] == 201
        for seq in range(120):  # alternate nodes; enough revisions for compaction
            status, headers, _ = await _stream(
                session, "POST", nodes.url(seq % 2), "text", b"%d;" % seq,
                Content_Type="text/plain", Producer_Id="p", Producer_Epoch="0",
                Producer_Seq=str(seq))
            assert status == 200, (seq, headers)
        # The last one again, through the other node: stored once.
        status, headers, _ = await _stream(session, "POST", a, "text", b"119;",
                                           Content_Type="text/plain", Producer_Id="p",
                                           Producer_Epoch="0", Producer_Seq="119")
        assert status == 204 and headers["Producer-Seq"] == "119"
        # A new epoch through one node fences the old one on the other.
        assert (await _stream(session, "POST", a, "text", b"e1;", Content_Type="text/plain",
                              Producer_Id="p", Producer_Epoch="1", Producer_Seq="0"))[0] == 200
        status, headers, _ = await _stream(session, "POST", b, "text", b"zombie;",
                                           Content_Type="text/plain", Producer_Id="p",
                                           Producer_Epoch="0", Producer_Seq="120")
        assert status == 403 and headers["Producer-Epoch"] == "1"
        assert (await _stream(session, "PUT", b, fork, Content_Type="text/plain",
                              Stream_Forked_From="text"))[0] == 201

        async def compacted() -> bool:  # past the log's first entry: a new node needs a snapshot
            ds = [await diagnostics(session, url, "text") for url in (a, b)]
            return bool(max(d["compacted_revision"] for d in ds) > first_entry + 1)

        await wait_until(compacted, timeout=40, what="etcd compaction past the log's start")
        nodes.kill(1)
        assert (await _stream(session, "POST", a, fork, b"forked;",
                              Content_Type="text/plain", Producer_Id="q", Producer_Epoch="0",
                              Producer_Seq="0"))[0] == 200
        assert (await _stream(session, "POST", a, "text", Stream_Closed="true",
                              Producer_Id="p", Producer_Epoch="1", Producer_Seq="1"))[0] == 204
        assert (await _stream(session, "DELETE", a, "json"))[0] == 204
        await nodes.start(1, 2)  # 1 replays its log; 2 joins past compaction: a snapshot
        await wait_until(lambda: _streams_agree(session, nodes.urls, names), timeout=60,
                         what="every node to read every stream alike")
        c = nodes.url(2)
        status, headers, body = await _stream(session, "GET", c, "text")
        assert body == b"first;" + b"".join(b"%d;" % i for i in range(120)) + b"e1;"
        assert headers["Stream-Closed"] == "true"
        assert (await _stream(session, "GET", c, fork))[2] == body + b"forked;"
        assert (await _stream(session, "HEAD", c, "json"))[0] == 404
        # Producer state came through the snapshot too: retries on the new node are
        # duplicates, of an append and of the close.
        status, headers, _ = await _stream(session, "POST", c, fork, b"forked;",
                                           Content_Type="text/plain", Producer_Id="q",
                                           Producer_Epoch="0", Producer_Seq="0")
        assert status == 204 and headers["Producer-Seq"] == "0"
        status, headers, _ = await _stream(session, "POST", c, "text", Stream_Closed="true",
                                           Producer_Id="p", Producer_Epoch="1",
                                           Producer_Seq="1")
        assert status == 204 and headers["Stream-Closed"] == "true"
        assert (await _stream(session, "GET", c, fork))[2] == body + b"forked;"
        d = await diagnostics(session, c, "text")
        assert d["snapshots_installed"] == 1


# -- stored consumer positions ---------------------------------------------------------------


async def _positions(url: str) -> dict[tuple[int, str], int]:
    async with Client(url, retry_timeout=5) as client:
        return {(c["topic"], c["name"]): c["index"] for c in await client.consumers()}


@with_groups
async def test_stored_positions_through_any_node(etcd: EtcdCluster, broker_process,
                                                 tmp_path: Path) -> None:
    """Heartbeats, resets and deletes through any node are the same positions on every node
    (the no-backwards rule too), through a kill -9 and a replay from the checkpoint."""
    nodes = Nodes(broker_process, tmp_path, etcd)
    await nodes.start(0, 1, 2)
    a, b, c = nodes.urls
    async with Client(a) as client:
        for n in range(10):
            await client.publish(TOPIC, b"m%d" % n)
    async with Client(b) as client:
        await client.heartbeat(TOPIC, 6, "billing")
        await client.heartbeat(TOPIC, 3, "audit")
        await client.heartbeat(TOPIC + 1, 2, "gone")
    async with Client(c) as client:
        await client.heartbeat(TOPIC, 2, "billing")  # lower, through another node: ignored
        await client.reset_consumer("audit", TOPIC, 1)
        assert await client.delete_consumer("gone") == [TOPIC + 1]
    wanted = {(TOPIC, "billing"): 6, (TOPIC, "audit"): 1}

    async def agree() -> bool:
        return all([await _positions(url) == wanted for url in nodes.urls])

    await wait_until(agree, timeout=30, what="every node to hold the same positions")
    nodes.kill(2)
    await nodes.start(2)  # replays the log from its checkpoint
    await wait_until(agree, timeout=60, what="the restarted node to hold the same positions")
    await nodes.wait_ready(2)  # what it held above its checkpoint is applied again by then
    async with Client(nodes.url(2)) as client:
        conn = client.conn(TOPIC, consumer="billing", heartbeat_interval=0)
        await conn.open(streaming=False)
        indexes = [m.index async for m in conn]
        await conn.close()
        assert indexes == list(range(7, 11))


async def test_node_killed_at_each_boundary_of_a_publish(etcd: EtcdCluster, broker_process,
                                                         tmp_path: Path) -> None:
    """Exactly once in a cluster: node 0 killed -9 at each write/fsync boundary of applying
    a producer publish sent through it and of the group fsync that follows its answer (etcd
    is the write-ahead log: no fsync comes before the answer); the Python client retries
    through another node; the message is stored once everywhere, node 0 catches up byte for
    byte, and a resend is a duplicate (tests/e2e/test_exactly_once.py does the same to one
    node)."""
    nodes = Nodes(broker_process, tmp_path, etcd)
    await nodes.start(0, 1, 2)
    work = tmp_path / "faults"
    work.mkdir()

    def faults(k: int, kill: str) -> dict[str, Any]:
        return {"launcher": FAULTPOINT, "env": {
            "FAULT_ROOT": str(nodes.data(0)), "FAULT_ARM": str(work / f"arm{k}"),
            "FAULT_TRACE": str(work / f"trace{k}"), "FAULT_KILL": kill,
            "FAULT_SKIP": "cluster.json"}}

    async def past_the_group_fsync(k: int, kill: str) -> bool:
        """The armed run got through the group fsync after the answer (or the kill)."""
        if kill:
            process = nodes.procs[0].proc
            return process is not None and process.poll() is not None
        return any(op == "fdatasync" and path.endswith(".seg")
                   for _n, op, path, _group in read_trace(work / f"trace{k}"))

    async def publish(k: int, kill: str = "") -> int:
        nodes.kill(0)
        await nodes.start(0, **faults(k, kill))
        # Node 0 serves the publishes only once it has caught up; before, the client goes to
        # another node, which may answer before node 0 applies the message (a loaded machine).
        await nodes.wait_ready(0)
        async with Client(nodes.urls, producer_id=f"c{k}", retry_timeout=30) as client:
            await client.publish(TOPIC, b"warm-up %d" % k)  # producer state exists
            (work / f"arm{k}").touch()
            index = await client.publish(TOPIC, b"message %d" % k)
            # Disarmed only once the group fsync after the answer ran (or the kill struck):
            # node 0 may apply the message after another node answered it.
            await wait_until(lambda: past_the_group_fsync(k, kill), timeout=30,
                             what=f"node 0's group fsync after the answer ({kill or 'no kill'})")
            (work / f"arm{k}").unlink()
            return index

    await publish(0)
    calls = read_trace(work / "trace0")
    assert {op for _n, op, _path, _group in calls} >= {"write", "fsync", "fdatasync"}, calls
    points = [str(n) for n, _op, _path, _group in calls] + [f"{calls[-1][0]}+"]
    for k, point in enumerate(points, 1):
        await publish(k, point)
        assert nodes.procs[0].proc is not None
        assert nodes.procs[0].proc.poll() == -9, f"node 0 was not killed at {point}"
    nodes.kill(0)
    await nodes.start(0)
    async with aiohttp.ClientSession() as session:
        stored = await converge(session, nodes.urls, at_least=2 * (len(points) + 1))
        datas = [data for _index, data in stored]
        for k in range(len(points) + 1):
            assert datas.count(b"message %d" % k) == 1, (k, datas)
            assert datas.count(b"warm-up %d" % k) == 1, (k, datas)
        await check_identical(nodes)
        for k in range(len(points) + 1):
            async with session.post(f"{nodes.url(0)}/messaging/messages",
                                    params={"topicID": str(TOPIC)}, data=b"message %d" % k,
                                    headers={"Producer-Id": f"c{k}.1", "Producer-Epoch": "0",
                                             "Producer-Seq": "1"}) as resp:
                assert resp.status == 200, await resp.text()
                assert resp.headers.get("X-Broker-Duplicate") == "true", k


async def _exited(process: BrokerProcess) -> bool:
    return process.proc is not None and process.proc.poll() is not None


async def test_the_cli_fails_over_when_its_first_url_is_killed(
        etcd: EtcdCluster, broker_process, tmp_path: Path) -> None:
    """``messaging tail --follow`` is given node 0 alone, before nodes 1 and 2 exist: it
    learns them from node 0 later (it asks again every RELEARN_INTERVAL). ``messaging
    publish`` gets node 0 first. Node 0 is killed (-9) between publishes; both go on through
    the others, and the tail prints every message once, in order."""
    nodes = Nodes(broker_process, tmp_path, etcd)
    await nodes.start(0)
    env = {**os.environ, "MESSAGING_CONFIG_DIR": str(tmp_path / "config"), "MESSAGING_URL": ""}
    tail = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "messaging.cli", "tail", nodes.url(0), str(TOPIC), "--follow",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
    await nodes.start(1, 2)
    urls = ",".join(nodes.urls)

    def publish(*lines: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "messaging.cli", "publish", urls,
                               str(TOPIC)], input="".join(f"{line}\n" for line in lines),
                              capture_output=True, text=True, timeout=60, env=env)

    async with Client(nodes.url(0)) as client:
        async def all_listed() -> bool:  # node 0 has seen the others join
            return sorted(await client.ping()) == sorted(nodes.urls)

        await wait_until(all_listed, timeout=20, what="node 0 to list every node")
    await asyncio.sleep(RELEARN_INTERVAL + 1)  # the tail has asked node 0 again since
    assert tail.stdout is not None
    try:
        before = [f"before {n}" for n in range(3)]
        result = await asyncio.to_thread(publish, *before)
        assert result.returncode == 0, result
        printed = [await asyncio.wait_for(tail.stdout.readline(), 30) for _ in before]
        nodes.kill(0)
        after = [f"after {n}" for n in range(200)]
        result = await asyncio.to_thread(publish, *after)
        assert result.returncode == 0, result
        assert result.stdout.startswith("published 200 messages"), result
        printed += [await asyncio.wait_for(tail.stdout.readline(), 30) for _ in after]
    finally:
        tail.kill()
        _out, err = await tail.communicate()
        print("tail's standard error:", err.decode(errors="replace"))
    rows = [line.decode().rstrip("\n").split("\t") for line in printed]
    assert [row[2] for row in rows] == before + after
    indexes = [int(row[0]) for row in rows]
    assert indexes == sorted(set(indexes))
