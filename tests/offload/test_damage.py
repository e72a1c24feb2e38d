"""A segment damaged on disk is never uploaded: an object of bad bytes would let every node
delete its own good copy."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from tests.conftest import StartServer

TOPIC = 6


async def test_a_damaged_segment_is_not_uploaded_and_stays(start_server: StartServer,
                                                           tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with aiohttp.ClientSession() as http:
        plain = await start_server(data=data, max_segment_size=2048)
        for k in range(100):
            async with http.post(f"{plain.url}/messaging/messages",
                                 params={"topicID": str(TOPIC)},
                                 data=f"{k:05d}".encode() * 20) as resp:
                assert resp.status == 200
        await plain.stop()
        segments = sorted((data / "topics" / str(TOPIC)).glob("*.seg"))
        damaged = segments[1]
        raw = bytearray(damaged.read_bytes())
        raw[200] ^= 0xFF  # inside the second frame's data: its CRC no longer matches
        damaged.write_bytes(bytes(raw))
        store = tmp_path / "store"
        store.mkdir()
        server = await start_server(data=data, max_segment_size=2048, object_store=f"file://{store}",
                                    local_retention_size=1, truncation_interval=0.2)
        broker = server.broker
        assert broker is not None
        for _ in range(100):
            await asyncio.sleep(0.1)
            if broker.manifest(TOPIC).objects:
                break
        await asyncio.sleep(2.5)  # a few passes
        manifest = broker.manifest(TOPIC)
        first_damaged = int(damaged.stem)
        assert [o.first for o in manifest.objects] == [int(segments[0].stem)]
        assert manifest.covered < first_damaged
        assert damaged.exists()  # its local copy stays
        async with http.get(f"{server.url}/messaging/diagnostics") as resp:
            report = await resp.json()
        error = report["object_store"]["last_error"]
        assert damaged.name in error and "damaged" in error
        async with http.get(f"{server.url}/metrics") as resp:
            metrics = await resp.text()
        assert 'kind="damaged_segment"' in metrics
