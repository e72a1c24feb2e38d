"""A real full disk: a small tmpfs filled by concurrent publishers, freed, killed, restarted.

Needs root (to mount the tmpfs); CI runs as root. Every acknowledged message is checked byte
for byte with a decoder written here, independent of messaging.frames.
"""

from __future__ import annotations

import asyncio
import os
import random
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from crc32c import crc32c

from messaging.frames import FRAMES_CONTENT_TYPE, encode_batch

_HEADER = struct.Struct(">QIHQI")


def independent_decode(body: bytes) -> list[tuple[int, int, bytes]]:
    """(index, topic, data) of every frame; fails on any damage or a torn tail."""
    out = []
    offset = 0
    while offset < len(body):
        index, crc, _type, topic, length = _HEADER.unpack_from(body, offset)
        end = offset + _HEADER.size + length
        assert end <= len(body), f"torn frame at byte {offset}"
        assert crc32c(body[offset + 12:end]) == crc, f"bad checksum at byte {offset}"
        out.append((index, topic, body[offset + _HEADER.size:end]))
        offset = end
    return out


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs, unmounted at the end."""
    if os.geteuid() != 0:
        pytest.fail("this test needs root: it mounts a small tmpfs to fill a real disk")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


async def publisher(session: aiohttp.ClientSession, url: str, topic: int, worker: int,
                    acked: dict[int, tuple[int, bytes]], refusals: list[int],
                    until_refused: int, deadline: float, requests: int = 20_000) -> None:
    loop = asyncio.get_running_loop()
    rng = random.Random(worker)
    n = 0
    while loop.time() < deadline and n < requests:
        n += 1
        if n % 4:
            data = f"w{worker}-{n}-".encode() + rng.randbytes(rng.randrange(2000))
            async with session.post(f"{url}/messaging/messages", params={"topicID": str(topic)},
                                    data=data) as resp:
                await resp.read()
                if resp.status == 200:
                    acked[int(resp.headers["X-Broker-Index"])] = (topic, data)
                    continue
        else:
            datas = [f"w{worker}-{n}-{k}".encode() * rng.randrange(1, 60) for k in range(20)]
            async with session.post(f"{url}/messaging/messages", data=encode_batch(topic, datas),
                                    headers={"Content-Type": FRAMES_CONTENT_TYPE}) as resp:
                body = await resp.read()
                if resp.status == 200:
                    result = await resp.json()
                    for k, index in enumerate(range(result["first"], result["last"] + 1)):
                        acked[index] = (topic, datas[k])
                    continue
        assert resp.status == 507, (resp.status, body)
        assert "disk full" in resp.headers["X-Broker-Error"]
        refusals.append(resp.status)
        if len(refusals) >= until_refused:
            return


async def stored(session: aiohttp.ClientSession, url: str, topics: list[int],
                 ) -> dict[int, tuple[int, bytes]]:
    out: dict[int, tuple[int, bytes]] = {}
    for topic in topics:
        async with session.get(f"{url}/messaging/messages", params={"topicID": str(topic)}
                               ) as resp:
            assert resp.status == 200
            for index, frame_topic, data in independent_decode(await resp.read()):
                assert frame_topic == topic and index not in out
                out[index] = (topic, data)
    return out


async def test_a_full_disk_loses_nothing_acknowledged(broker_process, small_disk: Path,
                                                      tmp_path: Path) -> None:
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (1 << 20))
    data = small_disk / "data"

    def start():
        process = broker_process(data, "--max-segment-size", "256K")
        process.log = tmp_path / "broker.log"  # not on the full disk
        return process.start()

    broker = start()
    topics = [1, 2, 3, 4]
    acked: dict[int, tuple[int, bytes]] = {}
    refusals: list[int] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        deadline = asyncio.get_running_loop().time() + 40
        await asyncio.gather(*(publisher(session, broker.url, topic, topic, acked, refusals,
                                         40, deadline) for topic in topics))
        assert len(refusals) >= 40, "the disk never filled up"
        assert await stored(session, broker.url, topics) == acked  # reads go on meanwhile

        broker.kill()  # kill -9 while the disk is full: it must start again and serve reads
        broker = start()
        assert await stored(session, broker.url, topics) == acked
        async with session.post(f"{broker.url}/messaging/messages", params={"topicID": "1"},
                                data=b"x" * 4000) as resp:
            assert resp.status == 507

        filler.unlink()  # space comes back: publishing resumes without a restart
        refusals.clear()
        before = len(acked)
        deadline = asyncio.get_running_loop().time() + 20
        await asyncio.gather(*(publisher(session, broker.url, topic, 10 + topic, acked,
                                         refusals, 1, deadline, requests=40)
                               for topic in topics))  # about 250 KB: well within the 1 MiB
        assert refusals == []
        assert len(acked) > before + 100
        broker.kill()
        broker = start()
        assert await stored(session, broker.url, topics) == acked
        broker.terminate()
    log = broker.log.read_text()
    assert "Traceback" not in log
    assert "disk full: no space left" in log
    assert list(data.glob("**/*.tmp")) == []
