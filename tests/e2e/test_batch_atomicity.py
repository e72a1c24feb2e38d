"""A publish batch is all or nothing, also after a crash: real broker processes killed under
concurrent 2,000-message batches with small segments (so batches straddle rolls), then
restarted on the same data.

Three kinds of round, on one data directory: SIGKILL from outside at a random moment; SIGKILL
half-way through a random segment write (tests/faultpoint.py, a torn write, always inside a
batch); and a kill at a random system call followed by a simulated power loss (every file
cut back to what was fsynced).
After every round each batch is either entirely present, once, or entirely absent, and every
acknowledged batch is present with the indexes it was answered with. A cluster node killed
mid-batch ends byte for byte like the others, every batch whole.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from messaging.frames import FRAMES_CONTENT_TYPE, decode, encode_batch
from tests.conftest import wait_until
from tests.e2e.test_etcd_log import (  # noqa: F401  (fixtures used by name)
    LOCAL_ONLY,
    TOPIC,
    EtcdCluster,
    Nodes,
    check_identical,
    etcd,
    etcd_cluster,
)
from tests.e2e.test_exactly_once import wait_for_trace
from tests.faultpoint import lose_unsynced
from tests.objects.conftest import seaweedfs  # noqa: F401  (a fixture, by name)


async def diagnostics_of(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, \
            session.get(f"{url}/messaging/diagnostics") as resp:
        found: dict[str, Any] = await resp.json()
        return found


FAULTPOINT = Path(__file__).resolve().parent.parent / "faultpoint.py"
BATCH = 2000
TOPICS = (1, 2, 3)
SENDERS = 4
KINDS = ("outside", "torn", "power") * 7  # 21 rounds

#: A batch's tag -> (first, last) index of an acknowledged batch.
Acked = dict[str, tuple[int, int]]


async def sender(session: aiohttp.ClientSession, url: str, worker: int, round_: int,
                 acked: Acked, rng: random.Random, *, topics: tuple[int, ...] = TOPICS,
                 limit: int = 200) -> None:
    """Publish batches until the broker goes away (at most ``limit``)."""
    for n in range(limit):
        tag = f"r{round_}w{worker}b{n}"
        datas = [f"{tag}-{k}-".encode() + bytes(rng.randrange(40)) for k in range(BATCH)]
        topic = topics[(worker + n) % len(topics)]
        try:
            async with session.post(f"{url}/messaging/messages", data=encode_batch(topic, datas),
                                    headers={"Content-Type": FRAMES_CONTENT_TYPE}) as resp:
                if resp.status != 200:
                    return
                result = await resp.json()
        except (TimeoutError, aiohttp.ClientError, ConnectionError):
            return
        assert result["count"] == BATCH
        acked[tag] = (result["first"], result["last"])


async def stored_batches(url: str, after: int = 0, *, topics: tuple[int, ...] = TOPICS,
                         headers: dict[str, str] | None = None,
                         ) -> tuple[dict[str, list[tuple[int, int]]], int]:
    """The batches on the broker above index ``after``: tag -> [(index, k)] in index order,
    and the highest index seen."""
    batches: dict[str, list[tuple[int, int]]] = {}
    highest = after
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        for topic in topics:
            async with session.get(f"{url}/messaging/messages",
                                   params={"topicID": str(topic), "index": str(after + 1)},
                                   headers=headers) as resp:
                if resp.status == 404:
                    continue
                assert resp.status == 200, await resp.text()
                body = await resp.read()
            messages, used = decode(body, after=0)
            assert used == len(body)
            for message in messages:
                tag, k, _rest = message.data.split(b"-", 2)
                batches.setdefault(tag.decode(), []).append((message.index, int(k)))
                highest = max(highest, message.index)
    return batches, highest


def check(batches: dict[str, list[tuple[int, int]]], acked: Acked, after: str) -> None:
    """Every batch whole and once; every acknowledged one present where it was answered."""
    for tag, messages in batches.items():
        assert [k for _index, k in messages] == list(range(BATCH)), (
            f"{after}: batch {tag} holds {len(messages)} of {BATCH} messages")
        indexes = [index for index, _k in messages]
        assert indexes == list(range(indexes[0], indexes[0] + BATCH)), f"{after}: {tag}"
    lost = {tag: span for tag, span in acked.items()
            if tag not in batches or batches[tag][0][0] != span[0]}
    assert not lost, f"{after}: acknowledged batches lost or moved: {sorted(lost)[:5]}"


async def test_a_batch_is_all_or_nothing_after_kill_9_torn_writes_and_power_loss(
        broker_process, tmp_path: Path) -> None:
    rng = random.Random(40)
    data = tmp_path / "data"
    acked: Acked = {}
    checked = 0  # the highest index a check has read
    for round_, kind in enumerate(KINDS):
        work = tmp_path / f"round{round_}"
        work.mkdir()
        env = {"FAULT_ROOT": str(data), "FAULT_ARM": str(work / "arm")}
        if kind == "torn":  # half-way through a segment write: always inside a batch
            env["FAULT_TEAR"] = f".seg#{rng.randrange(2, 12)}"
        elif kind == "power":
            env["FAULT_KILL"] = str(rng.randrange(4, 90))
        if kind == "power":
            env["FAULT_SYNCED"] = str(work / "synced")
        broker = broker_process(data, "--max-segment-size", "64K",
                                launcher=[sys.executable, str(FAULTPOINT)], env=env).start()
        # Before the load: what the previous round left is whole (the final check reads all).
        batches, checked = await stored_batches(broker.url, checked)
        check(batches, {tag: span for tag, span in acked.items()
                        if tag.startswith(f"r{round_ - 1}w")}, f"start of round {round_}")
        (work / "arm").touch()
        timeout = aiohttp.ClientTimeout(total=20)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            senders = [asyncio.ensure_future(sender(session, broker.url, w, round_, acked, rng))
                       for w in range(SENDERS)]
            assert broker.proc is not None
            if kind == "outside":
                await asyncio.sleep(rng.uniform(0.15, 0.6))
            else:  # dies at its kill point, or is killed when the load never reached it
                await asyncio.to_thread(_wait, broker.proc, 8.0)
            broker.kill()
            await asyncio.wait_for(asyncio.gather(*senders), 30)
        if kind == "power":
            lose_unsynced(data, work / "synced")
    final = broker_process(data).start()
    batches, _highest = await stored_batches(final.url)
    check(batches, acked, "after the last round")
    assert final.terminate() == 0
    log = final.log.read_text()
    torn_groups = log.count("whose commit mark a crash took") + log.count(
        "a group a crash interrupted")
    assert len(acked) > 3 * len(KINDS), "the load never got going"
    # The torn rounds did tear batches (else this proved nothing), and recovery cut them.
    assert torn_groups >= KINDS.count("torn") - 1, log[-3000:]


def _wait(proc: subprocess.Popen[str], timeout: float) -> bool:
    """Whether ``proc`` ended within ``timeout`` seconds."""
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return False
    return True


async def test_no_reader_sees_a_batch_before_its_group_is_committed(broker_process,
                                                                     tmp_path: Path) -> None:
    """The segment's fsync held while a batch that straddles rolls is written: a read, a
    streaming read already waiting, and the topic's description show none of it; once the
    fsync returns the whole batch arrives at once."""
    data, arm = tmp_path / "data", tmp_path / "arm"
    env = {"FAULT_ROOT": str(data), "FAULT_ARM": str(arm), "FAULT_TRACE": str(tmp_path / "t"),
           "FAULT_HOLD": "fdatasync:.seg"}
    broker = broker_process(data, "--max-segment-size", "64K",
                            launcher=[sys.executable, str(FAULTPOINT)], env=env).start()
    url = broker.url
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        async with session.post(f"{url}/messaging/messages", params={"topicID": "1"},
                                data=b"before") as resp:
            assert resp.status == 200
        async with session.get(f"{url}/messaging/messages",
                               params={"topicID": "1", "index": "2", "streaming": "true"},
                               ) as stream:
            arm.touch()
            datas = [b"held %d " % k + bytes(40) for k in range(BATCH)]
            publishing = asyncio.ensure_future(session.post(
                f"{url}/messaging/messages", data=encode_batch(1, datas),
                headers={"Content-Type": FRAMES_CONTENT_TYPE}))
            await wait_for_trace(tmp_path / "t", "held fdatasync")
            segments = sorted((data / "topics" / "1").glob("*.seg"))
            assert len(segments) >= 2, "the batch did not straddle a roll"
            async with session.get(f"{url}/messaging/messages",
                                   params={"topicID": "1"}) as resp:
                messages, _used = decode(await resp.read(), after=0)
            assert [m.data for m in messages] == [b"before"]
            async with session.get(f"{url}/messaging/topics/1") as resp:
                assert (await resp.json())["last_index"] == 1
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(stream.content.readexactly(1), 0.5)
            arm.unlink()
            resp = await asyncio.wait_for(publishing, 20)
            assert resp.status == 200
            resp.release()
            body = await asyncio.wait_for(stream.content.readexactly(
                sum(26 + len(d) for d in datas)), 20)
            streamed, _used = decode(body, after=1)
            assert [m.data for m in streamed] == datas
    assert broker.terminate() == 0


@pytest.mark.parametrize("lane", ["inline", "intake"])
async def test_a_cluster_node_killed_mid_batch_replays_every_batch_whole(
        etcd: EtcdCluster, broker_process, tmp_path: Path, lane: str,  # noqa: F811
        request: pytest.FixtureRequest) -> None:
    """A cluster node dies half-way through a segment write of 2,000-message batches over
    small segments (three times): started again, it cuts what no commit mark covers,
    replays the rest from etcd, and ends byte for byte like the others, every batch whole.
    In both lanes: through etcd, and as pointers to intake objects in SeaweedFS."""
    rng = random.Random(38)
    arm = tmp_path / "arm"
    arm.touch()
    extra: list[str] = []
    env: dict[str, str] = {}
    if lane == "intake":
        from tests.e2e.test_tiering import s3_env
        from tests.objects.conftest import BUCKET

        store = request.getfixturevalue("seaweedfs")
        extra = ["--object-store", f"s3://{BUCKET}/atomic-{tmp_path.name[-12:]}",
                 "--s3-endpoint", store.endpoint, "--intake-min-size", "1K"]
        env = s3_env()
    nodes = Nodes(broker_process, tmp_path, etcd, "--max-segment-size", "64K", *extra)

    def tearing() -> dict[str, object]:
        return {"launcher": [sys.executable, str(FAULTPOINT)],
                "env": {**env, "FAULT_ROOT": str(nodes.data(1)), "FAULT_ARM": str(arm),
                        "FAULT_TEAR": f".seg#{rng.randrange(2, 8)}"}}

    await nodes.start(0, 2, env=env)
    await nodes.start(1, **tearing())
    await nodes.wait_ready(0, 1, 2)
    if lane == "intake":  # before, batches go inline (see the intake tests)
        from tests.e2e.test_intake import lane_open

        await lane_open(nodes)
    acked: Acked = {}
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for round_ in range(3):
            senders = [asyncio.ensure_future(
                sender(session, nodes.url(0), w, round_, acked, rng, topics=(TOPIC,),
                       limit=8)) for w in range(2)]
            proc = nodes.procs[1].proc
            assert proc is not None
            died = await asyncio.to_thread(_wait, proc, 30.0)
            await asyncio.wait_for(asyncio.gather(*senders), 60)
            assert died, "node 1 never reached its torn write"
            nodes.kill(1)
            await nodes.start(1, **(tearing() if round_ < 2 else {"env": env}))
        await nodes.wait_ready(0, 1, 2)
        last = max(span[1] for span in acked.values())
        stored: list[dict[str, list[tuple[int, int]]]] = []
        for i in range(3):
            async def caught_up(url: str = nodes.url(i)) -> bool:
                async with session.get(f"{url}/messaging/topics/{TOPIC}",
                                       headers=LOCAL_ONLY) as resp:
                    return resp.status == 200 and (await resp.json())["last_index"] >= last
            await wait_until(caught_up, timeout=60, what=f"node {i} caught up")
            batches, _highest = await stored_batches(nodes.url(i), topics=(TOPIC,),
                                                     headers=LOCAL_ONLY)
            check(batches, acked, f"node {i}")
            stored.append(batches)
        assert stored[0] == stored[1] == stored[2]
        await check_identical(nodes)
    log = (tmp_path / "node1.log").read_text()
    assert log.count("whose commit mark a crash took") >= 3, log[-3000:]
    if lane == "intake":
        intake = (await diagnostics_of(nodes.url(0)))["intake"]
        assert intake["objects_written"] > 0, intake
