"""Append times in a 3-node etcd cluster where one node's clock is an hour ahead (libfaketime).

A command's time is the clock of the node that puts it to etcd, carried inside the entry, so
every node derives the same time for every message; the state machine never lets it go back,
so once the fast node has put a command, later commands from the other nodes are held at its
time. A node killed -9 and started again replays the log from its checkpoint (which records
the broker's time) and reports the same times.
"""

from __future__ import annotations

import asyncio
import glob
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from messaging.frames import FRAMES_CONTENT_TYPE, decode, encode_batch
from messaging.topic.times import TIME_RESOLUTION_MS, TIMES_SUFFIX
from tests.conftest import wait_until
from tests.e2e.test_etcd_log import (  # noqa: F401  (fixtures used by name)
    LOCAL_ONLY,
    TOPIC,
    EtcdCluster,
    Nodes,
    check_identical,
    etcd,
    etcd_cluster,
    groups,
    topic_folder,
)

HOUR_MS = 3_600_000
FAST = 1  # the node whose clock is an hour ahead
#: How far a time may be from the clock around the request that formed it (ms): the clock
#: read when the node put the entry lies between the test's readings before and after.
SLACK_MS = 50


def libfaketime() -> str:
    """The path of libfaketime.so.1 (Debian's faketime package)."""
    listed: list[str] = []
    if shutil.which("dpkg"):
        done = subprocess.run(["dpkg", "-L", "libfaketime"], capture_output=True, text=True,
                              timeout=30)
        listed = [line for line in done.stdout.splitlines()
                  if line.endswith("/libfaketime.so.1")]
    found = listed or sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if not found:
        pytest.fail("libfaketime is required for the cluster time test: apt-get install "
                    "faketime (make test installs it)")
    return found[0]


