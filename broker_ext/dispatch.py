"""Publishes `SendWatermark` tables and `HeadWatermark` events to each topic's companion topic.

Consumers read the companion topic (`watermark_topic_for`) with a compacted reader; the generator
triggers compaction now and then so that a consumer that attaches finds the latest table of each
partition (key `<partition>`) and the latest head event (key `head-<partition>`) at once without
reading the whole history.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import pulsar

from pulsar_access.admin import AdminError, PulsarAdmin
from pulsar_access.topics import watermark_topic_for
from watermark_core.protocol import (
    EVENT_PROPERTY,
    HEAD_WATERMARK,
    SEND_WATERMARK,
    HeadWatermark,
    WatermarkEvent,
    encode_head,
    encode_table,
    head_key,
    table_key,
)

log = logging.getLogger(__name__)

COMPACT_EVERY_EVENTS = 200
COMPACT_EVERY_S = 60.0


class WatermarkDispatcher:
    """One producer per companion topic, shared by every partition worker of that topic."""

    def __init__(self, client: pulsar.Client, admin: PulsarAdmin, instance_id: str) -> None:
        self._client = client
        self._admin = admin
        self._instance_id = instance_id
        self._producers: dict[str, pulsar.Producer] = {}
        self._since_compaction: dict[str, tuple[int, float]] = {}
        self._compaction_refused = False
        self._head_failures = 0
        self._head_failures_lock = threading.Lock()  # taken on the client's I/O thread: never held while blocking
        self._lock = threading.Lock()

    def _producer(self, companion: str) -> pulsar.Producer:
        with self._lock:
            producer = self._producers.get(companion)
            if producer is None:
                producer = self._client.create_producer(
                    companion, producer_name=f"__wm_dispatch-{self._instance_id}-{len(self._producers)}",
                    batching_enabled=False,
                )  # fmt: skip
                self._producers[companion] = producer
                self._since_compaction[companion] = (0, time.monotonic())
            return producer

    def publish(self, table: list[WatermarkEvent]) -> None:
        """Send a partition's table (every subscription's watermark) and wait until it is durable."""
        companion = watermark_topic_for(table[0].topic)
        self._producer(companion).send(
            encode_table(table),
            partition_key=table_key(table[0].partition),
            properties={EVENT_PROPERTY: SEND_WATERMARK},
        )
        self._maybe_compact(companion)

    def publish_head(self, event: HeadWatermark) -> None:
        """Send the watermark of a partition's head at a position, without waiting (never raises).

        Best effort: a head event lets a reader (the Spark source) know the watermark at a position
        before any subscription has acknowledged it; a lost one only delays that reader to the next
        head event or to the SendWatermark table, which is published as before. The send is
        asynchronous so that the partition's read loop does not wait for it; one producer per
        companion topic keeps head events and tables in the order they were published.
        """
        try:
            companion = watermark_topic_for(event.topic)
            self._producer(companion).send_async(
                encode_head(event),
                self._head_sent,
                partition_key=head_key(event.partition),
                properties={EVENT_PROPERTY: HEAD_WATERMARK},
            )
        except Exception as exc:  # a broker away or a bad value: the read loop goes on
            self._head_sent(exc, None)
            return
        self._maybe_compact(companion)

    def _head_sent(self, result: object, _message_id: object) -> None:
        if result == pulsar.Result.Ok:
            return
        with self._head_failures_lock:
            self._head_failures += 1
            first = self._head_failures == 1
        if first:
            log.warning("a HeadWatermark event was not published (%s); readers fall back to the tables", result)

    def _maybe_compact(self, companion: str) -> None:
        with self._lock:
            count, since = self._since_compaction[companion]
            count += 1
            due = count == 1 or count >= COMPACT_EVERY_EVENTS or time.monotonic() - since >= COMPACT_EVERY_S
            self._since_compaction[companion] = (0, time.monotonic()) if due else (count, since)
        if due and not self._compaction_refused:
            try:
                self._admin.trigger_compaction(companion)
            except AdminError as exc:  # 409: one is running already; anything else is retried later
                if exc.status in (401, 403):  # not this role's right (tenant admin): say so once, then stop asking
                    self._compaction_refused = True
                    log.warning(
                        "compaction of the __watermarks topics is not triggered: %s. Watermarks still flow; a "
                        "consumer that attaches reads the companion topic's whole history (see docs/SECURITY.md)",
                        exc,
                    )
                elif exc.status != 409:
                    log.warning("compaction of %s not triggered: %s", companion, exc)

    def forget(self, topic: str) -> None:
        companion = watermark_topic_for(topic)
        with self._lock:
            producer = self._producers.pop(companion, None)
            self._since_compaction.pop(companion, None)
        if producer is not None:
            with contextlib.suppress(pulsar.PulsarException):
                producer.close()

    def close(self) -> None:
        with self._lock:
            producers = list(self._producers.values())
            self._producers.clear()
        for producer in producers:
            with contextlib.suppress(pulsar.PulsarException):
                producer.close()
