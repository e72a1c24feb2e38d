"""Broker nodes of a cluster as the benchmarks reach them over HTTP: one publish to a node
(once more on a new connection when the node had closed a kept-alive one), and whether every
node is ready to take load (used by the cluster and soak benchmarks)."""

from __future__ import annotations

import aiohttp

from messaging.frames import FRAMES_CONTENT_TYPE

Session = aiohttp.ClientSession


async def post(session: Session, url: str, topic: int, body: bytes, batch: bool,
               timeout: float = 30) -> int:
    """Publish ``body`` (a frame batch when ``batch``, else one message) to ``topic`` on the
    node at ``url``; the HTTP status."""
    headers = {"Content-Type": FRAMES_CONTENT_TYPE if batch else "application/octet-stream"}
    for attempt in range(2):
        try:
            async with session.post(f"{url}/messaging/messages", params={"topicID": str(topic)},
                                    data=body, headers=headers,
                                    timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                await resp.read()
                return resp.status
        except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError):
            # A kept-alive connection the node closed (idle longer than its header timeout)
            # just as this request reused it: once more, on a new connection.
            if attempt:
                raise
    raise AssertionError("unreachable")


async def nodes_ready(session: Session, urls: list[str]) -> bool:
    """Every node's watch is live, it sees quorum, and it acknowledges a publish."""
    for url in urls:
        try:
            async with session.get(f"{url}/messaging/diagnostics",
                                   timeout=aiohttp.ClientTimeout(total=5)) as resp:
                d = await resp.json()
            if not (d.get("watch", {}).get("live") and d.get("quorum")):
                return False
            if await post(session, url, 99, b"ready?", batch=False, timeout=10) != 200:
                return False
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return False
    return True
