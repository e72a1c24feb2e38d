"""Seek and read by time over real sockets: ``since=`` on reads (frames and SSE), ``at=`` on
a topic's description, ``GET /messaging/times``, consumers' ``lag_ms``, and the 400s of bad
times."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from messaging.clock import format_moment, now_ms
from messaging.frames import FRAMES_CONTENT_TYPE, decode, encode_batch
from messaging.http.server import BrokerServer
from tests.conftest import StartServer

Session = aiohttp.ClientSession
#: Longer than the broker's time resolution (100 ms), so two bursts get two times.
PAUSE = 0.15


async def publish(http: Session, server: BrokerServer, topic: int, *datas: bytes) -> list[int]:
    """One request for all of ``datas``: one command, so one append time."""
    async with http.post(f"{server.url}/messaging/messages", data=encode_batch(topic, datas),
                         headers={"Content-Type": FRAMES_CONTENT_TYPE}) as resp:
        assert resp.status == 200
        answer = await resp.json()
    return list(range(answer["first"], answer["last"] + 1, 1))


async def get_json(http: Session, url: str, **params: Any) -> tuple[int, Any, str]:
    async with http.get(url, params={k: str(v) for k, v in params.items()}) as resp:
        body = await resp.json(content_type=None) if resp.status == 200 else None
        return resp.status, body, resp.headers.get("X-Broker-Error", "")


async def read_data(http: Session, server: BrokerServer, **params: Any) -> list[bytes]:
    async with http.get(f"{server.url}/messaging/messages",
                        params={k: str(v) for k, v in params.items()}) as resp:
        assert resp.status == 200, resp.headers.get("X-Broker-Error")
        messages, _ = decode(await resp.read())
    return [m.data for m in messages]


async def two_bursts(http: Session, server: BrokerServer, topic: int = 1,
                     ) -> tuple[list[int], list[int], int]:
    """Messages a1, a2, then (after a pause) b1, b2; returns both bursts' indexes and the
    append time of the second burst."""
    first = await publish(http, server, topic, b"a1", b"a2")
    await asyncio.sleep(PAUSE)
    second = await publish(http, server, topic, b"b1", b"b2")
    _status, times, _ = await get_json(http, f"{server.url}/messaging/times", topicID=topic)
    runs = dict(times["runs"])
    return first, second, runs[second[0]]


async def test_times_gives_every_message_its_append_time(server: BrokerServer,
                                                         http: Session) -> None:
    before = now_ms()
    first, second, later = await two_bursts(http, server)
    status, answer, _ = await get_json(http, f"{server.url}/messaging/times", topicID=1)
    assert status == 200 and answer["topic"] == 1
    assert answer["index"] == first[0] and answer["through"] == second[-1]
    runs = answer["runs"]
    assert [first for first, _ in runs] == sorted(first for first, _ in runs)
    times = [t for _, t in runs]
    assert times == sorted(times) and before <= times[0] and times[-1] <= now_ms()
    assert later - times[0] >= PAUSE * 1000 * 0.9
    # A range: from the second burst, end exclusive.
    status, part, _ = await get_json(http, f"{server.url}/messaging/times", topicID=1,
                                     index=second[0], end=second[1])
    assert (part["index"], part["through"]) == (second[0], second[0])
    assert part["runs"] == [[second[0], later]]


async def test_since_reads_from_the_first_message_at_or_after_it(server: BrokerServer,
                                                                  http: Session) -> None:
    _first, _second, later = await two_bursts(http, server)
    for since in (later, format_moment(later), later - 1 + 1):
        assert await read_data(http, server, topicID=1, since=since) == [b"b1", b"b2"]
    assert await read_data(http, server, topicID=1, since=0) == [b"a1", b"a2", b"b1", b"b2"]
    assert await read_data(http, server, topicID=1, since="1h") == [b"a1", b"a2", b"b1", b"b2"]
    assert await read_data(http, server, topicID=1, since=now_ms() + 60_000) == []
    assert await read_data(http, server, topicID=1, since=later, limit=1) == [b"b1"]


async def test_at_answers_the_index_or_null(server: BrokerServer, http: Session) -> None:
    first, second, later = await two_bursts(http, server)
    url = f"{server.url}/messaging/topics/1"
    assert (await get_json(http, url, at=later))[1]["index"] == second[0]
    assert (await get_json(http, url, at=later + 1))[1]["index"] is None
    assert (await get_json(http, url, at=0))[1]["index"] == first[0]
    assert (await get_json(http, url, at="10m"))[1]["index"] == first[0]
    status, _, error = await get_json(http, url, at="noon")
    assert status == 400 and error.startswith("invalid at 'noon': use an RFC 3339 time")
    status, _, error = await get_json(http, url, at=1, last=1)
    assert status == 400 and "at takes a time" in error


async def test_a_streaming_read_since_the_future_gets_what_comes_next(
        server: BrokerServer, http: Session) -> None:
    await publish(http, server, 1, b"old")
    params = {"topicID": "1", "since": str(now_ms() + 1), "streaming": "true"}
    async with http.get(f"{server.url}/messaging/messages", params=params) as resp:
        assert resp.status == 200
        await asyncio.sleep(PAUSE)
        await publish(http, server, 1, b"new")
        data = await asyncio.wait_for(resp.content.read(26 + 3), 10)
    messages, _ = decode(data)
    assert [m.data for m in messages] == [b"new"]


async def test_a_topic_that_does_not_exist_yet_is_read_from_its_first_message(
        server: BrokerServer, http: Session) -> None:
    params = {"topicID": "9", "since": "1m", "streaming": "true"}
    async with http.get(f"{server.url}/messaging/messages", params=params) as resp:
        assert resp.status == 200
        await publish(http, server, 9, b"first")
        data = await asyncio.wait_for(resp.content.read(26 + 5), 10)
    assert [m.data for m in decode(data)[0]] == [b"first"]


async def test_sse_reads_since(server: BrokerServer, http: Session) -> None:
    _first, second, later = await two_bursts(http, server)
    params = {"topicID": "1", "format": "sse", "since": str(later)}
    async with http.get(f"{server.url}/messaging/messages", params=params) as resp:
        assert resp.status == 200
        seen = b""
        async with asyncio.timeout(10):
            while b"b2" not in seen:
                seen += await resp.content.readany()
    assert b"a1" not in seen and b"a2" not in seen and b"b1" in seen
    assert f"id: {second[0]}".encode() in seen


async def stream_append(http: Session, url: str, *items: object) -> None:
    """One append of JSON ``items`` to a stream (one command: one append time)."""
    async with http.post(url, json=list(items)) as resp:
        assert resp.status in (200, 204), resp.headers.get("X-Broker-Error")


async def stream_get(http: Session, url: str, **params: str) -> tuple[int, Any, Any]:
    async with http.get(url, params=params) as resp:
        body = await resp.json(content_type=None) if resp.status == 200 else None
        return resp.status, body, resp.headers


async def test_durable_streams_read_since_as_native_reads_do(server: BrokerServer,
                                                              http: Session) -> None:
    """``since=T`` on ``/v1/stream`` reads: catch-up, long-poll and SSE start at the first
    message appended at or after T, also through a fork's lineage; with nothing that recent
    the read is up to date at the tail; given with ``offset`` or malformed it is a 400."""
    src = f"{server.url}/v1/stream/timed"
    async with http.put(src, headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 201
    await stream_append(http, src, "a1", "a2")
    await asyncio.sleep(PAUSE)
    await stream_append(http, src, "b1", "b2")
    _status, whole, _ = await stream_get(http, src, offset="-1")
    assert whole == ["a1", "a2", "b1", "b2"]
    topic = (await get_json(http, f"{server.url}/messaging/topics/timed"))[1]["id"]
    runs = dict((await get_json(http, f"{server.url}/messaging/times", topicID=topic))[1]["runs"])
    later = max(runs.values())
    for since in (str(later), format_moment(later)):
        status, body, headers = await stream_get(http, src, since=since)
        assert (status, body) == (200, ["b1", "b2"])
        assert headers["Stream-Up-To-Date"] == "true"
    status, body, _ = await stream_get(http, src, since="1h")
    assert body == ["a1", "a2", "b1", "b2"]
    status, body, headers = await stream_get(http, src, since=str(now_ms() + 60_000))
    assert (status, body, headers["Stream-Up-To-Date"]) == (200, [], "true")
    tail = headers["Stream-Next-Offset"]
    async with http.head(src) as resp:
        assert tail == resp.headers["Stream-Next-Offset"]

    # A fork holds the source's messages before its fork point, then its own.
    fork = f"{server.url}/v1/stream/timed-fork"
    async with http.put(fork, headers={"Content-Type": "application/json",
                                       "Stream-Forked-From": "/v1/stream/timed"}) as resp:
        assert resp.status == 201
    await asyncio.sleep(PAUSE)
    await stream_append(http, src, "c1")  # the source's own, after the fork point
    await stream_append(http, fork, "f1")
    status, body, _ = await stream_get(http, fork, since=str(later))
    assert body == ["b1", "b2", "f1"]
    status, body, _ = await stream_get(http, fork, since=str(later + 1))
    assert body == ["f1"]

    # Long-poll and SSE from a time still to come get what comes next.
    poll = asyncio.ensure_future(stream_get(http, src, since=str(now_ms() + 1), live="long-poll"))
    await asyncio.sleep(PAUSE)
    await stream_append(http, src, "d1")
    status, body, _ = await asyncio.wait_for(poll, 10)
    assert (status, body) == (200, ["d1"])
    async with http.get(src, params={"since": str(later), "live": "sse"}) as resp:
        assert resp.status == 200
        seen = b""
        async with asyncio.timeout(10):
            while b"d1" not in seen:
                seen += await resp.content.readany()
    assert b"a1" not in seen and b"b1" in seen and b"c1" in seen

    for params, error in (({"since": "1m", "offset": "-1"}, "give one of offset and since"),
                          ({"since": "yesterday"}, "invalid since 'yesterday': use an RFC 3339"),
                          ({"live": "long-poll"}, "live=long-poll needs an offset (or since)")):
        async with http.get(src, params=params) as resp:
            assert resp.status == 400
            assert error in resp.headers["X-Broker-Error"], resp.headers["X-Broker-Error"]


@pytest.mark.parametrize(("params", "error"), [
    ({"since": "yesterday"}, "invalid since 'yesterday': use an RFC 3339 time"),
    ({"since": "2026-11-26T10:00:00"}, "give a time zone"),
    ({"since": "-5m"}, "invalid since"),
    ({"since": "99999999999999999999"}, "out of range"),
    ({"since": "1m", "index": "3"}, "give one of index, since and consumer, not index and since"),
    ({"since": "1m", "consumer": "c"}, "not since and consumer"),
])
async def test_bad_times_are_400_naming_the_forms(server: BrokerServer, http: Session,
                                                  params: dict[str, str], error: str) -> None:
    await publish(http, server, 1, b"x")
    for fmt in ("frames", "sse"):
        async with http.get(f"{server.url}/messaging/messages",
                            params={"topicID": "1", "format": fmt, **params}) as resp:
            assert resp.status == 400
            assert error in resp.headers["X-Broker-Error"]


async def test_times_of_a_missing_topic_is_404_and_of_an_empty_range_is_empty(
        server: BrokerServer, http: Session) -> None:
    status, _, error = await get_json(http, f"{server.url}/messaging/times", topicID=4)
    assert status == 404 and "topic 4 not found" in error
    status, _, error = await get_json(http, f"{server.url}/messaging/times")
    assert status == 400 and "topicID" in error
    [index] = await publish(http, server, 4, b"x")
    status, answer, _ = await get_json(http, f"{server.url}/messaging/times", topicID=4,
                                       index=index + 1)
    assert status == 200 and answer["runs"] == []


async def test_consumers_show_how_long_ago_their_first_unread_message_was_appended(
        server: BrokerServer, http: Session) -> None:
    first, _second, later = await two_bursts(http, server)
    for name, index in (("behind", first[-1]), ("caught-up", 10**6)):
        async with http.post(f"{server.url}/messaging/heartbeat",
                             params={"topicID": "1", "index": str(index), "url": name}) as resp:
            assert resp.status == 200
    _status, rows, _ = await get_json(http, f"{server.url}/messaging/consumers")
    by_name = {row["name"]: row for row in rows}
    assert by_name["caught-up"]["lag_ms"] == 0
    lag = by_name["behind"]["lag_ms"]
    assert by_name["behind"]["lag"] == 2
    assert 0 <= now_ms() - later - lag <= 5_000  # measured from the first unread, b1


@pytest.mark.e2e
async def test_retention_by_age_waits_for_a_heartbeated_subscriber(
        start_server: StartServer, http: Session) -> None:
    """Through the API: segments older than --retention-age go when retention runs, never
    past a live subscriber's heartbeat, and a read below them is 410."""
    server = await start_server(max_segment_size=200, retention_age=0.5)
    old = await publish(http, server, 1, *[b"old-%02d" % n * 5 for n in range(12)])
    async with http.get(f"{server.url}/messaging/topics/1") as resp:
        segments = (await resp.json())["segments"]
    assert segments >= 3
    held = old[5]  # the subscriber got this far: it is inside an old segment, not the first
    async with http.post(f"{server.url}/messaging/heartbeat",
                         params={"topicID": "1", "index": str(held), "url": "sub"}) as resp:
        assert resp.status == 200
    await asyncio.sleep(0.7)  # the old messages are older than the age now
    new = await publish(http, server, 1, b"new")

    async def retention() -> int:
        async with http.post(f"{server.url}/messaging/retention") as resp:
            assert resp.status == 200
            deleted: int = (await resp.json())["deleted_bytes"]
            return deleted

    assert await retention() > 0
    _status, info, _ = await get_json(http, f"{server.url}/messaging/topics/1")
    assert old[0] < info["first_index"] <= held  # only whole segments below the heartbeat
    async with http.get(f"{server.url}/messaging/messages",
                        params={"topicID": "1", "index": str(old[0])}) as resp:
        assert resp.status == 410
        assert int(resp.headers["X-Broker-First-Index"]) == info["first_index"]
    async with http.post(f"{server.url}/messaging/heartbeat",
                         params={"topicID": "1", "index": str(new[0]), "url": "sub"}) as resp:
        assert resp.status == 200
    assert await retention() > 0
    _status, info, _ = await get_json(http, f"{server.url}/messaging/topics/1")
    assert info["first_index"] == new[0] and info["segments"] == 1  # the active one stays
    assert await read_data(http, server, topicID=1, index=new[0]) == [b"new"]
