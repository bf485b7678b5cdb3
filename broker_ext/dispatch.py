"""Publishes `SendWatermark` events to each topic's companion topic, through Pulsar itself.

Companion topics live in the watermark namespace (`pulsar_access.topics.watermark_topic_for`),
where only the generator's role may produce. Consumers read them with a compacted reader; the
generator triggers compaction now and then so that a consumer that attaches finds the latest event
of its subscription at once without reading the whole history.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import pulsar

from pulsar_access.admin import AdminError, PulsarAdmin
from pulsar_access.topics import watermark_namespace, watermark_topic_for
from watermark_core.protocol import EVENT_PROPERTY, SEND_WATERMARK, WatermarkEvent, encode_table, table_key

log = logging.getLogger(__name__)

COMPACT_EVERY_EVENTS = 200
COMPACT_EVERY_S = 60.0


class WatermarkDispatcher:
    """One producer per companion topic, shared by every partition worker of that topic."""

    def __init__(
        self, client: pulsar.Client, admin: PulsarAdmin, instance_id: str, namespace: str | None = None
    ) -> None:
        self._client = client
        self._admin = admin
        self._instance_id = instance_id
        self._namespace = watermark_namespace(namespace)
        self._namespace_checked = False
        self._producers: dict[str, pulsar.Producer] = {}
        self._since_compaction: dict[str, tuple[int, float]] = {}
        self._compaction_refused = False
        self._lock = threading.Lock()

    def ensure_namespace(self) -> None:
        """Create the watermark namespace where the broker lets us (a cluster without authorization).

        With authorization only an admin may create it (`make cluster-up` does, and grants produce
        there to the generator's role alone; docs/SECURITY.md): then say once, with the fix, if it
        is missing or not ours to write.
        """
        if self._namespace_checked:
            return
        try:
            self._admin.create_namespace(self._namespace)
        except AdminError as exc:
            if exc.status not in (401, 403):
                raise  # the broker is away: retried with the next table
            try:
                self._admin.list_topics(self._namespace)
            except AdminError as missing:
                log.error(
                    "the watermark namespace %s is missing or not open to this generator's role (%s); as an admin, "
                    "create it and grant the generator produce,consume and the applications consume there "
                    "(docs/SECURITY.md), or set --watermark-namespace / WM_WATERMARK_NAMESPACE", self._namespace,
                    missing,
                )
        self._namespace_checked = True

    def _producer(self, companion: str) -> pulsar.Producer:
        self.ensure_namespace()
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
        companion = watermark_topic_for(table[0].topic, self._namespace)
        self._producer(companion).send(
            encode_table(table),
            partition_key=table_key(table[0].partition),
            properties={EVENT_PROPERTY: SEND_WATERMARK},
        )
        self._maybe_compact(companion)

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
                        "compaction of the watermark tables is not triggered: %s. Watermarks still flow; a "
                        "consumer that attaches reads the companion topic's whole history (see docs/SECURITY.md)",
                        exc,
                    )
                elif exc.status != 409:
                    log.warning("compaction of %s not triggered: %s", companion, exc)

    def forget(self, topic: str) -> None:
        companion = watermark_topic_for(topic, self._namespace)
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
