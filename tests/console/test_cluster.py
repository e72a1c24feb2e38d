"""The console on every node of a 3-node cluster on one etcd cluster: each node's console
lists the topic published through another, and shows the nodes, their revisions and the
etcd endpoints."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

import pytest
from playwright.async_api import expect

from tests.conftest import wait_until
from tests.console.conftest import ConsolePage, publish
from tests.e2e.test_etcd_log import EtcdCluster, Nodes

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture(scope="module")
def etcd_members(tmp_path_factory: pytest.TempPathFactory):
    """Three etcd members for the module."""
    cluster = EtcdCluster(tmp_path_factory.mktemp("etcd"))
    cluster.ensure_running()
    try:
        yield cluster
    finally:
        cluster.stop()


async def test_the_console_works_through_any_node(console: ConsolePage, broker_process,
                                                  etcd_members: EtcdCluster,
                                                  tmp_path: Path) -> None:
    await etcd_members.wait_healthy()
    nodes = Nodes(broker_process, tmp_path, etcd_members)
    await nodes.start(0, 1, 2)
    index = publish(nodes.url(1), 12, "through node 1")
    # Every node caught up with that publish first: a node still catching up answers its
    # reads 503 (as it should), which the browser would log as a console error.
    for url in nodes.urls:
        await wait_until(functools.partial(_ready, url), timeout=30, what=f"{url} ready")
    page = console.page
    for i, url in enumerate(nodes.urls):
        await console.open(url, f"messages?topic=12&mode=index&from={index}")
        await expect(page.locator("#browse-rows pre").first).to_have_text("through node 1")
        await page.goto(f"{url}/console/#/topics")
        await expect(page.locator("#topic-list .vrow[data-topic='12']")).to_be_visible()
        await page.goto(f"{url}/console/#/cluster")
        await expect(page.locator("#readiness")).to_have_text("ready: writable and in quorum")
        await expect(page.locator("table.nodes tbody tr")).to_have_count(3, timeout=15_000)
        text = await page.locator("#cluster").inner_text()
        assert nodes.name in text and "etcd endpoints" in text, text
        for member in etcd_members.members:
            assert member.client_url in text
        for other in nodes.urls:
            assert other in text
        assert "watch" in text and "live from revision" in text, (i, text)


async def _ready(url: str) -> bool:
    """Whether the node answers /readyz with 200."""
    import urllib.error
    import urllib.request

    def get() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=5) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    return await asyncio.to_thread(get)
