"""Quorum reads of several command logs' keys (and registrations) in one etcd request.

Every command log a node applies proves etcd's quorum and learns how far its log key is with a
linearizable read twice a second (its monitor). A node holding many topic groups whose logs
live in one etcd cluster made one read per group; :class:`QuorumReads` gathers the reads asked
for in one turn of the event loop into one read-only transaction (a linearizable read of every
key at one revision), and the groups' monitors tick together (:func:`aligned_sleep`), so a
node makes one such request per tick and etcd cluster, however many groups it holds. The
logs' membership steps read their node lists (a prefix each) the same way.

Everything here runs on the event loop.
"""

from __future__ import annotations

import asyncio
from typing import Any

from messaging.errors import ClusterUnavailableError
from messaging.log.etcd.client import EtcdClient

#: Reads per request at most: etcd refuses a transaction of more operations than its
#: --max-txn-ops (128 by default), so a node holding more groups sends several.
MAX_READS = 64


async def aligned_sleep(interval: float) -> None:
    """Sleep until the next multiple of ``interval`` on the loop's clock, so periodic steps
    of several logs with one interval wake in the same turn of the loop."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(interval - loop.time() % interval)


class QuorumReads:
    """Linearizable reads of log keys, gathered per turn of the loop into one request."""

    def __init__(self, client: EtcdClient) -> None:
        self.client = client
        self._waiting: dict[tuple[bytes, bool], list[asyncio.Future[Any]]] = {}
        self._gathering = False
        self._reads: set[asyncio.Task[None]] = set()
        #: Requests sent to etcd so far, and the key reads they carried.
        self.requests = 0
        self.keys_read = 0

    async def read(self, key: bytes, *, prefix: bool = False) -> Any:
        """The range response of a quick linearizable read of ``key`` (keys only), or of
        every key under it with their values (``prefix``), read together with the others
        asked for in this turn of the loop; raises what
        :meth:`~messaging.log.etcd.client.EtcdClient.check_quorum` raises."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Any] = loop.create_future()
        self._waiting.setdefault((key, prefix), []).append(waiter)
        if not self._gathering:
            self._gathering = True
            loop.call_soon(self._send)
        return await waiter

    def _send(self) -> None:
        self._gathering = False
        waiting, self._waiting = self._waiting, {}
        waiting = {key: [w for w in waiters if not w.done()] for key, waiters in waiting.items()}
        waiting = {key: waiters for key, waiters in waiting.items() if waiters}
        keys = sorted(waiting)
        for first in range(0, len(keys), MAX_READS):
            part = {key: waiting[key] for key in keys[first:first + MAX_READS]}
            task = asyncio.get_running_loop().create_task(self._read(part),
                                                           name="messaging-etcd-quorum-read")
            self._reads.add(task)
            task.add_done_callback(self._reads.discard)

    async def _read(self, waiting: dict[tuple[bytes, bool], list[asyncio.Future[Any]]],
                    ) -> None:
        keys = sorted(waiting)
        self.requests += 1
        self.keys_read += len(keys)
        try:
            responses = await self.client.check_quorum_of(keys)
        except asyncio.CancelledError:
            # closing: the callers (whose own tasks were not cancelled) hear it as an error
            closed = ClusterUnavailableError("the read was cancelled: the log is closing")
            for waiters in waiting.values():
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_exception(closed)
            raise
        except Exception as err:
            for waiters in waiting.values():
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_exception(err)
            return
        for key, response in zip(keys, responses, strict=True):
            for waiter in waiting[key]:
                if not waiter.done():
                    waiter.set_result(response)

    async def close(self) -> None:
        """Cancel the reads under way (their callers get ClusterUnavailableError)."""
        for task in list(self._reads):
            task.cancel()
        await asyncio.gather(*self._reads, return_exceptions=True)
