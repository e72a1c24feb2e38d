"""Native topics as Server-Sent Events (``GET /messaging/messages?format=sse``) over real
sockets: every message an event whose id is its broker index, text or base64, control
events, a keepalive comment on an idle stream, ``Last-Event-ID`` resuming; and the encoder
the Durable Streams SSE shares."""

from __future__ import annotations

import asyncio
import base64

import aiohttp
import pytest

from messaging.http import sse
from messaging.http.server import BrokerServer


async def publish(http: aiohttp.ClientSession, server: BrokerServer, topic: int,
                  data: bytes) -> int:
    async with http.post(f"{server.url}/messaging/messages", params={"topicID": str(topic)},
                         data=data) as resp:
        assert resp.status == 200, await resp.text()
        return int(resp.headers["X-Broker-Index"])


class Events:
    """The events (and comments) of an SSE answer, read as they come."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response
        self.buffer = ""

    async def next(self, timeout: float = 5.0) -> dict[str, str]:
        """The next event's fields (``data`` lines joined by newlines; a comment as
        ``{"comment": text}``)."""
        while "\n\n" not in self.buffer:
            chunk = await asyncio.wait_for(self.response.content.readany(), timeout)
            assert chunk, "the stream ended"
            self.buffer += chunk.decode()
        block, self.buffer = self.buffer.split("\n\n", 1)
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            name, _, value = line.partition(":")
            if name == "":
                fields["comment"] = value.strip()
                continue
            value = value.removeprefix(" ") if name != "data" else value
            fields[name] = fields[name] + "\n" + value if name in fields else value
        return fields

    async def data_events(self, count: int) -> list[dict[str, str]]:
        """The next ``count`` message events (control events skipped)."""
        found: list[dict[str, str]] = []
        for _ in range(count * 3 + 5):
            if len(found) == count:
                break
            event = await self.next()
            if event.get("event") in ("data", sse.BASE64_EVENT):
                found.append(event)
        assert len(found) == count
        return found


async def test_a_native_topic_read_as_sse(server: BrokerServer,
                                          http: aiohttp.ClientSession) -> None:
    first = await publish(http, server, 1, b"hello\nworld")
    await publish(http, server, 2, b"other topic")
    binary = await publish(http, server, 1, b"\xff\x00\xfe")
    async with http.get(f"{server.url}/messaging/messages",
                        params={"topicID": "1", "index": "0", "format": "sse"}) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events = Events(resp)
        text, raw = await events.data_events(2)
        assert text == {"event": "data", "id": str(first), "data": "hello\nworld"}
        assert raw == {"event": sse.BASE64_EVENT, "id": str(binary),
                       "data": base64.b64encode(b"\xff\x00\xfe").decode()}
        control = await events.next()
        assert control["event"] == "control"
        assert control["data"] == f'{{"nextIndex":{binary + 1},"upToDate":true}}'
        later = await publish(http, server, 1, b"later")  # it follows the topic
        (event,) = await events.data_events(1)
        assert (event["id"], event["data"]) == (str(later), "later")
    async with http.get(f"{server.url}/messaging/messages",
                        params={"topicID": "1", "format": "sse"},
                        headers={"Last-Event-ID": str(binary)}) as resp:
        (event,) = await Events(resp).data_events(1)  # a reconnect resumes after the last id
        assert event["id"] == str(later)


async def test_an_idle_sse_stream_gets_keepalives_and_waits_for_a_new_topic(
        server: BrokerServer, http: aiohttp.ClientSession,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sse, "KEEPALIVE", 0.05)
    async with http.get(f"{server.url}/messaging/messages",
                        params={"topicID": "5", "format": "sse"}) as resp:
        assert resp.status == 200
        events = Events(resp)
        assert (await events.next())["event"] == "control"
        await publish(http, server, 5, b"first")
        (event,) = await events.data_events(1)
        assert event["data"] == "first"
        kinds = [await events.next() for _ in range(3)]
        assert {"comment": "keepalive"} in kinds


async def test_sse_parameter_errors(server: BrokerServer, http: aiohttp.ClientSession) -> None:
    await publish(http, server, 1, b"x")
    for params, headers, fragment in [
            ({"format": "xml"}, {}, "invalid format"),
            ({"format": "sse"}, {"Last-Event-ID": "x"}, "invalid Last-Event-ID")]:
        async with http.get(f"{server.url}/messaging/messages",
                            params={"topicID": "1", **params}, headers=headers) as resp:
            assert resp.status == 400
            assert fragment in resp.headers["X-Broker-Error"]


def test_the_encoder_splits_every_kind_of_line_end() -> None:
    assert sse.event("data", "a\r\nb\rc\nd", "7") == (
        "event: data\nid: 7\ndata:a\ndata:b\ndata:c\ndata:d\n\n")
    assert sse.event("control", "{}") == "event: control\ndata:{}\n\n"
    assert sse.control_event(1 << 63, False) == (
        f'event: control\ndata:{{"nextIndex":"{1 << 63}","upToDate":false}}\n\n')
