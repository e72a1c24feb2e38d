"""Reads over the store and the disk give what the disk alone gave: frames, limits and ends,
counts, seeks by time and times; local retention under a reader sends it back to the store;
a corrupt object is an error naming it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from messaging.broker.broker import Broker
from messaging.frames import decode
from messaging.objects.errors import ObjectCorruptError
from messaging.tiered.view import TieredTopic
from messaging.topic.topic import Topic
from tests.conftest import StartServer, wait_until

TOPIC = 3


async def fill(start_server: StartServer, tmp_path: Path, count: int = 400, *,
               segment: int = 2048, repeat: int = 10) -> tuple[Any, Broker, Path]:
    """A broker with a file:// store whose topic's closed segments are all in the store and
    still on the disk (local retention above the topic's size)."""
    store = tmp_path / "store"
    store.mkdir()
    server = await start_server(object_store=f"file://{store}", max_segment_size=segment,
                                local_retention_size=1 << 30, truncation_interval=3600)
    async with aiohttp.ClientSession() as http:
        for k in range(count):
            if k % 50 == 0:
                await asyncio.sleep(0.15)  # a new append time now and then
            async with http.post(f"{server.url}/messaging/messages",
                                 params={"topicID": str(TOPIC)},
                                 data=f"m{k:04d}".encode() * repeat) as resp:
                assert resp.status == 200
            if k % 7 == 0:  # another topic takes indexes in between
                async with http.post(f"{server.url}/messaging/messages",
                                     params={"topicID": "99"}, data=b"x") as resp:
                    assert resp.status == 200
    broker = server.broker
    assert broker is not None
    topic = broker.store.get(TOPIC)
    assert topic is not None

    async def all_closed_offloaded() -> bool:
        return broker.manifest(TOPIC).offloaded == topic.segments()[-2].committed_last_index

    await wait_until(all_closed_offloaded, timeout=20)
    return server, broker, store


def local_only(broker: Broker) -> None:
    """Keep only the active segment on the disk."""
    broker.local_retention_size = 0
    broker.enforce_retention()


def drain(reader: Any, size: int = 1000) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    for _ in range(10_000):
        chunk = reader.read(size)
        if not chunk:
            break
        messages, used = decode(chunk)
        assert used == len(chunk)
        out.extend((m.index, bytes(m.data)) for m in messages)
    return out


def answers(topic: Any, indexes: list[int]) -> dict[str, Any]:
    first, middle, last = indexes[0], indexes[len(indexes) // 2], indexes[-1]
    got: dict[str, Any] = {
        "first_index": topic.first_index,
        "all": drain(topic.reader(0)),
        "limit": drain(topic.reader(middle, limit=37)),
        "end": drain(topic.reader(first + 5, end=middle)),
        "count_after": [topic.count_after(i) for i in (0, first, middle, last)],
        "index_after": [topic.index_after(i, n) for i in (0, first + 1, middle)
                        for n in (1, 13, 1000)],
        "before_end": [topic.index_before_end(n) for n in (1, 100, 399, 5000)],
        "time_of": [topic.time_of(i) for i in (first, middle, last)],
    }
    times = [t for t in got["time_of"] if t is not None]
    got["at_time"] = [topic.index_at_time(t) for t in times] + [topic.index_at_time(0)]
    got["times"] = topic.times(0, last)
    return got


@pytest.mark.parametrize("marked", [False, True], ids=["from-byte-0", "from-marks"])
async def test_reads_over_the_store_answer_as_the_disk_did(
        start_server: StartServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        marked: bool) -> None:
    """Small objects are read from their first byte; with marks (a smaller stride than
    the real 1 MiB, and larger segments) a read, count or seek starts at a mark."""
    if marked:
        monkeypatch.setattr("messaging.offload.candidates.MARK_STRIDE", 8192)
        _server, broker, _store = await fill(start_server, tmp_path, segment=64 << 10,
                                             repeat=200)
        assert all(len(o.marks) >= 5 for o in broker.manifest(TOPIC).objects)
    else:
        _server, broker, _store = await fill(start_server, tmp_path)
    local = broker.store.get(TOPIC)
    assert isinstance(local, Topic)
    indexes = [i for i, _d in await asyncio.to_thread(drain, local.reader(0))]
    before = await asyncio.to_thread(answers, local, indexes)
    await asyncio.to_thread(local_only, broker)
    assert local.segment_count <= 2 and local.first_index > indexes[0]
    view = broker.topic(TOPIC)
    assert isinstance(view, TieredTopic)
    after = await asyncio.to_thread(answers, view, indexes)
    assert after == before


async def test_local_retention_under_a_reader_sends_it_back_to_the_store(
        start_server: StartServer, tmp_path: Path) -> None:
    _server, broker, _store = await fill(start_server, tmp_path)
    view = broker.topic(TOPIC)
    assert isinstance(view, TieredTopic)
    expected = await asyncio.to_thread(drain, view.reader(0))
    reader = view.reader(0)
    first = await asyncio.to_thread(reader.read, 300)  # from the disk: all of it is local
    assert first
    await asyncio.to_thread(local_only, broker)  # its segment goes (it is in the store)
    rest = await asyncio.to_thread(drain, reader)
    messages, _used = decode(first)
    got = [(m.index, bytes(m.data)) for m in messages] + rest
    assert got == expected


async def test_a_corrupt_object_is_an_error_naming_it(start_server: StartServer,
                                                      tmp_path: Path) -> None:
    _server, broker, store = await fill(start_server, tmp_path)
    await asyncio.to_thread(local_only, broker)
    obj = broker.manifest(TOPIC).objects[1]
    path = store / obj.name(TOPIC).name
    data = bytearray(path.read_bytes())
    data[40] ^= 0xFF
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))
    view = broker.topic(TOPIC)
    assert view is not None
    with pytest.raises(ObjectCorruptError) as raised:
        await asyncio.to_thread(drain, view.reader(0))
    assert obj.name(TOPIC).name in str(raised.value)
    assert raised.value.status == 500


