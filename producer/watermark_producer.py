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
import time
import uuid
from collections.abc import Callable
from typing import Any

import pulsar

from producer.routing import TARGET_PARTITION_PROPERTY, MarkerAwareRouter, PartitionCount
from pulsar_access.errors import explained, service_url_of
from pulsar_access.topics import full_name
from watermark_core.protocol import (
    MARKER_PROPERTY,
    MarkerKind,
    encode_idle,
    encode_set,
    encode_txn_abort,
    encode_txn_commit,
)

log = logging.getLogger(__name__)

SendCallback = Callable[[pulsar.Result, Any], None]


class TransactionClosedError(ValueError):
    """A watermark transaction was used after its commit or abort."""


class WatermarkTransaction:
    """Watermarks sent inside it are pending until `commit()`; `abort()` discards them."""

    def __init__(self, producer: WatermarkProducer) -> None:
        self.txn_id = uuid.uuid4().hex
        self._producer = producer
        self._pending_event_time: int | None = None
        self._outcome: str | None = None

    @property
    def closed(self) -> bool:
        return self._outcome is not None

    def _check_open(self) -> None:
        if self._outcome is not None:
            raise TransactionClosedError(
                f"watermark transaction {self.txn_id} was already {self._outcome}; start a new one with "
                "producer.new_transaction()"
            )

    def commit(self) -> None:
        """The pending watermark takes effect at the commit's position in the log."""
        self._check_open()
        self._producer._send_marker(MarkerKind.W_TXN_COMMIT, encode_txn_commit(self.txn_id))
        self._outcome = "committed"
        if self._pending_event_time is not None:
            self._producer._asserted(self._pending_event_time)

    def abort(self) -> None:
        self._check_open()
        self._producer._send_marker(MarkerKind.W_TXN_ABORT, encode_txn_abort(self.txn_id))
        self._outcome = "aborted"


class WatermarkBuilder:
    """`producer.new_watermark().event_time(t).send()` or `.mark_idle().send()`."""

    def __init__(self, producer: WatermarkProducer, txn: WatermarkTransaction | None) -> None:
        self._producer = producer
        self._txn = txn
        self._event_time: int | None = None
        self._idle = False

    def event_time(self, event_time_ms: int) -> WatermarkBuilder:
        """Assert that every later message of this producer has event time >= `event_time_ms`."""
        encode_set(event_time_ms)  # validates: a non-negative integer of milliseconds
        self._event_time = event_time_ms
        self._idle = False
        return self

    def mark_idle(self) -> WatermarkBuilder:
        """Leave this producer out of the watermark until its next `W_SET`."""
        self._idle = True
        self._event_time = None
        return self

    def _payload(self) -> tuple[MarkerKind, bytes]:
        if self._txn is not None:
            self._txn._check_open()
        txn_id = self._txn.txn_id if self._txn is not None else None
        if self._idle:
            return MarkerKind.W_IDLE, encode_idle(txn_id)
        if self._event_time is None:
            raise ValueError("a watermark needs .event_time(t_ms) or .mark_idle() before .send()")
        return MarkerKind.W_SET, encode_set(self._event_time, txn_id)

    def _record(self) -> None:
        if self._txn is not None:
            if self._event_time is not None:
                self._txn._pending_event_time = self._event_time
        elif self._idle:
            self._producer._went_idle()
        elif self._event_time is not None:
            self._producer._asserted(self._event_time)

    def send(self) -> list[pulsar.MessageId]:
        """Send the marker to every partition and wait; returns one message id per partition."""
        kind, payload = self._payload()
        ids = self._producer._send_marker(kind, payload)
        self._record()
        return ids

    def send_async(self, callback: SendCallback | None = None) -> None:
        """Send without waiting; `callback(result, message_id)` runs once all partitions answered."""
        kind, payload = self._payload()
        self._producer._send_marker_async(kind, payload, callback)
        self._record()


