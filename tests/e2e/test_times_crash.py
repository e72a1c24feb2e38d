"""Append times survive kill -9: a real broker process is killed while publishers publish
(single messages and batches) through HTTP; after a restart every acknowledged message is
there with a time (GET /messaging/times), times never decrease in index order, and
``since=`` starts exactly at the first message appended at or after a time."""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from messaging.broker.broker import ApplyResult, Broker
from messaging.frames import FRAMES_CONTENT_TYPE, decode, encode_batch
from messaging.topic.times import TIME_RESOLUTION_MS, TIMES_SUFFIX, decode_records
from tests.e2e.test_crash import publisher, read_topic
from tests.faultpoint import read_trace

TOPICS = (1, 2, 3)


async def times_of(session: aiohttp.ClientSession, url: str, topic: int,
                   indexes: list[int]) -> dict[int, int | None]:
    """The append time of each of ``indexes`` from GET /messaging/times."""
    async with session.get(f"{url}/messaging/times",
                           params={"topicID": str(topic), "index": "0"}) as resp:
        assert resp.status == 200, await resp.text()
        answer = await resp.json()
    runs = [(int(first), stamp) for first, stamp in answer["runs"]]
    assert [first for first, _ in runs] == sorted({first for first, _ in runs}), runs
    out: dict[int, int | None] = {}
    k = 0
    for index in sorted(indexes):
        while k + 1 < len(runs) and runs[k + 1][0] <= index:
            k += 1
        assert runs and runs[k][0] <= index, f"index {index} before the first run {runs[:1]}"
        out[index] = runs[k][1]
    return out


async def read_since(session: aiohttp.ClientSession, url: str, topic: int,
                     since: int) -> list[int]:
    async with session.get(f"{url}/messaging/messages",
                           params={"topicID": str(topic), "since": str(since)}) as resp:
        assert resp.status == 200, await resp.text()
        body = await resp.read()
    messages, used = decode(body, after=0)
    assert used == len(body)
    return [m.index for m in messages]


