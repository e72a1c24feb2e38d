"""Every endpoint and error path of the HTTP API, over real sockets: publishing, reading and
streaming, storage faults as clients see them (507, 503, 500, and reads that go on), and
hostile or malformed HTTP over raw sockets (control characters, bad encodings, odd numbers,
and floods of requests aiohttp cannot parse)."""

from __future__ import annotations

import asyncio
import gzip
import io
import logging
import os
import re
import struct
import threading
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from messaging import frames as message_module
from messaging.frames import (
    FRAMES_CONTENT_TYPE,
    HEADER_SIZE,
    BatchDecoder,
    decode,
    encode,
    encode_batch,
)
from messaging.http import app as http_module
from messaging.http.app import RejectionLog, error_response
from messaging.http.server import BrokerServer
from messaging.topic.reader import TopicReader
from messaging.topic.segment import segment_name
from tests.conftest import StartServer, wait_until
from tests.faults import Faults, inject
from tests.raw_http import PRINTABLE_HEADER, body_of, exchange, parse_head, responses

FRAMES = {"Content-Type": FRAMES_CONTENT_TYPE}


async def publish(http: aiohttp.ClientSession, server: BrokerServer, topic: int,
                  data: bytes) -> int:
    async with http.post(f"{server.url}/messaging/messages", params={"topicID": topic},
                         data=data) as resp:
        assert resp.status == 200, await resp.text()
        return int(resp.headers["X-Broker-Index"])


async def read(http: aiohttp.ClientSession, server: BrokerServer, **params) -> list:
    async with http.get(f"{server.url}/messaging/messages",
                        params={k: str(v) for k, v in params.items()}) as resp:
        assert resp.status == 200, await resp.text()
        return decode(await resp.read(), after=0)[0]


async def expect_error(resp: aiohttp.ClientResponse, status: int, fragment: str) -> None:
    assert resp.status == status, await resp.text()
    assert fragment in resp.headers["X-Broker-Error"], resp.headers["X-Broker-Error"]
    assert fragment in await resp.text()


async def test_single_publish_and_read(server: BrokerServer, http: aiohttp.ClientSession) -> None:
    assert await publish(http, server, 1, b"hello") == 1
    assert await publish(http, server, 2, b"") == 2
    assert await publish(http, server, 1, b"world") == 3
    messages = await read(http, server, topicID=1)
    assert [(m.index, m.topic, m.type, m.data) for m in messages] == [
        (1, 1, 1, b"hello"), (3, 1, 1, b"world")]
    assert [m.data for m in await read(http, server, topicID=2, index=0)] == [b""]
    assert [m.index for m in await read(http, server, topicID=1, index=2)] == [3]
    assert [m.index for m in await read(http, server, topicID=1, end=3)] == [1]
    assert [m.index for m in await read(http, server, topicID=1, limit=1)] == [1]


async def test_type_parameter(server: BrokerServer, http: aiohttp.ClientSession) -> None:
    async with http.post(f"{server.url}/messaging/messages",
                         params={"topicID": "5", "type": "42"}, data=b"x") as resp:
        assert resp.status == 200
    assert (await read(http, server, topicID=5))[0].type == 42


async def test_batch_publish(server: BrokerServer, http: aiohttp.ClientSession) -> None:
    body = encode_batch(7, [b"a", b"b", b"c"])
    async with http.post(f"{server.url}/messaging/messages", data=body, headers=FRAMES) as resp:
        assert resp.status == 200
        assert await resp.json() == {"first": 1, "last": 3, "count": 3}
        assert resp.headers["X-Broker-Index"] == "3"
    assert [m.data for m in await read(http, server, topicID=7)] == [b"a", b"b", b"c"]


