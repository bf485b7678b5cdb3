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
import logging
import threading
from collections.abc import Iterable, Mapping

import pulsar

from pulsar_access.companion import CompanionReader
from pulsar_access.incarnations import Incarnations
from spark_sink.offsets import Entry, PartitionKey
from watermark_core.protocol import HeadWatermark, WatermarkEvent

log = logging.getLogger(__name__)

MAX_FACTS_PER_PARTITION = 10_000


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

    A `CompanionReader` (pulsar_access/companion.py, shared with the consumer's feed) per topic, those of one
    `follow` reading each companion topic once, from its start: compaction keeps the latest table and head event
    of each partition, and everything after them follows as it is published. Tables and head events are both
    facts here, those about the topic's current incarnation (`incarnations`: the driver's reads the property,
    and forgets a partition whose incarnation changes, `KnownWatermarks.reset`).
    """

    def __init__(self, client: pulsar.Client, known: KnownWatermarks, incarnations: Incarnations | None = None) -> None:
        self._client = client
        self.known = known
        self._incarnations = incarnations or Incarnations(None, reader="the Spark source", named=False)
        self._readers: dict[str, CompanionReader] = {}

    @property
    def malformed_events(self) -> int:
        """Events on the companion topics skipped as malformed."""
        return sum(int(reader.malformed_events) for reader in self._readers.values())

    def follow(self, topics: Iterable[str]) -> None:
        """Also follow these (full, base) topics; reads what their companion topics hold before returning. Those
        whose tables share a companion topic (a group's) share one reader of it, joined before it reads anything,
        so each gets everything from the topic's start."""
        scope = object()  # this call's: topics followed later read their companion topics from the start again
        fresh = {
            topic: CompanionReader(self._client, topic, self._incarnations, on_table=self._on_table,
                                   on_head=self._on_head, shared=True, scope=scope)
            for topic in topics if topic not in self._readers
        }  # fmt: skip
        self._readers.update(fresh)
        for reader in fresh.values():
            reader.catch_up()
            reader.start()

    def _on_table(self, events: list[WatermarkEvent]) -> None:
        for event in events:
            if event.event_time is not None:
                self.known.add((event.topic, event.partition), event.position, event.event_time)

    def _on_head(self, head: HeadWatermark) -> None:
        self.known.add((head.topic, head.partition), head.position, head.event_time)

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