@pytest.mark.parametrize("seed", [1, 2])
async def test_sigkill_under_load_keeps_every_acknowledged_messages_time(
        broker_process, tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    data = tmp_path / "data"
    started_ms = time.time_ns() // 1_000_000
    broker = broker_process(data, "--max-segment-size", "16K").start()
    acked: dict[int, tuple[int, bytes]] = {}
    stop = asyncio.Event()
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        workers = [asyncio.ensure_future(publisher(session, broker.url, TOPICS[w % 3], w,
                                                   acked, stop))
                   for w in range(8)]
        await asyncio.sleep(rng.uniform(0.5, 1.5))
        broker.kill()  # SIGKILL at a random moment, publishes in flight
        await asyncio.wait_for(asyncio.gather(*workers), 30)
    killed_ms = time.time_ns() // 1_000_000
    assert len(acked) > 50, "the load never got going"

    restarted = broker_process(data).start()
    async with aiohttp.ClientSession(timeout=timeout) as session:
        stored: dict[int, tuple[int, bytes]] = {}
        stamps: dict[int, int | None] = {}
        for topic in TOPICS:
            messages = await read_topic(session, restarted.url, topic)
            for index, payload in messages.items():
                stored[index] = (topic, payload)
            stamps |= await times_of(session, restarted.url, topic, list(messages))
        missing = [i for i in acked if stored.get(i) != acked[i]]
        assert not missing, f"{len(missing)} acknowledged messages lost or changed: {missing[:5]}"
        untimed = [i for i in stored if stamps[i] is None]
        assert not untimed, f"{len(untimed)} messages without a time: {untimed[:5]}"
        ordered = [stamps[i] or 0 for i in sorted(stored)]
        # One broker time for all topics: non-decreasing in index order across them too.
        assert ordered == sorted(ordered), "append times decrease in index order"
        assert started_ms - 1000 <= ordered[0] and ordered[-1] <= killed_ms + 1000
        for topic in TOPICS:
            indexes = sorted(i for i, (t, _d) in stored.items() if t == topic)
            distinct = sorted({stamps[i] or 0 for i in indexes})
            for since in (distinct[len(distinct) // 2], distinct[len(distinct) // 2] + 1,
                          distinct[0], distinct[-1], distinct[0] - 60_000):
                expected = [i for i in indexes if (stamps[i] or 0) >= since]
                assert await read_since(session, restarted.url, topic, since) == expected, since
                async with session.get(f"{restarted.url}/messaging/topics/{topic}",
                                       params={"at": str(since)}) as resp:
                    assert (await resp.json())["index"] == (expected[0] if expected else None)
        # What comes after the restart is appended no earlier than what came before.
        async with session.post(f"{restarted.url}/messaging/messages", params={"topicID": "1"},
                                data=b"after restart") as resp:
            assert resp.status == 200
            index = int(resp.headers["X-Broker-Index"])
        after = await times_of(session, restarted.url, 1, [index])
        assert (after[index] or 0) >= ordered[-1]
    assert restarted.terminate() == 0
    for time_file in (data / "topics").glob("*/*" + TIMES_SUFFIX):
        raw = time_file.read_bytes()
        assert decode_records(raw)[1] == len(raw), f"{time_file} kept a torn tail"


# -- kill -9 at each boundary of a group that changes the time and starts a segment ----------


FAULTPOINT = Path(__file__).resolve().parents[1] / "faultpoint.py"
SEGMENT = "300"  # the second batch fills the first segment and starts another


def faulty_broker(broker_process, data: Path, work: Path, **faults: str) -> Any:
    """A broker process under tests/faultpoint.py (counting calls once ``work/arm`` exists)."""
    env = {"FAULT_ROOT": str(data), "FAULT_ARM": str(work / "arm"),
           "FAULT_TRACE": str(work / "trace"), **faults}
    return broker_process(data, "--max-segment-size", SEGMENT,
                          launcher=[sys.executable, str(FAULTPOINT)], env=env)


async def publish_batch(session: aiohttp.ClientSession, url: str,
                        datas: list[bytes]) -> tuple[int, int]:
    async with session.post(f"{url}/messaging/messages", data=encode_batch(1, datas),
                            headers={"Content-Type": FRAMES_CONTENT_TYPE}) as resp:
        assert resp.status == 200, await resp.text()
        answer = await resp.json()
    return answer["first"], answer["last"]


FIRST = [b"first %d" % k for k in range(3)]
SECOND = [b"second %d " % k + b"s" * 60 for k in range(5)]


async def later_clock(after_ms: int) -> None:
    """Let the wall clock pass the resolution, so the next group's time is a new one."""
    while time.time_ns() // 1_000_000 < after_ms + 3 * TIME_RESOLUTION_MS:
        await asyncio.sleep(0.005)


async def test_kill_at_each_boundary_of_a_timed_group(broker_process, tmp_path: Path) -> None:
    """The second group changes the time (a record appended to the first segment's time
    index) and fills that segment, starting another (a new time index). The broker is
    killed -9 just before each of its system calls, just after the last, and halfway
    through each write; after a restart the first group is there with its time, what is
    there of the second has a later time (and ``since=`` finds it), and no time index keeps
    a torn tail or a record of frames the kill took."""
    probe = tmp_path / "probe"
    probe.mkdir()
    traced = faulty_broker(broker_process, probe / "data", probe).start()
    async with aiohttp.ClientSession() as session:
        await publish_batch(session, traced.url, FIRST)
        await later_clock(time.time_ns() // 1_000_000)
        (probe / "arm").touch()
        await publish_batch(session, traced.url, SECOND)
        (probe / "arm").unlink()  # what closing writes is no part of the group
    traced.terminate()
    calls = read_trace(probe / "trace")
    time_calls = [(op, where) for _n, op, where, _g in calls if where.endswith(TIMES_SUFFIX)]
    assert tuple(op for op, _w in time_calls[:2]) == ("write", "fdatasync"), calls
    assert len({where for _op, where in time_calls}) == 2, "no record in two time indexes"
    points = ([str(n) for n, _op, _p, _g in calls] + [f"{calls[-1][0]}+"]
              + [f"{n}~" for n, op, _p, _g in calls if op == "write"])
    running = asyncio.Semaphore(3)  # a few at once: most of a run is waiting

    async def run(point: str) -> str:
        async with running:
            return await _kill_at(broker_process, tmp_path / f"kill{point}", point)

    outcomes = dict(zip(points, await asyncio.gather(*map(run, points)), strict=True))
    assert {"kept", "lost"} <= set(outcomes.values()), outcomes


async def _kill_at(broker_process, work: Path, point: str) -> str:
    """One run killed at ``point``; what survived of the second group ("kept", "partial",
    "lost")."""
    work.mkdir()
    data = work / "data"
    broker = faulty_broker(broker_process, data, work, FAULT_KILL=point)
    await asyncio.to_thread(broker.start)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
        first, last = await publish_batch(session, broker.url, FIRST)
        before = await times_of(session, broker.url, 1, list(range(first, last + 1)))
        await later_clock(max(stamp or 0 for stamp in before.values()))
        (work / "arm").touch()
        with contextlib.suppress(aiohttp.ClientError):
            await publish_batch(session, broker.url, SECOND)
    assert broker.proc is not None
    assert await asyncio.to_thread(broker.proc.wait, 20) == -signal.SIGKILL, point
    # The restart's recovery, in this process (a broker process is tested above).
    return await asyncio.to_thread(_recovered, data, point, first, before)


def _recovered(data: Path, point: str, first: int, before: dict[int, int | None]) -> str:
    broker = Broker.open(data, max_segment_size=int(SEGMENT))
    try:
        topic = broker.topic(1)
        assert topic is not None
        with topic.reader(topic.first_index) as reader:
            stored = {m.index: m.data for m in decode(reader.read_all(), after=0)[0]}
        stamps = {index: topic.time_of(index) for index in stored}
        assert {i: stored.get(i) for i in before} == {i: FIRST[i - first] for i in before}, point
        assert {i: stamps[i] for i in before} == before, point
        later = sorted(set(stored) - set(before))
        # Never acknowledged: whole, not at all, or (a group cut by the kill between its two
        # segments' writes, or a torn write) its first messages; every one with its time.
        assert [stored[i] for i in later] == SECOND[:len(later)], point
        newest = max(stamp or 0 for stamp in before.values())
        assert all((stamps[i] or 0) >= newest + TIME_RESOLUTION_MS for i in later), point
        assert topic.index_at_time(newest + 1) == (later[0] if later else None), point
        assert broker.time == max(stamp or 0 for stamp in stamps.values()), point
        # A group after the restart is appended after all of them, with a time of its own.
        now = time.time_ns() // 1_000_000
        held = broker.time  # the broker's time moves only a whole step ahead
        expected = now if now >= held + TIME_RESOLUTION_MS else held
        result = broker.write_group([encode_batch(1, [b"after restart"])], durable=True,
                                    times=[now])[0]
        assert isinstance(result, ApplyResult), result
        assert topic.time_of(result.first) == expected >= newest, point
    finally:
        broker.close()
    for time_file in (data / "topics" / "1").glob("*" + TIMES_SUFFIX):
        raw = time_file.read_bytes()
        records, used = decode_records(raw)
        assert used == len(raw), f"{point}: {time_file.name} is torn"
        assert time_file.with_suffix(".seg").exists(), point
        # A record starts a run of messages that are there: none is left of frames the
        # kill took.
        assert {index for index, _t in records} <= {*stored, result.first}, point
    return "kept" if len(later) == len(SECOND) else "partial" if later else "lost"