async def test_corrupt_batch_is_refused_whole(server: BrokerServer,
                                              http: aiohttp.ClientSession) -> None:
    body = bytearray(encode_batch(7, [b"a", b"b", b"c"]))
    body[-1] ^= 0x40
    async with http.post(f"{server.url}/messaging/messages", data=bytes(body),
                         headers=FRAMES) as resp:
        await expect_error(resp, 400, "checksum")
    async with http.post(f"{server.url}/messaging/messages", data=bytes(body[:-1]),
                         headers=FRAMES) as resp:
        await expect_error(resp, 400, "incomplete")
    internal = encode(0x8001, 7, b"x")
    async with http.post(f"{server.url}/messaging/messages", data=internal,
                         headers=FRAMES) as resp:
        await expect_error(resp, 400, "reserved")
    async with http.post(f"{server.url}/messaging/messages", data=encode(1, 8, b"x"),
                         params={"topicID": "7"}, headers=FRAMES) as resp:
        await expect_error(resp, 400, "not topicID 7")
    async with http.post(f"{server.url}/messaging/messages", data=b"", headers=FRAMES) as resp:
        await expect_error(resp, 400, "empty")
    async with http.get(f"{server.url}/messaging/topics") as resp:
        assert await resp.json() == []
    assert server.broker is not None and server.broker.index == 0


@pytest.mark.parametrize(("params", "fragment"), [
    ({}, "missing parameter topicID"),
    ({"topicID": "x"}, "invalid topicID"),
    ({"topicID": "-1"}, "invalid topicID"),
    ({"topicID": str(2**64)}, "invalid topicID"),
    ({"topicID": "1", "type": "abc"}, "invalid type"),
    ({"topicID": "1", "type": "32769"}, "invalid type"),
])
async def test_publish_parameter_errors(server: BrokerServer, http: aiohttp.ClientSession,
                                        params: dict, fragment: str) -> None:
    async with http.post(f"{server.url}/messaging/messages", params=params, data=b"x") as resp:
        await expect_error(resp, 400, fragment)


@pytest.mark.parametrize(("params", "fragment"), [
    ({}, "missing parameter topicID"),
    ({"topicID": "1", "index": "x"}, "invalid index"),
    ({"topicID": "1", "end": "-5"}, "invalid end"),
    ({"topicID": "1", "limit": "many"}, "invalid limit"),
    ({"topicID": "1", "streaming": "maybe"}, "invalid streaming"),
])
async def test_read_parameter_errors(server: BrokerServer, http: aiohttp.ClientSession,
                                     params: dict, fragment: str) -> None:
    async with http.get(f"{server.url}/messaging/messages", params=params) as resp:
        await expect_error(resp, 400, fragment)


async def test_wrong_method_and_unknown_path(server: BrokerServer,
                                             http: aiohttp.ClientSession) -> None:
    async with http.delete(f"{server.url}/messaging/messages") as resp:
        await expect_error(resp, 405, "not allowed")
    async with http.get(f"{server.url}/messaging/heartbeat") as resp:
        await expect_error(resp, 405, "not allowed")
    async with http.get(f"{server.url}/nowhere") as resp:
        await expect_error(resp, 404, "not found")
    async with http.get(f"{server.url}/messaging/topics/12") as resp:
        await expect_error(resp, 404, "topic 12 not found")


async def test_too_large(start_server: StartServer, http: aiohttp.ClientSession) -> None:
    server = await start_server(max_message_size=1000)
    async with http.post(f"{server.url}/messaging/messages", params={"topicID": "1"},
                         data=b"x" * 1001) as resp:
        await expect_error(resp, 413, "exceeds")
    async with http.post(f"{server.url}/messaging/messages", data=encode(1, 1, b"x" * 1001),
                         headers=FRAMES) as resp:
        await expect_error(resp, 413, "exceeds")
    assert await publish(http, server, 1, b"x" * 1000) == 1


async def test_request_body_over_the_request_limit(start_server: StartServer,
                                                   http: aiohttp.ClientSession) -> None:
    server = await start_server(max_message_size=100, max_request_size=4096)
    body = encode_batch(1, [b"y" * 100] * 100)
    async with http.post(f"{server.url}/messaging/messages", data=body, headers=FRAMES) as resp:
        await expect_error(resp, 413, "too large")


async def test_unknown_topic_reads(server: BrokerServer, http: aiohttp.ClientSession) -> None:
    async with http.get(f"{server.url}/messaging/messages", params={"topicID": "9"}) as resp:
        await expect_error(resp, 404, "topic 9 not found")


