"""The sweep: a deleted stream's objects leave the store; an object of a topic this broker
never knew stays (another group's, or something else sharing the prefix)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from tests.conftest import StartServer

STREAM = "swept"


async def test_a_deleted_streams_objects_are_swept(start_server: StartServer,
                                                   tmp_path: Path) -> None:
    store = tmp_path / "store"
    stranger = store / "12345" / f"{1:020d}-{9:020d}-{'ab' * 32}.seg"
    stranger.parent.mkdir(parents=True)
    stranger.write_bytes(b"not ours")
    server = await start_server(object_store=f"file://{store}", max_segment_size=2048,
                                object_sweep_grace=1.0, truncation_interval=0.2)
    broker = server.broker
    assert broker is not None
    url = f"{server.url}/v1/stream/{STREAM}"
    async with aiohttp.ClientSession() as http:
        async with http.put(url, headers={"Content-Type": "text/plain"}) as resp:
            assert resp.status in (200, 201)
        for k in range(120):
            async with http.post(url, data=f"{k:05d}".encode() * 10,
                                 headers={"Content-Type": "text/plain"}) as resp:
                assert resp.status in (200, 204)
        topic = broker.catalog.streams[STREAM].topic
        for _ in range(100):
            if len(broker.manifest(topic).objects) >= 3:
                break
            await asyncio.sleep(0.1)
        assert len(broker.manifest(topic).objects) >= 3
        assert list((store / str(topic)).glob("*.seg"))
        async with http.delete(url) as resp:
            assert resp.status in (200, 204)
        for _ in range(100):
            if not list((store / str(topic)).glob("*")):
                break
            await asyncio.sleep(0.1)
    assert not list((store / str(topic)).glob("*")), "a deleted stream's objects stay"
    assert stranger.exists()
