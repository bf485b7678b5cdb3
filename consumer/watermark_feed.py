"""Follows the `SendWatermark` events of one subscription on the topic's companion topic.

The generator publishes one event per (partition, subscription) change to the topic's companion
topic (`watermark_topic_for`: in the watermark namespace, where only the generator may produce);
compaction keeps the latest per key, so reading the compacted topic from its start gives the
current watermark at once, and reading on gives every change after it. Events come from there
only, and an event that names another topic or subscription is ignored.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable

import pulsar

from pulsar_access.errors import explained, service_url_of
from pulsar_access.topics import base_topic_and_partition, watermark_topic_for
from watermark_core.protocol import (
    EVENT_PROPERTY,
    HEAD_WATERMARK,
    MalformedMarker,
    Watermark,
    WatermarkEvent,
    decode_table,
)

log = logging.getLogger(__name__)

CATCH_UP_LIMIT_S = 10.0


def partition_indexes(client: pulsar.Client, topic: str) -> list[int]:
    """The partitions a consumer of `topic` reads: [-1] for a non-partitioned topic."""
    names = client.get_topic_partitions(topic)
    base, _ = base_topic_and_partition(topic)
    if names == [base]:
        return [-1]
    return sorted(base_topic_and_partition(name)[1] for name in names)


class WatermarkFeed:
    """The subscription's watermark: the minimum over the partitions it reads."""

    def __init__(
        self,
        client: pulsar.Client,
        topic: str,
        subscription: str,
        on_change: Callable[[Watermark], None],
        partitions: list[int] | None = None,
    ) -> None:
        self.topic, _ = base_topic_and_partition(topic)
        self.subscription = subscription
        self._on_change = on_change
        self._partitions = partitions if partitions is not None else partition_indexes(client, topic)
        self._per_partition: dict[int, int | None] = {}
        self._current: Watermark | None = None
        self._lock = threading.Lock()
        self.malformed_events = 0
        companion = watermark_topic_for(topic)
        with explained(service_url=service_url_of(client), topic=companion, doing="read the watermarks from"):
            self._reader = client.create_reader(companion, pulsar.MessageId.earliest, is_read_compacted=True)
        self._stop = threading.Event()
        self._caught_up = False
        self._catch_up()
        self._caught_up = True
        self._thread = threading.Thread(target=self._run, name=f"wm-feed-{subscription}", daemon=True)
        self._thread.start()

    @property
    def current(self) -> Watermark | None:
        return self._current  # one attribute read: atomic, no lock on the message path

    def _catch_up(self) -> None:
        """Read what is already there, so the latest watermark is known when the consumer attaches.

        Silent: the history before the latest event (older watermarks, or higher ones from before a
        seek) is not the subscription's watermark now and is never handed on; the caller takes
        `current` once this returns.
        """
        deadline = time.monotonic() + CATCH_UP_LIMIT_S
        while time.monotonic() < deadline and self._reader.has_message_available():
            try:
                self._handle(self._reader.read_next(timeout_millis=1000))
            except pulsar.Timeout:
                break

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                message = self._reader.read_next(timeout_millis=200)
            except pulsar.Timeout:
                continue
            except pulsar.AlreadyClosed:
                return
            except Exception:  # the reader reconnects by itself; keep following
                if self._stop.is_set():
                    return
                log.warning("reading watermarks of %s failed; retrying", self.topic, exc_info=True)
                time.sleep(1)
                continue
            self._handle(message)

    def _handle(self, message: pulsar.Message) -> None:
        if message.properties().get(EVENT_PROPERTY) == HEAD_WATERMARK:
            return  # the watermark at the partition's head: not a subscription's (the Spark source reads them)
        try:
            events = decode_table(message.data())
        except MalformedMarker as exc:
            self.malformed_events += 1
            if self.malformed_events == 1:
                log.warning(
                    "skipping malformed watermark event at %s on %s: %s",
                    message.message_id(),
                    message.topic_name(),
                    exc,
                )
            return
        for event in events:
            self._apply(event)

    def _apply(self, event: WatermarkEvent) -> None:
        if event.subscription != self.subscription or event.topic != self.topic:
            return
        if event.partition not in self._partitions:
            return
        with self._lock:
            self._per_partition[event.partition] = event.event_time
            times = [self._per_partition.get(p) for p in self._partitions]
            if any(t is None for t in times):
                return
            combined = Watermark(min(t for t in times if t is not None))
            if combined == self._current:
                return
            self._current = combined
        if self._caught_up:
            self._on_change(combined)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        with contextlib.suppress(pulsar.PulsarException):
            self._reader.close()
