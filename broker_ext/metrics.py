"""Prometheus metrics of the generator, per partition and subscription."""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

SubscriptionKey = tuple[str, int, str]
"""(topic, partition, subscription)."""


class _Published:
    """One subscription's latest watermark published (None: it has none now) and the tables published for it."""

    __slots__ = ("count", "event_time")

    def __init__(self) -> None:
        self.event_time: int | None = None
        self.count = 0


class _Subscriptions(Collector):
    """The series of each subscription's published tables, from plain values the loop thread keeps: a table costs
    two assignments instead of three metric updates, each behind a lock (issue 47: the burst's cost per `W_SET`).
    A scrape (on the server's thread) reads them; the age is taken then, so a watermark that stands still ages."""

    def __init__(self) -> None:
        self.latest: dict[SubscriptionKey, _Published] = {}

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, CounterMetricFamily]:
        names = ["topic", "partition", "subscription"]
        return (
            GaugeMetricFamily("wm_watermark_ms", "Watermark of a subscription (ms since epoch)", labels=names),
            GaugeMetricFamily("wm_watermark_age_seconds", "Wall clock at the scrape minus the watermark", labels=names),
            CounterMetricFamily("wm_watermarks_published", "Tables published for a subscription", labels=names),
        )

    def describe(self) -> Iterator[Metric]:
        """The families, empty: what the registry knows the collector by (a scrape asking for series by name)."""
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        watermark, age, published = self._families()
        now = time.time()
        for (topic, partition, subscription), latest in list(self.latest.items()):  # a copy: taken at once
            labels = [topic, str(partition), subscription]
            event_time = latest.event_time
            if event_time is not None:
                watermark.add_metric(labels, event_time)
                age.add_metric(labels, max(0.0, now - event_time / 1000))
            published.add_metric(labels, latest.count)
        yield watermark
        yield age
        yield published


class GeneratorMetrics:
    """All metrics in one registry of their own, so tests can start several generators in one process."""

    def __init__(self) -> None:
        # No `_created` series beside each counter (Pulsar's own metrics have none): a third of the per-topic
        # series, and of a scrape's CPU (1.3 -> 0.9 s at 5000 topics; docs/OPERATIONS.md).
        disable_created_metrics()  # type: ignore[no-untyped-call]  # (the library has no annotation for it)
        self.registry = CollectorRegistry()
        self._subscriptions = _Subscriptions()
        self.registry.register(self._subscriptions)
        part = ["topic", "partition"]
        self.read_lag = Gauge(
            "wm_read_lag_entries", "Entries between the generator's read position and the partition's tail", part,
            registry=self.registry,
        )  # fmt: skip
        self.markers_applied = Counter(
            "wm_markers_applied", "Markers folded into the head state", part, registry=self.registry
        )
        self.malformed_markers = Counter(
            "wm_malformed_markers", "Markers skipped as malformed", [*part, "reason"], registry=self.registry
        )
        self.broken_assertions = Counter(
            "wm_broken_assertions", "Messages with event time below their producer's own last W_SET",
            [*part, "producer"], registry=self.registry,
        )  # fmt: skip
        self.snapshots_written = Counter(
            "wm_snapshots_written", "W_SNAPSHOT records written", part, registry=self.registry
        )
        self.last_snapshot = Gauge(
            "wm_last_snapshot_timestamp_seconds",
            "When the last W_SNAPSHOT was written",
            part,
            registry=self.registry,
        )
        self.rebuild_reads = Counter(
            "wm_rebuild_reads", "Reads a rebuild made, by kind: a snapshot of the chain, or a range of entries",
            [*part, "kind"], registry=self.registry,
        )  # fmt: skip
        self.rebuild_entries_read = Counter(
            "wm_rebuild_entries_read", "Entries the rebuilds' range reads were delivered", part,
            registry=self.registry,
        )  # fmt: skip
        self.admin_calls = Counter(
            "wm_admin_calls", "Admin API calls made to follow cursors, by call", ["call"], registry=self.registry
        )
        self.partitions = Gauge(
            "wm_partitions", "Partitions followed, by whether this instance owns them", ["owned"],
            registry=self.registry,
        )  # fmt: skip

    def serve(self, port: int) -> None:
        """Expose /metrics on `port` (0: do not serve)."""
        if port:
            start_http_server(port, addr="127.0.0.1", registry=self.registry)

    def record_watermark(self, topic: str, partition: int, subscription: str, event_time: int | None) -> None:
        """A table giving the subscription this watermark (None: none, it moved back before every W_SET) was
        published."""
        latest = self._subscriptions.latest.get((topic, partition, subscription))
        if latest is None:
            latest = self._subscriptions.latest[topic, partition, subscription] = _Published()
        latest.event_time = event_time
        latest.count += 1

    def forget_subscription(self, topic: str, partition: int, subscription: str) -> None:
        """The subscription is gone: no watermark series for it (its count of tables stays, as a counter's does)."""
        latest = self._subscriptions.latest.get((topic, partition, subscription))
        if latest is not None:
            latest.event_time = None
