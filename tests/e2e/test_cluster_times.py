"""Append times in a 3-node etcd cluster whose clocks disagree (libfaketime).

A command's time is the clock of the node that puts it to etcd, carried inside the entry, so
every node derives the same time for every message, and the state machine never lets it go
back. A node whose clock is more than ``--max-clock-offset`` from its peers' takes no writes
(503 naming its clock, ``/readyz`` says why) until its clock is back, so no message anywhere
gets a time further than the bound from real time: tested with one node's clock moved an hour
ahead and ten seconds back while it runs, and started an hour ahead. Age retention measures
against the log's time, so a node an hour ahead deletes the same segments as the others. A
node killed -9 and started again replays the log from its checkpoint and reports the same
times.
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


def settable_clock(path: Path) -> dict[str, str]:
    """A node's environment with its wall clock offset by what ``path`` holds (``+1h``,
    ``-10s``, ``+0s``), read again at every reading. The monotonic clock, which timeouts,
    leases and gRPC deadlines are measured with, is left alone."""
    return {"LD_PRELOAD": libfaketime(), "FAKETIME_TIMESTAMP_FILE": str(path),
            "FAKETIME_NO_CACHE": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


#: --max-clock-offset (the default).
BOUND_MS = 500


async def refused_for_its_clock(session: aiohttp.ClientSession, url: str,
                                within: float = 10.0) -> str:
    """Publish through ``url`` until it answers 503 for its clock; the error it gives."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        async with session.post(f"{url}/messaging/messages", params={"topicID": str(TOPIC)},
                                data=b"refused?") as resp:
            error = resp.headers.get("X-Broker-Error", "")
            if resp.status == 503 and "clock" in error:
                assert resp.headers.get("Retry-After") == "1"
                return error
            assert resp.status == 200, (resp.status, error)
        assert asyncio.get_running_loop().time() < deadline, f"{url} never refused"
        await asyncio.sleep(0.1)


async def readiness(session: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with session.get(f"{url}/readyz") as resp:
        return resp.status, await resp.json()


async def test_a_clock_too_far_off_takes_no_writes_and_never_moves_the_cluster_time(
        etcd: EtcdCluster, broker_process, tmp_path: Path) -> None:  # noqa: F811
    clock = tmp_path / "clock"
    clock.write_text("+0s\n")
    nodes = Nodes(broker_process, tmp_path, etcd, "--max-segment-size", "1K")
    await nodes.start(0, 2)
    await nodes.start(FAST, env=settable_clock(clock))
    await nodes.wait_ready(0, FAST, 2)
    a, fast, c = nodes.urls
    bursts: dict[str, tuple[list[int], int, int]] = {}  # name: indexes, clock before, after
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:

        async def burst(name: str, url: str, count: int) -> None:
            before = now_ms()
            indexes = await publish(session, url, [f"{name} {k} ".encode() * 8
                                                   for k in range(count)])
            bursts[name] = (indexes, before, now_ms())
            await asyncio.sleep(2 * TIME_RESOLUTION_MS / 1000)  # the next burst is later

        await burst("a1", a, 10)
        await burst("fast1", fast, 5)  # its clock is right yet
        await burst("c1", c, 1)
        clock.write_text("+1h\n")  # stepped an hour ahead while it runs: refused at once
        error = await refused_for_its_clock(session, fast, within=3.0)
        assert "ahead" in error and "--max-clock-offset 500 ms" in error, error
        status, body = await readiness(session, fast)
        assert status == 503 and any("clock" in p for p in body["problems"]), body
        await burst("a2", a, 10)  # the others go on, at real time
        for url in (a, c):
            assert (await readiness(session, url))[0] == 200
        clock.write_text("+0s\n")
        await burst("fast2", fast, 1)  # back within the bound: it serves again by itself
        clock.write_text("-10s\n")  # ten seconds back
        error = await refused_for_its_clock(session, fast, within=3.0)
        assert "back" in error or "behind" in error, error
        await burst("c2", c, 1)
        clock.write_text("+0s\n")
        await burst("fast3", fast, 1)
        # Started an hour ahead: refused from its first publish.
        nodes.kill(FAST)
        clock.write_text("+1h\n")
        await nodes.start(FAST, env=settable_clock(clock))
        async with session.post(f"{fast}/messaging/messages", params={"topicID": str(TOPIC)},
                                data=b"never") as resp:
            assert resp.status == 503 and "clock" in resp.headers["X-Broker-Error"]
            assert "3599." in resp.headers["X-Broker-Error"] or "3600." in resp.headers[
                "X-Broker-Error"]
        await burst("a3", a, 1)
        async with session.get(f"{fast}/messaging/diagnostics") as resp:
            measured = (await resp.json())["clock"]
        assert measured["problem"] and len(measured["peers"]) == 2, measured
        assert all(abs(p["offset_ms"] - HOUR_MS) < 1000 for p in measured["peers"].values())
        nodes.kill(FAST)  # stopped: new messages get real times at once
        await burst("a4", a, 1)
        await burst("c3", c, 1)
        times = await agree(session, [a, c], published(bursts))
        assert None not in times.values(), times
        ordered = [times[i] or 0 for i in sorted(times)]
        assert ordered == sorted(ordered), "times decrease in index order"
        for name, (indexes, before, after) in bursts.items():
            for index in indexes:  # never further than the bound from real time
                stamp = times[index] or 0
                assert before - TIME_RESOLUTION_MS - SLACK_MS <= stamp <= after + SLACK_MS, (
                    name, stamp - before, after - stamp)
        clock.write_text("+0s\n")
        await nodes.start(FAST, env=settable_clock(clock))
        await burst("after restart", fast, 1)
        again = await agree(session, nodes.urls, published(bursts))
        assert {i: again[i] for i in times} == times
        await check_same_files(nodes)


async def test_age_retention_deletes_the_same_segments_on_a_node_an_hour_ahead(
        etcd: EtcdCluster, broker_process, tmp_path: Path) -> None:  # noqa: F811
    """Ages are measured against the log's time: the node whose clock is an hour ahead
    (refused for writes, still applying) deletes the segments the others delete, not every
    segment its own clock finds older than the age."""
    nodes = Nodes(broker_process, tmp_path, etcd)
    await nodes.start(0, 2)
    await nodes.start(FAST, env=fast_clock())
    await nodes.wait_ready(0, 2)
    a = nodes.url(0)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        async with session.put(f"{a}/messaging/topics/{TOPIC}",
                               json={"retention-age": "2s", "max-segment-size": "1K"}) as resp:
            assert resp.status == 201, await resp.text()
        await publish(session, a, [b"old %d " % k * 20 for k in range(40)])
        await asyncio.sleep(2.5)
        last = (await publish(session, a, [b"new %d " % k * 20 for k in range(40)]))[-1]
        await agree(session, nodes.urls, [last])
        kept = []
        for url in nodes.urls:
            async with session.post(f"{url}/messaging/retention") as resp:
                assert resp.status == 200, await resp.text()
            async with session.get(f"{url}/messaging/topics/{TOPIC}",
                                   headers=LOCAL_ONLY) as resp:
                info = await resp.json()
            kept.append((info["first_index"], info["segments"]))
        assert kept[0][0] > 1, "nothing was old enough: the test proves nothing"
        assert kept[1] == kept[0] == kept[2], kept
        await check_same_files(nodes)


def published(bursts: dict[str, tuple[list[int], int, int]]) -> list[int]:
    return [index for indexes, _before, _after in bursts.values() for index in indexes]


async def _diagnostics(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(f"{url}/messaging/diagnostics") as resp:
        result: dict[str, Any] = await resp.json()
    return result
