"""The fan-out: every parked stream gets every commit, in order, across slices and rolls."""

from __future__ import annotations

import asyncio

import aiohttp

from messaging.message import BatchDecoder
from messaging.server import BrokerServer
from tests.conftest import StartServer, wait_until


async def follow(session: aiohttp.ClientSession, server: BrokerServer, count: int,
                 ready: asyncio.Event, connected: list[int]) -> list[bytes]:
    got: list[bytes] = []
    decoder = BatchDecoder(after=0)
    async with session.get(f"{server.url}/messaging/messages",
                           params={"topicID": "1", "streaming": "true"}) as resp:
        assert resp.status == 200
        connected.append(1)
        await ready.wait()
        async for data in resp.content.iter_any():
            got.extend(m.data for batch in decoder.feed(data) for m in batch.messages())
            if len(got) >= count:
                break
    return got


async def test_every_parked_stream_gets_every_commit_in_order(start_server: StartServer,
                                                              ) -> None:
    server = await start_server(max_segment_size=2000)  # rolls every few commits
    streams, count = 150, 40  # more streams than one slice of the fan-out writes
    ready = asyncio.Event()
    connected: list[int] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=60)) as session:
        followers = [asyncio.ensure_future(follow(session, server, count, ready, connected))
                     for _ in range(streams)]

        async def all_connected() -> bool:
            return len(connected) == streams

        await wait_until(all_connected, timeout=30, what="every stream connected")
        ready.set()
        for n in range(count):
            async with session.post(f"{server.url}/messaging/messages",
                                    params={"topicID": "1"}, data=b"m%03d" % n * 20) as resp:
                assert resp.status == 200
        results = await asyncio.wait_for(asyncio.gather(*followers), 60)
    expected = [b"m%03d" % n * 20 for n in range(count)]
    assert all(got == expected for got in results)
