"""A Pulsar producer that also writes watermark markers into its topic (contract section 3).

Markers are ordinary messages sent by the same Pulsar producer as the data, so the broker-known
producer name identifies whose watermark they are and the log orders them with the data. On a
partitioned topic every marker is sent to every partition, since each partition has its own
watermark; a partition added to the topic later gets the producer's current assertion before any
of its data (`producer.routing.PartitionCount`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import pulsar

from producer.routing import TARGET_PARTITION_PROPERTY, MarkerAwareRouter, PartitionCount
from producer.schedule import check_intervals
from producer.writer import (
    MarkerWriter,
    SendCallback,
    TransactionClosedError,
    WatermarkBuilder,
    WatermarkTransaction,
)
from pulsar_access.errors import explained, service_url_of
from pulsar_access.topics import full_name
from watermark_core.protocol import MARKER_PROPERTY, MarkerKind, encode_set
from watermark_core.state import WatermarkConfig

log = logging.getLogger(__name__)

__all__ = ["TransactionClosedError", "WatermarkBuilder", "WatermarkProducer", "WatermarkTransaction"]


class _PartitionMarkers:
    """The `MarkerSink` of a Pulsar producer: one copy of each marker per covered partition.

    `partitions` is None for a non-partitioned topic. Partitions added to the topic are covered
    (`cover_new`) before the next marker or data message: they get `assertion()`, the producer's
    current W_SET, first. The writer calls the sink under its marker lock, so that W_SET is in
    order with every other marker of the producer.
    """

    def __init__(self, producer: pulsar.Producer, partitions: PartitionCount | None, label: str) -> None:
        self._producer = producer
        self._partitions = partitions
        self._label = label
        self.assertion: Callable[[], int | None] = lambda: None

    def _targets(self) -> list[int | None]:
        return [None] if self._partitions is None else list(range(self._partitions.covered))

    def has_new(self) -> bool:
        return self._partitions is not None and bool(self._partitions.uncovered())

    def cover_new(self) -> None:
        """Partitions added to the topic: send them this producer's current assertion, then count them covered.

        The router keeps data off them until this is done; an idle producer or one that never
        asserted has nothing to send there. A watermark transaction still open is not carried over
        (its commit does nothing where its W_SET is missing: the new partition keeps the older value).
        """
        if self._partitions is None:
            return
        new = self._partitions.uncovered()
        if not new:
            return
        event_time = self.assertion()
        if event_time is not None:
            payload = encode_set(event_time)
            for partition in new:
                self._producer.send(payload, properties=self._properties(MarkerKind.W_SET, partition))
        self._partitions.cover(new.stop)
        log.info("%s: partitions %d..%d added; asserted %s there", self._label, new.start, new.stop - 1,
                 event_time)  # fmt: skip

    @staticmethod
    def _properties(kind: MarkerKind, partition: int | None) -> dict[str, str]:
        properties = {MARKER_PROPERTY: kind.value}
        if partition is not None:
            properties[TARGET_PARTITION_PROPERTY] = str(partition)
        return properties

    def send(self, kind: MarkerKind, payload: bytes) -> list[Any]:
        self.cover_new()
        return [self._producer.send(payload, properties=self._properties(kind, p)) for p in self._targets()]

    def send_async(self, kind: MarkerKind, payload: bytes, callback: SendCallback | None) -> None:
        self.cover_new()
        targets = self._targets()
        remaining = [len(targets)]
        outcome: list[tuple[pulsar.Result, Any]] = []
        guard = threading.Lock()

        def on_sent(result: pulsar.Result, message_id: Any) -> None:
            with guard:
                if result != pulsar.Result.Ok or not outcome:
                    outcome[:] = [(result, message_id)]
                remaining[0] -= 1
                done = remaining[0] == 0
            if done and callback is not None:
                callback(*outcome[0])

        for partition in targets:
            self._producer.send_async(payload, on_sent, properties=self._properties(kind, partition))


class WatermarkProducer:
    """Wraps a `pulsar` producer; options it does not own pass through to `create_producer`.

    `ingestion_time_interval_ms`: also send the wall-clock time as a watermark at that interval
    (ingestion-time watermarks); data sent without an event time then gets the send time.
    `keepalive_interval_ms`: send a marker at most that long after the previous one (re-sending the
    latest watermark), so the generator's producer timeout (decided from the log) does not drop a
    live producer; None turns it off. `producer_timeout_ms`: the generator's producer timeout these
    intervals must stay below (default the generator's default, 60 s); a configuration that leaves
    no margin against it is refused (docs/DECISIONS.md, "Keepalive").
    """

    def __init__(
        self,
        client: pulsar.Client,
        topic: str,
        producer_name: str | None = None,
        *,
        ingestion_time_interval_ms: int | None = None,
        keepalive_interval_ms: int | None = 20_000,
        producer_timeout_ms: int = WatermarkConfig().producer_timeout_ms,
        **producer_options: Any,
    ) -> None:
        self._ingestion_interval_s = _positive_ms(ingestion_time_interval_ms, "ingestion_time_interval_ms")
        self._keepalive_s = _positive_ms(keepalive_interval_ms, "keepalive_interval_ms")
        _positive_ms(producer_timeout_ms, "producer_timeout_ms", allow_none=False)
        check_intervals(keepalive_interval_ms, ingestion_time_interval_ms, producer_timeout_ms)
        self._client = client
        self.topic = topic
        # A broker that is down, a wrong URL, a missing namespace or a refused token: one clear error.
        with explained(service_url=service_url_of(client), topic=topic, doing="create a producer on"):
            partitions = client.get_topic_partitions(topic)
            count = PartitionCount(len(partitions)) if partitions != [full_name(topic)] else None
            self._is_partitioned = count is not None
            if count is not None:
                producer_options["message_router"] = MarkerAwareRouter(producer_options.get("message_router"), count)
            self._producer = client.create_producer(topic, producer_name=producer_name, **producer_options)
        self._markers = _PartitionMarkers(self._producer, count, f"{self.producer_name} on {topic}")
        self._writer = MarkerWriter(
            self._markers,
            f"{self.producer_name} on {topic}",
            keepalive_s=self._keepalive_s,
            ingestion_s=self._ingestion_interval_s,
        )
        self._markers.assertion = lambda: self._writer.last_watermark
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if self._writer.schedule is not None:
            self._ticker = threading.Thread(target=self._tick, name=f"wm-producer-{self.producer_name}", daemon=True)
            self._ticker.start()

    @property
    def producer_name(self) -> str:
        """The broker-known name: the identity of this producer's watermark."""
        return str(self._producer.producer_name())

    @property
    def last_watermark(self) -> int | None:
        """What the log says this producer asserts: its latest W_SET (committed ones included), None
        before the first or while idle. This is what the keepalive re-sends."""
        return self._writer.last_watermark

    # -- data --------------------------------------------------------------------------------------

    def send(self, content: bytes, **kwargs: Any) -> pulsar.MessageId:
        """An ordinary message; keyword arguments are those of `pulsar.Producer.send`."""
        _check_properties(kwargs)
        self._cover_new_partitions()
        if kwargs.get("event_timestamp") is not None:
            return self._producer.send(content, **kwargs)
        kwargs.pop("event_timestamp", None)
        return self._writer.send_data(lambda stamp: self._producer.send(content, event_timestamp=stamp, **kwargs))

    def send_async(self, content: bytes, callback: SendCallback, **kwargs: Any) -> None:
        _check_properties(kwargs)
        self._cover_new_partitions()
        if kwargs.get("event_timestamp") is not None:
            self._producer.send_async(content, callback, **kwargs)
            return
        kwargs.pop("event_timestamp", None)
        self._writer.send_data(
            lambda stamp: self._producer.send_async(content, callback, event_timestamp=stamp, **kwargs)
        )

    def flush(self) -> None:
        self._producer.flush()

    def _cover_new_partitions(self) -> None:
        """Before data: partitions the router has seen added get this producer's assertion (in order with
        its markers), so the router may send data there."""
        if self._markers.has_new():
            self._writer.in_order(self._markers.cover_new)

    # -- watermarks ---------------------------------------------------------------------------------

    def new_watermark(self, txn: WatermarkTransaction | None = None) -> WatermarkBuilder:
        if txn is not None and txn._writer is not self._writer:
            raise ValueError("that watermark transaction belongs to another producer")
        return WatermarkBuilder(self._writer, txn)

    def new_transaction(self) -> WatermarkTransaction:
        return WatermarkTransaction(self._writer)

    # -- background: ingestion time and keepalive ---------------------------------------------------

    def _tick(self) -> None:
        """The ticker thread: wakes up when the writer's schedule says and sends what is due."""
        self._writer.run_ticker(self._stop.wait)

    # -- lifecycle ----------------------------------------------------------------------------------

    def close(self, idle: bool = True) -> None:
        """A graceful writer shutdown: `W_IDLE` first, so this producer stops holding the watermark."""
        if self._writer.closed:
            return
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=5)
        try:
            if idle:
                self.new_watermark().mark_idle().send()
            self._producer.flush()
        finally:
            self._writer.closed = True
            self._producer.close()

    def __enter__(self) -> WatermarkProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_properties(kwargs: dict[str, Any]) -> None:
    properties = kwargs.get("properties")
    if properties and (MARKER_PROPERTY in properties or TARGET_PARTITION_PROPERTY in properties):
        raise ValueError(
            f"the message properties {MARKER_PROPERTY!r} and {TARGET_PARTITION_PROPERTY!r} are reserved "
            "for watermark markers; use new_watermark() to send a watermark"
        )


def _positive_ms(value: int | None, name: str, allow_none: bool = True) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        accepted = "a positive number of milliseconds" + (" or None" if allow_none else "")
        raise ValueError(f"{name} must be {accepted}, got {value!r}")
    return value / 1000
