"""The answers of the API: whatever an error message holds, the header line is printable;
JSON answers write ids and indexes of 2^53 and more as strings, on every route."""

from __future__ import annotations

import aiohttp

from messaging.http.responses import error_response, json_answer
from messaging.http.server import BrokerServer
from messaging.json_ids import SAFE_LIMIT
from messaging.placement import NAMED_TOPIC_BASE
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
    assert response.text == f'{{"id": "{1 << 63}", "index": {SAFE_LIMIT - 1}, "live": true}}'


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
