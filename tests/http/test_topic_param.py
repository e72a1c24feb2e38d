"""``topicID`` as a stream's name (messaging.http.topic_param) over real sockets: reads,
streaming reads, the topic's description, consumer routes and heartbeats by name; unknown
and deleted names; read scopes checked by id and by name."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from messaging.errors import BadRequestError
from messaging.frames import decode
from messaging.http.auth import new_token, parse_scope, token_line
from messaging.http.server import BrokerServer
from messaging.http.topic_param import topic_to_write
from messaging.placement import NAMED_TOPIC_BASE
from tests.conftest import StartServer


async def make_stream(http: aiohttp.ClientSession, url: str, name: str, *datas: bytes,
                      headers: dict[str, str] | None = None) -> None:
    """Create stream ``name`` and append ``datas`` to it, one append each."""
    stream = f"{url}/v1/stream/{name}"
    text = {"Content-Type": "text/plain", **(headers or {})}
    async with http.put(stream, headers=text) as resp:
        assert resp.status == 201, await resp.text()
    for data in datas:
        async with http.post(stream, data=data, headers=text) as resp:
            assert resp.status in (200, 204), await resp.text()


async def test_a_read_takes_a_stream_name_where_it_takes_an_id(server: BrokerServer,
                                                               http: aiohttp.ClientSession,
                                                               ) -> None:
    await make_stream(http, server.url, "orders", b"one", b"two")
    for topic in ("orders", str(NAMED_TOPIC_BASE)):
        async with http.get(f"{server.url}/messaging/messages",
                            params={"topicID": topic}) as resp:
            assert resp.status == 200, await resp.text()
            messages, _ = decode(await resp.read())
        assert [m.data for m in messages] == [b"one", b"two"]
        assert {m.topic for m in messages} == {NAMED_TOPIC_BASE}
    async with http.get(f"{server.url}/messaging/messages",
                        params={"topicID": "orders", "streaming": "true"}) as resp:
        assert resp.status == 200
        got = b""
        while len(decode(got)[0]) < 2:
            got += await resp.content.readany()
    async with http.get(f"{server.url}/messaging/topics/orders") as resp:
        assert (await resp.json())["id"] == str(NAMED_TOPIC_BASE)


async def test_consumer_routes_and_heartbeats_take_a_name(server: BrokerServer,
                                                          http: aiohttp.ClientSession) -> None:
    await make_stream(http, server.url, "orders", b"one", b"two")
    async with http.post(f"{server.url}/messaging/heartbeat",
                         params={"topicID": "orders", "index": "1", "url": "c"}) as resp:
        assert resp.status == 200, await resp.text()
    async with http.get(f"{server.url}/messaging/consumers",
                        params={"topicID": "orders"}) as resp:
        (row,) = await resp.json()
    assert (row["topic"], row["name"], row["index"]) == (str(NAMED_TOPIC_BASE), "c", 1)
    async with http.put(f"{server.url}/messaging/consumers/c",
                        params={"topicID": "orders", "index": "0"}) as resp:
        assert resp.status == 200
        assert (await resp.json())["topic"] == str(NAMED_TOPIC_BASE)
    async with http.delete(f"{server.url}/messaging/consumers/c",
                           params={"topicID": "orders"}) as resp:
        assert await resp.json() == {"name": "c", "topics": [str(NAMED_TOPIC_BASE)]}


async def test_unknown_and_deleted_names(server: BrokerServer,
                                         http: aiohttp.ClientSession) -> None:
    for params in ({"topicID": "nope"}, {"topicID": "nope", "streaming": "true"}):
        async with http.get(f"{server.url}/messaging/messages", params=params) as resp:
            assert resp.status == 404
            assert resp.headers["X-Broker-Error"] == (
                "invalid topicID 'nope': not a topic id, and no stream has that name")
    await make_stream(http, server.url, "gone", b"x")
    async with http.delete(f"{server.url}/v1/stream/gone") as resp:
        assert resp.status == 204
    async with http.get(f"{server.url}/messaging/messages", params={"topicID": "gone"}) as resp:
        assert resp.status == 404  # deleted with no fork reading it: the name is free again
    async with http.get(f"{server.url}/messaging/messages",
                        params={"topicID": "bad\x01name"}) as resp:
        assert resp.status == 400
        assert "invalid topicID" in resp.headers["X-Broker-Error"]
    async with http.post(f"{server.url}/messaging/messages", params={"topicID": "orders"},
                         data=b"x") as resp:
        assert resp.status == 400  # a native publish takes ids only: streams take /v1/stream


@pytest.mark.parametrize(("params", "path"), [
    ({"topicID": "bad\x01name"}, "/messaging/messages"),
    ({"topicID": str(2**64)}, "/messaging/messages"),
    ({"topicID": "bad\x01name"}, "/messaging/consumers"),
    ({}, "/messaging/topics/bad%01name"),
])
async def test_a_400_for_a_topic_that_is_neither_id_nor_name_says_what_names_are(
        server: BrokerServer, http: aiohttp.ClientSession, params: dict[str, str],
        path: str) -> None:
    async with http.get(f"{server.url}{path}", params=params) as resp:
        assert resp.status == 400
        error = resp.headers["X-Broker-Error"]
    assert error.endswith(": expected a topic id (an unsigned integer below 2^64) or a "
                          "stream's name (the NAME of /v1/stream/NAME)"), error
    assert error.count("\n") == 0


def test_a_write_takes_ids_and_says_where_names_go() -> None:
    assert topic_to_write("7") == 7 and topic_to_write(str(2**64 - 1)) == 2**64 - 1
    assert topic_to_write(None) is None and topic_to_write("") is None
    for text in ("orders", "-1", "1.5", "１"):
        with pytest.raises(BadRequestError) as refused:
            topic_to_write(text)
        assert str(refused.value) == (
            f"invalid topicID {text!r}: a publish names its topic by id (an unsigned integer "
            "below 2^64); names are streams': create one with PUT /v1/stream/NAME and append "
            "with POST /v1/stream/NAME (reads take a stream's name as topicID)")
    with pytest.raises(BadRequestError, match=r"below 2\^64"):
        topic_to_write(str(2**64))


async def test_a_publish_to_a_name_is_told_about_streams(server: BrokerServer,
                                                         http: aiohttp.ClientSession) -> None:
    async with http.post(f"{server.url}/messaging/messages", params={"topicID": "orders"},
                         data=b"x") as resp:
        assert resp.status == 400
        assert "PUT /v1/stream/NAME" in resp.headers["X-Broker-Error"]


@pytest.fixture
def scoped_tokens(tmp_path: Path) -> tuple[Path, dict[str, dict[str, str]]]:
    """Tokens reading a stream by its name, by its id, by a NAME/* prefix, and not at all."""
    roles = {"by-name": "read=orders", "by-id": f"read={NAMED_TOPIC_BASE}",
             "prefix": "read=orders/*", "other": "read=1", "admin": "admin"}
    headers, lines = {}, []
    for role, scope in roles.items():
        token = new_token()
        headers[role] = {"Authorization": f"Bearer {token}"}
        lines.append(token_line(role, token, [parse_scope(scope)]))
    path = tmp_path / "tokens"
    path.write_text("\n".join(lines) + "\n")
    return path, headers


async def test_read_scopes_are_checked_by_id_and_by_name(
        start_server: StartServer, http: aiohttp.ClientSession,
        scoped_tokens: tuple[Path, dict[str, dict[str, str]]]) -> None:
    path, tokens = scoped_tokens
    server = await start_server(tokens=path)
    await make_stream(http, server.url, "orders", b"one", headers=tokens["admin"])

    async def status(role: str, topic: str) -> int:
        async with http.get(f"{server.url}/messaging/messages", params={"topicID": topic},
                            headers=tokens[role]) as resp:
            return resp.status

    for role in ("by-name", "by-id", "prefix", "admin"):  # orders/* covers orders itself
        assert await status(role, "orders") == 200, role
        assert await status(role, str(NAMED_TOPIC_BASE)) == 200, role
    assert await status("other", "orders") == 403
    assert await status("other", str(NAMED_TOPIC_BASE)) == 403
    # A name the token may not read is 403 whether or not a stream has it: no probing.
    assert await status("other", "secret") == 403
    assert await status("by-name", "orders/missing") == 403
    assert await status("prefix", "orders/missing") == 404