async def stream(http: aiohttp.ClientSession, server: BrokerServer, topic: int, count: int,
                 index: int = 0) -> list:
    got: list = []
    decoder = BatchDecoder(after=0)
    async with http.get(f"{server.url}/messaging/messages",
                        params={"topicID": str(topic), "index": str(index),
                                "streaming": "true"}) as resp:
        assert resp.status == 200
        async for data in resp.content.iter_any():
            got.extend(m for batch in decoder.feed(data) for m in batch.messages())
            if len(got) >= count:
                return got
    return got


async def test_stream_receives_later_messages(server: BrokerServer,
                                              http: aiohttp.ClientSession) -> None:
    await publish(http, server, 1, b"before")
    task = asyncio.ensure_future(stream(http, server, 1, 3))
    await asyncio.sleep(0.1)
    await publish(http, server, 1, b"after-1")
    await publish(http, server, 2, b"other topic")
    await publish(http, server, 1, b"after-2")
    got = await asyncio.wait_for(task, 10)
    assert [m.data for m in got] == [b"before", b"after-1", b"after-2"]


async def test_stream_of_a_topic_that_does_not_exist_yet(server: BrokerServer,
                                                         http: aiohttp.ClientSession) -> None:
    task = asyncio.ensure_future(stream(http, server, 4, 1))
    await asyncio.sleep(0.1)
    assert not task.done()
    await publish(http, server, 4, b"first")
    assert [m.data for m in await asyncio.wait_for(task, 10)] == [b"first"]


async def test_stream_survives_segment_rolls(start_server: StartServer,
                                             http: aiohttp.ClientSession) -> None:
    server = await start_server(max_segment_size=200)
    task = asyncio.ensure_future(stream(http, server, 1, 40))
    for i in range(40):
        await publish(http, server, 1, f"message {i:03d}".encode())
    got = await asyncio.wait_for(task, 10)
    assert [m.data for m in got] == [f"message {i:03d}".encode() for i in range(40)]
    assert server.broker is not None and server.broker.topic(1).segment_count > 5


async def test_heartbeat_topics_and_count_query(server: BrokerServer,
                                                http: aiohttp.ClientSession) -> None:
    for i in range(5):
        await publish(http, server, 3, f"{i}".encode())
    async with http.post(f"{server.url}/messaging/heartbeat",
                         params={"topicID": "3", "index": "2", "url": "sub-a"}) as resp:
        assert resp.status == 200
    async with http.post(f"{server.url}/messaging/heartbeat",
                         params={"topicID": "3", "index": "2"}) as resp:
        await expect_error(resp, 400, "missing parameter url")
    async with http.get(f"{server.url}/messaging/topics") as resp:
        (topic,) = await resp.json()
    assert topic["id"] == 3 and topic["first_index"] == 1 and topic["last_index"] == 5
    assert topic["subscribers"] == {"sub-a": 2} and topic["segments"] == 1
    async with http.get(f"{server.url}/messaging/topics/3",
                        params={"after": "2", "count": "3"}) as resp:
        assert (await resp.json())["index"] == 4
    async with http.get(f"{server.url}/messaging/topics/3", params={"after": "2"}) as resp:
        await expect_error(resp, 400, "go together")


async def test_ping_diagnostics_metrics(server: BrokerServer, http: aiohttp.ClientSession) -> None:
    await publish(http, server, 1, b"x")
    for method in ("GET", "POST"):
        async with http.request(method, f"{server.url}/messaging/ping") as resp:
            assert await resp.json() == {"urls": [server.url]}
    async with http.get(f"{server.url}/messaging/diagnostics") as resp:
        diagnostics = await resp.json()
    assert diagnostics["index"] == 1 and diagnostics["role"] == "standalone"
    assert diagnostics["topics"][0]["stats"]["recovered_truncated_bytes"] == 0
    async with http.get(f"{server.url}/metrics") as resp:
        text = await resp.text()
    assert "messaging_messages_published_total 1.0" in text
    assert "messaging_publish_latency_seconds_bucket" in text


async def test_read_below_retention_is_gone(start_server: StartServer,
                                            http: aiohttp.ClientSession) -> None:
    server = await start_server(max_segment_size=100, max_topic_size=0)
    for _i in range(10):
        await publish(http, server, 1, b"x" * 60)
    async with http.post(f"{server.url}/messaging/retention") as resp:
        assert (await resp.json())["deleted_bytes"] > 0
    async with http.get(f"{server.url}/messaging/topics/1") as resp:
        first = (await resp.json())["first_index"]
    assert first == 9  # 86-byte frames: two per 100-byte segment, and the active one stays
    async with http.get(f"{server.url}/messaging/messages",
                        params={"topicID": "1", "index": "3"}) as resp:
        await expect_error(resp, 410, f"first available index is {first}")
        assert resp.headers["X-Broker-First-Index"] == str(first)
    assert [m.index for m in await read(http, server, topicID=1, index=first)] == [9, 10]


