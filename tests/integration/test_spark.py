"""Spark on the real broker: the broker watermark is Spark's, and results flow back with watermarks."""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pulsar
import pytest

from consumer import WatermarkConsumer
from producer import WatermarkProducer
from pulsar_access.admin import PulsarAdmin
from tests.integration.helpers import MALFORMED, Recorder, wait_until, watermarks

pyspark = pytest.importorskip("pyspark")
from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

import spark_sink  # noqa: E402

BASE = 1_700_000_000_000
WINDOW_MS = 10_000


class Windows:
    """Collects the windows a query emits. A batch replayed after a restart (Spark's foreachBatch is
    at least once: a stop between the call and the commit log replays it) replaces its first run,
    keyed by batch id, as Spark's documentation advises for idempotent sinks."""

    def __init__(self) -> None:
        self.by_batch: dict[int, list[tuple[int, str, int]]] = {}
        self.lock = threading.Lock()

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        found = [(int(r["window"]["start"].timestamp() * 1000), r["key"], int(r["count"])) for r in df.collect()]
        with self.lock:
            self.by_batch[batch_id] = found

    @property
    def rows(self) -> list[tuple[int, str, int]]:
        with self.lock:
            return [row for batch in sorted(self.by_batch) for row in self.by_batch[batch]]

    def counts(self) -> dict[tuple[int, str], int]:
        return {(start, key): count for start, key, count in self.rows}

    def emitted(self) -> list[tuple[int, str]]:
        return [(start, key) for start, key, _ in self.rows]


def _start(spark: SparkSession, topic: str, sink: Windows, checkpoint: Path) -> Any:
    counts = (
        spark_sink.read_stream(spark, topic=topic, subscription="spark")
        .groupBy(F.window("event_time", "10 seconds"), "key")
        .count()
    )
    return (
        counts.writeStream.outputMode("append")
        .foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="500 milliseconds")
        .start()
    )


def _produce(producer: WatermarkProducer, keys: list[str], start_s: int, stop_s: int, rng: random.Random) -> Counter:
    """Events at 1 per second per key, up to 3 s out of order; an honest W_SET each second."""
    truth: Counter[tuple[int, str]] = Counter()
    for second in range(start_s, stop_s):
        for key in keys:
            event_time = BASE + second * 1000 + rng.randint(0, 3_000)
            producer.send(f"{key}@{event_time}".encode(), partition_key=key, event_timestamp=event_time)
            truth[(event_time - (event_time - BASE) % WINDOW_MS, key)] += 1
        producer.new_watermark().event_time(BASE + second * 1000).send()
    return truth


def deduplicated(admin: PulsarAdmin, topic: str) -> str:
    """Create `topic` with Pulsar's message deduplication on (what the exactly-once sink needs)."""
    admin.create_topic(topic)
    admin.set_topic_deduplication(topic)
    wait_until(lambda: admin.deduplication_enabled(topic), timeout_s=30, what="deduplication on the topic")
    return topic


def one_per_second(producer: WatermarkProducer, seconds: int, final: int) -> None:
    """One message with key "k" and a W_SET per event-time second from BASE, then a final W_SET."""
    producer.new_watermark().event_time(BASE).send()
    for second in range(seconds):
        producer.send(b"x", partition_key="k", event_timestamp=BASE + second * 1000)
        producer.new_watermark().event_time(BASE + second * 1000).send()
    producer.new_watermark().event_time(final).send()


