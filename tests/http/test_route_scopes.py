"""Every route declares the scope it needs, and the scope is checked before any parameter.

The routes come from the router of an application built as ``BrokerServer`` builds it
(:func:`messaging.http.app.make_app`: API, consumers, health, Durable Streams and the
cluster's snapshot route), so a route added later is covered without being listed here: one
that declares no scope fails these tests.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDictProxy

from messaging.broker.broker import Broker
from messaging.broker.snapshot import SNAPSHOT_PATH, SnapshotStream
from messaging.config import BrokerConfig
from messaging.http.app import make_app
from messaging.http.auth import (
    KINDS,
    OPEN,
    Principal,
    Scope,
    Tokens,
    declared_scope,
    new_token,
    parse_scope,
    requires,
    token_line,
)
from messaging.log.local import LocalLog
from messaging.stack.assemble import Stack
from tests.raw_server import app_server

#: A sample value for each path parameter of the routes.
SAMPLES = {"id": "1", "name": "s1"}
CLUSTER = "blue"
#: Scopes by token name: each kind alone, every kind but one (never admin: it holds all),
#: and tokens limited to one target.
ROLES: dict[str, list[str]] = {
    **{kind: [kind] for kind in KINDS},
    **{f"all-but-{kind}": [k for k in KINDS if k not in (kind, "admin")] for kind in KINDS},
    "read42": ["read=42"],
    "write42": ["write=42"],
    "consume-c1": ["consume=c1"],
}


class FakeSnapshots:
    """A cluster's snapshot source over a single node's broker."""

    cluster = CLUSTER

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    async def open_snapshot(self) -> SnapshotStream:
        return await asyncio.get_running_loop().run_in_executor(
            None, SnapshotStream.capture, self.broker, {"cluster": CLUSTER, "revision": 7})


@dataclass
class Node:
    """A served application and the tokens it accepts."""

    app: web.Application
    url: str
    tokens: dict[str, str]

    def auth(self, role: str | None) -> dict[str, str]:
        if role is None:
            return {}
        if role == "wrong":
            return {"Authorization": "Bearer msg_not-a-token"}
        return {"Authorization": f"Bearer {self.tokens[role]}"}


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    loop = asyncio.get_running_loop()
    tokens = {role: new_token() for role in ROLES}
    path = tmp_path / "tokens"
    path.write_text("".join(token_line(role, tokens[role], [parse_scope(s) for s in scopes])
                            + "\n" for role, scopes in ROLES.items()))
    config = BrokerConfig(data=tmp_path / "data")
    broker = await loop.run_in_executor(None, Broker.open, config.data)
    log = LocalLog(broker, "http://127.0.0.1:0")
    await log.start()
    tokens_file = await loop.run_in_executor(None, Tokens, path)
    app = make_app(Stack(broker, log), config, tokens=tokens_file,
                   snapshots=FakeSnapshots(broker))
    try:
        async with app_server(app) as url:
            yield Node(app, url, tokens)
    finally:
        await log.close()
        await loop.run_in_executor(None, broker.close)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


def sample_path(canonical: str) -> str:
    """A route's path with its parameters filled in from SAMPLES."""
    def fill(match: re.Match[str]) -> str:
        name = match.group(1)
        assert name in SAMPLES, f"add a sample value for path parameter {name!r} to SAMPLES"
        return SAMPLES[name]

    return re.sub(r"\{(\w+)(?::[^}]*)?\}", fill, canonical)


def routes(app: web.Application) -> Iterator[tuple[str, str, str]]:
    """(method, path, the scope kind it needs) for every route of ``app``'s router."""
    for route in app.router.routes():
        resource = route.resource
        assert resource is not None
        declared = declared_scope(route.handler)
        assert declared is not None, f"{route.method} {resource.canonical} declares no scope"
        methods = sorted(declared) if route.method == "*" else [route.method]
        assert isinstance(declared, str) or route.method == "*" or route.method in declared
        for method in methods:
            kind = declared if isinstance(declared, str) else declared[method]
            assert kind in (*KINDS, OPEN)
            yield method, sample_path(resource.canonical), kind


