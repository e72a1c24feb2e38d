"""Who may do what over HTTP: every endpoint with no token, a wrong one, one without the
scope and one with it; the attacks a token must not allow; the limits; the access log."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from messaging.http import limits as limits_module
from messaging.http.auth import new_token, parse_scope, token_line
from messaging.http.server import BrokerServer
from tests.conftest import StartServer


class Tokens:
    """Tokens of the test broker, by role."""

    def __init__(self, directory: Path) -> None:
        self.by_role: dict[str, str] = {}
        lines = []
        for role, scopes in {
            "admin": ["admin"],
            "reader": ["read=1,s1"],
            "writer": ["write=1,s1", "read=1,s1"],
            "consumer": ["consume=c1"],
            "other": ["read=999", "write=999", "consume=zz"],
        }.items():
            token = new_token()
            self.by_role[role] = token
            lines.append(token_line(role, token, [parse_scope(s) for s in scopes]))
        self.path = directory / "tokens"
        self.path.write_text("\n".join(lines) + "\n")

    def header(self, role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.by_role[role]}"}


@pytest.fixture
def tokens(tmp_path: Path) -> Tokens:
    return Tokens(tmp_path)


@pytest.fixture
async def secured(start_server: StartServer, tokens: Tokens) -> BrokerServer:
    return await start_server(tokens=tokens.path)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


# (method, path, query, body, headers, the role that has the scope)
ENDPOINTS: list[tuple[str, str, dict[str, str], bytes, dict[str, str], str]] = [
    ("POST", "/messaging/messages", {"topicID": "1"}, b"x", {}, "writer"),
    ("GET", "/messaging/messages", {"topicID": "1"}, b"", {}, "reader"),
    ("POST", "/messaging/heartbeat", {"topicID": "1", "index": "0", "url": "c1"}, b"", {},
     "consumer"),
    ("GET", "/messaging/topics/1", {}, b"", {}, "reader"),
    ("POST", "/messaging/retention", {}, b"", {}, "admin"),
    ("GET", "/metrics", {}, b"", {}, "admin"),
    ("PUT", "/v1/stream/s1", {}, b"", {"Content-Type": "text/plain"}, "writer"),
    ("POST", "/v1/stream/s1", {}, b"hi", {"Content-Type": "text/plain"}, "writer"),
    ("GET", "/v1/stream/s1", {}, b"", {}, "reader"),
    ("HEAD", "/v1/stream/s1", {}, b"", {}, "reader"),
    ("DELETE", "/v1/stream/s1", {}, b"", {}, "admin"),
    ("PUT", "/messaging/consumers/c1", {"topicID": "1", "index": "0"}, b"", {}, "admin"),
    ("DELETE", "/messaging/consumers/c1", {}, b"", {}, "admin"),
]


async def _call(http: aiohttp.ClientSession, server: BrokerServer, method: str, path: str,
                query: dict[str, str], body: bytes, headers: dict[str, str]
                ) -> tuple[int, dict[str, str]]:
    async with http.request(method, server.url + path, params=query, data=body or None,
                            headers=headers) as resp:
        await resp.read()
        return resp.status, dict(resp.headers)


async def test_every_endpoint_by_token(secured: BrokerServer, tokens: Tokens,
                                       http: aiohttp.ClientSession) -> None:
    rows = []
    for method, path, query, body, headers, role in ENDPOINTS:
        for who in ("none", "wrong", "other", role):
            sent = dict(headers)
            if who == "wrong":
                sent["Authorization"] = "Bearer not-a-token"
            elif who != "none":
                sent.update(tokens.header(who))
            status, answer = await _call(http, secured, method, path, query, body, sent)
            rows.append((method, path, who, status))
            if who in ("none", "wrong"):
                assert status == 401, rows[-1]
                assert answer.get("WWW-Authenticate", "").startswith("Bearer")
            elif who == "other":
                assert status == 403, rows[-1]
            else:
                assert status not in (401, 403), rows[-1]
            if status in (401, 403) and method != "HEAD":
                assert "X-Broker-Error" in answer
    # The admin token may do everything.
    for method, path, query, body, headers, _role in ENDPOINTS:
        status, _ = await _call(http, secured, method, path, query, body,
                                {**headers, **tokens.header("admin")})
        assert status not in (401, 403), (method, path, status)


async def test_open_endpoints_and_listing(secured: BrokerServer, tokens: Tokens,
                                          http: aiohttp.ClientSession) -> None:
    for path in ("/healthz", "/readyz"):
        async with http.get(secured.url + path) as resp:
            assert resp.status == 200, path
    async with http.options(secured.url + "/v1/stream/s1") as resp:
        assert resp.status == 204  # CORS preflights carry no credentials
    for topic in (1, 2):
        async with http.post(secured.url + "/messaging/messages", data=b"x",
                             params={"topicID": str(topic)},
                             headers=tokens.header("admin")) as resp:
            assert resp.status == 200
    async with http.get(secured.url + "/messaging/topics",
                        headers=tokens.header("reader")) as resp:
        assert [t["id"] for t in await resp.json()] == [1]  # only what it may read
    async with http.get(secured.url + "/messaging/diagnostics",
                        headers=tokens.header("reader")) as resp:
        report = await resp.json()
        assert "path" not in json.dumps(report) and report["version"]
    async with http.get(secured.url + "/messaging/diagnostics",
                        headers=tokens.header("admin")) as resp:
        assert (await resp.json())["path"] == str(secured.config.data)
    async with http.get(secured.url + "/metrics", headers=tokens.header("admin")) as resp:
        text = await resp.text()
    assert 'messaging_build_info{version="' in text
    assert 'messaging_topic_last_index{topic="1"}' in text


async def test_attacks_are_refused(start_server: StartServer, tokens: Tokens,
                                   http: aiohttp.ClientSession) -> None:
    """Taking over another consumer's position, pinning a topic with a fake subscriber and
    flooding a topic with subscribers."""
    server = await start_server(tokens=tokens.path, max_subscribers=3)
    consumer = tokens.header("consumer")

    async def heartbeat(url: str, index: int, headers: dict[str, str]) -> int:
        async with http.post(server.url + "/messaging/heartbeat", headers=headers,
                             params={"topicID": "1", "index": str(index), "url": url}) as resp:
            return resp.status

    assert await heartbeat("c1", 0, consumer) == 200
    assert await heartbeat("victim", 2**64 - 1, consumer) == 403  # take-over
    assert await heartbeat("pin", 0, tokens.header("writer")) == 403  # pinning
    async with http.post(server.url + "/messaging/retention",
                         headers=tokens.header("writer")) as resp:
        assert resp.status == 403
    admin = tokens.header("admin")
    assert await heartbeat("x" * 300, 0, admin) == 400
    assert await heartbeat("a", 0, admin) == 200
    assert await heartbeat("b", 0, admin) == 200
    assert await heartbeat("c", 0, admin) == 429  # c1, a, b registered: the cap is 3
    assert await heartbeat("a", 1, admin) == 200  # known subscribers go on


async def test_slow_upload_is_cut_off(start_server: StartServer, http: aiohttp.ClientSession,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits_module, "UPLOAD_GRACE", 0.3)
    server = await start_server(min_upload_rate=100_000)
    loop = asyncio.get_running_loop()

    async def trickle() -> AsyncIterator[bytes]:
        for _ in range(50):  # 10 bytes every 0.1 s: far below 100,000 bytes a second
            yield b"x" * 10
            await asyncio.sleep(0.1)

    started = loop.time()
    with pytest.raises(aiohttp.ClientError):
        async with http.post(server.url + "/messaging/messages", params={"topicID": "1"},
                             data=trickle()) as resp:
            await resp.read()
            assert resp.status == 408
            raise aiohttp.ClientPayloadError("answered 408")
    assert loop.time() - started < 3.0  # cut at the deadline, not after the whole body
    assert server.broker is not None and server.broker.topic(1) is None


async def test_append_rate_limit(start_server: StartServer,
                                 http: aiohttp.ClientSession) -> None:
    server = await start_server(max_append_rate=5)
    statuses = []
    for _ in range(8):
        async with http.post(server.url + "/messaging/messages", params={"topicID": "1"},
                             data=b"x") as resp:
            statuses.append((resp.status, resp.headers.get("Retry-After")))
    assert statuses[:5] == [(200, None)] * 5
    assert all(status == 429 and after is not None and int(after) >= 1
               for status, after in statuses[5:])
    async with http.post(server.url + "/messaging/messages", params={"topicID": "2"},
                         data=b"x") as resp:
        assert resp.status == 200  # per topic


async def test_stream_cap(start_server: StartServer, http: aiohttp.ClientSession) -> None:
    server = await start_server(max_streams=1)
    params = {"topicID": "1", "streaming": "true"}
    async with http.get(server.url + "/messaging/messages", params=params) as first:
        assert first.status == 200
        async with http.get(server.url + "/messaging/messages", params=params) as second:
            assert second.status == 503
            assert "--max-streams" in second.headers["X-Broker-Error"]


async def test_access_log(start_server: StartServer, tokens: Tokens,
                          http: aiohttp.ClientSession,
                          caplog: pytest.LogCaptureFixture) -> None:
    server = await start_server(tokens=tokens.path, access_log=True)
    with caplog.at_level(logging.INFO, logger="messaging.access"):
        async with http.post(server.url + "/messaging/messages", params={"topicID": "1"},
                             data=b"x", headers=tokens.header("writer")) as resp:
            assert resp.status == 200
        async with http.get(server.url + "/messaging/topics") as resp:
            assert resp.status == 401
        await asyncio.sleep(0.05)
    records: list[dict[str, Any]] = [r.access for r in caplog.records  # type: ignore[attr-defined]
                                     if r.name == "messaging.access"]
    assert [(r["method"], r["path"], r["status"], r["token"]) for r in records] == [
        ("POST", "/messaging/messages", 200, "writer"), ("GET", "/messaging/topics", 401, "-")]
    assert all(r["duration_ms"] >= 0 for r in records)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert all(token not in text for token in tokens.by_role.values())


async def test_operator_log_lines(server: BrokerServer, http: aiohttp.ClientSession,
                                  caplog: pytest.LogCaptureFixture) -> None:
    """INFO lines say when a topic is created and when a new subscriber registers."""
    with caplog.at_level(logging.INFO, logger="messaging"):
        async with http.post(server.url + "/messaging/messages", params={"topicID": "9"},
                             data=b"x") as resp:
            assert resp.status == 200
        for index in (0, 1):  # only the first heartbeat of a subscriber is news
            async with http.post(server.url + "/messaging/heartbeat",
                                 params={"topicID": "9", "index": str(index),
                                         "url": "reporter"}) as resp:
                assert resp.status == 200
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert lines.count("topic 9 created") == 1
    assert lines.count("topic 9: new subscriber 'reporter'") == 1
