"""The Spark source's offset: a typed value with one JSON form, like Spark's own `KafkaSourceOffset`.

Spark keeps offsets in its checkpoint as JSON. Ours holds, per partition of every topic read, the
last entry read (ledger, entry) or None before the first, and the broker watermark at that end
(`NO_WATERMARK` before there is one):

    {"topics": {"persistent://public/default/t": {"0": [ledger, entry], "1": null}}, "wm": ms, "tasks": n}

`tasks` is how many Spark tasks the batch ending there was cut for when it was planned: Spark runs a batch
again from the offsets in its checkpoint, and the exactly-once sink needs each task of it to get the same
rows as the first time, whatever driver runs it again (its CPU count, its `minPartitions`).

Checkpoints written before several topics could be read hold one topic's partitions without its
name (`{"partitions": {"0": [ledger, entry]}, "wm": ms}`); `from_json` reads them for the topic the
query names, so they keep restoring.

Also here, pure: counting and cutting entries across ledgers (`Ledgers`), for `maxOffsetsPerTrigger`
and for splitting a partition's range over several tasks.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

NO_WATERMARK = -1
Entry = tuple[int, int]
"""(ledger, entry) of a partition's message: the unit Spark offsets count in ("offsets" are entries)."""
PartitionKey = tuple[str, int]
"""(full topic name, partition index); the index is -1 for a non-partitioned topic."""


@dataclass(frozen=True)
class SourceOffset:
    """Where a batch ends: each partition's last entry read (None: nothing yet) and the broker watermark there."""

    partitions: Mapping[PartitionKey, Entry | None] = field(default_factory=dict)
    watermark: int = NO_WATERMARK
    held_back_by: tuple[PartitionKey, ...] = field(default=(), compare=False)
    """Partitions with entries but no watermark known at their end: they hold the watermark back
    (`KnownWatermarks.held_back_by`). In the JSON as `heldBackBy` (the query's progress shows it)."""
    tasks: int | None = None
    """How many tasks the batch ending here is cut for (`minPartitions`, by default the CPU count of the driver
    that planned it). None in offsets written before it was recorded: those are cut by today's option."""

    def to_json(self) -> dict[str, Any]:
        """The dict Spark stores in its checkpoint (`initialOffset`/`latestOffset` return it)."""
        topics: dict[str, dict[str, list[int] | None]] = {}
        for (topic, partition), entry in sorted(self.partitions.items()):
            topics.setdefault(topic, {})[str(partition)] = None if entry is None else [entry[0], entry[1]]
        data: dict[str, Any] = {"topics": topics, "wm": self.watermark}
        if self.tasks is not None:
            data["tasks"] = self.tasks
        if self.held_back_by:
            held: dict[str, list[int]] = {}
            for topic, partition in sorted(self.held_back_by):
                held.setdefault(topic, []).append(partition)
            data["heldBackBy"] = held
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None, legacy_topic: str | None = None) -> SourceOffset:
        """The offset Spark hands back (from `to_json`, possibly read from a checkpoint); None is the empty one.

        `legacy_topic` names the topic of a checkpoint written in the one-topic layout.
        """
        if not data:
            return cls()
        partitions: dict[PartitionKey, Entry | None] = {}
        for topic, entries in (data.get("topics") or {}).items():
            for key, entry in entries.items():
                partitions[(str(topic), int(key))] = _entry(entry)
        legacy = data.get("partitions") or {}
        if legacy:
            if legacy_topic is None:
                raise ValueError("this checkpoint's offsets name no topic; read it with one option 'topic'")
            for key, entry in legacy.items():
                partitions[(legacy_topic, int(key))] = _entry(entry)
        held = tuple(
            (str(topic), int(partition)) for topic, indexes in (data.get("heldBackBy") or {}).items()
            for partition in indexes
        )  # fmt: skip
        tasks = data.get("tasks")
        return cls(partitions, int(data.get("wm", NO_WATERMARK)), held, None if tasks is None else int(tasks))

    def with_watermark(self, watermark: int) -> SourceOffset:
        return SourceOffset(self.partitions, watermark, self.held_back_by, self.tasks)

    def ranges_after(self, start: SourceOffset) -> list[tuple[PartitionKey, Entry | None, Entry]]:
        """(partition, start entry or None, end entry) of every partition with entries in (start, self]."""
        ranges = []
        for key, stop in sorted(self.partitions.items()):
            begin = start.partitions.get(key)
            if stop is not None and (begin is None or stop > begin):
                ranges.append((key, begin, stop))
        return ranges


def _entry(value: Any) -> Entry | None:
    return None if value is None else (int(value[0]), int(value[1]))


