"""`df.writeStream.format("pulsar-watermark")`: rows become messages, the query's watermark a `W_SET`.

Executors write the rows of each batch as messages (columns `value`, optional `key`, `event_time`,
`properties`), taking them from Spark as Arrow record batches and sending through their process's
shared Pulsar client (`spark_sink.clients`). After the batch, on the driver, `commit` reads the
event-time watermark Spark used for that batch from the checkpoint's offset log and writes it to
the topic as `W_SET`.

**Exactly once** (option `deliveryGuarantee`, default `exactly-once`) rests on Pulsar's message
deduplication, which drops a message whose (producer name, sequence id) it has already persisted:

- a task's rows go out from a producer named after the query and its Spark partition
  (`writer_name`), with sequence ids `batch id * 2**32 + row` (`sequence_id`), the rows in a
  canonical order (sorted by everything a row writes) so that a batch Spark runs again numbers the same
  rows the same way;
- rows go out in client batches (one broker entry each) whose bounds are a pure function of the
  rows (`entry_starts`: at most `ENTRY_ROWS` rows and `ENTRY_BYTES` bytes, cut by an explicit flush;
  the client's own limits and timer are set so that they never cut first). Pulsar judges an entry by
  its first sequence id (the Python client does not send a batch's highest one), so a batch run again
  must send the very same entries: each is then either wholly persisted (dropped) or wholly new. A task
  first asks the broker for that producer's last persisted sequence id and sends only the entries
  after it (`entries_to_send`);
- the driver's `W_SET` of batch b goes out from the query's own producer with sequence id b.

A batch Spark runs again (a task retried, the driver restarted from its checkpoint after dying
between the write and the commit) so adds no row and no `W_SET` twice. With `at-least-once` rows
are sent under fresh producer names and a batch run again writes its rows again.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from spark_sink.clients import client_options, shared_client

log = logging.getLogger(__name__)

EXACTLY_ONCE, AT_LEAST_ONCE = "exactly-once", "at-least-once"
ROW_BITS = 32
"""A sequence id is `batch id << ROW_BITS | row`: up to 2**32 rows per task and batch, 2**31 batches."""
BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"
"""Spark's local properties of a micro-batch's tasks (`MicroBatchExecution`, `StreamExecution`)."""
ENTRY_ROWS = 1000
ENTRY_BYTES = 128 * 1024
"""An exactly-once entry holds at most this many rows, and this many bytes of values, keys and properties
(a bigger row is an entry of its own). Changing them changes the entries of a batch run again: keep them."""
ENTRY_PRODUCER: dict[str, Any] = {
    "batching_enabled": True,
    "batching_max_messages": 2 * ENTRY_ROWS,
    "batching_max_allowed_size_in_bytes": 4 * ENTRY_BYTES,
    "batching_max_publish_delay_ms": 3_600_000,
    "block_if_queue_full": True,
    "max_pending_messages": 2 * ENTRY_ROWS,
}
"""The rows' producers: only `send_entries`' flush cuts a batch (limits above an entry's, a timer that never
fires while an entry is built, room for a whole entry in the queue)."""
PRODUCER_BUSY_WAIT_S = 60.0
"""How long a task waits for a producer name still held by a task of a process that died."""


def sequence_id(batch_id: int, row: int) -> int:
    """The sequence id of a task's `row`-th row (canonical order) in micro-batch `batch_id`: it grows with both."""
    if not 0 <= row < 1 << ROW_BITS:
        raise ValueError(f"a task of the pulsar-watermark sink writes at most {1 << ROW_BITS} rows per batch")
    if not 0 <= batch_id < 1 << (63 - ROW_BITS):
        raise ValueError(f"batch id {batch_id} is out of the exactly-once sink's range")
    return batch_id << ROW_BITS | row


def entry_starts(sizes: Sequence[int], max_rows: int = ENTRY_ROWS, max_bytes: int = ENTRY_BYTES) -> list[int]:
    """The first row of each entry of a task's rows (their `sizes` in canonical order): greedy from row 0, so
    a batch run again cuts the same entries."""
    starts: list[int] = []
    rows = size = 0
    for row, row_size in enumerate(sizes):
        if row == 0 or rows == max_rows or size + row_size > max_bytes:
            starts.append(row)
            rows = size = 0
        rows += 1
        size += row_size
    return starts


def entries_to_send(
    batch_id: int, sizes: Sequence[int], last_persisted: int, max_rows: int = ENTRY_ROWS, max_bytes: int = ENTRY_BYTES
) -> list[range]:
    """The entries (rows of one client batch each) a task of `batch_id` still sends, given the producer's last
    persisted sequence id (-1: none), which is the first row of the last entry the broker holds: the entries
    after that one (the broker would drop any other whole, by its first row)."""
    starts = entry_starts(sizes, max_rows, max_bytes)
    bounds = [*starts, len(sizes)]
    entries = [range(start, end) for start, end in itertools.pairwise(bounds)]
    return [entry for entry in entries if sequence_id(batch_id, entry.start) > last_persisted]


