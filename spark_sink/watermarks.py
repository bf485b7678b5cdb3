"""The broker watermark at a batch's end: what the generator published about positions of the log.

The watermark at a position of a partition is a pure function of the log (contract section 1), it
only changes at markers, and it never goes down along the log. The generator publishes, on each
topic's companion topic, two kinds of facts "the watermark at position p is w":

- `HeadWatermark` events: whenever folding a marker changes the watermark of the partition's head,
  the new value at that marker's entry. The latest one at or before p is the watermark at p once
  the generator has read up to p;
- `SendWatermark` tables: each subscription's watermark at its mark-delete position (a lower bound
  there: the generator may publish a value folded short of it).

So the latest fact at or before a batch's end is the watermark there, or a lower bound of it if the
generator has not published the newest change yet: never above. `KnownWatermarks` keeps, per
partition, the facts that can still matter (bounded); `CompanionFollower` reads them from Pulsar.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import threading
import time
from collections.abc import Iterable, Mapping

import pulsar

from pulsar_access.incarnations import Incarnations
from pulsar_access.topics import watermark_topic_for
from spark_sink.offsets import Entry, PartitionKey
from watermark_core.protocol import (
    EVENT_PROPERTY,
    HEAD_WATERMARK,
    SEND_WATERMARK,
    MalformedMarker,
    decode_head,
    decode_table,
)

log = logging.getLogger(__name__)

MAX_FACTS_PER_PARTITION = 10_000
CATCH_UP_LIMIT_S = 10.0


class KnownWatermarks:
    """Per partition, known (position, watermark) facts; the watermark at any later position is at least
    the latest of them. Thread-safe: a follower adds, the driver asks."""

    def __init__(self, limit: int = MAX_FACTS_PER_PARTITION) -> None:
        self._limit = limit
        self._positions: dict[PartitionKey, list[Entry]] = {}
        self._values: dict[PartitionKey, list[int]] = {}
        self._lock = threading.Lock()

    def add(self, key: PartitionKey, position: Entry, watermark: int) -> None:
        """Record that the watermark at `position` is (at least) `watermark`.

        Kept strictly increasing in both position and value: a fact below one at an earlier or the
        same position says nothing new, and a later fact not above the new one is no longer needed.
        """
        with self._lock:
            positions = self._positions.setdefault(key, [])
            values = self._values.setdefault(key, [])
            index = bisect.bisect_right(positions, position)
            if index > 0 and values[index - 1] >= watermark:
                return
            end = index
            while end < len(positions) and values[end] <= watermark:
                end += 1
            if index > 0 and positions[index - 1] == position:
                index -= 1  # the same position with a higher value: replace it
            positions[index:end] = [position]
            values[index:end] = [watermark]
            if len(positions) > self._limit:  # keep the latest: the earliest matter only to batches behind
                del positions[: len(positions) - self._limit]
                del values[: len(values) - self._limit]

    def at(self, key: PartitionKey, position: Entry | None) -> int | None:
        """The highest watermark known at or before `position` (None if none is known)."""
        if position is None:
            return None
        with self._lock:
            positions = self._positions.get(key, [])
            index = bisect.bisect_right(positions, position)
            return self._values[key][index - 1] if index > 0 else None

    def watermark(self, ends: Mapping[PartitionKey, Entry | None]) -> int | None:
        """The query's watermark at a batch's ends (README, "Several topics"): the minimum over
        the partitions that have entries; None while one of them has no watermark known (`held_back_by`).

        An empty partition (no entry at all: end None) takes no part, as a producer that never sent W_SET
        takes no part in a partition's watermark; if it gets entries below the query's watermark later,
        it is a late joiner (its rows below are marked late, and the driver says which topic joined late).
        """
        found = [self.at(key, end) for key, end in ends.items() if end is not None]
        if not found or any(value is None for value in found):
            return None
        return min(value for value in found if value is not None)

    def held_back_by(self, ends: Mapping[PartitionKey, Entry | None]) -> list[PartitionKey]:
        """The partitions that hold the query's watermark back: entries, but no watermark known at their end
        (written only by plain producers, or not yet published by the generator). Never silent: the source
        names them in its offsets (the query's progress) and its log."""
        return sorted(key for key, end in ends.items() if end is not None and self.at(key, end) is None)

    def reset(self, key: PartitionKey) -> None:
        """Forget every fact of a partition: they are about an incarnation of its topic that was deleted."""
        with self._lock:
            self._positions.pop(key, None)
            self._values.pop(key, None)

    def forget_before(self, starts: Mapping[PartitionKey, Entry | None]) -> None:
        """Drop what no batch from `starts` on can need: all but the latest fact at or before each start."""
        with self._lock:
            for key, start in starts.items():
                positions = self._positions.get(key)
                if start is None or not positions:
                    continue
                keep_from = max(0, bisect.bisect_right(positions, start) - 1)
                del positions[:keep_from]
                del self._values[key][:keep_from]


class CompanionFollower:
    """Reads the companion topics of the topics a query reads, into a `KnownWatermarks`.

    One compacted reader per companion topic, from its start: compaction keeps the latest table and
    head event of each partition, and everything after them follows as it is published. Companion
    topics live in the watermark namespace (`watermark_topic_for`), where only the generator may
    produce (docs/SECURITY.md); an event read there that names another data topic than the one the
    companion belongs to is ignored, and so is one about another incarnation of the topic than the one it has
    now (`Incarnations`: a deleted topic's events stay on its companion). Malformed events are skipped, counted
    and logged once.
    """

    def __init__(self, client: pulsar.Client, known: KnownWatermarks, incarnations: Incarnations | None = None) -> None:
        self._client = client
        self.known = known
        self._incarnations = incarnations or Incarnations(None, reader="the Spark source")
        self._readers: dict[str, pulsar.Reader] = {}
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self.malformed_events = 0

    def follow(self, topics: Iterable[str]) -> None:
        """Also follow these (full, base) topics; reads what their companion topics hold before returning."""
        for topic in topics:
            companion = watermark_topic_for(topic)
            if companion in self._readers:
                continue
            reader = self._client.create_reader(companion, pulsar.MessageId.earliest, is_read_compacted=True)
            self._readers[companion] = reader
            deadline = time.monotonic() + CATCH_UP_LIMIT_S
            while time.monotonic() < deadline and reader.has_message_available():
                try:
                    self._handle(reader.read_next(timeout_millis=1000), topic)
                except pulsar.Timeout:
                    break
            thread = threading.Thread(target=self._run, args=(reader, topic), name=f"wm-head-{topic}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _run(self, reader: pulsar.Reader, topic: str) -> None:
        while not self._stop.is_set():
            try:
                message = reader.read_next(timeout_millis=200)
            except pulsar.Timeout:
                continue
            except Exception:  # closed, or the reader reconnects by itself
                if self._stop.is_set():
                    return
                log.warning("reading watermark events failed; retrying", exc_info=True)
                time.sleep(1)
                continue
            self._handle(message, topic)

    def _handle(self, message: pulsar.Message, topic: str) -> None:
        """An event read from `topic`'s companion topic; only facts about `topic` count."""
        kind = message.properties().get(EVENT_PROPERTY)
        try:
            if kind == HEAD_WATERMARK:
                head = decode_head(message.data())
                if head.topic == topic and self._incarnations.holds(topic, head.partition, head.incarnation):
                    self.known.add((head.topic, head.partition), head.position, head.event_time)
            elif kind == SEND_WATERMARK:
                for event in decode_table(message.data()):
                    if (
                        event.topic == topic and event.event_time is not None
                        and self._incarnations.holds(topic, event.partition, event.incarnation)
                    ):  # fmt: skip
                        self.known.add((event.topic, event.partition), event.position, event.event_time)
            else:
                raise MalformedMarker("bad-event", f"unknown watermark event kind {kind!r}")
        except MalformedMarker as exc:
            self.malformed_events += 1
            if self.malformed_events == 1:
                log.warning("skipping malformed watermark event at %s on %s: %s",
                            message.message_id(), message.topic_name(), exc)  # fmt: skip

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=2)
        for reader in self._readers.values():
            with contextlib.suppress(pulsar.PulsarException):
                reader.close()
