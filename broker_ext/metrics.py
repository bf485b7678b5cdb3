"""Prometheus metrics of the generator, per partition and subscription."""

from __future__ import annotations

import contextlib
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics, start_http_server


class GeneratorMetrics:
    """All metrics in one registry of their own, so tests can start several generators in one process."""

    def __init__(self) -> None:
        # No `_created` series beside each counter (Pulsar's own metrics have none): a third of the per-topic
        # series, and of a scrape's CPU (1.3 -> 0.9 s at 5000 topics; docs/OPERATIONS.md).
        disable_created_metrics()  # type: ignore[no-untyped-call]  # (the library has no annotation for it)
        self.registry = CollectorRegistry()
        self._children: dict[tuple[str, int, str], tuple[Gauge, Gauge, Counter]] = {}
        """Per subscription, its children of the three series `record_watermark` sets."""
        sub = ["topic", "partition", "subscription"]
        part = ["topic", "partition"]
        self.watermark = Gauge(
            "wm_watermark_ms", "Watermark of a subscription (ms since epoch)", sub, registry=self.registry
        )
        self.watermark_age = Gauge(
            "wm_watermark_age_seconds", "Wall clock minus the watermark, when it was last computed", sub,
            registry=self.registry,
        )  # fmt: skip
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
        self.watermarks_published = Counter(
            "wm_watermarks_published", "SendWatermark events published", sub, registry=self.registry
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

    def record_watermark(self, topic: str, partition: int, subscription: str, event_time: int) -> None:
        labels = (topic, partition, subscription)
        children = self._children.get(labels)
        if children is None:  # `labels()` validates its arguments each time: once per subscription, not per table
            named = (topic, str(partition), subscription)
            children = self._children[labels] = (
                self.watermark.labels(*named),
                self.watermark_age.labels(*named),
                self.watermarks_published.labels(*named),
            )
        watermark, age, published = children
        watermark.set(event_time)
        age.set(max(0.0, time.time() - event_time / 1000))
        published.inc()

    def forget_watermark(self, topic: str, partition: int, subscription: str) -> None:
        """The subscription has no watermark now (moved back before every W_SET)."""
        self._children.pop((topic, partition, subscription), None)
        for gauge in (self.watermark, self.watermark_age):
            with contextlib.suppress(KeyError):
                gauge.remove(topic, str(partition), subscription)
        self.watermarks_published.labels(topic, str(partition), subscription).inc()

    def forget_subscription(self, topic: str, partition: int, subscription: str) -> None:
        self._children.pop((topic, partition, subscription), None)
        for gauge in (self.watermark, self.watermark_age):
            with contextlib.suppress(KeyError):
                gauge.remove(topic, str(partition), subscription)
