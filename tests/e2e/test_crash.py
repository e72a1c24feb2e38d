"""Crash safety with a real broker process: SIGKILL under load, damaged tails, SIGTERM, and
heartbeats that survive a kill (start-up failures are tests/e2e/test_cli.py)."""

from __future__ import annotations

import asyncio
import random
import signal
from pathlib import Path

import aiohttp
import pytest

from messaging.frames import FRAMES_CONTENT_TYPE, decode, encode_batch
from messaging.topic.segment import segment_name


async def publisher(session: aiohttp.ClientSession, url: str, topic: int, worker: int,
                    acked: dict[int, tuple[int, bytes]], stop: asyncio.Event) -> None:
    n = 0
    while not stop.is_set() and n < 100_000:
        n += 1
        try:
            if n % 5:
                data = f"w{worker}-m{n}-".encode() + bytes(random.randrange(200))
                async with session.post(f"{url}/messaging/messages",
                                        params={"topicID": str(topic)}, data=data) as resp:
                    if resp.status != 200:
                        return
                    acked[int(resp.headers["X-Broker-Index"])] = (topic, data)
            else:
                datas = [f"w{worker}-b{n}-{k}".encode() for k in range(20)]
                async with session.post(f"{url}/messaging/messages",
                                        data=encode_batch(topic, datas),
                                        headers={"Content-Type": FRAMES_CONTENT_TYPE}) as resp:
                    if resp.status != 200:
                        return
                    result = await resp.json()
                    for k, index in enumerate(range(result["first"], result["last"] + 1)):
                        acked[index] = (topic, datas[k])
        except (TimeoutError, aiohttp.ClientError, ConnectionError):
            return


async def read_topic(session: aiohttp.ClientSession, url: str, topic: int) -> dict[int, bytes]:
    async with session.get(f"{url}/messaging/messages", params={"topicID": str(topic)}) as resp:
        assert resp.status == 200
        body = await resp.read()
    messages, used = decode(body, after=0)
    assert used == len(body)
    return {m.index: m.data for m in messages}


@pytest.mark.parametrize("seed", [1, 2])  # more rounds: tests/e2e/test_batch_atomicity.py
async def test_sigkill_under_load_loses_nothing_acknowledged(broker_process, tmp_path: Path,
                                                             seed: int) -> None:
    rng = random.Random(seed)
    data = tmp_path / "data"
    broker = broker_process(data, "--max-segment-size", "64K").start()
    acked: dict[int, tuple[int, bytes]] = {}
    stop = asyncio.Event()
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        workers = [asyncio.ensure_future(publisher(session, broker.url, 1 + w % 3, w, acked, stop))
                   for w in range(8)]
        await asyncio.sleep(rng.uniform(0.3, 1.5))
        broker.kill()  # SIGKILL at a random moment, publishes in flight
        await asyncio.wait_for(asyncio.gather(*workers), 30)
    assert len(acked) > 50, "the load never got going"

    restarted = broker_process(data).start()
    async with aiohttp.ClientSession(timeout=timeout) as session:
        stored: dict[int, tuple[int, bytes]] = {}
        for topic in (1, 2, 3):
            for index, payload in (await read_topic(session, restarted.url, topic)).items():
                assert index not in stored
                stored[index] = (topic, payload)
        missing = [i for i in acked if stored.get(i) != acked[i]]
        assert not missing, f"{len(missing)} acknowledged messages lost or changed: {missing[:5]}"
        async with session.post(f"{restarted.url}/messaging/messages", params={"topicID": "1"},
                                data=b"after restart") as resp:
            assert resp.status == 200
            assert int(resp.headers["X-Broker-Index"]) > max(stored)
    assert restarted.terminate() == 0