def fast_clock() -> dict[str, str]:
    """A node's environment with its wall clock an hour ahead. Only the wall clock: the
    monotonic clock, which timeouts, leases and gRPC deadlines are measured with, is left
    alone (FAKETIME_DONT_FAKE_MONOTONIC)."""
    return {"LD_PRELOAD": libfaketime(), "FAKETIME": "+1h", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


async def publish(session: aiohttp.ClientSession, url: str, datas: list[bytes]) -> list[int]:
    """Publish through one node (one message, or a batch as one command); retried while the
    node answers 503 (it did not take the command); returns the messages' indexes."""
    single = len(datas) == 1
    body = datas[0] if single else encode_batch(TOPIC, datas)
    headers = {} if single else {"Content-Type": FRAMES_CONTENT_TYPE}
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        try:
            async with session.post(f"{url}/messaging/messages",
                                    params={"topicID": str(TOPIC)}, data=body,
                                    headers=headers) as resp:
                if resp.status == 200:
                    last = int(resp.headers["X-Broker-Index"])
                    return list(range(last - len(datas) + 1, last + 1))
                assert resp.status == 503, (resp.status, await resp.text())
        except aiohttp.ClientConnectorError:
            pass  # never connected: never sent
        assert asyncio.get_running_loop().time() < deadline, f"{url} took no publish"
        await asyncio.sleep(0.1)


async def node_times(session: aiohttp.ClientSession, url: str) -> dict[int, int | None]:
    """Every message's append time as one node tells it (GET /messaging/times)."""
    async with session.get(f"{url}/messaging/messages", params={"topicID": str(TOPIC)},
                           headers=LOCAL_ONLY) as resp:
        if resp.status != 200:
            return {}
        messages, _used = decode(await resp.read(), after=0)
    async with session.get(f"{url}/messaging/times", params={"topicID": str(TOPIC)},
                           headers=LOCAL_ONLY) as resp:
        if resp.status != 200:
            return {}
        runs = (await resp.json())["runs"]
    out: dict[int, int | None] = {}
    for message in messages:
        covering = [stamp for first, stamp in runs if first <= message.index]
        out[message.index] = covering[-1] if covering else None
    return out


async def agree(session: aiohttp.ClientSession, urls: list[str],
                indexes: list[int]) -> dict[int, int | None]:
    """Wait until every node holds ``indexes`` with the same times; those times."""
    seen: list[dict[int, int | None]] = []

    async def same() -> bool:
        try:
            seen[:] = [await node_times(session, url) for url in urls]
        except aiohttp.ClientError:
            return False
        return set(indexes) <= seen[0].keys() and all(s == seen[0] for s in seen)

    await wait_until(same, timeout=30, what=f"{len(urls)} nodes reporting the same times")
    return seen[0]


async def since(session: aiohttp.ClientSession, url: str, moment: int) -> list[int]:
    async with session.get(f"{url}/messaging/messages", headers=LOCAL_ONLY,
                           params={"topicID": str(TOPIC), "since": str(moment)}) as resp:
        assert resp.status == 200, await resp.text()
        messages, _used = decode(await resp.read(), after=0)
    return [m.index for m in messages]


def time_files(data: Path) -> dict[str, bytes]:
    folder = topic_folder(data)
    return {f.name: f.read_bytes() for f in sorted(folder.glob("*" + TIMES_SUFFIX))}


async def check_same_files(nodes: Nodes) -> None:
    """Segments and time indexes byte for byte alike on every node."""
    await check_identical(nodes)
    files = [await asyncio.to_thread(time_files, nodes.data(i)) for i in range(3)]
    assert files[0] and all(other == files[0] for other in files[1:]), "time indexes differ"


async def test_a_node_an_hour_ahead_gives_every_node_the_same_times(
        etcd: EtcdCluster, broker_process, tmp_path: Path) -> None:  # noqa: F811
    nodes = Nodes(broker_process, tmp_path, etcd, "--max-segment-size", "1K")
    await nodes.start(0, 2)
    await nodes.start(FAST, env=fast_clock())
    a, fast, c = nodes.urls
    bursts: dict[str, tuple[list[int], int, int]] = {}  # name: indexes, clock before, after
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:

        async def burst(name: str, url: str, count: int) -> None:
            before = now_ms()
            indexes = await publish(session, url, [f"{name} {k} ".encode() * 8
                                                   for k in range(count)])
            bursts[name] = (indexes, before, now_ms())
            await asyncio.sleep(3 * TIME_RESOLUTION_MS / 1000)  # the next burst is later

        await burst("a1", a, 10)
        await burst("c1", c, 1)
        await burst("a2", a, 1)
        nodes.kill(2)  # down while the fast node writes: it replays all of that later
        await burst("fast1", fast, 10)  # the fast clock: an hour ahead
        await burst("a3", a, 1)  # held at the fast node's time
        await burst("fast2", fast, 1)  # its clock moved on: a time of its own
        await burst("a4", a, 10)
        await nodes.start(2)
        await burst("c2", c, 1)
        times = await agree(session, nodes.urls, published(bursts))

        def of(name: str) -> list[int | None]:
            return [times[i] for i in bursts[name][0]]

        assert None not in times.values(), times
        ordered = [times[i] or 0 for i in sorted(times)]
        assert ordered == sorted(ordered), "times decrease in index order"
        for name in ("a1", "c1", "a2"):  # the ordinary clocks before the fast node spoke
            _indexes, before, after = bursts[name]
            assert len(set(of(name))) == 1, name  # one command: one time
            assert before - SLACK_MS <= (of(name)[0] or 0) <= after + SLACK_MS, name
        fast1 = of("fast1")[0] or 0
        _indexes, before, after = bursts["fast1"]
        assert before + HOUR_MS - SLACK_MS <= fast1 <= after + HOUR_MS + SLACK_MS
        assert set(of("fast1")) == {fast1}
        assert of("a3") == [fast1], "a later command from a slower clock went back in time"
        fast2 = of("fast2")[0] or 0
        assert fast2 >= fast1 + TIME_RESOLUTION_MS
        assert set(of("a4")) == {fast2} and of("c2") == [fast2]
        # Seeking by time agrees on every node, the fast node's hour included.
        for url in nodes.urls:
            assert await since(session, url, fast1) == sorted(
                i for i, stamp in times.items() if (stamp or 0) >= fast1)
            assert (await since(session, url, fast1 + 1))[:1] == bursts["fast2"][0][:1]
            assert await since(session, url, (of("a2")[0] or 0) + 1) == sorted(
                bursts["fast1"][0] + bursts["a3"][0] + bursts["fast2"][0] + bursts["a4"][0]
                + bursts["c2"][0])
        await check_same_files(nodes)

        # Killed -9 and started again, each node replays from its checkpoint: same times.
        for i in (0, FAST):
            nodes.kill(i)
            await nodes.start(i, **({"env": fast_clock()} if i == FAST else {}))
            await burst(f"after restart {i}", nodes.url(i), 1)
            again = await agree(session, nodes.urls, published(bursts))
            assert {i: again[i] for i in times} == times
        assert [again[i] for i in bursts["after restart 0"][0]] == [fast2]
        last = again[bursts[f"after restart {FAST}"][0][0]] or 0
        assert last >= fast2 + TIME_RESOLUTION_MS  # the fast node's clock, later still
        await check_same_files(nodes)
        diagnostics = [await _diagnostics(session, url) for url in nodes.urls]
        assert {d["time"] for d in diagnostics} == {last}


def published(bursts: dict[str, tuple[list[int], int, int]]) -> list[int]:
    return [index for indexes, _before, _after in bursts.values() for index in indexes]


async def _diagnostics(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(f"{url}/messaging/diagnostics") as resp:
        result: dict[str, Any] = await resp.json()
    return result