async def status_of(http: aiohttp.ClientSession, node: Node, method: str, path: str,
                    role: str | None, **params: str) -> tuple[int, CIMultiDictProxy[str]]:
    async with http.request(method, node.url + path, headers=node.auth(role),
                            params=params or None) as resp:
        await resp.read()
        return resp.status, resp.headers


async def test_every_route_declares_its_scope_and_is_checked_first(
        node: Node, http: aiohttp.ClientSession) -> None:
    """No token or a wrong one: 401; a token with every kind but the one needed: 403 (no
    parameters are sent, so a handler that parsed first would answer 400); the kind needed:
    neither. Open routes never answer 401 or 403."""
    checked = list(routes(node.app))
    paths = {path for _method, path, _kind in checked}
    # The router really is the whole broker's: the API, health, streams and snapshots.
    assert {"/messaging/messages", "/healthz", "/readyz", "/v1/stream/s1",
            SNAPSHOT_PATH} <= paths
    for method, path, kind in checked:
        if kind == OPEN:
            for role in (None, "wrong", *ROLES):
                status, _ = await status_of(http, node, method, path, role)
                assert status not in (401, 403), (method, path, role, status)
            continue
        for role, expected in ((None, 401), ("wrong", 401), (f"all-but-{kind}", 403)):
            status, headers = await status_of(http, node, method, path, role)
            assert status == expected, (method, path, kind, role, status)
            if method != "HEAD":
                assert headers.get("X-Broker-Error"), (method, path, role)
            if status == 401:
                assert headers.get("WWW-Authenticate", "").startswith("Bearer")
        status, _ = await status_of(http, node, method, path, kind)
        assert status not in (401, 403), (method, path, kind, status)


async def test_snapshot_needs_admin(node: Node, http: aiohttp.ClientSession) -> None:
    """A token that may read one topic gets no snapshot (all topics' data), whatever the
    parameters; an admin token gets it, or 400 for another cluster's name."""
    async with http.post(node.url + "/messaging/messages", params={"topicID": "43"},
                         data=b"secret", headers=node.auth("admin")) as resp:
        assert resp.status == 200
    assert (await status_of(http, node, "GET", "/messaging/topics/43", "read42"))[0] == 403
    for params in ({}, {"cluster": CLUSTER}, {"cluster": "other"}):
        status, headers = await status_of(http, node, "GET", SNAPSHOT_PATH, "read42", **params)
        assert status == 403, params
        assert "no admin scope" in headers["X-Broker-Error"]
    async with http.get(node.url + SNAPSHOT_PATH, params={"cluster": CLUSTER},
                        headers=node.auth("admin")) as resp:
        assert resp.status == 200
        body = await resp.read()
    header = json.loads(body.split(b"\n", 1)[0])
    assert header["cluster"] == CLUSTER and header["revision"] == 7
    assert b"secret" in body  # the segment's bytes (its time records follow them)
    status, headers = await status_of(http, node, "GET", SNAPSHOT_PATH, "admin", cluster="red")
    assert status == 400 and "cluster 'blue'" in headers["X-Broker-Error"]


