"""Exactly once across crashes: kill -9 at every fsync/rename boundary of a group, restart,
retry as a client does, and the frames and the state recorded with them agree.

- Storage: every group of :mod:`tests.e2e.exactly_once_scenario` (native and stream producers,
  create, fork, close, TTL, delete, heartbeats, consumer resets and deletes, several commands
  over two topics, a segment roll) killed before each counted system call, after the last
  one, and half-way through each write; then reopened, the interrupted group retried and the
  rest applied: the final state is exactly that of a run without a crash.
- A real broker process with the Python client retrying by default, including the
  reproduction of the defect this guards against (the segment's fdatasync held, kill -9,
  restart, resend: answered as a duplicate, stored once).
- A 3-node cluster: a node killed at each boundary of a publish, the client retrying through
  another node.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from messaging.broker.broker import ApplyResult, Broker
from messaging.client.client import Client
from messaging.frames import decode
from tests.e2e import exactly_once_scenario as scenario
from tests.faultpoint import read_trace

HERE = Path(__file__).resolve().parent
FAULTPOINT = HERE.parent / "faultpoint.py"


def run_child(data: Path, work: Path, lines_first: bool,
              kill: str = "") -> subprocess.CompletedProcess[str]:
    """Run the scenario in a child process with fault points (tracing; killing at ``kill``)."""
    env = {**os.environ, "FAULT_ROOT": str(data), "FAULT_ARM": str(work / "arm"),
           "FAULT_TRACE": str(work / "trace"), "FAULT_KILL": kill}
    return subprocess.run([sys.executable, str(HERE / "exactly_once_scenario.py"), str(data),
                           "0", "first" if lines_first else "after"], env=env,
                          capture_output=True, text=True, timeout=60)


class Forks:
    """``exactly_once_scenario.py serve`` in a child process: runs of the scenario forked
    from one process that imported everything once (a run is then a fork, not a start)."""

    def __enter__(self) -> Forks:
        self._proc = subprocess.Popen(
            [sys.executable, str(HERE / "exactly_once_scenario.py"), "serve"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        return self

    def run(self, data: Path, work: Path, lines_first: bool, kill: str) -> tuple[int, str]:
        """One run killed at ``kill``: its exit code and standard error."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        way = "first" if lines_first else "after"
        self._proc.stdin.write(f"{data}\t{work}\t{kill}\t{way}\n")
        self._proc.stdin.flush()
        code = int(self._proc.stdout.readline())
        stderr = work / "stderr"
        return code, stderr.read_text() if stderr.exists() else ""

    def __exit__(self, *exc: object) -> None:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.close()
        try:
            self._proc.wait(30)
        finally:
            if self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait(10)
            self._proc.stdout.close()


def state(broker: Broker) -> dict[str, Any]:
    """Everything a client can observe: messages, catalog (producers, streams, forks),
    positions and the broker index."""
    topics = {}
    for topic in broker.topics():
        with topic.reader(topic.first_index) as reader:
            messages, _used = decode(reader.read_all(), after=0)
        topics[topic.id] = [(m.index, m.type, m.data) for m in messages]
    catalog = broker.catalog.saved()
    catalog["streams"] = sorted(catalog["streams"], key=lambda stream: stream["name"])
    return {"index": broker.index, "catalog": catalog,
            "positions": broker.positions.saved(), "topics": topics}


def kill_points(calls: list[tuple[int, str, str, str]]) -> list[str]:
    """Before every counted call, after the last call of each group, half-way through each
    write."""
    points = [str(n) for n, _op, _path, _group in calls]
    points += [f"{n}~" for n, op, _path, _group in calls if op == "write"]
    last_of_group: dict[str, int] = {}
    for n, _op, _path, group in calls:
        last_of_group[group] = n
    points += [f"{n}+" for n in last_of_group.values()]
    return points


Reference = tuple[dict[str, Any], list[str], bool]


