"""The answers of the API: whatever an error message holds, the header line is printable;
JSON answers write ids and indexes of 2^53 and more as strings, on every route, and end with
a newline."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from messaging.broker.view import SNAPSHOT_PATH
from messaging.http.app import ROUTES, SINGLE
from messaging.http.responses import error_response, json_answer
from messaging.http.server import BrokerServer
from messaging.json_ids import SAFE_LIMIT
from messaging.placement import NAMED_TOPIC_BASE
from tests.conftest import frames
from tests.http.test_topic_param import make_stream
from tests.raw_http import PRINTABLE_HEADER


def test_error_response_escapes_every_non_printable_character() -> None:
    message = "".join(map(chr, range(256))) + "\u2028\U0001f600"
    response = error_response(400, message)
    header = response.headers["X-Broker-Error"]
    assert PRINTABLE_HEADER.fullmatch(header.encode("ascii"))
    assert response.text == header + "\n"
    assert r"\x00" in header and r"\x7f" in header and r"\u2028" in header
    assert "".join(map(chr, range(32, 127))) in header  # printable ASCII kept as is


# -- JSON answers: ids and indexes every reader gets exactly --------------------------------


def test_json_answer_writes_big_integers_as_strings() -> None:
    response = json_answer({"id": 1 << 63, "index": SAFE_LIMIT - 1, "live": True},
                           status=201, headers={"X-Test": "1"})
    assert response.status == 201 and response.headers["X-Test"] == "1"
    assert response.content_type == "application/json"
    assert response.text == f'{{"id": "{1 << 63}", "index": {SAFE_LIMIT - 1}, "live": true}}\n'


async def test_every_json_route_writes_a_stream_id_as_a_string(
        server: BrokerServer, http: aiohttp.ClientSession) -> None:
    stream_id = str(NAMED_TOPIC_BASE)
    await make_stream(http, server.url, "orders", b"one")
    async with http.post(f"{server.url}/messaging/messages", params={"topicID": "1"},
                         data=b"native") as resp:
        assert resp.status == 200
    async with http.post(f"{server.url}/messaging/heartbeat",
                         params={"topicID": stream_id, "index": "1", "url": "c"}) as resp:
        assert resp.status == 200
    answers = {}
    for path in ("/messaging/topics", f"/messaging/topics/{stream_id}",
                 "/messaging/consumers", "/messaging/diagnostics"):
        async with http.get(server.url + path) as resp:
            assert resp.status == 200
            answers[path] = await resp.json()
    by_id = {row["id"]: row for row in answers["/messaging/topics"]}
    assert set(by_id) == {1, stream_id}  # the native topic's id stays a number
    assert by_id[stream_id]["name"] == "orders" and by_id[stream_id]["subscribers"] == {"c": 1}
    assert answers[f"/messaging/topics/{stream_id}"]["id"] == stream_id
    assert [row["topic"] for row in answers["/messaging/consumers"]] == [stream_id]
    assert {t["id"] for t in answers["/messaging/diagnostics"]["topics"]} == {1, stream_id}


# -- JSON answers end with a newline -----------------------------------------------------------

#: Routes of a single node whose answer is not JSON, and what it is instead.
NOT_JSON = {
    ("GET", "/messaging/messages"): "frames",
    ("POST", "/messaging/heartbeat"): "an empty 200",
    ("GET", "/metrics"): "Prometheus text",
    ("*", "/v1/stream/{name:.+}"): "the Durable Streams protocol's bodies",
    ("GET", SNAPSHOT_PATH): "a snapshot, for cluster peers only",
}
#: One request per JSON answer: (method, route path, path, query, body, headers).
JSON_REQUESTS: list[tuple[str, str, str, dict[str, str], bytes | None, dict[str, str]]] = [
    ("POST", "/messaging/messages", "/messaging/messages", {"topicID": "1"},
     frames(1, [0, 0]), {"Content-Type": "application/x-messaging-frames"}),
    ("GET", "/messaging/ping", "/messaging/ping", {}, None, {}),
    ("POST", "/messaging/ping", "/messaging/ping", {}, None, {}),
    ("GET", "/messaging/topics", "/messaging/topics", {}, None, {}),
    ("GET", "/messaging/times", "/messaging/times", {"topicID": "1"}, None, {}),
    ("GET", "/messaging/topics/{id}", "/messaging/topics/1", {}, None, {}),
    ("PUT", "/messaging/topics/{id}", "/messaging/topics/2", {}, b"{}", {}),
    ("DELETE", "/messaging/topics/{id}", "/messaging/topics/2", {}, None, {}),
    ("GET", "/messaging/diagnostics", "/messaging/diagnostics", {}, None, {}),
    ("POST", "/messaging/retention", "/messaging/retention", {}, None, {}),
    ("PUT", "/messaging/consumers/{name}", "/messaging/consumers/c",
     {"topicID": "1", "index": "1"}, None, {}),
    ("GET", "/messaging/consumers", "/messaging/consumers", {}, None, {}),
    ("DELETE", "/messaging/consumers/{name}", "/messaging/consumers/c", {}, None, {}),
    ("GET", "/healthz", "/healthz", {}, None, {}),
    ("GET", "/readyz", "/readyz", {}, None, {}),
    ("GET", "/messaging/whoami", "/messaging/whoami", {}, None, {}),
    ("GET", "/messaging/disk", "/messaging/disk", {}, None, {}),
    ("GET", "/console/config.json", "/console/config.json", {}, None, {}),
]


def test_every_route_is_either_answered_in_json_below_or_says_what_it_answers() -> None:
    """Built from the router: a new route is listed in one of the two, or this fails."""
    routes = {(r.method, r.path) for r in ROUTES if SINGLE in r.served}
    asked = {(method, route) for method, route, *_rest in JSON_REQUESTS}
    assert routes - NOT_JSON.keys() <= asked
    assert not asked & NOT_JSON.keys()


async def test_every_json_answer_is_one_line_ending_with_a_newline(
        server: BrokerServer, http: aiohttp.ClientSession) -> None:
    for method, _route, path, query, body, headers in JSON_REQUESTS:
        async with http.request(method, server.url + path, params=query, data=body,
                                headers=headers) as resp:
            assert resp.status in (200, 201), (method, path, await resp.text())
            assert resp.content_type == "application/json", (method, path)
            text = await resp.text()
        assert text.endswith("\n") and text.count("\n") == 1, (method, path, text)
        answer: Any = json.loads(text)
        assert answer is not None, (method, path)
