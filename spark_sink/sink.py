"""`df.writeStream.format("pulsar-watermark")`: rows become messages, the query's watermark a `W_SET`.

Executors write the rows of each batch as messages (columns `value`, optional `key`, `event_time`,
`properties`), taking them from Spark as Arrow record batches and sending through their process's
shared Pulsar client (`spark_sink.clients`). After the batch, on the driver, `commit` reads the
event-time watermark Spark used for that batch from the checkpoint's offset log and writes it to
the topic as `W_SET` from a producer whose name is derived from the checkpoint location, so it is
the same across restarts and a replayed batch re-sends the same watermark (idempotent). Rows are
written at least once.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from spark_sink.clients import client_options, shared_client


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
        self.producer_name = str(options.get("producerName") or _stable_name(self.checkpoint, self.topic))

    def settings(self) -> Any:
        from pulsar_access.settings import PulsarSettings

        return PulsarSettings(self.service_url, self.admin_url, self.auth_token)


def _stable_name(checkpoint: str | None, topic: str) -> str:
    digest = hashlib.sha1(f"{checkpoint}|{topic}".encode()).hexdigest()[:12]
    return f"spark-sink-{digest}"


def _millis(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    return int(value)


def _column(batch: Any, name: str) -> list[Any]:
    """A column of an Arrow record batch as Python values (None for every row if there is no such column)."""
    index = batch.schema.get_field_index(name)
    return batch.column(index).to_pylist() if index >= 0 else [None] * batch.num_rows


def batch_watermark(checkpoint: str, batch_id: int) -> int | None:
    """Spark's event-time watermark for `batch_id` (its offset log's `batchWatermarkMs`)."""
    path = os.path.join(checkpoint.removeprefix("file:"), "offsets", str(batch_id))
    try:
        with open(path) as log:
            log.readline()
            return int(json.loads(log.readline()).get("batchWatermarkMs", 0))
    except (OSError, ValueError):
        return None


class PulsarStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, schema: StructType, options: Any) -> None:
        self.options = SinkOptions(options)
        if "value" not in schema.fieldNames():
            raise ValueError("the pulsar-watermark sink needs a 'value' column (binary or string)")

    def write(self, iterator: Iterator[Any]) -> Written:
        """Executor: send this task's rows (Arrow record batches) and wait until Pulsar has them."""
        from pulsar_access.errors import explained

        client = shared_client(self.options.settings(), self.options.client_options)
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
                    payload = value.encode() if isinstance(value, str) else bytes(value or b"")
                    kwargs: dict[str, Any] = {}
                    if key is not None:
                        kwargs["partition_key"] = str(key)
                    if event_time is not None:
                        kwargs["event_timestamp"] = _millis(event_time)
                    if properties:
                        kwargs["properties"] = {str(k): str(v) for k, v in dict(properties).items()}
                    producer.send_async(payload, None, **kwargs)
                    rows += 1
            producer.flush()
        finally:
            producer.close()
        return Written(rows)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Driver, after the batch: the query's watermark goes to the topic as W_SET."""
        if not self.options.checkpoint:
            return
        watermark = batch_watermark(str(self.options.checkpoint), batchId)
        if not watermark:
            return
        from producer import WatermarkProducer

        # The producer is opened and closed per batch: Spark may run commit() in a fresh Python worker
        # each time, and a producer name can be connected only once at a time (ProducerBusy otherwise).
        client = shared_client(self.options.settings(), self.options.client_options)
        producer = WatermarkProducer(
            client, self.options.topic, producer_name=self.options.producer_name, keepalive_interval_ms=None
        )
        try:
            producer.new_watermark().event_time(watermark).send()
        finally:
            producer.close(idle=False)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Rows already sent stay (at least once); the batch is retried by Spark."""