@pytest.fixture(scope="module", params=[False, True], ids=["lines-after", "lines-first"])
def reference(request: pytest.FixtureRequest,
              tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """The state after the scenario without a crash, the kill points its trace lists, and
    which way its groups mark their commit (lines after their frames, or lines first)."""
    lines_first: bool = request.param
    work = tmp_path_factory.mktemp("reference")
    done = run_child(work / "data", work, lines_first)
    assert done.returncode == 0, done.stderr
    broker = scenario.open_broker(work / "data", lines_first)
    try:
        expected = state(broker)
    finally:
        broker.close()
    calls = read_trace(work / "trace")
    groups = {group for _n, _op, _path, group in calls}
    assert groups == {str(g) for g in range(1, len(scenario.GROUPS))}, groups
    ops = {op for _n, op, _path, _group in calls}
    assert {"write", "fsync", "fdatasync", "mkdir"} <= ops, ops
    return expected, kill_points(calls), lines_first


def test_every_group_has_boundaries(reference: Reference) -> None:
    expected, points, _lines_first = reference
    assert len(points) > 3 * len(scenario.GROUPS)
    # The scenario did what it says: the stream deleted, the fork alive, consumers gone.
    names = {s["name"] for s in expected["catalog"]["streams"]}
    assert names == {"s", "f"}
    assert expected["positions"] == {"2": {"r2": 1}}
    assert [data for _i, _t, data in expected["topics"][1]][:4] == [b"a0", b"a1", b"a2", b"a3"]


def test_kill_at_every_boundary_then_retry(reference: Reference, tmp_path: Path) -> None:
    expected, points, lines_first = reference
    works = {point: tmp_path / f"kill{point.replace('+', 'p').replace('~', 't')}"
             for point in points}
    for work in works.values():
        work.mkdir()
    # The children are independent (a directory each): forked by two servers at once,
    # then checked in order.
    deaths: dict[str, tuple[int, str]] = {}

    def kill_each(server: Forks, share: list[str]) -> None:
        for point in share:
            deaths[point] = server.run(works[point] / "data", works[point], lines_first, point)

    with Forks() as first, Forks() as second, ThreadPoolExecutor(2) as pool:
        for done in [pool.submit(kill_each, first, points[0::2]),
                     pool.submit(kill_each, second, points[1::2])]:
            done.result()
    for point in points:
        work = works[point]
        data = work / "data"
        code, stderr = deaths.get(point, (0, "not run"))
        assert code == -9, f"kill point {point} was never reached: {stderr}"
        interrupted = int(read_trace(work / "trace")[-1][3])
        broker = scenario.open_broker(data, lines_first)
        try:
            if scenario.plain(interrupted):
                # No producer: the batch is all there or all gone, and sent again if gone.
                held = scenario.present(broker, interrupted)
                assert held in (0, scenario.size(interrupted)), (
                    f"killed at {point}: {held} of {scenario.size(interrupted)} messages of "
                    f"{scenario.GROUPS[interrupted][0]!r} kept")
                if not held:
                    scenario.retry(broker, interrupted)
            else:
                scenario.retry(broker, interrupted)
                # Once more, as a client whose retry's answer was lost too: a producer's is
                # a duplicate, and nothing changes.
                for result in scenario.retry(broker, interrupted):
                    if "producer" in scenario.GROUPS[interrupted][0] and isinstance(
                            result, ApplyResult):  # (a deleted stream's append: not found)
                        assert result.stream is not None and result.stream.duplicate, point
            for group in range(interrupted + 1, len(scenario.GROUPS)):
                scenario.retry(broker, group)
            assert state(broker) == expected, (
                f"killed at {point} during group {interrupted} "
                f"({scenario.GROUPS[interrupted][0]})")
        finally:
            broker.close()
        reopened = scenario.open_broker(data, lines_first)
        try:
            assert state(reopened) == expected, f"after a clean restart (kill point {point})"
        finally:
            reopened.close()


# -- a real broker process, the Python client retrying ---------------------------------------


def faulty_broker(broker_process, data: Path, work: Path, *, port: int = 0,
                  **faults: str) -> Any:
    """A broker process running under tests/faultpoint.py."""
    env = {"FAULT_ROOT": str(data), "FAULT_ARM": str(work / "arm"),
           "FAULT_TRACE": str(work / "trace"), **faults}
    return broker_process(data, port=port, launcher=[sys.executable, str(FAULTPOINT)],
                          env=env)


async def topic_data(session: aiohttp.ClientSession, url: str, topic: int) -> list[bytes]:
    async with session.get(f"{url}/messaging/messages", params={"topicID": str(topic)}) as resp:
        if resp.status == 404:
            return []
        assert resp.status == 200, await resp.text()
        messages, _used = decode(await resp.read(), after=0)
    return [m.data for m in messages]


async def resend(session: aiohttp.ClientSession, url: str, topic: int, producer: str,
                 seq: int, data: bytes) -> aiohttp.ClientResponse:
    async with session.post(f"{url}/messaging/messages", params={"topicID": str(topic)},
                            data=data, headers={"Producer-Id": producer, "Producer-Epoch": "0",
                                                "Producer-Seq": str(seq)}) as resp:
        await resp.read()
        return resp


async def wait_for_trace(path: Path, what: str, timeout: float = 20.0) -> None:
    """Wait until the fault points recorded a call (a broker holding it, or dying at it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not any(what in line for line in
                  (path.read_text().splitlines() if path.exists() else [])):
        assert loop.time() < deadline, f"no {what!r} in {path}"
        await asyncio.sleep(0.02)


async def test_retry_after_a_crash_between_fsync_and_producer_record(
        broker_process, tmp_path: Path) -> None:
    """The reported reproduction: the segment's fdatasync held, the broker killed -9 while
    it waits, restarted; the client's retry of the lost publish is answered as a duplicate or
    stored once, and a raw resend of the same (id, epoch, seq) says duplicate."""
    data, work = tmp_path / "data", tmp_path
    broker = faulty_broker(broker_process, data, work, FAULT_HOLD="fdatasync:.seg").start()
    port = int(broker.url.rsplit(":", 1)[1])
    async with Client([broker.url], producer_id="p1", retry_timeout=30) as client, \
            aiohttp.ClientSession() as session:
        assert await client.publish(1, b"first") == 1
        (work / "arm").touch()
        lost = asyncio.ensure_future(client.publish(1, b"second"))
        await wait_for_trace(work / "trace", "fdatasync")
        broker.kill()
        (work / "arm").unlink()
        restarted = broker_process(data, port=port).start()
        index = await asyncio.wait_for(lost, 30)
        assert await topic_data(session, restarted.url, 1) == [b"first", b"second"]
        again = await resend(session, restarted.url, 1, "p1.1", 1, b"second")
        assert again.status == 200
        assert again.headers.get("X-Broker-Duplicate") == "true"
        assert int(again.headers["X-Broker-Index"]) == index
        assert await topic_data(session, restarted.url, 1) == [b"first", b"second"]
    assert restarted.terminate() == 0


async def test_client_retries_through_a_kill_at_each_boundary(broker_process,
                                                              tmp_path: Path) -> None:
    """A producer publish through the Python client, the broker killed at each boundary of
    its group and restarted on the same port: every message stored once, in order."""
    probe = tmp_path / "probe"
    probe.mkdir()
    traced = faulty_broker(broker_process, probe / "data", probe).start()
    async with Client([traced.url], producer_id="p1") as client:
        await client.publish(1, b"m0")
        (probe / "arm").touch()
        await client.publish(1, b"m1")
        (probe / "arm").unlink()  # what closing writes is no part of the publish
    traced.terminate()
    calls = read_trace(probe / "trace")
    assert {op for _n, op, _path, _group in calls} >= {"write", "fdatasync"}
    # One node under --fsync always writes lines first: the state journal's line (the
    # group's commit mark, with the producer's new seq) is written and fdatasynced, then the
    # frames are written and fdatasynced.
    steps = [(op, str(path)[-4:]) for _n, op, path, _group in calls
             if op in ("write", "fdatasync")]
    assert steps == [("write", ".log"), ("fdatasync", ".log"), ("write", ".seg"),
                     ("fdatasync", ".seg")], steps
    points = [str(n) for n, _op, _p, _g in calls] + [f"{calls[-1][0]}+"]
    for point in points:
        work = tmp_path / f"kill{point.replace('+', 'p')}"
        work.mkdir()
        data = work / "data"
        broker = faulty_broker(broker_process, data, work, FAULT_KILL=point).start()
        port = int(broker.url.rsplit(":", 1)[1])
        async with Client([broker.url], producer_id="p1", retry_timeout=30) as client, \
                aiohttp.ClientSession() as session:
            await client.publish(1, b"m0")
            (work / "arm").touch()
            lost = asyncio.ensure_future(client.publish(1, b"m1"))
            assert broker.proc is not None
            await asyncio.to_thread(broker.proc.wait, 20)
            restarted = broker_process(data, port=port).start()
            await asyncio.wait_for(lost, 30)
            await client.publish(1, b"m2")
            assert await topic_data(session, restarted.url, 1) == [b"m0", b"m1", b"m2"], point
            again = await resend(session, restarted.url, 1, "p1.1", 1, b"m1")
            assert again.headers.get("X-Broker-Duplicate") == "true", point
        assert restarted.terminate() == 0
