"""Snapshots between cluster peers: ``GET /messaging/snapshot`` and the fetch that reads it.

A snapshot is one JSON header line (broker index, subscribers, every topic's tombstone and
committed segments, plus the cluster name and the etcd revision it reflects) followed by the
segments' bytes in header order: the format :meth:`Broker.install_snapshot` reads. The serving
side captures the header and opens every segment on the writer thread (no apply runs then, so
the cut is exactly the applied revision), then streams the files from other threads: segments
are append-only, so the captured committed prefixes do not change under the reader.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import urllib.parse
import urllib.request
from typing import IO, Any, BinaryIO, Protocol

from aiohttp import web

from messaging import snapshot
from messaging.auth import requires
from messaging.broker import Broker
from messaging.errors import BadRequestError, MessagingError

log = logging.getLogger(__name__)

SNAPSHOT_PATH = "/messaging/snapshot"
SNAPSHOT_CONTENT_TYPE = "application/x-messaging-snapshot"
REVISION_HEADER = "X-Messaging-Revision"
_CHUNK = 1 << 20


class SnapshotStream:
    """A consistent snapshot being read: the header line, then each segment's bytes."""

    def __init__(self, header: dict[str, Any], files: list[tuple[BinaryIO, int]]) -> None:
        self.header = header
        self._pending: list[tuple[BinaryIO, int]] = files
        self._head = json.dumps(header).encode() + b"\n"

    @classmethod
    def capture(cls, broker: Broker, extra: dict[str, Any]) -> SnapshotStream:
        """Describe and open the broker's committed data (writer thread only)."""
        header, paths = snapshot.describe(broker)
        files: list[tuple[BinaryIO, int]] = []
        try:
            for path, size in paths:
                files.append((path.open("rb"), size))
        except BaseException:
            for f, _size in files:
                f.close()
            raise
        return cls({**header, **extra}, files)

    def read(self, max_bytes: int = _CHUNK) -> bytes:
        """The next bytes of the snapshot; b"" at the end (blocking: call it on a thread)."""
        if self._head:
            head, self._head = self._head, b""
            return head
        while self._pending:
            f, remaining = self._pending[0]
            chunk = f.read(min(max_bytes, remaining)) if remaining else b""
            if remaining and not chunk:
                raise MessagingError(f"{f.name} is shorter than its committed size")
            remaining -= len(chunk)
            if remaining:
                self._pending[0] = (f, remaining)
            else:
                f.close()
                self._pending.pop(0)
            if chunk:
                return chunk
        return b""

    def close(self) -> None:
        """Close the segment files not read to the end."""
        for f, _size in self._pending:
            f.close()
        self._pending = []


class SnapshotSource(Protocol):
    """What serves snapshots: the cluster log (it knows the cluster and the revision)."""

    cluster: str

    async def open_snapshot(self) -> SnapshotStream:
        """A snapshot taken on the writer thread, at the applied revision."""
        ...


def add_snapshot_route(app: web.Application, source: SnapshotSource) -> None:
    """Serve ``GET /messaging/snapshot?cluster=NAME`` from ``source``.

    Admin only: a snapshot holds every topic's data, whatever a token may read.
    """

    @requires("admin")
    async def handler(request: web.Request) -> web.StreamResponse:
        cluster = request.query.get("cluster", "")
        if cluster != source.cluster:
            raise BadRequestError(f"this node belongs to cluster {source.cluster!r}, "
                                  f"not {cluster!r}")
        loop = asyncio.get_running_loop()
        snapshot = await source.open_snapshot()
        try:
            response = web.StreamResponse(headers={
                "Content-Type": SNAPSHOT_CONTENT_TYPE,
                REVISION_HEADER: str(snapshot.header["revision"])})
            response.enable_chunked_encoding()
            await response.prepare(request)
            while chunk := await loop.run_in_executor(None, snapshot.read, _CHUNK):
                await response.write(chunk)
            await response.write_eof()
            return response
        finally:
            await loop.run_in_executor(None, snapshot.close)

    app.router.add_get(SNAPSHOT_PATH, handler)


def fetch_snapshot(url: str, cluster: str, timeout: float = 30.0, *,
                   token: str | None = None, ca: str | None = None) -> IO[bytes]:
    """Open a peer's snapshot for reading (blocking: call it on a thread).

    ``timeout`` bounds connecting and every read, so a peer that stops sending cannot hold
    the caller forever. ``token``: an admin token, when the peers require tokens; ``ca``:
    the CA that signed the peers' certificates (https).
    """
    query = urllib.parse.urlencode({"cluster": cluster})
    request = urllib.request.Request(f"{url.rstrip('/')}{SNAPSHOT_PATH}?{query}")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    context = ssl.create_default_context(cafile=ca) if ca else None
    response: IO[bytes] = urllib.request.urlopen(request, timeout=timeout, context=context)
    return response
