"""What the Spark source's tasks read: a batch's ranges, cut and grouped into tasks (`plan`).

A batch is (start, end] per partition, both offsets in Spark's checkpoint. `plan` cuts it into about
`tasks` tasks, `tasks` being the count the end offset recorded when the batch was planned (`SourceOffset.tasks`):
a batch Spark runs again is then cut as the first time, whatever the driver, and each task (each producer of
the exactly-once sink, in a pass-through query) gets the same rows. The cuts count entries across ledgers
(`Ledgers`); a range's entries are counted from its start, so ledgers deleted before it change nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pyspark.sql.datasource import InputPartition

from spark_sink.offsets import NO_WATERMARK, Entry, Ledgers, PartitionKey, SourceOffset, group_pieces

MIN_ENTRIES_PER_SPLIT = 2000
"""A partition's range is cut for more tasks only into pieces of at least this many entries."""

Piece = tuple[PartitionKey, Entry | None, Entry]
"""A partition's entries in (after, up to]: the whole of its range in a batch, or a piece of it."""


class TopicRange(InputPartition):
    """What one task reads: a partition's entries in (start, end], maybe the watermark row. Picklable.

    `watermark` is the broker watermark at the batch's end (None before there is one), `late_below`
    the one Spark holds while it reads this batch (the watermark at the batch's start).
    """

    def __init__(
        self,
        key: PartitionKey | None,
        start: Entry | None,
        end: Entry | None,
        watermark: int | None,
        late_below: int | None,
        watermark_row: bool,
    ) -> None:
        super().__init__((key, start, end, watermark, late_below, watermark_row))
        self.key = key
        self.start = start
        self.end = end
        self.watermark = watermark
        self.late_below = late_below
        self.watermark_row = watermark_row


class ReadTask(InputPartition):
    """One Spark task: the ranges it reads one after the other in one Python worker. Picklable."""

    def __init__(self, ranges: Sequence[TopicRange]) -> None:
        super().__init__(tuple(ranges))
        self.ranges = tuple(ranges)


def present(watermark: int) -> int | None:
    """A watermark of an offset, None for `NO_WATERMARK`."""
    return None if watermark == NO_WATERMARK else watermark


def split(ranges: Sequence[Piece], tasks: int, ledgers: Callable[[PartitionKey], Ledgers]) -> list[Piece]:
    """The batch's ranges, large ones cut so that about `tasks` tasks share the work (Kafka's
    `minPartitions`), in pieces of at least `MIN_ENTRIES_PER_SPLIT` entries."""
    sizes = {key: ledgers(key).between(first, last) for key, first, last in ranges}
    total = sum(sizes.values())
    pieces: list[Piece] = []
    for key, first, last in ranges:
        wanted = round(tasks * sizes[key] / total) if total else 1
        cuts = max(1, min(wanted, sizes[key] // MIN_ENTRIES_PER_SPLIT))
        if cuts == 1:
            pieces.append((key, first, last))
        else:
            pieces += [(key, a, b) for a, b in ledgers(key).split(first, last, cuts)]
    return pieces


def plan(
    begin: SourceOffset, stop: SourceOffset, tasks: int, ledgers: Callable[[PartitionKey], Ledgers]
) -> list[ReadTask]:
    """The tasks of the batch (begin, stop]: its ranges cut for about `tasks` tasks and grouped, in order, into
    tasks of at least `MIN_ENTRIES_PER_SPLIT` entries (`group_pieces`); the first range also carries the
    watermark row if the watermark moved (a task of its own if nothing was written)."""
    watermark, late_below = present(stop.watermark), present(begin.watermark)
    moved = watermark is not None and stop.watermark > begin.watermark
    ranges = stop.ranges_after(begin)
    pieces = split(ranges, tasks, ledgers) if ranges else []
    reads = [
        TopicRange(key, first, last, watermark, late_below, moved and index == 0)
        for index, (key, first, last) in enumerate(pieces)
    ]
    if moved and not reads:
        reads.append(TopicRange(None, None, None, watermark, late_below, True))
    sizes = [ledgers(key).between(first, last) for key, first, last in pieces] or [0]  # [0]: the watermark row
    groups = group_pieces(sizes, tasks, MIN_ENTRIES_PER_SPLIT) if reads else []
    return [ReadTask([reads[index] for index in group]) for group in groups]