@pytest.mark.e2e  # over a second: left out of the unit run
async def test_retention_honours_heartbeats_then_timeout(start_server: StartServer,
                                                         http: aiohttp.ClientSession) -> None:
    server = await start_server(max_segment_size=100, max_topic_size=0,
                                subscriber_timeout=1.0)
    for _i in range(10):
        await publish(http, server, 1, b"x" * 60)
    async with http.post(f"{server.url}/messaging/heartbeat",
                         params={"topicID": "1", "index": "4", "url": "reporter"}) as resp:
        assert resp.status == 200
    async with http.post(f"{server.url}/messaging/retention") as resp:
        assert (await resp.json())["deleted_bytes"] > 0
    assert next(m.index for m in await read(http, server, topicID=1, index=5)) == 5
    await asyncio.sleep(1.1)  # the subscriber timeout itself is what is being tested
    async with http.post(f"{server.url}/messaging/retention") as resp:
        assert (await resp.json())["deleted_bytes"] > 0
    async with http.get(f"{server.url}/messaging/messages",
                        params={"topicID": "1", "index": "5"}) as resp:
        assert resp.status == 410


async def test_stalled_reader_does_not_slow_publishers(server: BrokerServer,
                                                       http: aiohttp.ClientSession) -> None:
    payload = b"z" * 60_000
    for _ in range(20):
        await publish(http, server, 1, payload)
    # A reader that asks for a stream and then never reads from its socket.
    _reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /messaging/messages?topicID=1&streaming=true HTTP/1.1\r\n"
                 b"Host: x\r\n\r\n")
    await writer.drain()
    healthy = asyncio.ensure_future(stream(http, server, 1, 220))
    loop = asyncio.get_running_loop()
    started = loop.time()
    for _ in range(200):
        await publish(http, server, 1, payload)
    publish_time = loop.time() - started
    got = await asyncio.wait_for(healthy, 30)
    assert len(got) == 220
    assert publish_time < 30
    assert server.broker is not None
    assert server.broker.metrics.active_streams._value.get() >= 1  # the stalled one is open
    writer.close()


