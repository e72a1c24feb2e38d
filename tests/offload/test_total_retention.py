"""Total retention with an object store: max-topic-size counts the store and the disk, the
oldest objects go through the log (and out of the store), and a live subscriber holds them
back as it holds local segments back."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import aiohttp

from messaging.frames import decode
from messaging.headers import INDEX_HEADER
from tests.conftest import StartServer, wait_until

TOPIC = 4
LIMIT = 16 << 10


async def test_total_retention_reaches_into_the_store(start_server: StartServer,
                                                      tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    server = await start_server(object_store=f"file://{store}", max_segment_size=2048,
                                local_retention_size=4096, max_topic_size=LIMIT,
                                subscriber_timeout=3.0, truncation_interval=0.2,
                                object_sweep_grace=1.0)
    broker = server.broker
    assert broker is not None
    async with aiohttp.ClientSession() as http:
        async def post(k: int) -> int:
            async with http.post(f"{server.url}/messaging/messages",
                                 params={"topicID": str(TOPIC)},
                                 data=f"{k:05d}".encode() * 20) as resp:
                assert resp.status == 200
                return int(resp.headers[INDEX_HEADER])

        async def heartbeat(index: int) -> None:
            async with http.post(f"{server.url}/messaging/heartbeat",
                                 params={"topicID": str(TOPIC), "index": str(index),
                                         "url": "slow"}) as resp:
                assert resp.status == 200

        first = await post(0)
        await heartbeat(first)
        for k in range(1, 600):  # about 4 times the limit
            await post(k)
            if k % 50 == 0:
                await heartbeat(first)  # live: it still needs everything after ``first``
        await heartbeat(first)

        def stored_bytes() -> int:
            total = 0
            for path in store.rglob("*.seg"):
                with contextlib.suppress(FileNotFoundError):  # deleted since it was listed
                    total += path.stat().st_size
            return total

        # Held back by the subscriber (heartbeating all the while): nothing after its
        # position goes, however far above the limit the topic is.
        for _ in range(100):
            await heartbeat(first)
            if broker.manifest(TOPIC).size > 2 * LIMIT:
                break
            await asyncio.sleep(0.2)
        for _ in range(5):
            await heartbeat(first)
            await asyncio.sleep(0.3)
        assert broker.manifest(TOPIC).size > 2 * LIMIT
        assert broker.manifest(TOPIC).expired <= first
        assert broker.manifest(TOPIC).first_index <= first + 1
        # Once it is silent longer than --subscriber-timeout, the limit applies to the
        # store too, through the log, and the objects leave the store.
        async def within_limit() -> bool:
            manifest = broker.manifest(TOPIC)
            local = broker.store.get(TOPIC)
            assert local is not None
            return (manifest.expired > first and manifest.size + local.size <= LIMIT + 4096
                    and stored_bytes() == manifest.size)

        await wait_until(within_limit, timeout=30, what="total retention in the store")
        manifest = broker.manifest(TOPIC)
        async with http.get(f"{server.url}/messaging/messages",
                            params={"topicID": str(TOPIC), "index": str(first)}) as resp:
            assert resp.status == 410
            assert f"first available index is {manifest.first_index}" in \
                resp.headers["X-Broker-Error"]
        async with http.get(f"{server.url}/messaging/topics/{TOPIC}") as resp:
            info = await resp.json()
        assert info["first_index"] == manifest.first_index
        async with http.get(f"{server.url}/messaging/messages",
                            params={"topicID": str(TOPIC),
                                    "index": str(info["first_index"])}) as resp:
            assert resp.status == 200
            messages, _used = decode(await resp.read())
        datas = [bytes(m.data) for m in messages]
        assert datas[-1] == b"00599" * 20
        ks = [int(d[:5]) for d in datas]
        assert ks == list(range(ks[0], 600))  # no gap after what expired


async def _true(value: bool) -> bool:
    return value
