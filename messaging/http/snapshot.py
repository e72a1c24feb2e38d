"""``GET /messaging/snapshot``: a cluster node's snapshot for a peer that catches up.

The node captures the snapshot on its writer thread (no apply runs then, so the cut is exactly
the applied revision) and streams the files from other threads: segments are append-only, so
the captured committed prefixes do not change under the reader. Admin scope only: a snapshot
holds every topic's data.
"""

from __future__ import annotations

from typing import Protocol

from aiohttp import web

from messaging.broker.view import SNAPSHOT_CONTENT_TYPE, SnapshotStream
from messaging.errors import BadRequestError
from messaging.headers import REVISION_HEADER
from messaging.http.auth import requires
from messaging.http.executors import Executors

_CHUNK = 1 << 20


class SnapshotSource(Protocol):
    """What serves snapshots: the cluster log (it knows the cluster and the revision)."""

    cluster: str

    async def open_snapshot(self) -> SnapshotStream:
        """A snapshot taken on the writer thread, at the applied revision."""
        ...


class SnapshotHandlers:
    """``GET /messaging/snapshot?cluster=NAME`` from ``source`` (routed at
    :data:`messaging.broker.snapshot.SNAPSHOT_PATH`)."""

    def __init__(self, source: SnapshotSource, executors: Executors) -> None:
        self.source = source
        self.executors = executors  # the snapshot's files are read on the maintenance thread

    @requires("admin")
    async def snapshot(self, request: web.Request) -> web.StreamResponse:
        """Stream a snapshot. Admin only: it holds every topic's data, whatever a token may
        read."""
        source = self.source
        cluster = request.query.get("cluster", "")
        if cluster != source.cluster:
            raise BadRequestError(f"this node belongs to cluster {source.cluster!r}, "
                                  f"not {cluster!r}")
        snapshot = await source.open_snapshot()
        try:
            response = web.StreamResponse(headers={
                "Content-Type": SNAPSHOT_CONTENT_TYPE,
                REVISION_HEADER: str(snapshot.header["revision"])})
            response.enable_chunked_encoding()
            await response.prepare(request)
            while chunk := await self.executors.maintain(snapshot.read, _CHUNK):
                await response.write(chunk)
            await response.write_eof()
            return response
        finally:
            await self.executors.maintain(snapshot.close)
