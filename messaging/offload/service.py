"""The object store of one broker process, from ``--object-store`` and its options.

:class:`ObjectStorage` makes the store once (an S3 store reads the AWS files as it is made)
and attaches it to each broker the process runs (one, or one per held topic group): the
broker's reads then go through the store below its local segments, its retention keeps
local copies by the local limits, and an :class:`~messaging.offload.uploader.Offloader`
uploads for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from messaging.broker.broker import Broker
from messaging.broker.metrics import BrokerMetrics
from messaging.config import BrokerConfig
from messaging.objects.store import ObjectStore
from messaging.objects.url import parse_store_url
from messaging.offload.uploader import Apply, Offloader
from messaging.tiered.cache import ObjectCache
from messaging.tiered.manifest import Manifest
from messaging.tiered.metrics import StoreMetrics
from messaging.tiered.view import Tiered


class ObjectStorage:
    """One process's object store and how its brokers use it."""

    def __init__(self, config: BrokerConfig, store: ObjectStore) -> None:
        self.config = config
        self.store = store

    @classmethod
    async def open(cls, config: BrokerConfig) -> ObjectStorage | None:
        """The store ``--object-store`` names (None without one); a ConfigError for a URL
        or options that are not usable. The store is not contacted: a broker starts, and
        serves its local data, while the store is down."""
        config.check_object_store()
        if config.object_store is None:
            return None
        url = config.object_store
        store = await asyncio.get_running_loop().run_in_executor(
            None, lambda: parse_store_url(url, config.s3_endpoint))
        return cls(config, store)

    def for_broker(self, metrics: BrokerMetrics) -> BrokerObjects:
        """What one broker (not opened yet) uses of the store: a read cache and figures
        registered with its metrics. Call on the event loop."""
        store_metrics = StoreMetrics(metrics.registry)
        cache = ObjectCache(self.store, asyncio.get_running_loop(),
                            self.config.object_cache_size, store_metrics,
                            timeout=self.config.object_store_timeout)
        return BrokerObjects(self, cache, store_metrics)


@dataclass(frozen=True)
class BrokerObjects:
    """One broker's use of the process's object store: its read cache and figures."""

    storage: ObjectStorage
    cache: ObjectCache
    metrics: StoreMetrics

    def reads(self, manifest_of: Callable[[int], Manifest]) -> Tiered:
        """The broker's reads below its local segments (given its committed manifests)."""
        return Tiered(self.storage.store, self.cache, manifest_of, self.metrics)

    def offloader(self, broker: Broker, apply: Apply,
                  is_uploader: Callable[[], bool]) -> Offloader:
        """The broker's uploader (not started)."""
        config = self.storage.config
        return Offloader(broker, apply, self.storage.store, self.cache, self.metrics,
                         is_uploader, concurrency=config.object_uploads,
                         sweep_grace=config.object_sweep_grace)


def first_of(urls: Callable[[], list[str]], url: str) -> Callable[[], bool]:
    """Whether ``url`` is the first of the live nodes ``urls()`` lists (sorted): the one
    that uploads for a single log."""
    def chosen() -> bool:
        live = urls()
        return bool(live) and live[0] == url
    return chosen
