"""A broker with a file:// object store: upload, local retention, reads over both."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from messaging.frames import decode
from messaging.http.server import BrokerServer
from tests.conftest import StartServer, wait_until


async def publish(http: aiohttp.ClientSession, url: str, topic: int, data: bytes) -> None:
    async with http.post(f"{url}/messaging/messages", params={"topicID": str(topic)},
                         data=data) as resp:
        assert resp.status == 200, await resp.text()


async def read_all(http: aiohttp.ClientSession, url: str, topic: int,
                   index: int = 0) -> list[tuple[int, bytes]]:
    async with http.get(f"{url}/messaging/messages",
                        params={"topicID": str(topic), "index": str(index)}) as resp:
        assert resp.status == 200, (resp.status, resp.headers.get("X-Broker-Error"))
        body = await resp.read()
    messages, used = decode(body)
    assert used == len(body)
    return [(m.index, bytes(m.data)) for m in messages]


async def test_offload_and_read_back(start_server: StartServer, tmp_path: Path,
                                     http: aiohttp.ClientSession) -> None:
    store = tmp_path / "store"
    store.mkdir()
    server: BrokerServer = await start_server(
        object_store=f"file://{store}", max_segment_size=2048, local_retention_size=4096,
        truncation_interval=0.2)
    sent = []
    for k in range(300):
        data = f"message {k:05d} ".encode() * 6
        await publish(http, server.url, 7, data)
        sent.append(data)
    broker = server.broker
    assert broker is not None

    async def offloaded() -> bool:
        topic = broker.store.get(7)
        return (len(broker.manifest(7).objects) > 5 and topic is not None
                and topic.first_index > broker.manifest(7).first_index)

    await wait_until(offloaded, timeout=20)
    got = await read_all(http, server.url, 7)
    assert [d for _i, d in got] == sent
    indexes = [i for i, _d in got]
    assert indexes == sorted(indexes) and len(set(indexes)) == len(indexes)
    # from the middle of the store
    middle = indexes[len(indexes) // 3]
    assert [i for i, _d in await read_all(http, server.url, 7, middle)] == \
        indexes[len(indexes) // 3:]
    await asyncio.sleep(0)
