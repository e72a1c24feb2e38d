"""The Durable Streams surface (/v1/stream/{name}) of an in-process broker, over real HTTP.

JSON mode, long-poll (woken by the append, not by a timer), SSE through segment rolls, forks
with sub-offsets inside an append split into several messages, idempotent producers and zombie
fencing, CORS and security headers on every answer (errors too), DELETE and re-creation, and
sliding TTLs (HEAD does not extend one, GET does) and absolute expiry.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import random
import sys
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from messaging.broker import stream_reads
from messaging.broker.catalog import parse_token
from messaging.frames import FRAMES_CONTENT_TYPE, encode
from messaging.http import streams
from messaging.http.executors import Executors
from messaging.http.server import BrokerServer
from messaging.placement import NAMED_TOPIC_BASE
from tests.conftest import StartServer

JSON = {"Content-Type": "application/json"}
TEXT = {"Content-Type": "text/plain"}
OCTET = {"Content-Type": "application/octet-stream"}

Answer = tuple[int, Mapping[str, str], bytes]


def stream_url(server: BrokerServer, name: str) -> str:
    """The URL of a stream on ``server``."""
    return f"{server.url}/v1/stream/{name}"


async def call(http: aiohttp.ClientSession, method: str, url: str, body: bytes | None = None,
               headers: Mapping[str, str] | None = None, **params: str) -> Answer:
    """One request; its status, headers and body. No Content-Type is sent unless given
    (aiohttp would add ``application/octet-stream`` to a PUT or POST)."""
    headers = dict(headers or {})
    skip = () if any(h.lower() == "content-type" for h in headers) else ("Content-Type",)
    # aiohttp warns (an error here) about big bodies given as bytes: give those as a file.
    data = io.BytesIO(body) if body is not None and len(body) > 1 << 16 else body
    async with http.request(method, url, data=data, headers=headers, params=params or None,
                            skip_auto_headers=skip) as resp:
        return resp.status, resp.headers, await resp.read()


def producer(pid: str, epoch: int, seq: int) -> dict[str, str]:
    """Idempotent producer headers."""
    return {"Producer-Id": pid, "Producer-Epoch": str(epoch), "Producer-Seq": str(seq)}


async def bounded_wait(predicate: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    """Wait for in-process state to become true (a bounded loop of short sleeps)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


# -- JSON mode ----------------------------------------------------------------------------------


async def test_json_mode_round_trip(server: BrokerServer, http: aiohttp.ClientSession) -> None:
    url = stream_url(server, "events")
    status, headers, _ = await call(http, "PUT", url, b"[]", JSON)
    assert status == 201, headers
    assert headers["Content-Type"] == "application/json"
    status, headers, body = await call(http, "GET", url)
    assert status == 200 and json.loads(body) == []
    assert headers["Content-Type"] == "application/json"
    offsets = [headers["Stream-Next-Offset"]]

    posts: list[tuple[bytes, list[Any]]] = [
        (b'{"event": "created"}', [{"event": "created"}]),
        (b'[{"event": "a"}, {"event": "b"}]', [{"event": "a"}, {"event": "b"}]),
        (b"[[1,2], [3,4]]", [[1, 2], [3, 4]]),
        (b"[[[1,2,3]]]", [[[1, 2, 3]]]),
        (b' "text" ', ["text"]),
        ('{"\u00fc": "\u00df\\n"}'.encode(), [{"\u00fc": "\u00df\n"}]),
        (b"[null, 0, false]", [None, 0, False]),
    ]
    everything: list[Any] = []
    for data, stored in posts:
        status, headers, _ = await call(http, "POST", url, data,
                                        {"Content-Type": "application/json; charset=utf-8"})
        assert status == 204, (data, headers)
        assert headers["Stream-Next-Offset"] > offsets[-1]
        offsets.append(headers["Stream-Next-Offset"])
        everything.extend(stored)

    # Refused: an empty array on POST, invalid JSON, an empty body; nothing stored.
    for bad in (b"[]", b"{bad", b"[1,", b"", b"\xff"):
        status, headers, _ = await call(http, "POST", url, bad, JSON)
        assert status == 400, (bad, status)
        assert headers["X-Broker-Error"]
    status, headers, body = await call(http, "GET", url)
    assert status == 200 and json.loads(body) == everything
    assert headers["Stream-Next-Offset"] == offsets[-1]
    assert headers["Stream-Up-To-Date"] == "true"

    # From every offset an append returned: the rest, as one JSON array.
    done = 0
    for k, offset in enumerate(offsets):
        status, headers, body = await call(http, "GET", url, offset=offset)
        assert status == 200 and json.loads(body) == everything[done:], offset
        if k < len(posts):
            done += len(posts[k][1])
    # offset=now: an empty array at the tail.
    status, headers, body = await call(http, "GET", url, offset="now")
    assert (status, body) == (200, b"[]") and headers["Stream-Next-Offset"] == offsets[-1]

    # PUT: [] again on the existing stream is 200; a new stream takes initial messages
    # (flattened), and invalid JSON creates nothing.
    assert (await call(http, "PUT", url, b"[]", JSON))[0] == 200
    second = stream_url(server, "initial")
    assert (await call(http, "PUT", second, b'[{"x": 1}, [2]]', JSON))[0] == 201
    assert json.loads((await call(http, "GET", second))[2]) == [{"x": 1}, [2]]
    third = stream_url(server, "invalid")
    assert (await call(http, "PUT", third, b"{nope", JSON))[0] == 400
    assert (await call(http, "HEAD", third))[0] == 404