async def store_read_bytes(http: aiohttp.ClientSession, url: str) -> float:
    """The broker's own reads from the store so far (its metric)."""
    async with http.get(f"{url}/metrics") as resp:
        text = await resp.text()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("messaging_object_store_read_bytes_total"))


async def test_finding_where_a_batch_ends_reads_no_object_it_passes(
        start_server: StartServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``after``/``count`` lookups (a Spark read's planning) over offloaded segments: a count
    that passes whole objects, or ends at an object's last message or at a mark, is answered
    from the manifest without reading the store; one that ends between marks reads from the
    mark before its answer (a chunk of that object), none of the objects it passed."""
    monkeypatch.setattr("messaging.offload.candidates.MARK_STRIDE", 8192)
    server, broker, _store = await fill(start_server, tmp_path, segment=64 << 10, repeat=200)
    local = broker.store.get(TOPIC)
    assert isinstance(local, Topic)
    indexes = [i for i, _d in await asyncio.to_thread(drain, local.reader(0))]
    await asyncio.to_thread(local_only, broker)
    objects = broker.manifest(TOPIC).objects
    assert len(objects) >= 2
    async with aiohttp.ClientSession() as http:
        async def index_after(after: int, count: int) -> tuple[int, float]:
            before = await store_read_bytes(http, server.url)
            async with http.get(f"{server.url}/messaging/topics/{TOPIC}",
                                params={"after": str(after), "count": str(count)}) as resp:
                assert resp.status == 200
                index = (await resp.json())["index"]
            return index, await store_read_bytes(http, server.url) - before

        # Past every object (and the disk): the last message, from the manifest alone.
        assert await index_after(0, 10**9) == (indexes[-1], 0)
        # Exactly through the first object: its last index, from its manifest entry.
        first = objects[0]
        assert await index_after(0, first.count) == (first.last, 0)
        # At a mark of the second object: its index, from the manifest's marks.
        mark_index, _position, mark_ordinal = objects[1].marks[1]
        assert await index_after(0, first.count + mark_ordinal + 1) == (mark_index, 0)
        # Between marks: exact, reading (a cache chunk from) the mark before the answer: of
        # the object that holds it only.
        count = first.count + mark_ordinal + 3
        index, read = await index_after(0, count)
        assert index == indexes[count - 1]
        assert 0 < read <= objects[1].size
