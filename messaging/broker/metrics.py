"""Prometheus metrics of one broker (a registry per broker, so tests can run several)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Info, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from messaging import __version__

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
#: Finer between 5 and 50 ms, where a fan-out to many followers lags.
LAG_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 1, 2.5)


class LatencyHistogram(Collector):
    """A histogram cheap enough to observe on every publish (a bisect and two additions).

    prometheus-client's Histogram takes a lock and walks every bucket per observation. This
    one is observed and collected on the event loop's thread only, so it needs neither.
    """

    def __init__(self, name: str, documentation: str,
                 buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = list(buckets)
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        """Count one observation."""
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.total += seconds

    def collect(self) -> Iterator[Metric]:
        cumulative = []
        running = 0
        for bound, count in zip([*map(str, self.bounds), "+Inf"], self.counts, strict=True):
            running += count
            cumulative.append((bound, running))
        family = HistogramMetricFamily(self.name, self.documentation)
        family.add_metric([], cumulative, self.total)
        yield family


class LoopCounter(Collector):
    """A counter cheap enough to bump for every chunk sent to every follower.

    Incremented on the event loop's thread only (a plain integer addition; prometheus-client's
    Counter takes a lock each time), read when the metrics are collected.
    """

    def __init__(self, name: str, documentation: str) -> None:
        self.name = name
        self.documentation = documentation
        self.value = 0

    def inc(self, amount: int = 1) -> None:
        """Add ``amount`` (never negative)."""
        self.value += amount

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation)
        family.add_metric([], self.value)
        yield family


class BrokerMetrics:
    """Counters, gauges and histograms the broker, its log and its HTTP layer update."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.messages_published = Counter(
            "messaging_messages_published", "Messages applied to topics", registry=r)
        self.bytes_published = Counter(
            "messaging_bytes_published", "Frame bytes applied to topics", registry=r)
        self.messages_streamed = LoopCounter(
            "messaging_messages_streamed", "Messages sent to readers")
        self.bytes_streamed = LoopCounter(
            "messaging_bytes_streamed", "Frame bytes sent to readers")
        r.register(self.messages_streamed)
        r.register(self.bytes_streamed)
        self.publish_latency = LatencyHistogram(
            "messaging_publish_latency_seconds", "Time from request to durable acknowledgement")
        r.register(self.publish_latency)
        self.fanout_lag = LatencyHistogram(
            "messaging_fanout_lag_seconds", "Per fan-out slice: time from the oldest commit "
            "it carried becoming visible to its write to the followers' sockets",
            LAG_BUCKETS)
        r.register(self.fanout_lag)
        self.fsyncs = Counter("messaging_fsyncs", "Group-commit fsync rounds", registry=r)
        self.group_commits = Counter(
            "messaging_group_commit_commands", "Commands written per group commit", registry=r)
        self.active_streams = Gauge(
            "messaging_active_streams", "Open streaming GET responses", registry=r)
        self.recovered_truncated_bytes = Counter(
            "messaging_recovered_truncated_bytes", "Torn or corrupt bytes cut off at open",
            registry=r)
        self.retention_deleted_bytes = Counter(
            "messaging_retention_deleted_bytes", "Bytes deleted by retention", registry=r)
        self.retention_deleted_segments = Counter(
            "messaging_retention_deleted_segments", "Segments deleted by retention", registry=r)
        self.build_info = Info("messaging_build", "The broker's version", registry=r)
        self.build_info.info({"version": __version__})
        self.write_failures = Counter(
            "messaging_write_failures", "Groups of commands that failed and were undone, by "
            "reason (disk_full, stopped: a topic stopped after a failed fsync, error)",
            labelnames=["reason"], registry=r)

    def watch_subscribers(self, collect: Callable[[], list[tuple[int, str, int, int]]]) -> None:
        """Export subscriber progress: ``collect`` returns (topic, url, index, lag) rows."""
        self.registry.register(_SubscriberCollector(collect))

    def watch_topics(self, collect: Callable[[], list[TopicRow]]) -> None:
        """Export per-topic figures and health: ``collect`` returns :class:`TopicRow` rows."""
        self.registry.register(_TopicCollector(collect))

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


class _SubscriberCollector(Collector):
    def __init__(self, collect: Callable[[], list[tuple[int, str, int, int]]]) -> None:
        self._collect = collect

    def collect(self) -> Iterator[Metric]:
        rows = self._collect()
        index = GaugeMetricFamily("messaging_subscriber_index",
                                  "Index a subscriber heartbeated", labels=["topic", "url"])
        lag = GaugeMetricFamily("messaging_subscriber_lag",
                                "Topic last index minus the subscriber's", labels=["topic", "url"])
        for topic, url, at, behind in rows:
            index.add_metric([str(topic), url], at)
            lag.add_metric([str(topic), url], behind)
        count = GaugeMetricFamily("messaging_subscribers", "Registered subscribers")
        count.add_metric([], len(rows))
        yield index
        yield lag
        yield count


class TopicRow(NamedTuple):
    """One topic's figures for the metrics."""

    topic: int
    corrupt_frames: int
    writable: bool
    size: int
    first_index: int
    last_index: int
    segments: int


class _TopicCollector(Collector):
    def __init__(self, collect: Callable[[], list[TopicRow]]) -> None:
        self._collect = collect

    def collect(self) -> Iterator[Metric]:
        rows = self._collect()
        for name, doc, attribute in (
                ("messaging_topic_size_bytes", "Bytes of the topic's segment files", "size"),
                ("messaging_topic_first_index", "First index still readable", "first_index"),
                ("messaging_topic_last_index", "Last committed index", "last_index"),
                ("messaging_topic_segments", "Segment files", "segments")):
            gauge = GaugeMetricFamily(name, doc, labels=["topic"])
            for row in rows:
                gauge.add_metric([str(row.topic)], getattr(row, attribute))
            yield gauge
        corrupt = CounterMetricFamily(
            "messaging_corrupt_frames", "Damaged frames found on disk (recovery excluded)",
            labels=["topic"])
        writable = GaugeMetricFamily(
            "messaging_topic_writable", "1 if the topic accepts writes, 0 if it stopped after "
            "a failed fsync (restart the broker)", labels=["topic"])
        for row in rows:
            corrupt.add_metric([str(row.topic)], row.corrupt_frames)
            writable.add_metric([str(row.topic)], 1 if row.writable else 0)
        yield corrupt
        yield writable
