"""`spark.readStream.format("pulsar-watermark")`: Pulsar topics as a Spark stream, with their watermark.

Offsets live in Spark's checkpoint (`SourceOffset`): per partition of every topic read, the last
entry of the batch (ledger, entry), and the broker watermark *at those ends*. The driver takes each
partition's last entry from the admin API and the watermark at that entry from what the generator
published (`spark_sink.watermarks`: the head events it publishes as it folds markers, and the
subscriptions' tables), the minimum over every partition. Executors read exactly the range with a
Pulsar reader, hide markers and hand Spark Arrow record batches. The subscription is acknowledged
up to each batch's end once Spark has finished it, so the broker's own view of the subscription
(retention, backlog, `broker-ext status`) follows the query, and its watermark there is the one
Spark has.

Besides data, a batch carries one row with `is_watermark = true` and `event_time` = the broker
watermark whenever that watermark moved; every row has `watermark` (the broker watermark at the
batch's end), `producer` (the Pulsar producer name) and `late` (its event time is below the broker
watermark Spark holds while reading it: its producer broke its promise). `read_stream` (in
`spark_sink`) turns these into Spark's own event-time watermark.

This module is the reader Spark calls; each concern it hands work to has a module of its own:
`spark_sink.options` (what the user passes), `spark_sink.driver` (partitions, each batch's end and
watermark, the subscription), `spark_sink.ranges` (a batch cut into tasks, as recorded in its end offset)
and `spark_sink.rows` (the executors' read loop and Arrow rows).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from spark_sink.driver import DriverState
from spark_sink.offsets import SourceOffset
from spark_sink.options import SourceOptions
from spark_sink.ranges import ReadTask, plan

SCHEMA = (
    "key string, value binary, event_time timestamp, publish_time timestamp, topic string, partition int, "
    "message_id string, properties map<string,string>, producer string, late boolean, is_watermark boolean, "
    "watermark timestamp"
)


class PulsarStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Driver side: offsets and commits. Executor side: `read`. Pulsar handles are never pickled."""

    def __init__(self, schema: StructType, options: Any) -> None:
        self.schema = schema
        self.options = SourceOptions(options)
        self._driver: DriverState | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"schema": self.schema, "options": self.options, "_driver": None}

    def _state(self) -> DriverState:
        if self._driver is None:
            self._driver = DriverState(self.options)
        return self._driver

    def _offset(self, data: Mapping[str, Any] | None) -> SourceOffset:
        return SourceOffset.from_json(data, self.options.topic)

    def initialOffset(self) -> dict[str, Any]:
        return SourceOffset(self._state().starting_positions(), tasks=self.options.min_partitions).to_json()

    def getDefaultReadLimit(self) -> ReadLimit:
        """`maxOffsetsPerTrigger` as Spark's own read limit (Spark passes it back to `latestOffset`)."""
        if self.options.max_offsets is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_offsets)

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: read up to the ends as they are now, then stop."""
        state = self._state()
        state.available_now = state.ends(state.partitions())

    def latestOffset(self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None) -> dict[str, Any]:
        """The partitions' ends (within `limit`), and the broker watermark at those ends."""
        state = self._state()
        begin = self._offset(start) if start else state.last_end or SourceOffset(state.starting_positions())
        # `begin` is a batch Spark has finished: Spark asks for the next end only after the previous
        # batch completed. Acknowledging it here, rather than only in commit() (which Spark calls when
        # the *next* batch starts), lets the subscription follow the query even when no new data
        # would start another batch (docs/ARCHITECTURE.md, "Where the source acknowledges").
        state.acknowledge(begin)
        end = state.next_end(begin, limit.max_rows if isinstance(limit, ReadMaxRows) else None)
        state.last_end = end
        return end.to_json()

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return self._driver.last_end.to_json() if self._driver is not None and self._driver.last_end else None

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """The batch's tasks, cut as when it was planned: its end offset, in Spark's checkpoint, holds the count
        (offsets from before it was recorded: today's `minPartitions`). A batch run again so gives each task,
        and so each of the exactly-once sink's producers, the same rows on any driver (`spark_sink.ranges`)."""
        begin, stop = self._offset(start), self._offset(end)
        return plan(begin, stop, stop.tasks or self.options.min_partitions, self._state().ledgers_of)

    def commit(self, end: dict[str, Any]) -> None:
        """Spark finished every batch up to `end`: acknowledge the subscription up to there."""
        self._state().acknowledge(self._offset(end))

    def stop(self) -> None:
        if self._driver is not None:
            self._driver.close()
            self._driver = None

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Executor: Arrow record batches of the task's ranges' data messages, markers hidden."""
        # Imported here, on executors only: the driver's Python processes (the application's and Spark's
        # planning worker) import this module but never build rows, and pyarrow costs them ~150 ms and its memory.
        from spark_sink.rows import ArrowRows, read_range

        assert isinstance(partition, ReadTask)
        for part in partition.ranges:
            batches = ArrowRows(self.schema, part)
            if part.key is not None and part.end is not None:
                yield from read_range(self.options, part, batches)
            if part.watermark_row and part.watermark is not None:
                yield batches.watermark_row(part.watermark)