def query_producer_name(query_id: str, topic: str) -> str:
    """The query's own producer on `topic` (its `W_SET`s): the same across restarts from one checkpoint."""
    digest = hashlib.sha1(f"{query_id}|{topic}".encode()).hexdigest()[:12]
    return f"spark-sink-{digest}"


def writer_name(query_producer: str, spark_partition: int) -> str:
    """The producer of one Spark partition's rows: the same for every run of a batch of this query."""
    return f"{query_producer}-{spark_partition}"


def target_partitions(keys: Sequence[str | None], partitions: int) -> list[int]:
    """Each row's partition of the output topic (-1: it has none): by key as the Java client's default
    router, else round robin over the rows in their canonical order (the same on every run)."""
    from producer.routing import java_string_hash

    if partitions <= 0:
        return [-1] * len(keys)
    return [
        (java_string_hash(key) & 0x7FFFFFFF) % partitions if key else row % partitions for row, key in enumerate(keys)
    ]


def query_id_of(checkpoint: str) -> str | None:
    """The query's id from its checkpoint (`metadata`, written when the query first started)."""
    try:
        with open(os.path.join(checkpoint.removeprefix("file:"), "metadata")) as metadata:
            return str(json.loads(metadata.readline())["id"])
    except (OSError, ValueError, KeyError):
        return None


@dataclass
class Written(WriterCommitMessage):
    rows: int


class SinkOptions:
    def __init__(self, options: Any) -> None:
        from pulsar_access.errors import checked_admin_url, checked_service_url
        from pulsar_access.settings import PulsarSettings

        topic = options.get("topic")
        if not topic:
            raise ValueError("option 'topic' is required for the pulsar-watermark sink: .option('topic', 'out')")
        self.topic = str(topic)
        env = PulsarSettings.from_env()
        self.service_url = str(options.get("serviceUrl") or options.get("service.url") or env.service_url)
        self.admin_url = str(options.get("adminUrl") or options.get("admin.url") or env.admin_url)
        checked_service_url(self.service_url, "option 'serviceUrl' (or PULSAR_SERVICE_URL)")
        checked_admin_url(self.admin_url, "option 'adminUrl' (or PULSAR_ADMIN_URL)")
        self.auth_token = options.get("authToken") or env.auth_token
        self.client_options = client_options(options)
        self.checkpoint = options.get("checkpointLocation")
        self.producer_name = options.get("producerName")
        guarantee = str(options.get("deliveryGuarantee") or EXACTLY_ONCE).lower()
        if guarantee not in (EXACTLY_ONCE, AT_LEAST_ONCE):
            raise ValueError(
                f"option 'deliveryGuarantee' must be '{EXACTLY_ONCE}' or '{AT_LEAST_ONCE}', got {guarantee!r}"
            )
        self.exactly_once = guarantee == EXACTLY_ONCE
        self.partitions = 0

    def settings(self) -> Any:
        from pulsar_access.settings import PulsarSettings

        return PulsarSettings(self.service_url, self.admin_url, self.auth_token)

    def query_producer(self, query_id: str | None) -> str:
        """`producerName` if given, else named after the query (its id, else its checkpoint) and the topic."""
        return str(self.producer_name or query_producer_name(query_id or str(self.checkpoint), self.topic))


def check_deduplication(options: SinkOptions) -> int:
    """Driver, at the query's start: the output topic's partition count, after making sure that Pulsar
    deduplicates on it when exactly-once output was asked for (a clear error naming the command if not)."""
    from pulsar_access.admin import AdminError, PulsarAdmin, TopicNotFound
    from pulsar_access.topics import TopicName

    admin = PulsarAdmin(options.settings())
    partitions, enabled = 0, True
    try:
        try:
            partitions = admin.partitions(options.topic)
        except TopicNotFound:
            admin.create_topic(options.topic)  # what Pulsar's auto-creation would do at the first write
        if options.exactly_once:
            enabled = admin.deduplication_enabled(options.topic)
    except AdminError as exc:
        if exc.status not in (401, 403):
            raise
        log.warning("cannot check message deduplication on %s (%s); writing with sequence ids: exactly once "
                    "holds only if deduplication is on", options.topic, exc)  # fmt: skip
    finally:
        admin.close()
    if not enabled:
        name = TopicName.parse(options.topic)
        raise ValueError(
            f"exactly-once output to {name.full} needs Pulsar message deduplication, which is off there: "
            f"turn it on with `pulsar-admin namespaces set-deduplication {name.tenant_namespace} --enable` (or "
            f"`pulsar-admin topics set-deduplication {name.full} --enable`), or write at least once with "
            ".option('deliveryGuarantee', 'at-least-once')"
        )
    return partitions


