"""The HTTP room's threads: one pool per role, alive only between the app's start and cleanup."""

from __future__ import annotations

import threading

import aiohttp
import pytest
from aiohttp import web

from messaging.errors import BrokerClosedError
from messaging.http.executors import Executors
from tests.conftest import StartServer


def current_thread() -> threading.Thread:
    return threading.current_thread()


async def test_each_role_has_its_own_threads_only_while_started() -> None:
    executors = Executors(read_threads=1, validate_threads=1)
    app = web.Application()
    with pytest.raises(BrokerClosedError):
        executors.read(current_thread)
    await executors.start(app)
    reader = await executors.read(current_thread)
    validator = await executors.validate(current_thread)
    assert reader.name.startswith("messaging-read")
    assert validator.name.startswith("messaging-validate")
    assert reader is not threading.current_thread()
    await executors.stop(app)
    assert not reader.is_alive() and not validator.is_alive()
    with pytest.raises(BrokerClosedError, match="not serving"):
        executors.validate(current_thread)
    await executors.stop(app)  # a second cleanup is harmless


def test_a_pool_needs_a_thread() -> None:
    with pytest.raises(ValueError, match="at least one thread"):
        Executors(read_threads=0)


async def test_a_stopped_broker_leaves_no_read_or_validation_thread(
        start_server: StartServer, http: aiohttp.ClientSession) -> None:
    server = await start_server()
    async with http.post(f"{server.url}/messaging/messages", params={"topicID": "1"},
                         data=b"x") as resp:
        assert resp.status == 200
    async with http.get(f"{server.url}/messaging/messages", params={"topicID": "1"}) as resp:
        assert resp.status == 200
        await resp.read()
    assert any(t.name.startswith("messaging-read") for t in threading.enumerate())
    await server.stop()
    assert not [t.name for t in threading.enumerate()
                if t.name.startswith(("messaging-read", "messaging-validate"))]