class WatermarkProducer:
    """Wraps a `pulsar` producer; options it does not own pass through to `create_producer`.

    `ingestion_time_interval_ms`: also send the wall-clock time as a watermark at that interval
    (ingestion-time watermarks); data sent without an event time then gets the send time.
    `keepalive_interval_ms`: re-send the latest watermark when no marker went out for that long,
    so the generator's producer timeout (decided from the log) does not drop a live producer.
    """

    def __init__(
        self,
        client: pulsar.Client,
        topic: str,
        producer_name: str | None = None,
        *,
        ingestion_time_interval_ms: int | None = None,
        keepalive_interval_ms: int | None = 20_000,
        **producer_options: Any,
    ) -> None:
        self._ingestion_interval_s = _positive_ms(ingestion_time_interval_ms, "ingestion_time_interval_ms")
        self._keepalive_s = _positive_ms(keepalive_interval_ms, "keepalive_interval_ms")
        self._client = client
        self.topic = topic
        # A broker that is down, a wrong URL, a missing namespace or a refused token: one clear error.
        with explained(service_url=service_url_of(client), topic=topic, doing="create a producer on"):
            partitions = client.get_topic_partitions(topic)
            self._partitions = PartitionCount(len(partitions))
            self._is_partitioned = partitions != [full_name(topic)]
            if self._is_partitioned:
                producer_options["message_router"] = MarkerAwareRouter(
                    producer_options.get("message_router"), self._partitions
                )
            self._covering = threading.Lock()
            self._producer = client.create_producer(topic, producer_name=producer_name, **producer_options)
        self._lock = threading.Lock()
        self._last_event_time: int | None = None
        self._idle = False
        self._last_marker_at = time.monotonic()
        self._closed = False
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if self._ingestion_interval_s or self._keepalive_s:
            self._ticker = threading.Thread(target=self._tick, name=f"wm-producer-{self.producer_name}", daemon=True)
            self._ticker.start()

    @property
    def producer_name(self) -> str:
        """The broker-known name: the identity of this producer's watermark."""
        return str(self._producer.producer_name())

    @property
    def last_watermark(self) -> int | None:
        """The latest event time this producer asserted (None before the first or after idling)."""
        return None if self._idle else self._last_event_time

    # -- data --------------------------------------------------------------------------------------

    def send(self, content: bytes, **kwargs: Any) -> pulsar.MessageId:
        """An ordinary message; keyword arguments are those of `pulsar.Producer.send`."""
        self._stamp(kwargs)
        self._cover_new_partitions()
        return self._producer.send(content, **kwargs)

    def send_async(self, content: bytes, callback: SendCallback, **kwargs: Any) -> None:
        self._stamp(kwargs)
        self._cover_new_partitions()
        self._producer.send_async(content, callback, **kwargs)

    def flush(self) -> None:
        self._producer.flush()

    def _stamp(self, kwargs: dict[str, Any]) -> None:
        if self._ingestion_interval_s and kwargs.get("event_timestamp") is None:
            kwargs["event_timestamp"] = self._now_ms()
        properties = kwargs.get("properties")
        if properties and (MARKER_PROPERTY in properties or TARGET_PARTITION_PROPERTY in properties):
            raise ValueError(
                f"the message properties {MARKER_PROPERTY!r} and {TARGET_PARTITION_PROPERTY!r} are reserved "
                "for watermark markers; use new_watermark() to send a watermark"
            )

    # -- watermarks ---------------------------------------------------------------------------------

    def new_watermark(self, txn: WatermarkTransaction | None = None) -> WatermarkBuilder:
        if txn is not None and txn._producer is not self:
            raise ValueError("that watermark transaction belongs to another producer")
        return WatermarkBuilder(self, txn)

    def new_transaction(self) -> WatermarkTransaction:
        return WatermarkTransaction(self)

    def _asserted(self, event_time: int) -> None:
        with self._lock:
            self._last_event_time = event_time
            self._idle = False

    def _went_idle(self) -> None:
        with self._lock:
            self._idle = True

    def _marker_properties(self, kind: MarkerKind, partition: int | None) -> dict[str, str]:
        properties = {MARKER_PROPERTY: kind.value}
        if partition is not None:
            properties[TARGET_PARTITION_PROPERTY] = str(partition)
        return properties

    def _targets(self) -> list[int | None]:
        return list(range(self._partitions.covered)) if self._is_partitioned else [None]

    def _cover_new_partitions(self) -> None:
        """Partitions added to the topic: send them this producer's current assertion before anything else.

        The router keeps data off them until this is done; an idle producer or one that never
        asserted has nothing to send there. A watermark transaction still open is not carried over
        (its commit does nothing where its W_SET is missing: the new partition keeps the older value).
        """
        if not self._is_partitioned or not self._partitions.uncovered():
            return
        with self._covering:
            new = self._partitions.uncovered()
            if not new:
                return
            with self._lock:
                event_time = None if self._idle else self._last_event_time
            if event_time is not None:
                payload = encode_set(event_time)
                for partition in new:
                    self._producer.send(payload, properties=self._marker_properties(MarkerKind.W_SET, partition))
            self._partitions.cover(new.stop)
            log.info("%s: partitions %d..%d added; producer %s asserted %s there", self.topic, new.start,
                     new.stop - 1, self.producer_name, event_time)  # fmt: skip

    def _send_marker(self, kind: MarkerKind, payload: bytes) -> list[pulsar.MessageId]:
        self._check_open()
        self._cover_new_partitions()
        ids = [
            self._producer.send(payload, properties=self._marker_properties(kind, partition))
            for partition in self._targets()
        ]
        self._last_marker_at = time.monotonic()
        return ids

    def _send_marker_async(self, kind: MarkerKind, payload: bytes, callback: SendCallback | None) -> None:
        self._check_open()
        self._cover_new_partitions()
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
            self._producer.send_async(payload, on_sent, properties=self._marker_properties(kind, partition))
        self._last_marker_at = time.monotonic()

    # -- background: ingestion time and keepalive ---------------------------------------------------

    def _now_ms(self) -> int:
        """Wall-clock milliseconds that never go back, so ingestion-time watermarks stay honest."""
        with self._lock:
            now = max(int(time.time() * 1000), self._last_event_time or 0)
            return now

    def _tick(self) -> None:
        periods = [s for s in (self._ingestion_interval_s, self._keepalive_s) if s]
        while not self._stop.wait(min(periods)):
            try:
                if self._ingestion_interval_s:
                    self.new_watermark().event_time(self._now_ms()).send_async()
                elif self._keepalive_s and time.monotonic() - self._last_marker_at >= self._keepalive_s:
                    with self._lock:
                        event_time = None if self._idle else self._last_event_time
                    if event_time is not None:
                        self.new_watermark().event_time(event_time).send_async()
            except Exception:  # a broker hiccup must not kill the ticker; the next tick retries
                log.warning("watermark keepalive for %s on %s failed", self.producer_name, self.topic, exc_info=True)

    # -- lifecycle ----------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"watermark producer {self.producer_name} on {self.topic} is closed")

    def close(self, idle: bool = True) -> None:
        """A graceful writer shutdown: `W_IDLE` first, so this producer stops holding the watermark."""
        if self._closed:
            return
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=5)
        try:
            if idle:
                self.new_watermark().mark_idle().send()
            self._producer.flush()
        finally:
            self._closed = True
            self._producer.close()

    def __enter__(self) -> WatermarkProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _positive_ms(value: int | None, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive number of milliseconds or None, got {value!r}")
    return value / 1000
