"""Storage faults as clients see them, over real sockets: 507, 503, 500, and reads that go on."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import aiohttp
import pytest

from messaging.message import FRAMES_CONTENT_TYPE, HEADER_SIZE, decode, encode_batch
from messaging.segment import segment_name
from messaging.server import BrokerServer
from tests.conftest import StartServer
from tests.faults import Faults, inject

FRAMES = {"Content-Type": FRAMES_CONTENT_TYPE}


async def post(http: aiohttp.ClientSession, server: BrokerServer, topic: int,
               data: bytes) -> aiohttp.ClientResponse:
    async with http.post(f"{server.url}/messaging/messages", params={"topicID": str(topic)},
                         data=data) as resp:
        await resp.read()
        return resp


async def read_all(http: aiohttp.ClientSession, server: BrokerServer, topic: int,
                   index: int = 0) -> list[tuple[int, bytes]]:
    async with http.get(f"{server.url}/messaging/messages",
                        params={"topicID": str(topic), "index": str(index)}) as resp:
        assert resp.status == 200, resp.headers.get("X-Broker-Error")
        return [(m.index, m.data) for m in decode(await resp.read(), after=0)[0]]


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_disk_full_is_507_reads_go_on_and_publishing_resumes(
        start_server: StartServer, http: aiohttp.ClientSession,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    server = await start_server()
    assert (await post(http, server, 1, b"stored")).status == 200
    with inject(monkeypatch, Faults(tmp_path, write_budget=10)) as faults:
        for _ in range(5):
            resp = await post(http, server, 1, b"refused" * 10)
            assert resp.status == 507
            assert "disk full" in resp.headers["X-Broker-Error"]
        assert await read_all(http, server, 1) == [(1, b"stored")]
        faults.heal()
        resp = await post(http, server, 1, b"space is back")
        assert resp.status == 200 and resp.headers["X-Broker-Index"] == "2"
    assert await read_all(http, server, 1) == [(1, b"stored"), (2, b"space is back")]
    async with http.get(f"{server.url}/metrics") as resp:
        assert 'messaging_write_failures_total{reason="disk_full"} 5.0' in await resp.text()


async def test_failed_fsync_is_503_until_restart(
        start_server: StartServer, http: aiohttp.ClientSession,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    server = await start_server()
    assert (await post(http, server, 1, b"stored")).status == 200
    with inject(monkeypatch, Faults(tmp_path, sync_failures=1)):
        resp = await post(http, server, 1, b"never visible")
        assert resp.status == 503
        assert "fsync failed" in resp.headers["X-Broker-Error"]
    resp = await post(http, server, 1, b"still refused")
    assert resp.status == 503 and "restart" in resp.headers["X-Broker-Error"]
    assert (await post(http, server, 2, b"another topic")).status == 200
    async with http.get(f"{server.url}/messaging/diagnostics") as resp:
        topics = {t["id"]: t for t in (await resp.json())["topics"]}
    assert topics[1]["writable"] is False and topics[2]["writable"] is True
    assert await read_all(http, server, 1) == [(1, b"stored")]
    data = server.config.data
    await server.stop()
    restarted = await start_server(data=data)
    assert await read_all(http, restarted, 1) == [(1, b"stored")]
    resp = await post(http, restarted, 1, b"after restart")
    assert resp.status == 200 and resp.headers["X-Broker-Index"] == "3"


async def damaged_broker(start_server: StartServer, http: aiohttp.ClientSession,
                         flip_frame: int) -> tuple[BrokerServer, list[tuple[int, bytes]]]:
    """A broker whose first (older) segment has a flipped bit in frame ``flip_frame``."""
    server = await start_server(max_segment_size=4096)
    datas = [f"message {n:03d}".encode() * 8 for n in range(60)]
    async with http.post(f"{server.url}/messaging/messages", data=encode_batch(1, datas),
                         headers=FRAMES) as resp:
        assert resp.status == 200
    data = server.config.data
    await server.stop()
    first = data / "topics" / "1" / segment_name(1)
    raw = bytearray(first.read_bytes())
    frame = HEADER_SIZE + len(datas[0])
    raw[flip_frame * frame + HEADER_SIZE + 5] ^= 0x40
    first.write_bytes(raw)
    return await start_server(data=data), list(zip(range(1, 61), datas, strict=True))


async def test_damage_at_the_start_of_an_older_segment_is_a_500(
        start_server: StartServer, http: aiohttp.ClientSession) -> None:
    server, _expected = await damaged_broker(start_server, http, flip_frame=0)
    async with http.get(f"{server.url}/messaging/messages", params={"topicID": "1"}) as resp:
        assert resp.status == 500
        message = resp.headers["X-Broker-Error"]
    assert "topic 1" in message and segment_name(1) in message and "byte 0" in message
    async with http.get(f"{server.url}/metrics") as resp:
        assert 'messaging_corrupt_frames_total{topic="1"} 1.0' in await resp.text()


async def test_frames_before_the_damage_are_delivered(
        start_server: StartServer, http: aiohttp.ClientSession) -> None:
    server, expected = await damaged_broker(start_server, http, flip_frame=10)
    received = b""
    with pytest.raises(aiohttp.ClientPayloadError):
        async with http.get(f"{server.url}/messaging/messages",
                            params={"topicID": "1"}) as resp:
            assert resp.status == 200
            async for chunk in resp.content.iter_any():
                received += chunk
    messages, _used = decode(received, after=0)
    assert [(m.index, m.data) for m in messages] == expected[:10]
    # Reads that start after the damaged segment are not affected.
    later = await read_all(http, server, 1, index=40)
    assert later == [item for item in expected if item[0] >= 40]


async def test_failing_and_abandoned_reads_leak_no_descriptors(
        start_server: StartServer, http: aiohttp.ClientSession) -> None:
    server, _expected = await damaged_broker(start_server, http, flip_frame=0)
    for _ in range(5):  # warm up pools and executor threads
        async with http.get(f"{server.url}/messaging/messages",
                            params={"topicID": "1"}) as resp:
            await resp.read()
    before = open_descriptors()
    for _ in range(200):
        async with http.get(f"{server.url}/messaging/messages",
                            params={"topicID": "1"}) as resp:
            assert resp.status == 500
            await resp.read()
    for _ in range(50):  # streams the client walks away from mid-way
        async with http.get(f"{server.url}/messaging/messages",
                            params={"topicID": "1", "index": "40",
                                    "streaming": "true"}) as resp:
            assert resp.status == 200
            await resp.content.read(10)
    await asyncio.sleep(0.2)  # let the server notice the closed connections
    assert open_descriptors() <= before + 5
