"""Figures of the object store: uploads, reads, the read cache and errors by kind."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from messaging.objects import errors


class StoreMetrics:
    """Counters of one broker's use of its object store (in the broker's registry)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.errors = Counter(
            "messaging_object_store_errors", "Failed object store operations, by operation "
            "(upload, read, list, delete) and kind (unreachable, server_error, denied, "
            "bucket_missing, corrupt, not_found, conflict, other)",
            labelnames=["operation", "kind"], registry=r)
        self.uploaded_segments = Counter(
            "messaging_object_store_uploaded_segments", "Segments uploaded, verified and "
            "recorded in the manifest", registry=r)
        self.uploaded_bytes = Counter(
            "messaging_object_store_uploaded_bytes", "Bytes of segments (and their time "
            "indexes) uploaded and verified", registry=r)
        self.read_bytes = Counter(
            "messaging_object_store_read_bytes", "Bytes fetched from the store by ranged "
            "GETs (reads and prefetches)", registry=r)
        self.cache_hits = Counter(
            "messaging_object_cache_hits", "Reads of object chunks found in the read cache",
            registry=r)
        self.cache_misses = Counter(
            "messaging_object_cache_misses", "Reads of object chunks fetched from the store",
            registry=r)
        self.deleted_objects = Counter(
            "messaging_object_store_deleted_objects", "Objects deleted from the store (total "
            "retention, deleted topics, orphans of interrupted uploads)", registry=r)

        self.backlog_segments = Gauge(
            "messaging_offload_backlog_segments", "Rolled segments not yet in the object "
            "store", registry=r)
        self.backlog_bytes = Gauge(
            "messaging_offload_backlog_bytes", "Bytes of rolled segments not yet in the "
            "object store", registry=r)
        self.backlog_oldest_seconds = Gauge(
            "messaging_offload_backlog_oldest_seconds", "Age of the newest message of the "
            "oldest segment waiting for upload (0: none waits)", registry=r)
        self.missing_objects = Gauge(
            "messaging_object_store_missing_objects", "Objects the manifest records that "
            "the store no longer holds (see diagnostics)", registry=r)

    def error(self, operation: str, kind: str) -> None:
        """Count one failure of ``operation``."""
        self.errors.labels(operation, kind).inc()


def error_kind(error: BaseException) -> str:
    """The metric label of an object store error."""
    kinds: list[tuple[type[BaseException], str]] = [
        (errors.StoreUnreachableError, "unreachable"), (errors.StoreServerError, "server_error"),
        (errors.StoreDeniedError, "denied"), (errors.StoreBucketMissingError, "bucket_missing"),
        (errors.ObjectCorruptError, "corrupt"), (errors.ObjectNotFoundError, "not_found"),
        (errors.ObjectConflictError, "conflict")]
    for cls, kind in kinds:
        if isinstance(error, cls):
            return kind
    return "other"