@pytest.mark.parametrize("damage", ["truncate", "flip"])
async def test_damaged_tail_is_cut_and_reported(broker_process, tmp_path: Path,
                                                damage: str) -> None:
    data = tmp_path / "data"
    broker = broker_process(data).start()
    async with aiohttp.ClientSession() as session:
        for i in range(10):
            async with session.post(f"{broker.url}/messaging/messages", params={"topicID": "1"},
                                    data=f"message {i}".encode()) as resp:
                assert resp.status == 200
    assert broker.terminate() == 0
    segment = data / "topics" / "1" / segment_name(1)
    raw = bytearray(segment.read_bytes())
    if damage == "truncate":
        raw = raw[:-5]
    else:
        raw[-3] ^= 0x10
    segment.write_bytes(raw)

    restarted = broker_process(data).start()
    async with aiohttp.ClientSession() as session:
        stored = await read_topic(session, restarted.url, 1)
        assert stored == {i + 1: f"message {i}".encode() for i in range(9)}
        async with session.get(f"{restarted.url}/messaging/diagnostics") as resp:
            stats = (await resp.json())["topics"][0]["stats"]
        assert stats["recovered_truncated_bytes"] > 0
        async with session.get(f"{restarted.url}/metrics") as resp:
            assert "messaging_recovered_truncated_bytes_total 3" in await resp.text()
    assert restarted.terminate() == 0
    assert "truncated" in restarted.log.read_text()


async def test_sigterm_finishes_streams_and_exits_cleanly(broker_process, tmp_path: Path) -> None:
    broker = broker_process(tmp_path / "data").start()
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{broker.url}/messaging/messages", params={"topicID": "1"},
                                data=b"before shutdown") as resp:
            assert resp.status == 200
        async with session.get(f"{broker.url}/messaging/messages",
                               params={"topicID": "1", "streaming": "true"}) as stream:
            first = await asyncio.wait_for(stream.content.readexactly(26 + 15), 10)
            assert decode(first)[0][0].data == b"before shutdown"
            assert broker.proc is not None
            broker.proc.send_signal(signal.SIGTERM)
            rest = await asyncio.wait_for(stream.content.read(), 20)  # the stream ends
            assert rest == b""
    assert broker.proc.wait(20) == 0
    assert "broker stopped" in broker.log.read_text()


@pytest.mark.parametrize("heartbeat", [True, False])
async def test_retention_after_kill_honours_acknowledged_heartbeats(
        broker_process, tmp_path: Path, heartbeat: bool) -> None:
    data = tmp_path / "data"
    options = ("--max-segment-size", "1K", "--max-topic-size", "2K")
    broker = broker_process(data, *options).start()
    async with aiohttp.ClientSession() as session:
        datas = [f"message {n:03d} ".encode() * 8 for n in range(100)]
        async with session.post(f"{broker.url}/messaging/messages",
                                data=encode_batch(1, datas),
                                headers={"Content-Type": FRAMES_CONTENT_TYPE}) as resp:
            assert resp.status == 200
        if heartbeat:
            async with session.post(f"{broker.url}/messaging/heartbeat",
                                    params={"topicID": "1", "index": "10",
                                            "url": "reporter"}) as resp:
                assert resp.status == 200
        broker.kill()  # kill -9 right after the 200: nothing else saved the heartbeat
        broker = broker_process(data, *options).start()
        async with session.post(f"{broker.url}/messaging/retention") as resp:
            deleted = (await resp.json())["deleted_bytes"]
        async with session.get(f"{broker.url}/messaging/messages",
                               params={"topicID": "1", "index": "11"}) as resp:
            if heartbeat:
                assert resp.status == 200
                got = decode(await resp.read(), after=0)[0]
                assert [m.index for m in got] == list(range(11, 101))
            else:  # the control: without the heartbeat, retention does delete that far
                assert deleted > 0 and resp.status == 410
        async with session.get(f"{broker.url}/messaging/topics/1") as resp:
            subscribers = (await resp.json())["subscribers"]
        assert subscribers == ({"reporter": 10} if heartbeat else {})
