"""The intake lane's figures, one set per log (in its broker's registry)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

_FILL_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0)
_COMMIT_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


class IntakeMetrics:
    """One log's figures of the intake lane (in its broker's registry)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.objects = Counter(
            "messaging_intake_objects", "Intake objects this node wrote that carried "
            "publishes of this log", registry=r)
        self.bytes = Counter(
            "messaging_intake_bytes", "Bytes of this log's publishes this node wrote to "
            "intake objects", registry=r)
        self.fill = Histogram(
            "messaging_intake_window_fill", "How full each intake object this node wrote "
            "was, as a share of the window's byte limit", buckets=_FILL_BUCKETS, registry=r)
        self.commit = Histogram(
            "messaging_intake_pointer_commit_seconds", "From an intake object stored to its "
            "pointer committed in this log and applied here", buckets=_COMMIT_BUCKETS,
            registry=r)
        self.gets = Counter(
            "messaging_intake_gets", "GET requests this node made for intake objects this "
            "log's pointers name", registry=r)
        self.fetched = Counter(
            "messaging_intake_fetched_objects", "Intake objects (whole, or this log's range) "
            "this node fetched for this log's pointers: GETs per object is gets over this",
            registry=r)
