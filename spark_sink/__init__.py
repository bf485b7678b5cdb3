"""Spark source and sink for watermarked Pulsar topics.

`read_stream(spark, topic=..., subscription=...)` returns a streaming DataFrame whose Spark
event-time watermark is the broker watermark; write results back with
`df.writeStream.format("pulsar-watermark").option("topic", ...)` after `register(spark)`.
"""

from __future__ import annotations

from typing import Any

FORMAT = "pulsar-watermark"


def data_source() -> Any:
    """The Python data source class (PySpark is imported only when Spark is used)."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, DataSourceStreamWriter
    from pyspark.sql.types import StructType

    from spark_sink.sink import PulsarStreamWriter
    from spark_sink.source import SCHEMA, PulsarStreamReader

    class PulsarWatermarkDataSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return FORMAT

        def schema(self) -> str:
            return SCHEMA

        def streamReader(self, schema: StructType) -> DataSourceStreamReader:
            return PulsarStreamReader(schema, self.options)

        def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
            return PulsarStreamWriter(schema, self.options)

    return PulsarWatermarkDataSource


def local_session(service_url: str, admin_url: str) -> Any:
    """A local[2] Spark session for this machine (demo, benchmarks, tests), with the source registered.

    Executors run this interpreter (`PYSPARK_PYTHON`), which has `pulsar-client` and this package,
    and find the cluster through `PULSAR_SERVICE_URL` / `PULSAR_ADMIN_URL`. One shuffle partition:
    each one is a state-store task per micro-batch, and with a 1 s trigger on 2 cores that fixed cost,
    not the rows, is what delays a window's close (docs/DECISIONS.md, Spark, latency).
    """
    import os
    import sys

    from pyspark.sql import SparkSession

    os.environ.update(PYSPARK_PYTHON=sys.executable, PULSAR_SERVICE_URL=service_url, PULSAR_ADMIN_URL=admin_url)
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def register(spark: Any) -> None:
    """Make `format("pulsar-watermark")` known to this Spark session."""
    spark.dataSource.register(data_source())


WATERMARK_DELAY_KEY = "spark.watermarkDelayMs"
"""The column metadata by which Spark knows an event-time column (`EventTimeWatermark.delayKey`)."""
_CLOCK = "__broker_watermark_clock"


def read_stream(spark: Any, **options: Any) -> Any:
    """A stream of Pulsar topics whose Spark watermark is the broker watermark.

    Options (see `spark_sink.options.SourceOptions`): `topic`, `topics` (comma list) or
    `topicsPattern`; `subscription` (required); `serviceUrl` / `service.url`, `adminUrl` / `admin.url`,
    `authToken`, `pulsar.client.*`; `startingOffsets` (earliest | latest | per-partition JSON),
    `maxOffsetsPerTrigger`, `failOnDataLoss`, `minPartitions`.

    Columns: `key`, `value`, `event_time`, `publish_time`, `topic`, `partition`, `message_id`,
    `properties`, `producer` (the Pulsar producer name) and `late` (the row's event time is below the
    broker watermark Spark holds while reading it: its producer broke its promise; Spark drops such a
    row in a windowed aggregation if its window has closed, so route `late` rows elsewhere to see
    them). Write ordinary Spark code on the result (`groupBy(window("event_time", ...))`, append mode)
    and do not add `withWatermark`: Spark's watermark is already the broker's. After each micro-batch
    it is the broker watermark at the batch's end position (the minimum over every partition of every
    topic read); a window closes in the next micro-batch once that passes its end, also when no data
    arrives.

    How: the source puts the broker watermark at the batch's end on every row (`watermark`) and, when
    it moved, on one extra row (`is_watermark`). Spark's watermark is the maximum of a column that is
    `least(event_time, watermark)` on data rows and the watermark on that extra row: exactly the
    broker watermark. The extra row is dropped above the watermark node by `NOT is_watermark OR
    clock < watermark`: one conjunct that refers to the clock column, which the optimizer can
    neither split nor fold (a filter without the clock, or with a null test on it, which it folds
    since the clock is never null, is pushed below the watermark node and the extra row never
    counts). `event_time` is then marked as the event-time column Spark's windows and state eviction
    use. One source, read once.
    """
    from pyspark.sql import functions as F

    register(spark)
    options = {k: str(v) for k, v in options.items()}
    raw = spark.readStream.format(FORMAT).options(**options).load()
    epoch = F.lit(0).cast("timestamp")
    clock = F.least(F.col("event_time"), F.coalesce(F.col("watermark"), epoch))
    marked = raw.withColumn(_CLOCK, clock).withWatermark(_CLOCK, "0 seconds")
    data = marked.filter(~F.col("is_watermark") | (F.col(_CLOCK) < F.col("watermark")))
    return data.select(
        "key", "value",
        F.col("event_time").alias("event_time", metadata={WATERMARK_DELAY_KEY: 0}),
        "publish_time", "topic", "partition", "message_id", "properties", "producer", "late",
    )  # fmt: skip
