"""The consumer endpoints and reads by consumer over real sockets (in-process broker):
listing, the no-backwards rule, reset, delete, and the start of a read by consumer."""

from __future__ import annotations

import aiohttp

from messaging.frames import decode
from messaging.http.server import BrokerServer


async def read(http: aiohttp.ClientSession, url: str, **params: str) -> tuple[list[int], str]:
    async with http.get(f"{url}/messaging/messages", params={"topicID": "1", **params}) as resp:
        assert resp.status == 200, resp.headers.get("X-Broker-Error")
        return ([m.index for m in decode(await resp.read())[0]],
                resp.headers["X-Broker-Consumer-Index"])


async def test_consumer_positions_over_http(server: BrokerServer,
                                            http: aiohttp.ClientSession) -> None:
    url = server.url
    for n in range(6):
        async with http.post(f"{url}/messaging/messages", params={"topicID": "1"},
                             data=b"m%d" % n) as resp:
            assert resp.status == 200
    assert await read(http, url, consumer="new") == ([1, 2, 3, 4, 5, 6], "0")
    for index in ("4", "2"):  # the second is lower: "alive", not a move back
        async with http.post(f"{url}/messaging/heartbeat",
                             params={"topicID": "1", "index": index, "url": "c"}) as resp:
            assert resp.status == 200
    assert await read(http, url, consumer="c") == ([5, 6], "4")
    async with http.get(f"{url}/messaging/consumers", params={"topicID": "1"}) as resp:
        (row,) = await resp.json()
    assert {k: row[k] for k in ("topic", "name", "index", "last_index", "lag", "live")} == {
        "topic": 1, "name": "c", "index": 4, "last_index": 6, "lag": 2, "live": True}
    async with http.put(f"{url}/messaging/consumers/c",
                        params={"topicID": "1", "index": "1"}) as resp:
        assert resp.status == 200
    assert await read(http, url, consumer="c") == ([2, 3, 4, 5, 6], "1")
    async with http.delete(f"{url}/messaging/consumers/c") as resp:
        assert (await resp.json()) == {"name": "c", "topics": [1]}
    async with http.get(f"{url}/messaging/consumers") as resp:
        assert await resp.json() == []
    async with http.delete(f"{url}/messaging/consumers/c") as resp:
        assert resp.status == 404


async def test_lag_counts_messages_not_broker_indexes(server: BrokerServer,
                                                      http: aiohttp.ClientSession) -> None:
    """Indexes are shared by every topic: with topic 2's publishes between topic 1's, two
    unread messages of topic 1 are a lag of 2, not the difference of their indexes."""
    for n in range(6):
        async with http.post(f"{server.url}/messaging/messages",
                             params={"topicID": str(1 + n % 2)}, data=b"m%d" % n) as resp:
            assert resp.status == 200
    # topic 1 holds indexes 1, 3, 5; consumer c processed 1
    async with http.post(f"{server.url}/messaging/heartbeat",
                         params={"topicID": "1", "index": "1", "url": "c"}) as resp:
        assert resp.status == 200
    async with http.get(f"{server.url}/messaging/consumers", params={"topicID": "1"}) as resp:
        (row,) = await resp.json()
    assert (row["index"], row["last_index"], row["lag"]) == (1, 5, 2)


async def test_reset_takes_a_json_body_with_numbers_or_decimal_strings(
        server: BrokerServer, http: aiohttp.ClientSession) -> None:
    for n in range(3):
        async with http.post(f"{server.url}/messaging/messages", params={"topicID": "1"},
                             data=b"m%d" % n) as resp:
            assert resp.status == 200
    url = f"{server.url}/messaging/consumers/c"
    for body, index in [({"topicID": 1, "index": 2}, 2), ({"topicID": "1", "index": "3"}, 3)]:
        async with http.put(url, json=body) as resp:
            assert resp.status == 200, await resp.text()
            assert await resp.json() == {"topic": 1, "name": "c", "index": index}
    for body, fragment in [({"topicID": 1, "index": 1.5}, "invalid index"),
                           ({"topicID": 1, "index": -1}, "invalid index"),
                           ({"topicID": 1, "index": True}, "invalid index"),
                           ({"topicID": 1, "index": " 1"}, "invalid index"),
                           ({"topicID": 1.0, "index": 1}, "invalid topicID"),
                           ({"topicID": 2**64, "index": 1}, "invalid topicID"),
                           ({"index": 1}, "missing parameter topicID"),
                           ({"topicID": 1}, "missing parameter index"),
                           ([1, 2], "expected an object")]:
        async with http.put(url, json=body) as resp:
            assert resp.status == 400, body
            assert fragment in resp.headers["X-Broker-Error"], body
    async with http.put(url, data=b"{", headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 400 and "invalid JSON body" in resp.headers["X-Broker-Error"]


async def test_reset_reads_a_json_body_sent_as_a_form(server: BrokerServer,
                                                      http: aiohttp.ClientSession) -> None:
    """``curl -XPUT -d '{"topicID":1,"index":2}'`` sends application/x-www-form-urlencoded:
    the body is still the JSON object the query does not replace."""
    for n in range(3):
        async with http.post(f"{server.url}/messaging/messages", params={"topicID": "1"},
                             data=b"m%d" % n) as resp:
            assert resp.status == 200
    url = f"{server.url}/messaging/consumers/c"
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    async with http.put(url, data=b'{"topicID":1,"index":2}', headers=form) as resp:
        assert resp.status == 200, resp.headers.get("X-Broker-Error")
        assert await resp.json() == {"topic": 1, "name": "c", "index": 2}
    async with http.put(url, params={"topicID": "1", "index": "1"}, data=b"x=1",
                        headers=form) as resp:  # the query names the topic: the body is not read
        assert resp.status == 200 and (await resp.json())["index"] == 1
    async with http.put(url, data=b"topicID=1&index=2", headers=form) as resp:
        assert resp.status == 400 and "invalid JSON body" in resp.headers["X-Broker-Error"]
