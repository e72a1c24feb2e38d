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

from messaging.broker.broker import Broker
from messaging.config import BrokerConfig
from messaging.objects.store import ObjectStore
from messaging.objects.url import parse_store_url
from messaging.offload.uploader import Apply, Offloader
from messaging.tiered.cache import ObjectCache
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

    def attach(self, broker: Broker, apply: Apply,
               is_uploader: Callable[[], bool]) -> Offloader:
        """Give ``broker`` the store (reads, local retention) and make its uploader (not
        started). Call on the event loop."""
        config = self.config
        metrics = StoreMetrics(broker.metrics.registry)
        cache = ObjectCache(self.store, asyncio.get_running_loop(), config.object_cache_size,
                            metrics)
        offloader = Offloader(broker, apply, self.store, cache, metrics, is_uploader,
                              concurrency=config.object_uploads,
                              sweep_grace=config.object_sweep_grace)
        broker.tiered = Tiered(self.store, cache, broker.manifest, metrics)
        broker.offload_status = offloader.describe
        return offloader


def first_of(urls: Callable[[], list[str]], url: str) -> Callable[[], bool]:
    """Whether ``url`` is the first of the live nodes ``urls()`` lists (sorted): the one
    that uploads for a single log."""
    def chosen() -> bool:
        live = urls()
        return bool(live) and live[0] == url
    return chosen
