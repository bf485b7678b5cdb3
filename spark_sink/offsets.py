"""The Spark source's offset: a typed value with one JSON form, like Spark's own `KafkaSourceOffset`.

Spark keeps offsets in its checkpoint as JSON. Ours holds, per partition of the topic, the last entry
read (ledger, entry) or None before the first, and the broker watermark at that end (`NO_WATERMARK`
before there is one). The JSON layout (`{"partitions": {"0": [ledger, entry]}, "wm": ms}`) is what
checkpoints written by earlier versions hold, so they keep restoring.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

NO_WATERMARK = -1
Entry = tuple[int, int]
"""(ledger, entry) of a partition's message: the unit Spark offsets count in."""


@dataclass(frozen=True)
class SourceOffset:
    """Where a batch ends: each partition's last entry read (None: nothing yet) and the broker watermark."""

    partitions: Mapping[int, Entry | None] = field(default_factory=dict)
    watermark: int = NO_WATERMARK

    def to_json(self) -> dict[str, Any]:
        """The dict Spark stores in its checkpoint (`initialOffset`/`latestOffset` return it)."""
        return {
            "partitions": {str(p): None if e is None else [e[0], e[1]] for p, e in sorted(self.partitions.items())},
            "wm": self.watermark,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> SourceOffset:
        """The offset Spark hands back (from `to_json`, possibly read from a checkpoint); None is the empty one."""
        if not data:
            return cls()
        partitions = {
            int(key): None if entry is None else (int(entry[0]), int(entry[1]))
            for key, entry in (data.get("partitions") or {}).items()
        }
        return cls(partitions, int(data.get("wm", NO_WATERMARK)))

    def with_watermark(self, watermark: int) -> SourceOffset:
        return SourceOffset(self.partitions, watermark)

    def capped(self, start: SourceOffset, max_entries: int) -> SourceOffset:
        """At most about `max_entries` entries past `start`, shared over the partitions (within one ledger)."""
        share = max(1, max_entries // max(1, len(self.partitions)))
        capped: dict[int, Entry | None] = {}
        for partition, stop in self.partitions.items():
            begin = start.partitions.get(partition)
            if stop is not None and begin is not None and stop[0] == begin[0] and stop[1] - begin[1] > share:
                stop = (begin[0], begin[1] + share)
            capped[partition] = stop
        return SourceOffset(capped, self.watermark)

    def ranges_after(self, start: SourceOffset) -> list[tuple[int, Entry | None, Entry]]:
        """(partition, start entry or None, end entry) of every partition with entries in (start, self]."""
        ranges = []
        for partition, stop in sorted(self.partitions.items()):
            begin = start.partitions.get(partition)
            if stop is not None and (begin is None or stop > begin):
                ranges.append((partition, begin, stop))
        return ranges