async def test_single_message_post_is_curl_friendly(server: BrokerServer) -> None:
    proc = await asyncio.create_subprocess_exec(
        "curl", "-s", "-i", "-XPOST", f"{server.url}/messaging/messages?topicID=1",
        "--data-binary", "from curl", stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(proc.communicate(), 10)
    assert b"X-Broker-Index: 1" in out
    proc = await asyncio.create_subprocess_exec(
        "curl", "-s", f"{server.url}/messaging/messages?topicID=1", stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(proc.communicate(), 10)
    assert decode(out)[0][0].data == b"from curl"
    assert struct.unpack(">Q", out[:8])[0] == 1


@pytest.mark.parametrize("mode", ["interval", "never"])
async def test_relaxed_fsync_modes(start_server: StartServer, http: aiohttp.ClientSession,
                                   mode: str) -> None:
    server = await start_server(fsync=mode)
    assert await publish(http, server, 1, b"quick") == 1
    assert [m.data for m in await read(http, server, topicID=1)] == [b"quick"]
    async with http.get(f"{server.url}/messaging/diagnostics") as resp:
        assert (await resp.json())["fsync"] == mode
    assert server.broker is not None
    fsyncs = server.broker.metrics.fsyncs

    async def synced() -> bool:
        return bool(fsyncs._value.get() >= 1)

    if mode == "interval":  # the periodic fsync picks the topic up within ~100 ms
        await wait_until(synced, timeout=5, what="the interval fsync")
    else:
        assert fsyncs._value.get() == 0


async def test_stream_overtaken_by_retention_is_broken_off(start_server: StartServer,
                                                           http: aiohttp.ClientSession) -> None:
    server = await start_server(max_segment_size=64 << 10, max_topic_size=0)
    body = encode_batch(1, [b"p" * 1000] * 20_000)  # 20 MB: far more than socket buffers
    async with http.post(f"{server.url}/messaging/messages", data=io.BytesIO(body),
                         headers=FRAMES) as resp:
        assert resp.status == 200
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /messaging/messages?topicID=1&streaming=true HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    await asyncio.sleep(0.3)  # the stream fills the socket buffers and waits for us
    async with http.post(f"{server.url}/messaging/retention") as resp:
        assert (await resp.json())["deleted_bytes"] > 0
    received = 0
    while chunk := await asyncio.wait_for(reader.read(1 << 20), 20):
        received += len(chunk)
    assert received < len(body)  # cut off, not a silent gap
    writer.close()
    async with http.get(f"{server.url}/messaging/messages",
                        params={"topicID": "1", "index": "1"}) as resp:
        assert resp.status == 410


# -- storage faults as clients see them ----------------------------------------------------


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


# -- 7: control characters echoed into X-Broker-Error ------------------------------------------


@pytest.mark.parametrize("escape", ["%00", "%01", "%7F", "%0A", "%0D%0A", "%1B", "%C3%A9"])
async def test_control_characters_in_the_path_get_a_sanitised_404(server: BrokerServer,
                                                                  escape: str) -> None:
    raw = await exchange(server.port, f"GET /nowhere{escape}x HTTP/1.1\r\nHost: t\r\n"
                                      f"Connection: close\r\n\r\n".encode())
    status, headers = parse_head(raw)
    assert status == 404
    message = headers["x-broker-error"]
    assert message.startswith("not found: GET /nowhere") and message.endswith("x")
    assert body_of(raw).decode("ascii") == message + "\n"


async def test_control_characters_in_a_parameter_get_a_sanitised_400(server: BrokerServer,
                                                                     ) -> None:
    raw = await exchange(server.port, b"GET /messaging/topics/1%00%7F HTTP/1.1\r\nHost: t\r\n"
                                      b"Connection: close\r\n\r\n")
    status, headers = parse_head(raw)
    assert status == 400
    assert headers["x-broker-error"] == (r"invalid topic id '1\x00\x7f': "
                                         "expected an unsigned integer")
    raw = await exchange(server.port, b"GET /messaging/messages?topicID=%01 HTTP/1.1\r\n"
                                      b"Host: t\r\nConnection: close\r\n\r\n")
    assert parse_head(raw)[0] == 400


def test_error_response_escapes_every_non_printable_character() -> None:
    message = "".join(map(chr, range(256))) + "\u2028\U0001f600"
    response = error_response(400, message)
    header = response.headers["X-Broker-Error"]
    assert PRINTABLE_HEADER.fullmatch(header.encode("ascii"))
    assert response.text == header + "\n"
    assert r"\x00" in header and r"\x7f" in header and r"\u2028" in header
    assert "".join(map(chr, range(32, 127))) in header  # printable ASCII kept as is


# -- 8: bodies that do not decode, numbers int() would take ---------------------------------


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_body_that_does_not_match_its_content_encoding_is_400(
        server: BrokerServer, http: aiohttp.ClientSession, encoding: str) -> None:
    for content_type in ("application/octet-stream", "application/x-messaging-frames"):
        async with http.post(f"{server.url}/messaging/messages", params={"topicID": "1"},
                             data=b"this is not compressed",
                             headers={"Content-Encoding": encoding,
                                      "Content-Type": content_type}) as resp:
            assert resp.status == 400, await resp.text()
            assert f"not valid {encoding} data" in resp.headers["X-Broker-Error"]
    assert server.broker is not None and server.broker.index == 0


async def test_gzip_body_is_decoded(server: BrokerServer, http: aiohttp.ClientSession) -> None:
    async with http.post(f"{server.url}/messaging/messages", params={"topicID": "1"},
                         data=gzip.compress(b"squeezed"),
                         headers={"Content-Encoding": "gzip"}) as resp:
        assert resp.status == 200, await resp.text()
    async with http.get(f"{server.url}/messaging/messages", params={"topicID": "1"}) as resp:
        assert [m.data for m in decode(await resp.read(), after=0)[0]] == [b"squeezed"]


@pytest.mark.parametrize("value", ["１２", "1_0", "+7", " 1 ", "1 ", "-0", "٣", "²", "0x1",
                                   "1e3", "1.0", "9" * 21, "1" * 5000])
async def test_numbers_are_ascii_digits_only(server: BrokerServer, http: aiohttp.ClientSession,
                                             value: str) -> None:
    async with http.post(f"{server.url}/messaging/messages", params={"topicID": value},
                         data=b"x") as resp:
        assert resp.status == 400, await resp.text()
        assert "invalid topicID" in resp.headers["X-Broker-Error"]
    async with http.get(f"{server.url}/messaging/messages",
                        params={"topicID": "1", "index": value}) as resp:
        assert resp.status == 400
        assert "invalid index" in resp.headers["X-Broker-Error"]
    async with http.get(f"{server.url}/messaging/topics/{value.strip() or 'x'}x") as resp:
        assert resp.status in (400, 404)
    assert server.broker is not None and server.broker.index == 0


async def test_plain_numbers_still_work(server: BrokerServer, http: aiohttp.ClientSession) -> None:
    for topic in ("007", str(2**63 - 1)):
        async with http.post(f"{server.url}/messaging/messages", params={"topicID": topic},
                             data=b"x") as resp:
            assert resp.status == 200, await resp.text()
    async with http.get(f"{server.url}/messaging/topics/7") as resp:
        assert (await resp.json())["id"] == 7


# -- 10: malformed requests are one rate-limited warning line, never a traceback ------------

MALFORMED = [
    b"G\x00T / HTTP/1.1\r\nHost: t\r\n\r\n",                         # bad method
    b"GET\r\n\r\n",                                                   # bad request line
    b"GET / HTTP/9.Z\r\nHost: t\r\n\r\n",                             # bad version
    b"GET / HTTP/1.1\r\nHo st: t\r\n\r\n",                            # invalid header name
    b"GET / HTTP/1.1\r\nX: a\x00b\r\n\r\n",                           # invalid header value
    b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n",                    # request line too long
    b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 300 + b"\r\n",              # too many headers
    b"GET /\xc3\xa9 HTTP/1.1\r\nHost: t\r\n\r\n",                      # raw non-ASCII path
    b"POST /messaging/messages?topicID=1 HTTP/1.1\r\nHost: t\r\n"
    b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",       # bad chunk size
    b"POST /messaging/messages?topicID=1 HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",                   # smuggling attempt
    b"POST /messaging/messages?topicID=1 HTTP/1.1\r\nHost: t\r\n"
    b"Content-Length: abc\r\n\r\n",                                   # bad Content-Length
    b"POST /messaging/messages?topicID=1 HTTP/1.1\r\nHost: t\r\n"
    b"Content-Encoding: gzip\r\nContent-Length: 5\r\n\r\nhello",      # not gzip
    b"POST /messaging/messages HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n"
    b"Content-Type: application/x-messaging-frames\r\n"
    b"Content-Encoding: deflate\r\n\r\nhello",                          # not deflate
    b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + b"\x00" * 40,  # TLS on the HTTP port
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",                              # HTTP/2 preface
]


async def test_malformed_requests_log_no_tracebacks(server: BrokerServer,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    requests = MALFORMED * 20  # 300 requests
    limit = asyncio.Semaphore(50)

    async def send(request: bytes) -> bytes:
        async with limit:
            return await exchange(server.port, request)

    loop = asyncio.get_running_loop()
    started = loop.time()
    answers = await asyncio.wait_for(asyncio.gather(*(send(r) for r in requests)), 60)
    elapsed = loop.time() - started
    assert server.connections is not None
    server.connections.rejections.flush()

    for request, raw in zip(requests, answers, strict=True):
        status, headers = responses(raw)[-1]
        assert status == 400, (request[:60], raw[:300])
        assert headers["x-broker-error"], raw[:300]

    assert "Traceback" not in caplog.text
    assert not [r for r in caplog.records if r.exc_info], caplog.text[:3000]
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert all(r.name == "messaging.http.app" for r in warnings), {r.name for r in warnings}
    rejected = [r for r in warnings if r.getMessage().startswith("rejected")]
    summaries = [int(m.group(1)) for r in warnings
                 if (m := re.match(r"(\d+) more rejected", r.getMessage()))]
    assert len(warnings) == len(rejected) + len(summaries)
    assert len(rejected) + sum(summaries) == len(requests)  # each one exactly once
    seconds = int(elapsed) + 2  # rate windows the flood can touch
    assert len(rejected) <= seconds * server.connections.rejections.per_second
    assert len(summaries) <= seconds


@pytest.mark.e2e  # over a second: left out of the unit run
async def test_rejection_log_summarises_past_its_rate(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    rejections = RejectionLog(logging.getLogger("test.rejections"), per_second=3)
    for i in range(10):
        rejections.warning("rejected %d", i)
    assert [r.getMessage() for r in caplog.records] == ["rejected 0", "rejected 1", "rejected 2"]
    await asyncio.sleep(1.2)  # the summary is due when the one-second window ends
    assert caplog.records[-1].getMessage().startswith("7 more rejected")
    rejections.warning("rejected again")
    assert caplog.records[-1].getMessage() == "rejected again"
    assert len(caplog.records) == 5


async def raw_request(server: BrokerServer, request: bytes, timeout: float = 10) -> bytes:
    """Send raw bytes, return everything the broker answers until it closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()


async def test_head_of_messages_is_headers_only(server: BrokerServer,
                                                http: aiohttp.ClientSession) -> None:
    await publish(http, server, 1, b"x" * 100)
    for query in ("topicID=1", "topicID=1&streaming=true"):
        answer = await raw_request(server, (
            f"HEAD /messaging/messages?{query} HTTP/1.1\r\nHost: x\r\n\r\n"
            f"GET /messaging/ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").encode())
        head, _, rest = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and b"X-Broker-Index: 1" in head
        # No frame bytes after the HEAD's headers: the next answer follows at once.
        assert rest.startswith(b"HTTP/1.1 200"), rest[:60]


async def test_http10_reads_get_a_plain_body(server: BrokerServer,
                                             http: aiohttp.ClientSession) -> None:
    await publish(http, server, 1, b"first")
    await publish(http, server, 1, b"second")
    answer = await raw_request(server, b"GET /messaging/messages?topicID=1 HTTP/1.0\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200"), head
    assert b"Transfer-Encoding" not in head
    assert [m.data for m in decode(body, after=0)[0]] == [b"first", b"second"]


async def test_big_batches_are_validated_off_the_loop(server: BrokerServer,
                                                      http: aiohttp.ClientSession,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[str] = []
    validate = message_module.validate_publish

    def recording(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        return validate(*args, **kwargs)

    monkeypatch.setattr(http_module, "validate_publish", recording)  # where http looks it up
    small = encode_batch(1, [b"s"] * 10)
    big = encode_batch(1, [b"b" * 1000] * 1000)
    for body in (small, big):
        async with http.post(f"{server.url}/messaging/messages", data=body,
                             headers=FRAMES) as resp:
            assert resp.status == 200
    loop_thread = threading.current_thread().name
    assert threads[0] == loop_thread and threads[1] != loop_thread


async def test_a_stream_behind_within_the_tail_reads_no_file(
        server: BrokerServer, http: aiohttp.ClientSession,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream opened behind the end, where the topic's in-memory tail still holds what it
    needs, reads the files once (the first chunk, before the 200) and takes the rest from
    the tail on the loop: no thread read per chunk."""
    for _ in range(4):  # 4 commits of 400 x 100 B: about 200 KiB, all in the tail
        async with http.post(f"{server.url}/messaging/messages",
                             data=encode_batch(7, [b"t" * 100] * 400), headers=FRAMES) as resp:
            assert resp.status == 200
    reads: list[int] = []
    original = TopicReader.read

    def counting(self: TopicReader, max_bytes: int) -> bytes:
        reads.append(max_bytes)
        return original(self, max_bytes)

    monkeypatch.setattr(TopicReader, "read", counting)
    decoder = BatchDecoder(after=0)
    received = 0
    async with http.get(f"{server.url}/messaging/messages",
                        params={"topicID": "7", "streaming": "true"}) as resp:
        assert resp.status == 200
        async for data in resp.content.iter_any():
            received += sum(batch.count for batch in decoder.feed(data))
            if received >= 1600:
                break
    assert received == 1600
    assert len(reads) == 1, reads