async def test_catch_up_in_chunks_and_etags(server: BrokerServer,
                                             http: aiohttp.ClientSession) -> None:
    url = stream_url(server, "big")
    rng = random.Random(3)
    parts = [rng.randbytes(size) for size in (700_000, 900_000, 5, 1_500_000, 300_000)]
    await call(http, "PUT", url, headers=OCTET)
    for part in parts:
        assert (await call(http, "POST", url, part, OCTET))[0] == 204
    whole = b"".join(parts)
    tail = (await call(http, "HEAD", url))[1]["Stream-Next-Offset"]

    # More than one read's worth: chunks without Stream-Up-To-Date until the last, each
    # resuming at the previous Stream-Next-Offset, together exactly the stream.
    got, offset, reads = b"", "-1", 0
    while reads < 50:
        reads += 1
        status, headers, body = await call(http, "GET", url, offset=offset)
        assert status == 200
        got += body
        assert headers["Stream-Next-Offset"] > offset or offset == "-1"
        offset = headers["Stream-Next-Offset"]
        if headers.get("Stream-Up-To-Date") == "true":
            break
        assert body
    assert got == whole and offset == tail and reads > 1

    # ETag: a repeated read is 304 with If-None-Match, until the stream grows.
    status, headers, _ = await call(http, "GET", url, offset=tail)
    etag = headers["ETag"]
    assert (await call(http, "GET", url, headers={"If-None-Match": etag}, offset=tail))[0] == 304
    await call(http, "POST", url, b"more", OCTET)
    status, headers, body = await call(http, "GET", url, headers={"If-None-Match": etag},
                                       offset=tail)
    assert (status, body) == (200, b"more") and headers["ETag"] != etag


async def test_native_api_refuses_the_named_range(server: BrokerServer,
                                                  http: aiohttp.ClientSession) -> None:
    url = stream_url(server, "s")
    await call(http, "PUT", url, b"mine", TEXT)
    assert server.broker is not None
    topic = server.broker.catalog.streams["s"].topic
    assert topic >= NAMED_TOPIC_BASE
    for target in (topic, NAMED_TOPIC_BASE + 12345):
        status, _, _ = await call(http, "POST", f"{server.url}/messaging/messages", b"intruder",
                                  topicID=str(target))
        assert status == 400, target
        status, _, _ = await call(http, "POST", f"{server.url}/messaging/messages",
                                  encode(1, target, b"intruder"),
                                  {"Content-Type": FRAMES_CONTENT_TYPE})
        assert status == 400, target
    assert (await call(http, "GET", url))[2] == b"mine"


