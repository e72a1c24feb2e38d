"""Catching up from a peer's snapshot when etcd compacted the log past this node.

A node whose next revision etcd has compacted away cannot replay the log: it fetches a live
peer's snapshot (:mod:`messaging.log.etcd.snapshot_fetch`), at or after the compaction,
verifies it and installs it over its topics (staged, then renamed: never merged), and
checkpoints it. Peers are tried in turn, and the list again until one serves a snapshot.

The checkpoint is marked ``installing`` once the snapshot's header is accepted and until it
is installed: a crash in between leaves topics that may be half old, half new, and the next
start discards them (:meth:`~messaging.log.etcd.checkpoint.Checkpoints.load`).

:meth:`SnapshotInstaller.install` runs on the event loop; the fetch and install run on the
node's writer thread, which owns the broker and the checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor
from typing import Any

import grpc

from messaging.broker.broker import Broker
from messaging.errors import DataDirectoryError, MessagingError
from messaging.log.etcd.checkpoint import Checkpoints
from messaging.log.etcd.client import describe
from messaging.log.etcd.membership import Membership
from messaging.log.etcd.snapshot_fetch import fetch_snapshot
from messaging.log.local import DeferredSync
from messaging.quiet_log import RECURRING_LOG_INTERVAL, QuietLog

log = logging.getLogger(__name__)

#: While no peer serves a snapshot, the peers are listed and tried again this often (s).
RETRY_INTERVAL = 1.0


class SnapshotInstaller:
    """Installs a live peer's snapshot over this node's data (see the module docstring)."""

    def __init__(self, broker: Broker, cluster: str, url: str, membership: Membership,
                 writer: Executor, checkpoints: Checkpoints, unsynced: DeferredSync, *,
                 peer_token: str | None = None, peer_ca: str | None = None) -> None:
        """``url``: this node's (never asked); ``peer_token``: an admin token, for peers that
        require tokens; ``peer_ca``: the CA of the peers' certificates."""
        self.broker = broker
        self.cluster = cluster
        self.url = url
        self._membership = membership
        self._writer = writer
        self._checkpoints = checkpoints
        self._unsynced = unsynced
        self._peer_token = peer_token
        self._peer_ca = peer_ca
        self._quiet = QuietLog(log, RECURRING_LOG_INTERVAL)
        #: Snapshots installed since start.
        self.installed = 0

    async def install(self, compacted: int) -> int:
        """Replace local data with a live peer's snapshot at or after ``compacted`` - 1;
        returns the snapshot's revision. Retries until a peer serves one (cancel to stop)."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                await self._membership.refresh()
            except (grpc.aio.AioRpcError, MessagingError) as err:
                log.info("listing peers failed: %s", describe(err))
            for url in [u for u in self._membership.urls() if u != self.url]:
                try:
                    header = await loop.run_in_executor(self._writer, self._install, url,
                                                        compacted)
                except (OSError, ValueError, KeyError, MessagingError) as err:
                    log.warning("snapshot from %s not installed: %s", url, describe(err))
                    continue
                self.installed += 1
                revision = int(header["revision"])
                log.info("installed the snapshot of %s at revision %d (broker index %d)", url,
                         revision, self.broker.index)
                return revision
            self._quiet.log("no snapshot", logging.WARNING, "no live peer served a snapshot "
                           "at or after revision %d yet; retrying", compacted - 1)
            await asyncio.sleep(RETRY_INTERVAL)

    def _install(self, url: str, compacted: int) -> dict[str, Any]:
        """Fetch, verify and install a peer's snapshot; then checkpoint it (writer thread)."""
        self._unsynced.flush()  # the topics it names are about to be replaced

        def accept(header: dict[str, Any]) -> None:
            if header.get("cluster") != self.cluster:
                raise DataDirectoryError(f"{url} serves cluster {header.get('cluster')!r}")
            revision = int(header["revision"])
            if revision + 1 < compacted:
                raise DataDirectoryError(f"its snapshot is at revision {revision}, before the "
                                         f"compaction at {compacted}")
            self._checkpoints.mark_installing()

        try:
            with fetch_snapshot(url, self.cluster, token=self._peer_token,
                                ca=self._peer_ca) as stream:
                header = self.broker.install_snapshot(stream, accept)
        except BaseException:
            self._checkpoints.unmark_installing()  # local data untouched: keep its checkpoint
            raise
        self._checkpoints.installed(int(header["revision"]))
        return header