@pytest.mark.usefixtures("generator")
def test_windowed_counts_equal_the_ground_truth_across_a_restart(
    spark: SparkSession, pulsar_client: pulsar.Client, admin: PulsarAdmin, topic: str, tmp_path: Path
) -> None:
    admin.create_topic(topic, partitions=2)
    rng = random.Random(7)
    producers = [WatermarkProducer(pulsar_client, topic, producer_name=f"spark-p{i}") for i in range(2)]
    for producer in producers:
        producer.new_watermark().event_time(BASE).send()
    sink = Windows()
    query = _start(spark, topic, sink, tmp_path / "ckpt")
    truth: Counter[tuple[int, str]] = Counter()
    truth += _produce(producers[0], ["a", "b"], 0, 12, rng)
    truth += _produce(producers[1], ["c"], 0, 12, rng)
    # both producers asserted 11 s: the window [0, 10 s) must close
    wait_until(lambda: (BASE, "a") in sink.counts(), timeout_s=90, what="the first window to close")
    query.stop()

    query = _start(spark, topic, sink, tmp_path / "ckpt")  # restart from the checkpoint
    truth += _produce(producers[0], ["a", "b"], 12, 25, rng)
    truth += _produce(producers[1], ["c"], 12, 25, rng)
    # no data after this: only the watermark closes the window [20 s, 30 s)
    for producer in producers:
        producer.new_watermark().event_time(BASE + 31_000).send()
    expected = {window: count for window, count in truth.items()}
    wait_until(lambda: sink.counts().keys() >= expected.keys(), timeout_s=120, what="every window to close")
    # the sentinel: a later window, closed by a later watermark; a window emitted again would come before it
    producers[0].send(b"z@sentinel", partition_key="z", event_timestamp=BASE + 45_000)
    for producer in producers:
        producer.new_watermark().event_time(BASE + 51_000).send()
    expected[(BASE + 40_000, "z")] = 1
    wait_until(lambda: (BASE + 40_000, "z") in sink.counts(), timeout_s=120, what="the sentinel window to close")
    query.stop()
    assert sink.counts() == expected
    assert len(sink.emitted()) == len(set(sink.emitted())), "a window was emitted twice"
    for producer in producers:
        producer.close()


