"""Assemble and close one broker stack: metrics, object reads, the broker, its log (local,
or etcd in a cluster), and with an object store its uploader, in that order.

Both ways a process serves topics go through :func:`open_stack`: a single node (one stack,
:class:`messaging.http.server.BrokerServer`) and a node of a cluster of topic groups (one
stack per held group, :class:`messaging.cluster.node.GroupNode`). Nothing is attached to a
running broker: whatever it uses is given to it when it is made.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from messaging.broker.broker import Broker
from messaging.broker.metrics import BrokerMetrics
from messaging.broker.retention import Retention
from messaging.config import BrokerConfig, EtcdSettings
from messaging.log.base import Log
from messaging.log.local import LocalLog
from messaging.offload.service import ObjectStorage, first_of
from messaging.offload.uploader import Offloader
from messaging.placement import NAMED_TOPIC_BASE

if TYPE_CHECKING:  # grpc: imported only in cluster mode
    from messaging.log.etcd.clock_check import ClockCheck
    from messaging.log.etcd.intake import Intake
    from messaging.log.etcd.log import EtcdLog
    from messaging.log.etcd.share import EtcdShare

__all__ = ["Broker", "Stack", "broker_options", "etcd_log", "local_log", "open_stack"]

LogT = TypeVar("LogT", bound=Log)
#: Starts a broker's command log.
LogMaker = Callable[[Broker], Awaitable[LogT]]


@dataclass
class Stack(Generic[LogT]):
    """One broker and what serves it: its command log, and with an object store its
    uploader. ``group``: the topic group it holds in a cluster of groups (0 otherwise)."""

    broker: Broker
    log: LogT
    offloader: Offloader | None = None
    group: int = 0

    @property
    def retention(self) -> Retention:
        """The broker's retention service."""
        return self.broker.retention

    def object_status(self) -> dict[str, Any] | None:
        """What diagnostics show of the object store (None: the broker has none)."""
        return self.offloader.describe() if self.offloader is not None else None

    async def close(self) -> None:
        """Stop the uploader and the log, then close the broker (it checkpoints)."""
        if self.offloader is not None:
            await self.offloader.close()
        await self.log.close()
        await asyncio.get_running_loop().run_in_executor(None, self.broker.close)


def broker_options(config: BrokerConfig) -> dict[str, Any]:
    """The :meth:`Broker.open` options a broker config sets."""
    return {"max_segment_size": config.max_segment_size,
            "max_topic_size": config.max_topic_size,
            "retention_age": config.retention_age,
            "local_retention_size": config.local_retention_size,
            "local_retention_age": config.local_retention_age,
            "subscriber_timeout": config.subscriber_timeout,
            # Every group durable, on one node: lines first (see messaging.broker.recovery).
            "lines_first": config.fsync == "always" and config.etcd is None}


async def open_stack(config: BrokerConfig, url: str, start_log: LogMaker[LogT], *,
                     path: Path | None = None, storage: ObjectStorage | None = None,
                     first_named_topic: int = NAMED_TOPIC_BASE,
                     is_uploader: Callable[[], bool] | None = None,
                     group: int = 0) -> Stack[LogT]:
    """Open a broker on ``path`` (default the config's data directory), start its log
    (:func:`local_log` or :func:`etcd_log`) and, with ``storage``, its uploader; a failure
    closes what was opened and raises.

    ``is_uploader`` says whether this node uploads for the broker (default: the first of
    the log's live nodes).
    """
    loop = asyncio.get_running_loop()
    metrics = BrokerMetrics()
    objects = storage.for_broker(metrics) if storage is not None else None
    broker = await loop.run_in_executor(None, lambda: Broker.open(
        path or config.data, metrics=metrics, first_named_topic=first_named_topic,
        object_reads=objects.reads if objects is not None else None,
        **broker_options(config)))
    log: LogT | None = None
    try:
        log = await start_log(broker)
        offloader = None
        if objects is not None:
            offloader = objects.offloader(broker, log.apply,
                                          is_uploader or first_of(log.urls, url))
            await offloader.start()
    except BaseException:
        if log is not None:
            await log.close()
        await loop.run_in_executor(None, broker.close)
        raise
    return Stack(broker, log, offloader, group)


def local_log(config: BrokerConfig, url: str) -> LogMaker[LocalLog]:
    """Starts a single node's log."""
    async def start(broker: Broker) -> LocalLog:
        local = LocalLog(broker, url, config.fsync)
        await local.start()
        return local
    return start


def etcd_log(config: BrokerConfig, url: str, settings: EtcdSettings,
             clock: ClockCheck | None = None,
             share: EtcdShare | None = None,
             intake: Intake | None = None) -> LogMaker[EtcdLog]:
    """Starts a cluster log on etcd (``settings``: the cluster's, or one group's; ``clock``:
    the node's clock check, and ``share``: its client, watch stream and quorum reads for the
    etcd cluster of ``settings``, both shared by its groups' logs; ``intake``: the node's
    intake lane, with an object store)."""
    async def start(broker: Broker) -> EtcdLog:
        from messaging.log.etcd.log import EtcdLog  # grpc: only in cluster mode

        cluster = EtcdLog(broker, url, settings, config.fsync, peer_token=config.peer_token,
                          peer_ca=str(config.peer_ca) if config.peer_ca else None,
                          clock=clock, share=share, intake=intake)
        await cluster.start()
        return cluster
    return start