def _millis(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    return int(value)


def _column(batch: Any, name: str) -> list[Any]:
    """A column of an Arrow record batch (or table) as Python values (None for every row if there is none)."""
    index = batch.schema.get_field_index(name)
    return batch.column(index).to_pylist() if index >= 0 else [None] * batch.num_rows


def batch_watermark(checkpoint: str, batch_id: int) -> int | None:
    """Spark's event-time watermark for `batch_id` (its offset log's `batchWatermarkMs`)."""
    path = os.path.join(checkpoint.removeprefix("file:"), "offsets", str(batch_id))
    try:
        with open(path) as log_file:
            log_file.readline()
            return int(json.loads(log_file.readline()).get("batchWatermarkMs", 0))
    except (OSError, ValueError):
        return None


def _message(value: Any, key: Any, event_time: Any, properties: Any) -> tuple[bytes, dict[str, Any]]:
    payload = value.encode() if isinstance(value, str) else bytes(value or b"")
    kwargs: dict[str, Any] = {}
    if key is not None:
        kwargs["partition_key"] = str(key)
    if event_time is not None:
        kwargs["event_timestamp"] = _millis(event_time)
    if properties:
        kwargs["properties"] = {str(k): str(v) for k, v in dict(properties).items()}
    return payload, kwargs


_PROPERTIES_ORDER = "__pulsar_watermark_properties"
"""A column `_canonical` adds to sort by: what a row's `properties` write, as text."""


def _written_properties(properties: Any) -> str:
    """The properties a row writes (as `_message` does: a dict of strings, none when empty) as sortable text."""
    if not properties:
        return ""
    return json.dumps(sorted({str(k): str(v) for k, v in dict(properties).items()}.items()))


def _canonical(batches: list[Any]) -> Any:
    """A task's rows as one Arrow table in a canonical order: a batch run again numbers each row the same,
    whatever order Spark hands them in.

    The order is total over everything a row writes (`value`, `key`, `event_time` and `properties`): rows
    still tied write the very same message, so which of them gets which sequence id changes nothing. With a
    tie left among rows that write different messages, a replay that swapped two of them across an entry's
    boundary would write one twice and the other never.
    """
    import pyarrow as pa

    table = pa.Table.from_batches(batches)
    keys = [(name, "ascending") for name in ("value", "key", "event_time") if name in table.column_names]
    if "properties" in table.column_names:  # a map column cannot be sorted by: its written form can
        written = [_written_properties(p) for p in table.column("properties").to_pylist()]
        table = table.append_column(_PROPERTIES_ORDER, pa.array(written, pa.string()))
        keys.append((_PROPERTIES_ORDER, "ascending"))
    return table.sort_by(keys)


def _message_size(payload: bytes, kwargs: dict[str, Any]) -> int:
    """What a row weighs against `ENTRY_BYTES`: its value, key and properties."""
    properties = kwargs.get("properties") or {}
    return len(payload) + len(kwargs.get("partition_key") or "") + sum(len(k) + len(v) for k, v in properties.items())


def send_entries(producer: Any, batch_id: int, messages: Sequence[tuple[bytes, dict[str, Any]]],
                 entries: Sequence[range]) -> None:  # fmt: skip
    """Each entry's rows as one client batch (sequence id `sequence_id(batch_id, row)`), cut by a flush."""
    for entry in entries:
        for row in entry:
            payload, kwargs = messages[row]
            producer.send_async(payload, None, sequence_id=sequence_id(batch_id, row), **kwargs)
        producer.flush()


def _create_producer(client: Any, service_url: str, topic: str, name: str, **settings: Any) -> Any:
    """A producer under a stable name; a name still held by a task of a process that died is waited for."""
    import pulsar

    from pulsar_access.errors import explained

    deadline = time.monotonic() + PRODUCER_BUSY_WAIT_S
    with explained(service_url=service_url, topic=topic, doing="write to"):
        while True:
            try:
                return client.create_producer(topic, producer_name=name, **settings)
            except pulsar.ProducerBusy:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)


class PulsarStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, schema: StructType, options: Any) -> None:
        self.options = SinkOptions(options)
        if "value" not in schema.fieldNames():
            raise ValueError("the pulsar-watermark sink needs a 'value' column (binary or string)")
        self.options.partitions = check_deduplication(self.options)

    def write(self, iterator: Iterator[Any]) -> Written:
        """Executor: send this task's rows (Arrow record batches) and wait until Pulsar has them."""
        client = shared_client(self.options.settings(), self.options.client_options)
        if self.options.exactly_once:
            return self._write_exactly_once(client, list(iterator))
        from pulsar_access.errors import explained

        with explained(service_url=self.options.service_url, topic=self.options.topic, doing="write to"):
            producer = client.create_producer(self.options.topic, batching_enabled=True, block_if_queue_full=True)
        rows = 0
        try:
            for batch in iterator:
                columns = zip(
                    _column(batch, "value"), _column(batch, "key"), _column(batch, "event_time"),
                    _column(batch, "properties"), strict=True,
                )  # fmt: skip
                for value, key, event_time, properties in columns:
                    payload, kwargs = _message(value, key, event_time, properties)
                    producer.send_async(payload, None, **kwargs)
                    rows += 1
            producer.flush()
        finally:
            producer.close()
        return Written(rows)

    def _write_exactly_once(self, client: Any, batches: list[Any]) -> Written:
        from pyspark import TaskContext

        from pulsar_access.topics import partition_name

        context = TaskContext.get()
        assert context is not None, "write() runs in a Spark task"
        batch_id = int(context.getLocalProperty(BATCH_ID_PROPERTY) or -1)
        if batch_id < 0:
            raise RuntimeError("the pulsar-watermark sink runs in streaming queries only (no micro-batch id)")
        name = writer_name(
            self.options.query_producer(context.getLocalProperty(QUERY_ID_PROPERTY)), context.partitionId()
        )
        batches = [batch for batch in batches if batch.num_rows]
        if not batches:
            return Written(0)
        table = _canonical(batches)
        rows = list(zip(
            _column(table, "value"), _column(table, "key"), _column(table, "event_time"), _column(table, "properties"),
            strict=True,
        ))  # fmt: skip
        by_target: dict[int, list[int]] = {}
        keys = [None if r[1] is None else str(r[1]) for r in rows]
        for row, target in enumerate(target_partitions(keys, self.options.partitions)):
            by_target.setdefault(target, []).append(row)
        sent = 0
        for target, indexes in sorted(by_target.items()):
            topic = self.options.topic if target < 0 else partition_name(self.options.topic, target)
            messages = [_message(*rows[row]) for row in indexes]
            producer = _create_producer(client, self.options.service_url, topic, name, **ENTRY_PRODUCER)
            try:
                entries = entries_to_send(batch_id, [_message_size(*m) for m in messages], producer.last_sequence_id())
                unsent = sum(map(len, entries))
                if unsent < len(messages):
                    log.warning("%s: batch %d run again: %d of its %d rows from %s already written, not sent again",
                                topic, batch_id, len(messages) - unsent, len(messages), name)  # fmt: skip
                send_entries(producer, batch_id, messages, entries)
                sent += unsent
            finally:
                producer.close()
        return Written(sent)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Driver, after the batch: the query's watermark goes to the topic as W_SET."""
        if not self.options.checkpoint:
            return
        watermark = batch_watermark(str(self.options.checkpoint), batchId)
        if not watermark:
            return
        client = shared_client(self.options.settings(), self.options.client_options)
        name = self.options.query_producer(query_id_of(str(self.options.checkpoint)))
        if self.options.exactly_once:
            self._commit_exactly_once(client, name, watermark, batchId)
            return
        from producer import WatermarkProducer

        # The producer is opened and closed per batch: Spark may run commit() in a fresh Python worker
        # each time, and a producer name can be connected only once at a time (ProducerBusy otherwise).
        producer = WatermarkProducer(client, self.options.topic, producer_name=name, keepalive_interval_ms=None)
        try:
            producer.new_watermark().event_time(watermark).send()
        finally:
            producer.close(idle=False)

    def _commit_exactly_once(self, client: Any, name: str, watermark: int, batch_id: int) -> None:
        """The batch's W_SET to every partition, sequence id = batch id: sent once whatever runs again."""
        from pulsar_access.topics import partition_name
        from watermark_core.protocol import MARKER_PROPERTY, MarkerKind, encode_set

        partitions = self.options.partitions
        targets = [partition_name(self.options.topic, p) for p in range(partitions)] or [self.options.topic]
        for topic in targets:
            producer = _create_producer(client, self.options.service_url, topic, name, batching_enabled=False)
            try:
                if producer.last_sequence_id() >= batch_id:
                    log.warning("%s: batch %d run again: its W_SET already written, not sent again", topic, batch_id)
                else:
                    producer.send(
                        encode_set(watermark),
                        properties={MARKER_PROPERTY: MarkerKind.W_SET.value},
                        sequence_id=batch_id,
                    )
            finally:
                producer.close()

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Rows already sent stay; Spark runs the batch again (exactly once: those rows are not sent twice)."""