@pytest.mark.usefixtures("generator")
def test_the_sink_writes_rows_and_the_query_watermark_for_a_downstream_consumer(
    spark: SparkSession, pulsar_client: pulsar.Client, admin: PulsarAdmin, topic: str, tmp_path: Path
) -> None:
    output = deduplicated(admin, f"{topic}-out")
    downstream = Recorder()
    consumer = WatermarkConsumer(pulsar_client, output, "downstream", listener=downstream)
    producer = WatermarkProducer(pulsar_client, topic, producer_name="upstream")
    one_per_second(producer, seconds=25, final=BASE + 40_000)

    spark_sink.register(spark)
    counts = (
        spark_sink.read_stream(spark, topic=topic, subscription="spark")
        .groupBy(F.window("event_time", "10 seconds"), "key")
        .count()
        .select(
            F.to_json(F.struct(F.col("window.start").cast("long").alias("start"), "key", "count")).alias("value"),
            F.col("key"),
            F.col("window.end").alias("event_time"),
        )
    )
    query = (
        counts.writeStream.format("pulsar-watermark")
        .outputMode("append")
        .option("topic", output)
        .option("checkpointLocation", str(tmp_path / "ckpt-sink"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        wait_until(lambda: len(downstream.messages()) == 3, timeout_s=120, what="three windows downstream")
        wait_until(lambda: bool(watermarks(downstream)), timeout_s=60, what="a watermark downstream")
    finally:
        query.stop()
    rows = sorted((json.loads(m) for m in downstream.messages()), key=lambda r: r["start"])  # type: ignore[arg-type]
    assert [(r["start"], r["count"]) for r in rows] == [
        (BASE // 1000, 10),
        (BASE // 1000 + 10, 10),
        (BASE // 1000 + 20, 5),
    ]
    # what the downstream consumer saw: never a window whose end is below a watermark it already had
    seen_watermark = 0
    for kind, value in downstream.events:
        if kind == "wm":
            seen_watermark = int(value)  # type: ignore[call-overload]
        else:
            assert (json.loads(value)["start"] * 1000 + WINDOW_MS) >= seen_watermark  # type: ignore[arg-type]
    assert watermarks(downstream)[-1] >= BASE + 20_000
    consumer.close()
    producer.close()


def test_bad_options_name_the_fix(spark: SparkSession) -> None:
    spark_sink.register(spark)
    with pytest.raises(Exception, match="option 'subscription' is required"):
        spark.readStream.format("pulsar-watermark").option("topic", "t").load().writeStream.format(
            "console"
        ).start().awaitTermination(30)


def test_exactly_once_output_to_a_topic_without_deduplication_names_the_admin_command(
    spark: SparkSession, topic: str, tmp_path: Path
) -> None:
    spark_sink.register(spark)
    rows = spark.readStream.format("rate").load().select(F.col("value").cast("string").alias("value"))
    with pytest.raises(Exception, match="pulsar-admin namespaces set-deduplication public/default --enable"):
        rows.writeStream.format("pulsar-watermark").option("topic", topic).option(
            "checkpointLocation", str(tmp_path / "ckpt")
        ).start().awaitTermination(60)


@pytest.mark.usefixtures("generator")
def test_a_second_query_on_the_sinks_output_gets_the_first_querys_watermark(
    spark: SparkSession, pulsar_client: pulsar.Client, admin: PulsarAdmin, topic: str, tmp_path: Path
) -> None:
    """Upstream counts 10 s windows into a topic; downstream sums them in 30 s windows on its watermark."""
    output = deduplicated(admin, f"{topic}-tens")  # the downstream query starts before the upstream one writes
    producer = WatermarkProducer(pulsar_client, topic, producer_name="chain-source")
    one_per_second(producer, seconds=50, final=BASE + 80_000)

    spark_sink.register(spark)
    upstream = (
        spark_sink.read_stream(spark, topic=topic, subscription="chain-up")
        .groupBy(F.window("event_time", "10 seconds"))
        .count()
        .select(F.col("count").cast("string").alias("value"), F.col("window.end").alias("event_time"))
        .writeStream.format("pulsar-watermark")
        .outputMode("append")
        .option("topic", output)
        .option("checkpointLocation", str(tmp_path / "up"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    sums = Windows()
    downstream = (
        spark_sink.read_stream(spark, topic=output, subscription="chain-down")
        .withColumn("key", F.lit("all"))
        .withColumn("n", F.col("value").cast("string").cast("long"))
        .groupBy(F.window("event_time", "30 seconds"), "key")
        .agg(F.sum("n").alias("count"))
        .writeStream.outputMode("append")
        .foreachBatch(sums)
        .option("checkpointLocation", str(tmp_path / "down"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        # 30 s windows are aligned to the epoch: [B+10 s, B+40 s) holds the upstream windows ending at
        # 10, 20 and 30 s, [B+40 s, B+70 s) those ending at 40 and 50 s; the last closes only when the
        # upstream query's watermark, written by its sink, passes B+70 s
        wait_until(lambda: len(sums.counts()) == 2, timeout_s=180, what="the two downstream windows")
    finally:
        upstream.stop()
        downstream.stop()
    assert sums.counts() == {(BASE + 10_000, "all"): 30, (BASE + 40_000, "all"): 20}
    producer.close()


@pytest.mark.usefixtures("generator")
def test_malformed_markers_never_reach_a_query_and_do_not_stop_it(
    spark: SparkSession, pulsar_client: pulsar.Client, topic: str, tmp_path: Path
) -> None:
    producer = WatermarkProducer(pulsar_client, topic, producer_name="spark-good")
    raw = pulsar_client.create_producer(topic, producer_name="spark-raw", batching_enabled=False)
    producer.new_watermark().event_time(BASE).send()
    for i, (properties, payload, _) in enumerate(MALFORMED):
        raw.send(payload, properties=properties)
        producer.send(f"k@{i}".encode(), partition_key="k", event_timestamp=BASE + i * 1_000)
    producer.new_watermark().event_time(BASE + 20_000).send()  # closes [0, 10 s)
    sink = Windows()
    query = _start(spark, topic, sink, tmp_path / "ckpt")
    try:
        wait_until(lambda: (BASE, "k") in sink.counts(), timeout_s=120, what="the window to close")
        assert query.exception() is None
    finally:
        query.stop()
    assert sink.counts() == {(BASE, "k"): len(MALFORMED)}  # the data only: no marker became a row
    producer.close()
    raw.close()


def _spark_watermark(query: Any) -> int:
    """Spark's event-time watermark of a running query (ms), from its latest progress."""
    from datetime import datetime

    progress = query.lastProgress or {}
    stamp = (progress.get("eventTime") or {}).get("watermark", "1970-01-01T00:00:00.000Z")
    return int(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000)


def _source_watermark(query: Any) -> int:
    """The broker watermark in the end offset of the query's latest batch (what its next batch holds)."""
    sources = (query.lastProgress or {}).get("sources") or [{}]
    offset = sources[0].get("endOffset") or {}
    return int((json.loads(offset) if isinstance(offset, str) else offset).get("wm", -1))


@pytest.mark.usefixtures("generator")
def test_a_query_on_two_topics_closes_a_window_only_when_both_watermarks_passed_it(
    spark: SparkSession, pulsar_client: pulsar.Client, admin: PulsarAdmin, topic: str, tmp_path: Path
) -> None:
    first, second = f"{topic}-a", f"{topic}-b"
    admin.create_topic(first, partitions=2)
    admin.create_topic(second)
    ahead = WatermarkProducer(pulsar_client, first, producer_name="ahead")
    behind = WatermarkProducer(pulsar_client, second, producer_name="behind")
    for producer in (ahead, behind):
        producer.new_watermark().event_time(BASE).send()
        producer.send(b"x", partition_key="k", event_timestamp=BASE + 2_000)
    ahead.new_watermark().event_time(BASE + 15_000).send()  # first topic: past the window [0, 10 s)
    behind.new_watermark().event_time(BASE + 5_000).send()  # second topic: not yet
    sink = Windows()
    query = (
        spark_sink.read_stream(spark, topics=f"{first},{second}", subscription="two")
        .groupBy(F.window("event_time", "10 seconds"), "key").count()
        .writeStream.outputMode("append").foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(processingTime="500 milliseconds").start()
    )  # fmt: skip
    try:
        # Spark's watermark is the minimum over both topics (every partition): 5 s, not 15 s
        wait_until(lambda: _spark_watermark(query) == BASE + 5_000, timeout_s=90, what="Spark's watermark at 5 s")
        assert sink.counts() == {}, "a window closed before the second topic's watermark passed it"
        behind.new_watermark().event_time(BASE + 12_000).send()
        wait_until(lambda: sink.counts() == {(BASE, "k"): 2}, timeout_s=60, what="the window to close")
        wait_until(lambda: _spark_watermark(query) == BASE + 12_000, timeout_s=30, what="Spark's watermark at 12 s")
    finally:
        query.stop()
    ahead.close()
    behind.close()


def _end_of(query: Any, topic: str) -> tuple[int, int]:
    """The latest batch's end entry of a non-partitioned topic, (-1, -1) before one."""
    sources = (query.lastProgress or {}).get("sources") or [{}]
    offset = sources[0].get("endOffset") or {}
    entry = ((json.loads(offset) if isinstance(offset, str) else offset).get("topics") or {}).get(topic, {}).get("-1")
    return (int(entry[0]), int(entry[1])) if entry else (-1, -1)


def _held_back_by(query: Any) -> dict[str, list[int]]:
    """The partitions named as holding the watermark back in the latest batch's end offset (the progress)."""
    sources = (query.lastProgress or {}).get("sources") or [{}]
    offset = sources[0].get("endOffset") or {}
    return dict((json.loads(offset) if isinstance(offset, str) else offset).get("heldBackBy") or {})


@pytest.mark.usefixtures("generator")
def test_a_pattern_with_an_empty_topic_does_not_stall_and_one_without_a_watermark_is_named(
    spark: SparkSession, pulsar_client: pulsar.Client, admin: PulsarAdmin, topic: str, tmp_path: Path
) -> None:
    """Issue #26 (4): an empty matched topic held the query's watermark back for good, silently."""
    watermarked, empty, plain = f"{topic}-watermarked", f"{topic}-empty", f"{topic}-plain"
    for name in (watermarked, empty, plain):
        admin.create_topic(name)
    producer = WatermarkProducer(pulsar_client, watermarked, producer_name="sensor")
    producer.new_watermark().event_time(BASE).send()
    producer.send(b"x", event_timestamp=BASE + 1_000)
    producer.new_watermark().event_time(BASE + 15_000).send()
    query = (
        spark_sink.read_stream(spark, topicsPattern=f"{topic}-.*", subscription="pattern")
        .writeStream.foreachBatch(lambda df, _id: df.count())
        .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(processingTime="500 milliseconds").start()
    )  # fmt: skip
    plain_producer = pulsar_client.create_producer(plain)
    try:
        # the empty topics take no part: the watermarked topic's 15 s is the query's
        wait_until(lambda: _source_watermark(query) == BASE + 15_000, timeout_s=90, what="the broker watermark 15 s")
        assert _held_back_by(query) == {}
        plain_producer.send(b"no event-time promise")  # messages, but no producer takes part there
        wait_until(lambda: _held_back_by(query) == {plain: [-1]}, timeout_s=60, what="the plain topic named")
        producer.new_watermark().event_time(BASE + 25_000).send()
        last = producer.send(b"y", event_timestamp=BASE + 26_000)
        wait_until(lambda: _end_of(query, watermarked) >= (last.ledger_id(), last.entry_id()), timeout_s=60,
                   what="a batch ending after the new rows")  # fmt: skip
        time.sleep(3)  # the generator's 25 s is out by now: a batch would carry it, were the plain topic not named
        assert _source_watermark(query) == BASE + 15_000  # held where it was, by the topic it names
        assert _held_back_by(query) == {plain: [-1]}
    finally:
        query.stop()
        plain_producer.close()
        producer.close()


def test_late_rows_are_marked_not_dropped_unseen_and_name_the_producer_the_generator_counts(
    spark: SparkSession, pulsar_client: pulsar.Client, pulsar_settings: Any, namespace: str, tmp_path: Path
) -> None:
    """A late row names its producer (`producer`), the same one the generator's broken-assertion metric names."""
    from bench.common import metric_samples
    from devtools.local_cluster import free_port
    from tests.integration.generator_process import GeneratorProcess

    port = free_port()
    generator = GeneratorProcess(
        pulsar_settings, tmp_path / "gen.log", "late-gen", WM_NAMESPACES=namespace, WM_METRICS_PORT=str(port)
    ).start()
    topic = f"persistent://{namespace}/late"
    honest = WatermarkProducer(pulsar_client, topic, producer_name="honest")
    breaker = WatermarkProducer(pulsar_client, topic, producer_name="promise-breaker")
    for producer in (honest, breaker):
        producer.new_watermark().event_time(BASE + 10_000).send()
    honest.send(b"on-time", event_timestamp=BASE + 12_000)
    seen: dict[bytes, tuple[str, bool]] = {}
    late_by_producer: Counter[str] = Counter()
    lock = threading.Lock()

    def collect(df: DataFrame, _batch: int) -> None:
        rows = df.collect()
        late = df.filter("late").groupBy("producer").count().collect()  # the README's recipe: who, how often
        with lock:
            late_by_producer.update({row["producer"]: row["count"] for row in late})
            seen.update((bytes(row["value"]), (row["producer"], bool(row["late"]))) for row in rows)

    query = (
        spark_sink.read_stream(spark, topic=topic, subscription="late").writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(processingTime="500 milliseconds").start()
    )  # fmt: skip
    try:
        wait_until(lambda: b"on-time" in seen, timeout_s=90, what="the first row")
        wait_until(lambda: _source_watermark(query) == BASE + 10_000, timeout_s=30, what="a batch ending at 10 s")
        breaker.send(b"broken-promise", event_timestamp=BASE + 5_000)  # below its own W_SET and the watermark
        wait_until(lambda: b"broken-promise" in seen, timeout_s=60, what="the late row")

        def broken(producer: str) -> float:
            return sum(metric_samples(port, "wm_broken_assertions_total", producer=producer))

        wait_until(lambda: broken("promise-breaker") > 0, timeout_s=30, what="the generator's broken-assertion count")
        assert broken("honest") == 0 and broken("promise-breaker") == 1
    finally:
        query.stop()
        generator.stop()
    assert seen == {b"on-time": ("honest", False), b"broken-promise": ("promise-breaker", True)}
    assert late_by_producer == {"promise-breaker": 1}
    honest.close()
    breaker.close()


@pytest.mark.usefixtures("generator")
def test_exact_windows_on_a_spark_standalone_cluster(
    pulsar_client: pulsar.Client, pulsar_settings: Any, admin: PulsarAdmin, topic: str, tmp_path: Path
) -> None:
    """The same source and watermark on a real cluster: a standalone Master and Worker on loopback, the
    query's driver and executors in processes of their own."""
    from tests.integration.spark_cluster import SparkStandalone, run_job

    admin.create_topic(topic, partitions=2)
    producer = WatermarkProducer(pulsar_client, topic, producer_name="standalone")
    producer.new_watermark().event_time(BASE).send()
    truth = _produce(producer, ["a", "b"], 0, 25, random.Random(3))
    producer.new_watermark().event_time(BASE + 31_000).send()  # closes the last window without new data
    cluster = SparkStandalone(tmp_path).start()
    try:
        env = {"PULSAR_SERVICE_URL": pulsar_settings.service_url, "PULSAR_ADMIN_URL": pulsar_settings.admin_url}
        rows = run_job(cluster.url, topic, "standalone", tmp_path / "ckpt", len(truth), env)
    finally:
        cluster.stop()
    assert len(rows) == len({(start, key) for start, key, _ in rows}), "a window was emitted twice"
    assert {(start, key): count for start, key, count in rows} == dict(truth)
    producer.close()


def test_a_query_on_a_deleted_and_recreated_topic_marks_none_of_its_rows_late(
    spark: SparkSession, pulsar_client: pulsar.Client, pulsar_settings: Any, admin: PulsarAdmin, namespace: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    """Issue #26 (1): before, the query took T+10 h from the companion topic and marked every new row late."""
    from tests.integration.generator_process import GeneratorProcess
    from tests.integration.helpers import recreate_after_a_high_watermark

    generator = GeneratorProcess(pulsar_settings, tmp_path / "gen.log", "recreate-spark", WM_NAMESPACES=namespace)
    generator.start()
    topic = f"persistent://{namespace}/recreated"
    new = recreate_after_a_high_watermark(pulsar_client, admin, topic, BASE, "query")
    for i in range(5):
        new.send(f"new-{i}".encode(), event_timestamp=BASE + 1_000 * i)
    new.new_watermark().event_time(BASE + 5_000).send()
    seen: dict[bytes, bool] = {}
    lock = threading.Lock()

    def collect(df: DataFrame, _batch: int) -> None:
        rows = df.collect()
        with lock:
            seen.update((bytes(row["value"]), bool(row["late"])) for row in rows)

    query = (
        spark_sink.read_stream(spark, topic=topic, subscription="query").writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(processingTime="500 milliseconds").start()
    )  # fmt: skip
    try:
        wait_until(lambda: len(seen) == 5, timeout_s=90, what="the new rows")
        wait_until(lambda: _source_watermark(query) == BASE + 5_000, timeout_s=60, what="the new topic's watermark")
        new.send(b"after", event_timestamp=BASE + 6_000)
        wait_until(lambda: b"after" in seen, timeout_s=60, what="a row after the watermark")
        assert _source_watermark(query) == BASE + 5_000
    finally:
        query.stop()
        generator.stop()
        new.close()
    assert seen == {**{f"new-{i}".encode(): False for i in range(5)}, b"after": False}
