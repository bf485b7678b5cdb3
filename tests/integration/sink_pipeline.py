"""A pipeline's driver in a process of its own, for tests that SIGKILL it: source -> windowed count -> sink.

`python -m tests.integration.sink_pipeline TOPIC OUTPUT CHECKPOINT WINDOW_S` runs until killed: counts per key
in WINDOW_S-second windows on the broker watermark, written to OUTPUT by the pulsar-watermark sink
(exactly once), with a 250 ms trigger. It prints "started" once the query runs.
"""

from __future__ import annotations

import os
import sys


def main(topic: str, output: str, checkpoint: str, window_s: int) -> None:
    from pyspark.sql import functions as F

    import spark_sink

    spark = spark_sink.local_session(os.environ["PULSAR_SERVICE_URL"], os.environ["PULSAR_ADMIN_URL"])
    counts = (
        spark_sink.read_stream(spark, topic=topic, subscription="pipeline")
        .groupBy(F.window("event_time", f"{window_s} seconds"), "key")
        .count()
        .select(
            F.to_json(
                F.struct((F.col("window.start").cast("double") * 1000).cast("long").alias("start"), "key", "count")
            ).alias("value"),
            F.col("key"),
            F.col("window.end").alias("event_time"),
        )
    )
    query = (
        counts.writeStream.format("pulsar-watermark")
        .outputMode("append")
        .option("topic", output)
        .option("deliveryGuarantee", os.environ.get("SINK_DELIVERY_GUARANTEE", "exactly-once"))
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="250 milliseconds")
        .start()
    )
    print("started", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
