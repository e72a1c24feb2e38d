"""Reads after a restart are exact, end to end: a broker process is written over HTTP,
killed (SIGKILL) or stopped (SIGTERM), started again, and read over HTTP; every read must
return exactly what was acknowledged. The same property in process, with a model, is
tests/topic/test_reader.py.
"""

from __future__ import annotations

import asyncio
import random
import re
from pathlib import Path

import aiohttp
import pytest

from messaging.frames import FRAMES_CONTENT_TYPE, Message, decode, encode, encode_many
from tests.topic.test_reader import payload


async def publish_over_http(session: aiohttp.ClientSession, url: str, rng: random.Random,
                            total: int) -> dict[int, list[Message]]:
    """About ``total`` bytes in a few hundred messages over three topics, in single and batch
    POSTs; returns every acknowledged message by topic (indexes from the answers)."""
    by_topic: dict[int, list[Message]] = {1: [], 2: [], 3: []}
    sent = 0
    posts = 0
    while sent < total and posts < 1000:
        posts += 1
        count = 1 if rng.random() < 0.4 else rng.randrange(2, 12)
        batch = []
        for _ in range(count):
            topic = rng.choices((1, 2, 3), weights=(6, 3, 1))[0]
            size = rng.randrange(10, 3000) if rng.random() < 0.3 else rng.randrange(8000, 24000)
            batch.append((topic, payload(rng, size)))
            sent += size
        if count == 1:
            (topic, data), = batch
            async with session.post(f"{url}/messaging/messages",
                                    params={"topicID": str(topic)}, data=data) as resp:
                assert resp.status == 200, await resp.text()
                first = int(resp.headers["X-Broker-Index"])
        else:
            body = b"".join(encode(1, topic, data) for topic, data in batch)
            async with session.post(f"{url}/messaging/messages", data=body,
                                    headers={"Content-Type": FRAMES_CONTENT_TYPE}) as resp:
                assert resp.status == 200, await resp.text()
                answer = await resp.json()
                first = answer["first"]
                assert answer["count"] == count
        for k, (topic, data) in enumerate(batch):
            by_topic[topic].append(Message(first + k, 1, topic, data))
    return by_topic


async def get_frames(session: aiohttp.ClientSession, url: str, topic: int,
                     **params: str) -> tuple[bytes, int]:
    async with session.get(f"{url}/messaging/messages",
                           params={"topicID": str(topic), **params}) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.read(), int(resp.headers["X-Broker-Index"])


def select(messages: list[Message], index: int = 0, end: int | None = None,
           limit: int | None = None) -> list[Message]:
    chosen = [m for m in messages if m.index >= index and (end is None or m.index < end)]
    return chosen if limit is None else chosen[:limit]


def assert_frames(raw: bytes, expected: list[Message], what: str) -> None:
    messages, used = decode(raw, after=0)
    assert [m.index for m in messages] == [m.index for m in expected], what
    assert used == len(raw) and raw == encode_many(expected), what


@pytest.mark.parametrize("stop", ["sigkill", "sigterm"])
@pytest.mark.parametrize("segment_size", ["1500K", "4K"])
async def test_http_reads_after_restart_are_exact(broker_process, tmp_path: Path,
                                                  segment_size: str, stop: str) -> None:
    rng = random.Random(f"{segment_size}-{stop}")
    data = tmp_path / "data"
    broker = broker_process(data, "--max-segment-size", segment_size).start()
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        by_topic = await publish_over_http(session, broker.url, rng, 3_500_000)
    assert sum(len(m.data) for ms in by_topic.values() for m in ms) >= 3_500_000
    assert 150 <= sum(map(len, by_topic.values())) <= 600
    if stop == "sigkill":
        broker.kill()  # every acknowledged message was fsynced: all must be read back
    else:
        assert broker.terminate() == 0
    restarted = broker_process(data, "--max-segment-size", segment_size).start()
    segments = sorted((data / "topics" / "1").glob("*.seg"))
    assert len(segments) >= 2  # reads cross segments the recovery did not index
    if segment_size == "1500K":
        assert segments[0].stat().st_size > 1 << 20  # more than one 1 MiB read chunk
    url = restarted.url
    async with aiohttp.ClientSession(timeout=timeout) as session:
        # First a bounded read, before anything has read (and indexed) the old segments.
        raw, _ = await get_frames(session, url, 1, index="0", end="150")
        assert_frames(raw, select(by_topic[1], end=150), "index=0&end=150, cold")
        for topic, messages in by_topic.items():
            for attempt in range(3):
                raw, last = await get_frames(session, url, topic)
                assert_frames(raw, messages, f"topic {topic}: full read {attempt + 1}")
                assert last == messages[-1].index
        for topic, messages in by_topic.items():
            middle = messages[len(messages) // 2].index
            cases: list[dict[str, int]] = [
                {"index": 0, "end": 150}, {"limit": 1}, {"limit": 7}, {"limit": 100},
                {"index": middle, "limit": 9}, {"index": middle + 1, "end": middle + 60},
                {"index": 0, "end": middle, "limit": 25}, {"index": messages[-1].index + 1},
            ]
            for case in cases:
                raw, _ = await get_frames(session, url, topic,
                                          **{k: str(v) for k, v in case.items()})
                assert_frames(raw, select(messages, **case), f"topic {topic} {case}")
            async with session.get(f"{url}/messaging/topics/{topic}",
                                   params={"after": str(middle), "count": "10"}) as resp:
                info = await resp.json()
            later = select(messages, middle)
            assert info["index"] == later[min(10, len(later)) - 1].index
            # A streaming read with an end in the middle ends by itself.
            async with session.get(f"{url}/messaging/messages", params={
                    "topicID": str(topic), "streaming": "true", "end": str(middle)}) as resp:
                raw = await asyncio.wait_for(resp.read(), 30)
            assert_frames(raw, select(messages, end=middle), f"topic {topic} streaming")
        async with session.get(f"{url}/metrics") as resp:
            assert resp.status == 200
            metrics = await resp.text()
    streamed = re.search(r"^messaging_messages_streamed_total (\S+)$", metrics, re.M)
    assert streamed is not None and float(streamed.group(1)) > 0
    assert restarted.terminate() == 0
    log = restarted.log.read_text()
    assert "Traceback" not in log
    assert "broken off" not in log
