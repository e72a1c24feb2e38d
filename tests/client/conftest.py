"""Fixtures the client tests share."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from messaging.http.server import BrokerServer
from tests.proxy import FaultProxy


@pytest.fixture
async def proxy(server: BrokerServer) -> AsyncIterator[FaultProxy]:
    """A TCP proxy in front of the test's broker that can cut or stall connections."""
    p = await FaultProxy(server.port).start()
    yield p
    await p.stop()
