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
    and find the cluster through `PULSAR_SERVICE_URL` / `PULSAR_ADMIN_URL`.
    """
    import os
    import sys

    from pyspark.sql import SparkSession

    os.environ.update(PYSPARK_PYTHON=sys.executable, PULSAR_SERVICE_URL=service_url, PULSAR_ADMIN_URL=admin_url)
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.sql.shuffle.partitions", "2")
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


def read_stream(spark: Any, **options: Any) -> Any:
    """A stream of the topic whose Spark watermark is the broker watermark.

    Options: `topic`, `subscription` (required), `serviceUrl`, `adminUrl`, `startingPosition`
    (earliest | latest), `maxMessagesPerTrigger`. Write ordinary Spark code on the result
    (`groupBy(window("event_time", ...))`, append mode) and do not add `withWatermark`: Spark's
    watermark is already the broker's. A window closes once the broker watermark passes its end,
    one micro-batch later, also when no data arrives.

    How: the data branch (data rows plus a row carrying the broker watermark whenever it moves) and
    a branch that reads only those watermark rows each get `withWatermark("event_time", "0 seconds")`;
    Spark's global watermark is the minimum of the two, which is the broker watermark. The filter
    that removes the watermark rows refers to `event_time`, so the optimizer keeps it above the
    watermark nodes. Data is read once: the second branch reads no data.
    """
    from pyspark.sql import functions as F

    register(spark)
    options = {k: str(v) for k, v in options.items() if k.lower() != "watermarksonly"}
    data = spark.readStream.format(FORMAT).options(**options).load().withWatermark("event_time", "0 seconds")
    marks = (
        spark.readStream.format(FORMAT).options(**options).option("watermarksOnly", "true").load()
        .withWatermark("event_time", "0 seconds")
    )  # fmt: skip
    keep = F.when(F.col("is_watermark"), F.lit(None)).otherwise(F.col("event_time")).isNotNull()
    return data.unionByName(marks).filter(keep).drop("is_watermark")