async def test_targets_are_checked_before_the_other_parameters(
        node: Node, http: aiohttp.ClientSession) -> None:
    """A token with the kind a route needs but not the target it names: 403, even when the
    other parameters are missing or invalid (a 400 would mean they were parsed first)."""
    cases = [
        ("GET", "/messaging/messages", "read42", {"topicID": "43", "index": "x"}),
        ("GET", "/messaging/topics/43", "read42", {"after": "x"}),
        ("GET", "/messaging/consumers", "read42", {"topicID": "43", "name": ""}),
        ("POST", "/messaging/messages", "write42", {"topicID": "43", "type": "x"}),
        ("POST", "/messaging/heartbeat", "consume-c1", {"url": "victim", "index": "x"}),
    ]
    for method, path, role, params in cases:
        status, _ = await status_of(http, node, method, path, role, **params)
        assert status == 403, (method, path, params, status)
    # A fork names a second target, its source: it may be read, or 403 (not 400 for the TTL).
    async with http.put(node.url + "/v1/stream/fork", headers={
            **node.auth("all-but-read"), "Stream-Forked-From": "s1", "Stream-TTL": "x"}) as resp:
        assert resp.status == 403 and "stream 's1'" in resp.headers["X-Broker-Error"]
    # With the target allowed, the other parameters are checked next.
    for method, path, role, params in [
            ("GET", "/messaging/messages", "read42", {"topicID": "42", "index": "x"}),
            ("POST", "/messaging/messages", "write42", {"topicID": "42", "type": "x"}),
            ("POST", "/messaging/heartbeat", "consume-c1", {"url": "c1", "index": "x"})]:
        status, _ = await status_of(http, node, method, path, role, **params)
        assert status == 400, (method, path, params, status)


async def test_unknown_paths_and_methods_answer_401_before_404_and_405(
        node: Node, http: aiohttp.ClientSession) -> None:
    """Who has no valid token learns nothing of the routes: 401 first, like Kafka's."""
    for method, path, known in (("GET", "/nothing/here", 404),
                                ("DELETE", "/messaging/topics", 405),
                                ("PATCH", "/v1/stream/s1", 405),
                                ("OPTIONS", "/messaging/messages", 405)):
        for role in (None, "wrong"):
            status, _ = await status_of(http, node, method, path, role)
            assert status == 401, (method, path, role, status)
        status, headers = await status_of(http, node, method, path, "read")
        assert status == known, (method, path, status)
        assert headers.get("X-Broker-Error")


async def test_a_route_without_a_declaration_is_refused(tmp_path: Path,
                                                        http: aiohttp.ClientSession) -> None:
    """Fail closed: an undeclared route answers 500 to everyone and never runs."""
    loop = asyncio.get_running_loop()
    token = new_token()
    path = tmp_path / "tokens"
    path.write_text(token_line("ops", token, [Scope("admin")]) + "\n")
    broker = await loop.run_in_executor(None, Broker.open, tmp_path / "data")
    log = LocalLog(broker, "http://127.0.0.1:0")
    await log.start()
    app = make_app(Stack(broker, log), tokens=await loop.run_in_executor(None, Tokens, path))
    ran = []

    async def forgotten(request: web.Request) -> web.Response:
        ran.append(request)
        return web.Response(text="served")

    app.router.add_get("/forgotten", forgotten)
    try:
        async with app_server(app) as base:
            for headers in ({}, {"Authorization": f"Bearer {token}"}):
                async with http.get(f"{base}/forgotten", headers=headers) as resp:
                    assert resp.status == 500
                    assert "declares no scope" in resp.headers["X-Broker-Error"]
            assert not ran
            with pytest.raises(AssertionError, match="/forgotten declares no scope"):
                list(routes(app))
    finally:
        await log.close()
        await loop.run_in_executor(None, broker.close)


def test_declarations_and_holds() -> None:
    @requires({"get": "read", "DELETE": "admin"})
    async def handler(request: web.Request) -> web.Response:
        raise AssertionError

    declared = declared_scope(handler)
    assert isinstance(declared, Mapping) and dict(declared) == {"GET": "read", "DELETE": "admin"}
    for bad in ("root", {"GET": "everything"}):
        with pytest.raises(ValueError, match="unknown scope kind"):
            requires(bad)
    reader = Principal("r", (Scope("read", ("42",)),))
    assert reader.holds("read") and not reader.holds("write") and not reader.holds("admin")
    admin = Principal("ops", (Scope("admin"),))
    assert all(admin.holds(kind) for kind in KINDS)
