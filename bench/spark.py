"""Issue 5: how soon a window closes after the broker watermark passes it, and the source's rate."""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
import uuid
from typing import Any

import pulsar

from bench.common import say
from consumer.watermark_feed import WatermarkFeed
from producer import WatermarkProducer
from pulsar_access.admin import PulsarAdmin
from pulsar_access.settings import PulsarSettings
from watermark_core.protocol import Watermark

BASE = 1_700_000_000_000
TRIGGER_S = 1.0


def _session(settings: PulsarSettings) -> Any:
    import spark_sink

    return spark_sink.local_session(settings.service_url, settings.admin_url)


def window_close_latency(spark: Any, client: pulsar.Client, windows: int = 12) -> float:
    """Median ms from the subscription's broker watermark passing a window's end to the window's row."""
    from pyspark.sql import functions as F

    import spark_sink

    topic = f"persistent://public/default/bench-spark-{uuid.uuid4().hex[:6]}"
    passed: dict[int, float] = {}
    emitted: dict[int, float] = {}
    lock = threading.Lock()

    def on_watermark(watermark: Watermark | None) -> None:
        if watermark is None:
            return
        with lock:
            for index in range(windows):
                if watermark.event_time >= BASE + (index + 1) * 10_000:
                    passed.setdefault(index, time.monotonic())

    def collect(df: Any, _batch: int) -> None:
        now = time.monotonic()
        with lock:
            for row in df.collect():
                emitted.setdefault(int((row["window"]["start"].timestamp() * 1000 - BASE) // 10_000), now)

    producer = WatermarkProducer(client, topic, producer_name="bench-spark")
    producer.new_watermark().event_time(BASE).send()
    query = (
        spark_sink.read_stream(spark, topic=topic, subscription="bench")
        .groupBy(F.window("event_time", "10 seconds"))
        .count()
        .writeStream.outputMode("append")
        .foreachBatch(collect)
        .option("checkpointLocation", tempfile.mkdtemp(prefix="wm-bench-spark-"))
        .trigger(processingTime=f"{TRIGGER_S} seconds")
        .start()
    )
    feed = WatermarkFeed(client, topic, "bench", on_watermark)
    for index in range(windows):
        for second in range(10):
            producer.send(b"x", event_timestamp=BASE + index * 10_000 + second * 1000)
        producer.new_watermark().event_time(BASE + (index + 1) * 10_000).send()
        time.sleep(3)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(emitted) < windows:
        time.sleep(0.5)
    query.stop()
    feed.close()
    producer.close()
    latencies = [(emitted[i] - passed[i]) * 1000 for i in range(windows) if i in emitted and i in passed]
    say(f"  {len(latencies)} windows: close latencies {[round(x) for x in latencies]} ms")
    return statistics.median(latencies)


def source_vs_reader(spark: Any, client: pulsar.Client, admin: PulsarAdmin, count: int = 100_000) -> dict[str, float]:
    """Rows/s of the Spark source (one query, 1 s triggers) against a plain reader in one process."""
    import spark_sink

    topic = f"persistent://public/default/bench-rate-{uuid.uuid4().hex[:6]}"
    producer = client.create_producer(topic, batching_enabled=True, block_if_queue_full=True)
    for i in range(count):
        producer.send_async(b"x" * 100, None, event_timestamp=BASE + i)
    producer.flush()
    producer.close()

    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    started = time.perf_counter()
    for _ in range(count):
        reader.read_next(timeout_millis=30_000)
    reader_rate = count / (time.perf_counter() - started)
    reader.close()

    spark_sink.register(spark)
    rows = [0]

    def counted(df: Any, _batch: int) -> None:
        rows[0] += df.count()

    started = time.perf_counter()
    query = (
        spark.readStream.format("pulsar-watermark")
        .option("topic", topic)
        .option("subscription", "bench-rate")
        .load()
        .filter("not is_watermark")
        .writeStream.foreachBatch(counted)
        .option("checkpointLocation", tempfile.mkdtemp(prefix="wm-bench-rate-"))
        .trigger(processingTime="1 second")
        .start()
    )
    deadline = time.monotonic() + 300
    while rows[0] < count and time.monotonic() < deadline:
        time.sleep(0.2)
    source_rate = rows[0] / (time.perf_counter() - started)
    query.stop()
    return {
        "spark_source_rows_per_s": round(source_rate),
        "plain_reader_rows_per_s": round(reader_rate),
        "spark_source_vs_reader_ratio": round(source_rate / reader_rate, 3),
    }


def run(settings: PulsarSettings) -> dict[str, float | int | str]:
    spark = _session(settings)
    client = settings.client()
    admin = PulsarAdmin(settings)
    try:
        say("Spark window close latency")
        latency = window_close_latency(spark, client)
        say("Spark source rate against a plain reader")
        rates = source_vs_reader(spark, client, admin)
    finally:
        spark.stop()
        client.close()
        admin.close()
    return {
        "spark_window_close_latency_p50_ms": round(latency),
        "spark_window_close_latency_p50_ms_how": (
            "12 windows of 10 s; time from the generator publishing a broker watermark >= the window's end for "
            f"the query's subscription to the window's row in foreachBatch; trigger {TRIGGER_S:.0f} s, local[2]"
        ),
        **rates,
        "spark_source_vs_reader_ratio_how": (
            "100000 messages of 100 B; rows/s of the pulsar-watermark source (1 s triggers, Spark start-up and "
            "first-batch cost included) over a plain pulsar reader reading the same topic in one process"
        ),
    }