class Ledgers:
    """A partition's ledgers and how many entries each holds, from its internal stats: entries counted
    and cut across ledger boundaries.

    Positions are (ledger, entry); (ledger, -1) is "before that ledger's first entry" and None
    "before everything". Ledgers Pulsar deleted are not known; a position in one counts as the
    start of the next ledger still there.
    """

    def __init__(self, ledgers: Sequence[tuple[int, int]]) -> None:
        known = sorted((int(ledger), int(entries)) for ledger, entries in ledgers if int(entries) > 0)
        self._ids = [ledger for ledger, _ in known]
        self._sizes = [entries for _, entries in known]
        self._before: list[int] = []  # entries in the ledgers before each one
        total = 0
        for size in self._sizes:
            self._before.append(total)
            total += size
        self.total = total

    @classmethod
    def from_stats(cls, stats: Mapping[str, Any]) -> Ledgers:
        """From the admin API's internal stats: the open ledger's size is its last confirmed entry + 1."""
        sizes = {int(info["ledgerId"]): int(info.get("entries", 0)) for info in stats.get("ledgers") or []}
        last = str(stats.get("lastConfirmedEntry", "-1:-1")).split(":")
        ledger, entry = int(last[0]), int(last[1])
        if entry >= 0:
            sizes[ledger] = max(sizes.get(ledger, 0), entry + 1)
        return cls(list(sizes.items()))

    @property
    def first(self) -> int | None:
        """The first ledger still there with entries (None: the partition holds none)."""
        return self._ids[0] if self._ids else None

    def count_to(self, position: Entry | None) -> int:
        """How many entries lie at or before `position`."""
        if position is None:
            return 0
        ledger, entry = position
        index = bisect.bisect_left(self._ids, ledger)
        if index < len(self._ids) and self._ids[index] == ledger:
            return self._before[index] + max(0, min(entry + 1, self._sizes[index]))
        return self._before[index] if index < len(self._ids) else self.total

    def between(self, after: Entry | None, upto: Entry | None) -> int:
        """How many entries lie in (after, upto]."""
        return max(0, self.count_to(upto) - self.count_to(after))

    def at(self, count: int) -> Entry | None:
        """The position with `count` entries at or before it (None for 0; the last entry beyond the total)."""
        if count <= 0 or not self._ids:
            return None
        count = min(count, self.total)
        index = bisect.bisect_right(self._before, count - 1) - 1
        return (self._ids[index], count - 1 - self._before[index])

    def advance(self, after: Entry | None, entries: int, upto: Entry) -> Entry:
        """The position `entries` entries after `after`, but not past `upto`."""
        target = self.at(self.count_to(after) + entries)
        return upto if target is None or target > upto or target <= (after or (-1, -1)) else target

    def split(self, after: Entry | None, upto: Entry, pieces: int) -> list[tuple[Entry | None, Entry]]:
        """(after, upto] cut into at most `pieces` consecutive ranges of about the same number of entries."""
        total = self.between(after, upto)
        pieces = max(1, min(pieces, total))
        cuts: list[Entry | None] = [after]
        start = self.count_to(after)
        for piece in range(1, pieces):
            cut = self.at(start + total * piece // pieces)
            if cut is not None and cut > (cuts[-1] or (-1, -1)) and cut < upto:
                cuts.append(cut)
        ranges: list[tuple[Entry | None, Entry]] = []
        for index, begin in enumerate(cuts):
            end = cuts[index + 1] if index + 1 < len(cuts) else upto
            assert end is not None
            ranges.append((begin, end))
        return ranges


def share_limit(
    starts: Mapping[PartitionKey, Entry | None],
    ends: Mapping[PartitionKey, Entry | None],
    ledgers: Mapping[PartitionKey, Ledgers],
    limit: int,
) -> dict[PartitionKey, Entry | None]:
    """At most `limit` entries in all, shared over the partitions in proportion to their backlog (as
    Spark's Kafka source shares `maxOffsetsPerTrigger`), counted across ledger boundaries.

    Every partition with a backlog gets at least one entry, so none starves; a partition whose
    ledgers are unknown is not capped.
    """
    backlog = {
        key: ledgers[key].between(starts.get(key), end) if key in ledgers else 0
        for key, end in ends.items()
        if end is not None
    }
    total = sum(backlog.values())
    if total <= limit:
        return dict(ends)
    capped = dict(ends)
    for key, behind in backlog.items():
        end = ends[key]
        if behind == 0 or end is None:
            continue
        share = max(1, limit * behind // total)
        capped[key] = ledgers[key].advance(starts.get(key), share, end)
    return capped


def group_pieces(sizes: Sequence[int], tasks: int, min_entries: int) -> list[list[int]]:
    """Indexes of consecutive pieces (of `sizes` entries each) grouped into Spark tasks.

    As many groups as `tasks` allows with at least `min_entries` entries each, but at least one, of
    about equal entries. A batch of a few messages on many partitions is then one task, not one per
    partition: each task is a round trip through a Python worker (tens of ms), and a single worker
    finds its kept readers where the last batch left them.
    """
    if not sizes:
        return []
    total = sum(sizes)
    count = max(1, min(tasks, len(sizes), total // max(1, min_entries)))
    groups: list[list[int]] = [[] for _ in range(count)]
    done = 0
    for index, size in enumerate(sizes):
        # the group this piece's middle falls in, by entries so far; never more than `count - 1`
        group = min(count - 1, (2 * done + size) * count // (2 * total)) if total else 0
        groups[group].append(index)
        done += size
    return [group for group in groups if group]
