"""``/messaging/topics/{id}`` over real sockets: create and configure (PUT), describe (GET),
delete (DELETE), bad input, 410 for readers of a deleted topic, a stream's topic by name, the
per-topic message size, and the scopes each needs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from messaging.http.auth import new_token, parse_scope, token_line
from messaging.http.server import BrokerServer
from tests.conftest import StartServer

Session = aiohttp.ClientSession


async def call(http: Session, method: str, url: str, body: Any = None,
               headers: dict[str, str] | None = None) -> tuple[int, Any, str]:
    """Status, JSON answer (or None) and X-Broker-Error of one request."""
    async with http.request(method, url, json=body, headers=headers) as resp:
        data = await resp.json(content_type=None) if resp.status < 300 else None
        return resp.status, data, resp.headers.get("X-Broker-Error", "")


def topic_url(server: BrokerServer, topic: int | str) -> str:
    return f"{server.url}/messaging/topics/{topic}"


async def test_put_creates_configures_and_resets(server: BrokerServer, http: Session) -> None:
    status, answer, _ = await call(http, "PUT", topic_url(server, 7),
                                   {"max-topic-size": "1G", "max-segment-size": 4096})
    assert status == 201
    assert (answer["id"], answer["last_index"], answer["segments"]) == (7, 0, 0)
    assert answer["settings"] == {
        "max-topic-size": {"value": 1 << 30, "source": "topic"},
        "retention-age": {"value": None, "source": "default"},
        "max-segment-size": {"value": 4096, "source": "topic"},
        "max-message-size": {"value": 1 << 20, "source": "default"}}
    status, answer, _ = await call(http, "PUT", topic_url(server, 7),
                                   {"max-topic-size": None, "max-message-size": "1K"})
    assert status == 200  # it exists: only the keys given change
    assert {k: v["value"] for k, v in answer["settings"].items()} == {
        "max-topic-size": 1 << 30, "retention-age": None, "max-segment-size": 4096,
        "max-message-size": 1024}
    assert answer["settings"]["max-topic-size"]["source"] == "default"
    status, listed, _ = await call(http, "GET", f"{server.url}/messaging/topics")
    assert [t["id"] for t in listed] == [7]


async def test_get_shows_the_topic_and_broker_flags(start_server: StartServer,
                                                    http: Session) -> None:
    server = await start_server(max_topic_size=5 << 30)
    async with http.post(f"{server.url}/messaging/messages?topicID=3", data=b"x") as resp:
        assert resp.status == 200
    status, answer, _ = await call(http, "GET", topic_url(server, 3))
    assert status == 200 and answer["last_index"] == 1
    assert answer["settings"]["max-topic-size"] == {"value": 5 << 30, "source": "broker"}
    async with http.get(topic_url(server, 3), params={"after": 0, "count": 1}) as resp:
        assert (await resp.json())["index"] == 1  # the lookups of before still work
    assert (await call(http, "GET", topic_url(server, 4)))[0] == 404


@pytest.mark.parametrize(("body", "reason"), [
    ({"max-topic-sizes": 1}, "unknown setting"),
    ({"max-topic-size": "big"}, "invalid max-topic-size"),
    ({"max-segment-size": 0}, "must be from 1"),
    ({"retention-age": "a week"}, "invalid retention-age"),
    ({"max-message-size": "2M"}, "above this broker's maximum"),
    ([1, 2], "JSON object"),
])
async def test_bad_settings_are_400_and_change_nothing(server: BrokerServer, http: Session,
                                                       body: Any, reason: str) -> None:
    status, _, error = await call(http, "PUT", topic_url(server, 7), body)
    assert status == 400 and reason in error
    assert (await call(http, "GET", topic_url(server, 7)))[0] == 404
    async with http.put(topic_url(server, 7), data=b"{not json") as resp:
        assert resp.status == 400 and "not JSON" in resp.headers["X-Broker-Error"]
    assert (await call(http, "PUT", topic_url(server, "a%01b"), {}))[0] == 400


async def test_a_topics_message_size_is_413(server: BrokerServer, http: Session) -> None:
    await call(http, "PUT", topic_url(server, 1), {"max-message-size": 8})
    async with http.post(f"{server.url}/messaging/messages?topicID=1", data=b"x" * 9) as resp:
        assert resp.status == 413 and "max-message-size of 8" in resp.headers["X-Broker-Error"]
    async with http.post(f"{server.url}/messaging/messages?topicID=1", data=b"x" * 8) as resp:
        assert resp.status == 200


async def test_delete_then_410_then_a_publish_creates_it_again(server: BrokerServer,
                                                               http: Session) -> None:
    base = server.url
    for data in (b"a", b"b"):
        async with http.post(f"{base}/messaging/messages?topicID=5", data=data) as resp:
            assert resp.status == 200
    async with http.post(f"{base}/messaging/heartbeat?topicID=5&index=2&url=r") as resp:
        assert resp.status == 200
    stream = await http.get(f"{base}/messaging/messages?topicID=5&index=1&streaming=true")
    assert stream.status == 200
    await stream.content.readexactly(2 * 27)  # both frames: the stream is open and caught up
    status, answer, _ = await call(http, "DELETE", topic_url(server, 5))
    # The deletion takes an index of its own: the old topic's last was 2.
    assert status == 200 and answer == {"id": 5, "deleted": True, "deleted_at": 3}
    assert await asyncio.wait_for(stream.content.read(), 5) == b""  # the open stream ended
    stream.release()
    for url in (f"{base}/messaging/messages?topicID=5", topic_url(server, 5),
                f"{base}/messaging/messages?topicID=5&streaming=true"):
        status, _, error = await call(http, "GET", url)
        assert status == 410 and "topic 5 was deleted" in error, url
    assert (await call(http, "DELETE", topic_url(server, 5)))[0] == 410
    status, consumers, _ = await call(http, "GET", f"{base}/messaging/consumers")
    assert consumers == []
    async with http.post(f"{base}/messaging/messages?topicID=5", data=b"c") as resp:
        assert resp.headers["X-Broker-Index"] == "4"
    async with http.get(f"{base}/messaging/messages?topicID=5&index=1") as resp:
        assert resp.status == 410 and resp.headers["X-Broker-First-Index"] == "4"
    # Readers resuming right after the old topic's last message (2) are fenced too: the
    # new topic's first message is not theirs to continue with.
    async with http.get(f"{base}/messaging/messages?topicID=5&index=3") as resp:
        assert resp.status == 410 and resp.headers["X-Broker-First-Index"] == "4"
    async with http.get(f"{base}/messaging/messages?topicID=5&format=sse",
                        headers={"Last-Event-ID": "2"}) as resp:
        assert resp.status == 410 and "topic 5 was deleted (at index 3)" in resp.headers[
            "X-Broker-Error"]
    async with http.get(f"{base}/messaging/messages?topicID=5&index=4") as resp:
        assert resp.status == 200 and (await resp.read()).endswith(b"c")
    assert (await call(http, "DELETE", topic_url(server, 6)))[0] == 404


async def test_a_deleted_topic_forgets_its_producers(server: BrokerServer, http: Session,
                                                     ) -> None:
    """A publish re-sent with the producer headers of a request the deleted topic had taken is
    never answered as a duplicate pointing into deleted data (issue: it was 200, Duplicate)."""
    url = f"{server.url}/messaging/messages?topicID=23"

    async def publish(epoch: int, seq: int, data: bytes) -> tuple[int, dict[str, str]]:
        headers = {"Producer-Id": "p", "Producer-Epoch": str(epoch), "Producer-Seq": str(seq)}
        async with http.post(url, data=data, headers=headers) as resp:
            return resp.status, dict(resp.headers)

    for seq in range(3):
        assert (await publish(2, seq, b"old"))[0] == 200
    status, headers = await publish(2, 2, b"old")
    assert status == 200 and headers["X-Broker-Duplicate"] == "true"
    assert (await call(http, "DELETE", topic_url(server, 23)))[0] == 200
    status, headers = await publish(2, 2, b"old")
    assert status == 409 and "X-Broker-Duplicate" not in headers
    assert "new here and must start at seq 0" in headers["X-Broker-Error"]
    assert headers["Producer-Expected-Seq"] == "0"
    status, headers = await publish(1, 0, b"new")  # an older epoch than before: not fenced
    assert status == 200 and "X-Broker-Duplicate" not in headers
    assert int(headers["X-Broker-Index"]) == 5  # after the deletion's own index, 4
    async with http.get(f"{server.url}/messaging/messages?topicID=23&index=5") as resp:
        assert resp.status == 200 and b"new" in await resp.read()


async def test_a_streams_topic_takes_settings_by_name_and_is_deleted_as_a_stream(
        server: BrokerServer, http: Session) -> None:
    async with http.put(f"{server.url}/v1/stream/orders") as resp:
        assert resp.status == 201
    status, answer, _ = await call(http, "PUT", topic_url(server, "orders"),
                                   {"max-topic-size": "10M"})
    assert status == 200 and answer["name"] == "orders"
    topic_id = int(answer["id"])
    assert topic_id >= 1 << 63
    status, by_id, _ = await call(http, "GET", topic_url(server, topic_id))
    assert by_id["settings"]["max-topic-size"] == {"value": 10 << 20, "source": "topic"}
    status, _, error = await call(http, "DELETE", topic_url(server, "orders"))
    assert status == 400 and "DELETE /v1/stream/orders" in error
    assert (await call(http, "PUT", topic_url(server, "nothing"), {}))[0] == 404
    assert (await call(http, "PUT", topic_url(server, (1 << 63) + 99), {}))[0] == 404
    # An id in the named range with no stream behind it: no such topic, whatever the verb.
    status, _, error = await call(http, "GET", topic_url(server, (1 << 63) + 191))
    assert status == 404 and f"topic {(1 << 63) + 191} not found" in error


async def test_a_streams_own_message_size_splits_its_appends(server: BrokerServer,
                                                              http: Session) -> None:
    """Appends to a byte stream are split at its topic's max-message-size as at the broker's;
    a JSON element over it is refused, naming the stream (not its topic's id)."""
    text = {"Content-Type": "text/plain"}
    async with http.put(f"{server.url}/v1/stream/chat", headers=text) as resp:
        assert resp.status == 201
    await call(http, "PUT", topic_url(server, "chat"), {"max-message-size": "10K"})
    big = bytes(range(256)) * 80  # 20480 bytes: two messages of 10 KiB
    async with http.post(f"{server.url}/v1/stream/chat", data=big, headers=text) as resp:
        assert resp.status == 204, resp.headers.get("X-Broker-Error")
    async with http.get(f"{server.url}/v1/stream/chat", params={"offset": "-1"}) as resp:
        assert await resp.read() == big
    status, answer, _ = await call(http, "GET", topic_url(server, "chat"))
    assert status == 200 and answer["last_index"] - answer["first_index"] == 1  # 2 messages
    json_type = {"Content-Type": "application/json"}
    async with http.put(f"{server.url}/v1/stream/events", headers=json_type) as resp:
        assert resp.status == 201
    await call(http, "PUT", topic_url(server, "events"), {"max-message-size": 8})
    async with http.post(f"{server.url}/v1/stream/events", data=b'["a long string"]',
                         headers=json_type) as resp:
        assert resp.status == 413
        assert "stream 'events'" in resp.headers["X-Broker-Error"]
        assert str(1 << 63) not in resp.headers["X-Broker-Error"]


async def test_scopes(start_server: StartServer, http: Session, tmp_path: Path) -> None:
    tokens = {role: new_token() for role in ("admin", "reader", "writer")}
    scopes = {"admin": ["admin"], "reader": ["read=1"], "writer": ["write=1", "read=1"]}
    (tmp_path / "tokens").write_text("".join(
        token_line(role, tokens[role], [parse_scope(s) for s in scopes[role]]) + "\n"
        for role in tokens))
    server = await start_server(tokens=tmp_path / "tokens")

    def auth(role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {tokens[role]}"}

    url = topic_url(server, 1)
    assert (await call(http, "PUT", url, {}))[0] == 401
    for role in ("reader", "writer"):
        assert (await call(http, "PUT", url, {}, auth(role)))[0] == 403
        assert (await call(http, "DELETE", url, None, auth(role)))[0] == 403
    assert (await call(http, "PUT", url, {}, auth("admin")))[0] == 201
    assert (await call(http, "GET", url, None, auth("reader")))[0] == 200
    await call(http, "PUT", topic_url(server, 2), {}, auth("admin"))
    assert (await call(http, "GET", topic_url(server, 2), None, auth("reader")))[0] == 403
    assert (await call(http, "DELETE", url, None, auth("admin")))[0] == 200