# -- long-poll ----------------------------------------------------------------------------------


@pytest.mark.e2e  # slow: over a third of a second
async def test_long_poll_is_woken_by_an_append(start_server: StartServer,
                                               http: aiohttp.ClientSession,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    timeout = 5.0
    server = await start_server(long_poll_timeout=timeout)
    assert server.broker is not None
    url = stream_url(server, "live")
    assert (await call(http, "PUT", url, b"first", TEXT))[0] == 201
    tail = (await call(http, "HEAD", url))[1]["Stream-Next-Offset"]

    reads: list[float] = []
    real_read = stream_reads.read

    def counting_read(*args: Any, **kwargs: Any) -> list[stream_reads.Item]:
        reads.append(time.monotonic())
        return real_read(*args, **kwargs)

    monkeypatch.setattr(stream_reads, "read", counting_read)
    sleeps: list[tuple[str, float]] = []
    real_sleep = asyncio.sleep

    async def spying_sleep(delay: float, result: Any = None) -> Any:
        sleeps.append((sys._getframe(1).f_globals.get("__name__", "?"), delay))
        return await real_sleep(delay, result)

    monkeypatch.setattr(asyncio, "sleep", spying_sleep)
    loop = asyncio.get_running_loop()
    answered: list[float] = []

    async def long_poll() -> Answer:
        answer = await call(http, "GET", url, offset=tail, live="long-poll")
        answered.append(loop.time())
        return answer

    waiters = server.broker.streams_changed.waiting
    poll = asyncio.ensure_future(long_poll())
    try:
        await bounded_wait(lambda: server.broker is not None
                           and server.broker.streams_changed.waiting > waiters,
                           "the long-poll to park")
        parked_reads = len(reads)
        await real_sleep(0.3)  # idle: a polling implementation would read again here
        assert not poll.done()
        assert len(reads) == parked_reads, "the long-poll read again while nothing changed"

        started = loop.time()
        status, headers, _ = await call(http, "POST", url, b"second", TEXT)
        acknowledged = loop.time()
        assert status == 204
        status_lp, headers_lp, body = await asyncio.wait_for(poll, timeout + 5)
    finally:
        poll.cancel()
    delay = answered[0] - acknowledged
    print(f"long-poll answered {delay * 1000:.1f} ms after the append's answer "
          f"({(answered[0] - started) * 1000:.1f} ms after the append was sent; "
          f"timeout {timeout} s)")
    assert abs(delay) < 1.0 and answered[0] - started < 1.0
    assert status_lp == 200 and body == b"second"
    assert headers_lp["Stream-Next-Offset"] == headers["Stream-Next-Offset"]
    assert headers_lp["Stream-Up-To-Date"] == "true" and headers_lp["Stream-Cursor"]
    polling = [(module, d) for module, d in sleeps
               if module.startswith("messaging") and d < timeout]
    assert not polling, f"the broker slept in a loop: {polling}"

    # Closing the stream wakes a parked long-poll at once: 204 with Stream-Closed.
    end = headers["Stream-Next-Offset"]
    parked = asyncio.ensure_future(call(http, "GET", url, offset=end, live="long-poll"))
    try:
        await bounded_wait(lambda: server.broker is not None
                           and server.broker.streams_changed.waiting > waiters,
                           "the second long-poll to park")
        began = loop.time()
        status, headers, _ = await call(http, "POST", url, b"", {"Stream-Closed": "true"})
        assert status == 204 and headers["Stream-Next-Offset"] == end
        status, headers, body = await asyncio.wait_for(parked, timeout + 5)
    finally:
        parked.cancel()
    assert loop.time() - began < 1.0
    assert (status, body) == (204, b"")
    assert headers["Stream-Closed"] == "true" and headers["Stream-Next-Offset"] == end


@pytest.mark.e2e  # slow: over a third of a second
async def test_long_poll_timeout_closure_and_forks(start_server: StartServer,
                                                  http: aiohttp.ClientSession) -> None:
    server = await start_server(long_poll_timeout=0.2)
    src = stream_url(server, "src")
    await call(http, "PUT", src, b"a", TEXT)
    tail = (await call(http, "HEAD", src))[1]["Stream-Next-Offset"]

    # Nothing arrives: 204 at the timeout, at the same offset, with a cursor.
    began = time.monotonic()
    status, headers, _ = await call(http, "GET", src, offset=tail, live="long-poll")
    assert status == 204 and 0.15 < time.monotonic() - began < 3
    assert headers["Stream-Next-Offset"] == tail and headers["Stream-Up-To-Date"] == "true"
    assert headers["Stream-Cursor"] and "Stream-Closed" not in headers

    # A fork waits for its own appends only.
    fork = stream_url(server, "fork")
    assert (await call(http, "PUT", fork, headers={"Stream-Forked-From": "/v1/stream/src"}
                       ))[0] == 201
    fork_poll = asyncio.ensure_future(call(http, "GET", fork, offset=tail, live="long-poll"))
    await asyncio.sleep(0.05)
    await call(http, "POST", src, b"source-only", TEXT)
    status, headers, body = await asyncio.wait_for(fork_poll, 5)
    assert status == 204 and body == b""
    fork_poll = asyncio.ensure_future(call(http, "GET", fork, offset=tail, live="long-poll"))
    await asyncio.sleep(0.05)
    await call(http, "POST", fork, b"fork-own", TEXT)
    status, headers, body = await asyncio.wait_for(fork_poll, 5)
    assert (status, body) == (200, b"fork-own")

    # At the tail of a closed stream: 204 with Stream-Closed, without waiting.
    status, headers, _ = await call(http, "POST", src, b"", {"Stream-Closed": "true"})
    assert status == 204 and headers["Stream-Closed"] == "true"
    end = headers["Stream-Next-Offset"]
    began = time.monotonic()
    status, headers, _ = await call(http, "GET", src, offset=end, live="long-poll")
    assert status == 204 and time.monotonic() - began < 0.15
    assert headers["Stream-Closed"] == "true" and headers["Stream-Up-To-Date"] == "true"
    assert headers["Stream-Next-Offset"] == end


# -- SSE ----------------------------------------------------------------------------------------


async def read_events(resp: aiohttp.ClientResponse, events: list[tuple[str, str]]) -> None:
    """Parse an SSE body into (event, data) pairs until the server ends it."""
    event = "message"
    data: list[str] = []
    for _ in range(1_000_000):
        raw = await resp.content.readline()
        if not raw:
            return
        line = raw.decode().rstrip("\n").rstrip("\r")
        if not line:
            if data:
                events.append((event, "\n".join(data)))
            event, data = "message", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            event = value
        elif field == "data":
            data.append(value)
    raise AssertionError("an SSE body that never ends")


def caught_up(events: list[tuple[str, str]], offset: str) -> Callable[[], bool]:
    """Whether an SSE reader has had a control event at or past ``offset``."""
    return lambda: any(event == "control" and json.loads(data)["streamNextOffset"] >= offset
                       for event, data in events)


async def test_sse_through_segment_rolls(start_server: StartServer, tmp_path: Path,
                                         http: aiohttp.ClientSession) -> None:
    server = await start_server(max_segment_size=1024)
    assert server.broker is not None
    url = stream_url(server, "sse")
    assert (await call(http, "PUT", url, headers=OCTET))[0] == 201
    topic = server.broker.catalog.streams["sse"].topic
    rng = random.Random(7)
    sent: list[bytes] = []
    events: list[tuple[str, str]] = []

    async with http.get(url, params={"offset": "-1", "live": "sse"}) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        assert resp.headers["Stream-SSE-Data-Encoding"] == "base64"
        reader = asyncio.ensure_future(read_events(resp, events))
        try:
            await bounded_wait(lambda: bool(events), "the first control event")
            for k in range(40):
                data = rng.randbytes(rng.randrange(1, 300)) + b"\r\n\x00" * (k % 2)
                status, headers, _ = await call(http, "POST", url, data, OCTET)
                assert status == 204
                sent.append(data)
                if k % 3 == 0:  # sometimes let the reader catch up before the next one
                    await bounded_wait(caught_up(events, headers["Stream-Next-Offset"]),
                                       "the SSE reader to catch up")
            status, headers, _ = await call(http, "POST", url, b"", {"Stream-Closed": "true"})
            assert status == 204
            final = headers["Stream-Next-Offset"]
            await asyncio.wait_for(reader, 10)  # the server ends the response
        finally:
            reader.cancel()

    def segment_files() -> list[str]:
        return sorted(p.name for p in (server.config.data / "topics" / str(topic)).iterdir()
                      if p.suffix == ".seg")

    segments = await asyncio.get_running_loop().run_in_executor(None, segment_files)
    assert len(segments) >= 4, segments

    received = b""
    offsets: list[str] = []
    previous = ""
    for k, (event, payload) in enumerate(events):
        if event == "data":
            received += base64.b64decode(payload.replace("\n", "").replace("\r", ""),
                                         validate=True)
            assert events[k + 1][0] == "control", "a data event without its control event"
            control = json.loads(events[k + 1][1])
            offsets.append(control["streamNextOffset"])
        else:
            assert event == "control", event
            control = json.loads(payload)
            assert control["streamNextOffset"] >= previous
            previous = control["streamNextOffset"]
    assert received == b"".join(sent)
    assert offsets == sorted(set(offsets)), "offsets after data must strictly increase"
    last = json.loads(events[-1][1])
    assert events[-1][0] == "control"
    assert last == {"streamNextOffset": final, "streamClosed": True, "upToDate": True}
    assert not any(json.loads(d).get("streamClosed") for e, d in events[:-1] if e == "control")


async def test_sse_text_and_json_are_not_base64(server: BrokerServer,
                                                http: aiohttp.ClientSession) -> None:
    text = stream_url(server, "text")
    await call(http, "PUT", text, "line one\nline two\r\n\u00e9".encode(), TEXT)
    await call(http, "POST", text, b"", {"Stream-Closed": "true"})
    events: list[tuple[str, str]] = []
    async with http.get(text, params={"offset": "-1", "live": "sse"}) as resp:
        assert "Stream-SSE-Data-Encoding" not in resp.headers
        await asyncio.wait_for(read_events(resp, events), 10)
    assert events[0] == ("data", "line one\nline two\n\u00e9")
    assert json.loads(events[-1][1])["streamClosed"] is True

    doc = stream_url(server, "doc")
    await call(http, "PUT", doc, b'[{"k": "v"}, 2]', JSON)
    await call(http, "POST", doc, b"", {"Stream-Closed": "true"})
    events = []
    async with http.get(doc, params={"offset": "-1", "live": "sse"}) as resp:
        await asyncio.wait_for(read_events(resp, events), 10)
    values = [v for e, d in events if e == "data" for v in json.loads(d)]
    assert values == [{"k": "v"}, 2]


# -- forks over HTTP ----------------------------------------------------------------------------


async def test_fork_sub_offset_inside_an_append_split_into_messages(
        start_server: StartServer, http: aiohttp.ClientSession) -> None:
    server = await start_server(max_message_size=8)
    src = stream_url(server, "src")
    await call(http, "PUT", src, b"head-", TEXT)
    anchor = (await call(http, "HEAD", src))[1]["Stream-Next-Offset"]
    big = b"ABCDEFGHIJKLMNOPQRST"  # 20 bytes: messages of 8, 8 and 4
    await call(http, "POST", src, big, TEXT)
    assert server.broker is not None
    source = server.broker.catalog.streams["src"]
    stored = await asyncio.get_running_loop().run_in_executor(
        None, stream_reads.read, server.broker, server.broker.catalog, source, (0, 0))
    assert [i.data for i in stored] == [b"head-", b"ABCDEFGH", b"IJKLMNOP", b"QRST"]
    for sub in (0, 1, 7, 8, 9, 16, 17, 20):
        fork = stream_url(server, f"fork{sub}")
        headers = {"Stream-Forked-From": "/v1/stream/src", "Stream-Fork-Offset": anchor,
                   "Stream-Fork-Sub-Offset": str(sub)}
        status, answer, _ = await call(http, "PUT", fork, headers=headers)
        assert status == 201, (sub, answer)
        assert answer["Content-Type"] == "text/plain"
        status, answer, body = await call(http, "GET", fork)
        assert body == b"head-" + big[:sub], sub
        middle = answer["Stream-Next-Offset"]
        assert (await call(http, "PUT", fork, headers=headers))[0] == 200  # idempotent
        await call(http, "POST", fork, b"+own", TEXT)
        assert (await call(http, "GET", fork))[2] == b"head-" + big[:sub] + b"+own"
        assert (await call(http, "GET", fork, offset=middle))[2] == b"+own"
    status, _, _ = await call(http, "PUT", stream_url(server, "over"), headers={
        "Stream-Forked-From": "/v1/stream/src", "Stream-Fork-Offset": anchor,
        "Stream-Fork-Sub-Offset": "21"})
    assert status == 400


# -- producers ----------------------------------------------------------------------------------


async def test_zombie_fencing_over_http(server: BrokerServer,
                                        http: aiohttp.ClientSession) -> None:
    url = stream_url(server, "orders")
    await call(http, "PUT", url, headers=TEXT)
    status, headers, _ = await call(http, "POST", url, b"a", {**TEXT, **producer("w", 0, 0)})
    assert status == 200 and (headers["Producer-Epoch"], headers["Producer-Seq"]) == ("0", "0")
    status, headers, _ = await call(http, "POST", url, b"a", {**TEXT, **producer("w", 0, 0)})
    assert status == 204 and headers["Producer-Seq"] == "0"  # a retry: a duplicate
    status, headers, _ = await call(http, "POST", url, b"c", {**TEXT, **producer("w", 0, 2)})
    assert status == 409
    assert (headers["Producer-Expected-Seq"], headers["Producer-Received-Seq"]) == ("1", "2")

    # The producer restarts with epoch 1: the old one (a zombie) is fenced.
    status, headers, _ = await call(http, "POST", url, b"b", {**TEXT, **producer("w", 1, 0)})
    assert status == 200 and headers["Producer-Epoch"] == "1"
    for seq in (1, 0, 5):
        status, headers, body = await call(http, "POST", url, b"zombie",
                                           {**TEXT, **producer("w", 0, seq)})
        assert status == 403 and headers["Producer-Epoch"] == "1", body
    status, _, _ = await call(http, "POST", url, b"x", {**TEXT, **producer("w", 2, 1)})
    assert status == 400  # a new epoch starts at 0
    for partial in ({"Producer-Id": "w"}, {"Producer-Id": "w", "Producer-Epoch": "1"},
                    {**producer("w", 1, 1), "Producer-Seq": "-1"}, producer("", 0, 0),
                    producer("w", 2**53, 0)):
        assert (await call(http, "POST", url, b"x", {**TEXT, **partial}))[0] == 400, partial
    assert (await call(http, "GET", url))[2] == b"ab"


# -- headers on every answer --------------------------------------------------------------------


SECURITY = {"Access-Control-Allow-Origin": "*", "X-Content-Type-Options": "nosniff",
            "Cross-Origin-Resource-Policy": "cross-origin"}


async def test_cors_and_security_headers_on_errors_too(server: BrokerServer,
                                                       http: aiohttp.ClientSession) -> None:
    url = stream_url(server, "s")
    answers: dict[str, Answer] = {}
    answers["201 create"] = await call(http, "PUT", url, b"x", TEXT)
    answers["200 append"] = await call(http, "POST", url, b"y", {**TEXT, **producer("p", 1, 0)})
    answers["403 fenced"] = await call(http, "POST", url, b"z", {**TEXT, **producer("p", 0, 0)})
    answers["200 read"] = await call(http, "GET", url)
    answers["200 head"] = await call(http, "HEAD", url)
    answers["204 options"] = await call(http, "OPTIONS", url, headers={
        "Origin": "https://example.com", "Access-Control-Request-Method": "POST"})
    answers["400 offset"] = await call(http, "GET", url, offset="nonsense")
    answers["400 empty"] = await call(http, "POST", url, b"", TEXT)
    answers["404 missing"] = await call(http, "GET", stream_url(server, "missing"))
    answers["405 method"] = await call(http, "PATCH", url, b"x")
    answers["409 type"] = await call(http, "POST", url, b"x", JSON)
    await call(http, "PUT", stream_url(server, "f"), headers={"Stream-Forked-From": "s"})
    await call(http, "POST", url, b"", {"Stream-Closed": "true"})
    answers["409 closed"] = await call(http, "POST", url, b"late", TEXT)
    answers["204 delete"] = await call(http, "DELETE", url)
    answers["410 gone"] = await call(http, "GET", url)
    answers["409 recreate"] = await call(http, "PUT", url, headers=TEXT)

    for label, (status, headers, _) in answers.items():
        assert status == int(label.split()[0]), (label, status, headers)
        for name, value in SECURITY.items():
            assert headers.get(name) == value, (label, name)
        exposed = {h.strip().lower() for h in headers["Access-Control-Expose-Headers"].split(",")}
        assert {"stream-next-offset", "stream-closed", "producer-epoch", "etag",
                "producer-expected-seq"} <= exposed, label
        if status >= 400:
            assert headers["X-Broker-Error"], label
    allowed = answers["204 options"][1]["Access-Control-Allow-Methods"]
    assert {"GET", "POST", "PUT", "DELETE", "HEAD"} <= {m.strip() for m in allowed.split(",")}
    assert answers["403 fenced"][1]["Producer-Epoch"] == "1"
    closed = answers["409 closed"][1]
    assert closed["Stream-Closed"] == "true" and closed["Stream-Next-Offset"]


# -- delete, re-create, expiry ------------------------------------------------------------------


async def test_delete_then_recreate(server: BrokerServer, http: aiohttp.ClientSession) -> None:
    assert server.broker is not None
    url = stream_url(server, "again")
    await call(http, "PUT", url, b"old data", TEXT)
    topic = server.broker.catalog.streams["again"].topic
    assert (await call(http, "DELETE", url))[0] == 204
    for method in ("GET", "HEAD", "DELETE"):
        assert (await call(http, method, url))[0] == 404, method
    assert (await call(http, "POST", url, b"x", TEXT))[0] == 404
    topic_path = server.config.data / "topics" / str(topic)
    exists = await asyncio.get_running_loop().run_in_executor(None, topic_path.exists)
    assert not exists
    status, headers, _ = await call(http, "PUT", url, headers=JSON)
    assert status == 201
    status, headers, body = await call(http, "GET", url)
    assert (status, body, headers["Content-Type"]) == (200, b"[]", "application/json")


def rfc3339(when: float) -> str:
    """A UTC RFC 3339 time with milliseconds."""
    return datetime.fromtimestamp(when, UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


@pytest.mark.e2e  # slow: TTLs are whole seconds, so this waits a little over one
async def test_sliding_ttl_and_expiry(start_server: StartServer, http: aiohttp.ClientSession,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streams, "EXPIRY_SWEEP_INTERVAL", 0.2)
    server = await start_server()
    assert server.broker is not None
    touched, headed, absolute = (stream_url(server, n) for n in ("touched", "headed",
                                                                 "absolute"))
    loop = asyncio.get_running_loop()
    start = loop.time()
    expires_at = rfc3339(time.time() + 1.0)
    assert (await call(http, "PUT", touched, b"t", {**TEXT, "Stream-TTL": "1"}))[0] == 201
    assert (await call(http, "PUT", headed, b"h", {**TEXT, "Stream-TTL": "1"}))[0] == 201
    assert (await call(http, "PUT", absolute, b"a",
                       {**TEXT, "Stream-Expires-At": expires_at}))[0] == 201
    # Never touched after its creation: the background sweep deletes it.
    assert (await call(http, "PUT", stream_url(server, "swept"), b"s",
                       {**TEXT, "Stream-TTL": "1"}))[0] == 201
    topic = server.broker.catalog.streams["headed"].topic
    status, headers, _ = await call(http, "HEAD", headed)
    assert status == 200 and headers["Stream-TTL"] == "1"
    assert (await call(http, "HEAD", absolute))[1]["Stream-Expires-At"] == expires_at

    await asyncio.sleep(max(0.0, start + 0.55 - loop.time()))
    assert (await call(http, "GET", touched))[0] == 200  # extends the TTL to ~1.55 s
    assert (await call(http, "HEAD", headed))[0] == 200  # does not
    assert (await call(http, "GET", absolute))[0] == 200  # an absolute expiry stays put

    await asyncio.sleep(max(0.0, start + 1.2 - loop.time()))
    assert loop.time() - start < 1.5, "the test ran too slowly to tell"
    assert (await call(http, "HEAD", touched))[0] == 200
    assert (await call(http, "HEAD", headed))[0] == 404
    assert (await call(http, "GET", headed))[0] == 404
    assert (await call(http, "GET", absolute))[0] == 404
    assert "headed" not in server.broker.catalog.streams
    await bounded_wait(lambda: server.broker is not None
                       and "swept" not in server.broker.catalog.streams,
                       "the sweep to delete an expired stream", timeout=2.0)
    topic_path = server.config.data / "topics" / str(topic)
    assert not await loop.run_in_executor(None, topic_path.exists)

    # Expired names can be created again, empty.
    assert (await call(http, "PUT", headed, headers=TEXT))[0] == 201
    assert (await call(http, "GET", headed))[2] == b""
    assert (await call(http, "PUT", absolute, headers=TEXT))[0] == 201
    assert (await call(http, "GET", touched))[2] == b"t"


async def test_a_reader_behind_a_commit_returns_at_once(server: BrokerServer,
                                                        http: aiohttp.ClientSession) -> None:
    """A long-poll or SSE reader waits for frames after its own position: a commit that
    landed while it was busy (reading, writing to its socket) wakes it, it is not left
    waiting for the commit after that one."""
    assert server.broker is not None and server.log is not None
    url = stream_url(server, "behind")
    assert (await call(http, "PUT", url, headers=OCTET))[0] == 201
    status, headers, _ = await call(http, "POST", url, b"first", OCTET)
    assert status == 204
    position = parse_token(headers["Stream-Next-Offset"])
    assert position is not None
    assert (await call(http, "POST", url, b"second", OCTET))[0] == 204  # committed now
    handlers = streams.StreamHandlers(server.broker, server.log, Executors(), 1 << 20)
    stream = server.broker.catalog.streams["behind"]
    # Bounded well below the wait's own timeout: waiting it out is the bug.
    await asyncio.wait_for(handlers.wait_for_change(stream, position[0], timeout=60), 10)


def test_an_empty_read_waits_for_a_newer_commit_not_for_frames_already_there() -> None:
    """After a read from a position found nothing: frames committed before the read (a gap,
    a retention cut) are not waited for again (that would return at once and spin); frames
    not committed yet are."""
    assert streams.wait_after((10, 0), committed_before_read=12) == 12
    assert streams.wait_after((10, 0), committed_before_read=10) == 10
    assert streams.wait_after((10, 3), committed_before_read=7) == 10


@pytest.mark.e2e  # over half a second: left out of the unit run
async def test_sse_sends_one_control_event_per_catch_up(start_server: StartServer,
                                                        http: aiohttp.ClientSession) -> None:
    """After the data it has, an SSE reader gets one control event and then waits for the
    next commit (it once woke at once and sent a second control event)."""
    server = await start_server(long_poll_timeout=3.0)
    url = stream_url(server, "once")
    assert (await call(http, "PUT", url, b"one message", TEXT))[0] == 201
    events: list[tuple[str, str]] = []
    async with http.get(url, params={"offset": "-1", "live": "sse"}) as resp:
        reader = asyncio.ensure_future(read_events(resp, events))
        try:
            await bounded_wait(lambda: any(e == "control" for e, _ in events), "a control event")
            await asyncio.sleep(0.5)  # long enough for a spurious second one to arrive
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
    assert [event for event, _ in events] == ["data", "control"]
