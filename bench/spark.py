"""Issues 5 and 14: how soon a window closes after the producers allow it, and the source's steady rate."""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import threading
import time
import uuid
from typing import Any

import pulsar

from bench.common import median_ratio, say
from consumer.watermark_feed import WatermarkFeed
from producer import WatermarkProducer
from pulsar_access.admin import PulsarAdmin
from pulsar_access.settings import PulsarSettings
from pulsar_access.topics import watermark_topic_for
from watermark_core.protocol import (
    EVENT_PROPERTY,
    HEAD_WATERMARK,
    MARKER_PROPERTY,
    SEND_WATERMARK,
    Watermark,
    decode_head,
    decode_table_with_heads,
    key_topic,
)

BASE = 1_700_000_000_000
TRIGGER_S = 1.0
WINDOW_S = 3
WINDOWS = 15
WARM_BATCHES = 5
WARM_WINDOWS = 2
"""Windows sent with data before the timed ones and not timed: a query's first batches with rows and its
first emitted windows still compile code and start workers (seconds, not what a running query costs)."""
ALL_WINDOWS = WARM_WINDOWS + WINDOWS
TIMED = range(WARM_WINDOWS, ALL_WINDOWS)
RATE_MESSAGES = 1_000_000
RATE_LIMIT = 100_000
CLOSE_BASE = BASE - BASE % (WINDOW_S * 1000)
"""The latency run's event-time origin, on a window boundary: Spark's tumbling windows start at multiples
of their length since the epoch, and BASE is 2 s past a 3 s boundary. Measuring from BASE timed each window
from the W_SET one second before the one that passes its end (one trigger too much)."""


def _phase(window: int) -> float:
    """Seconds by which window `window`'s messages and W_SETs are sent later than the run's one-second grid.

    Spark starts a processing-time batch on the wall clock's multiples of the trigger interval, so a
    run whose sends are all on one grid meets every batch at the same phase: each window waits the
    same part of a trigger for the next batch, and the run's p50 moved by up to half a trigger from
    run to run with that phase alone. The timed windows' phases cover one trigger evenly, so the
    figures are over every phase, as W_SETs arriving at any time would meet them.
    """
    return (window % WINDOWS) / WINDOWS * TRIGGER_S


def _session(settings: PulsarSettings) -> Any:
    import spark_sink

    return spark_sink.local_session(settings.service_url, settings.admin_url)


def _iso_ms(text: str) -> int:
    from datetime import datetime

    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def window_close_latency(spark: Any, client: pulsar.Client, admin: PulsarAdmin) -> dict[str, float | int | str]:
    """Per window: ms from sending the W_SET that passes its end (the later of two producers') to its row
    in foreachBatch; and, as before, from the subscription's broker watermark passing it to that row."""
    from pyspark.sql import functions as F

    import spark_sink

    topic = f"persistent://public/default/bench-close-{uuid.uuid4().hex[:6]}"
    admin.create_topic(topic, partitions=2)
    window_ms = WINDOW_S * 1000
    sent: dict[int, float] = {}  # window index -> when the W_SET passing its end was sent
    published: dict[int, float] = {}  # window index -> when the subscription's watermark passed its end
    emitted: dict[int, float] = {}
    emitted_in: dict[int, int] = {}  # window index -> the batch that emitted it
    headed: dict[int, float] = {}  # window index -> when head events of both partitions passed its end
    to_trigger: dict[int, float] = {}  # window index -> s from its W_SET to Spark's next trigger time
    lock = threading.Lock()
    heads: dict[int, int] = {}
    stop_heads = threading.Event()

    def follow_heads() -> None:
        """Diagnostics: when the generator's head events (what the source reads) pass each window's end."""
        reader = client.create_reader(watermark_topic_for(topic), pulsar.MessageId.earliest)
        while not stop_heads.is_set():
            try:
                message = reader.read_next(timeout_millis=200)
            except pulsar.Timeout:
                continue
            if key_topic(message.partition_key()) != topic:
                continue  # another topic of the companion topic's group
            kind = message.properties().get(EVENT_PROPERTY)
            riding = decode_table_with_heads(message.data())[1] if kind == SEND_WATERMARK else []
            if kind != HEAD_WATERMARK and not riding:
                continue
            now = time.monotonic()
            for head in riding or [decode_head(message.data())]:  # alone, or riding on a table
                heads[head.partition] = max(heads.get(head.partition, 0), head.event_time)
            if len(heads) == 2:
                with lock:
                    for index in range(ALL_WINDOWS + 1):
                        if min(heads.values()) >= CLOSE_BASE + (index + 1) * window_ms:
                            headed.setdefault(index, now)
        reader.close()

    head_thread = threading.Thread(target=follow_heads, daemon=True)
    head_thread.start()

    def on_watermark(watermark: Watermark | None) -> None:
        if watermark is None:
            return
        now = time.monotonic()
        with lock:
            for index in range(ALL_WINDOWS + 1):
                if watermark.event_time >= CLOSE_BASE + (index + 1) * window_ms:
                    published.setdefault(index, now)

    def collect(df: Any, batch: int) -> None:
        rows = df.collect()
        now = time.monotonic()
        with lock:
            for row in rows:
                index = int((row["window"]["start"].timestamp() * 1000 - CLOSE_BASE) // window_ms)
                emitted.setdefault(index, now)
                emitted_in.setdefault(index, batch)

    producers = [WatermarkProducer(client, topic, producer_name=f"bench-close-{i}") for i in range(2)]
    for producer in producers:
        producer.new_watermark().event_time(CLOSE_BASE).send()
    query = (
        spark_sink.read_stream(spark, topic=topic, subscription="bench")
        .groupBy(F.window("event_time", f"{WINDOW_S} seconds"))
        .count()
        .writeStream.outputMode("append")
        .foreachBatch(collect)
        .option("checkpointLocation", tempfile.mkdtemp(prefix="wm-bench-spark-"))
        .trigger(processingTime=f"{TRIGGER_S} seconds")
        .start()
    )
    feed = WatermarkFeed(client, topic, "bench", on_watermark)
    # Warm-up: the query is up, has read the first W_SET and has run a few batches (Spark's first
    # batches compile and start the Python workers: seconds each, not what a running query costs)
    warm_until = time.monotonic() + 60
    while time.monotonic() < warm_until and len(query.recentProgress) < WARM_BATCHES:
        time.sleep(0.2)
    first_timed_batch = len(query.recentProgress)
    seconds = (ALL_WINDOWS + 1) * WINDOW_S
    started = time.monotonic()
    for second in range(1, seconds + 1):
        # one W_SET per second per producer, one event-time second each; data in the second before it;
        # each window's seconds shifted by its own phase (see `_phase`)
        time.sleep(max(0.0, started + second - 1 + _phase((second - 1) // WINDOW_S) - time.monotonic()))
        for producer in producers:
            for i in range(5):
                producer.send(b"x", partition_key=str(i), event_timestamp=CLOSE_BASE + (second - 1) * 1000 + i * 100)
        for index, producer in enumerate(producers):
            if second % WINDOW_S == 0 and index == len(producers) - 1:
                with lock:  # the later producer's W_SET is the one that passes the window's end
                    sent[second // WINDOW_S - 1] = time.monotonic()
                    # Spark starts batches on the wall clock's multiples of the trigger interval
                    to_trigger[second // WINDOW_S - 1] = TRIGGER_S - time.time() % TRIGGER_S
            producer.new_watermark().event_time(CLOSE_BASE + second * 1000).send()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(emitted) < ALL_WINDOWS:
        time.sleep(0.2)
    progress = list(query.recentProgress)[first_timed_batch:]
    carried: dict[int, int] = {}  # window index -> the first batch whose end offset's watermark passed its end
    used: dict[int, int] = {}  # window index -> the first batch run with Spark's watermark past its end
    for batch in progress:
        offset = ((batch.get("sources") or [{}])[0]).get("endOffset") or {}
        wm = int((json.loads(offset) if isinstance(offset, str) else offset).get("wm", -1))
        stamp = (batch.get("eventTime") or {}).get("watermark")
        spark_wm = _iso_ms(stamp) if stamp else -1
        for index in range(ALL_WINDOWS):
            if wm >= CLOSE_BASE + (index + 1) * window_ms:
                carried.setdefault(index, int(batch["batchId"]))
            if spark_wm >= CLOSE_BASE + (index + 1) * window_ms:
                used.setdefault(index, int(batch["batchId"]))
    query.stop()
    stop_heads.set()
    head_thread.join(timeout=2)
    feed.close()
    for producer in producers:
        producer.close()
    phases: dict[str, list[int]] = {}
    for batch in progress:
        for phase, ms in (batch.get("durationMs") or {}).items():
            phases.setdefault(phase, []).append(int(ms))
    say("  batch phases, median ms over the timed batches: " + ", ".join(
        f"{phase} {statistics.median(values):.0f}" for phase, values in sorted(phases.items())
    ))  # fmt: skip
    from_wset = [(emitted[i] - sent[i]) * 1000 for i in TIMED if i in emitted and i in sent]
    from_published = [(emitted[i] - published[i]) * 1000 for i in TIMED if i in emitted and i in published]
    say(f"  {len(from_wset)} windows: from the W_SET {[round(x) for x in from_wset]} ms")
    say(f"  from the subscription's published watermark {[round(x) for x in from_published]} ms")
    beyond = [(emitted[i] - sent[i] - to_trigger[i]) * 1000 for i in TIMED if i in emitted and i in sent]
    say(
        f"  from the W_SET minus the wait for Spark's next trigger {[round(x) for x in beyond]} ms, median "
        f"{statistics.median(beyond):.0f} (one trigger plus a batch's run to the sink, whatever the phase)"
    )
    to_head = [round((headed[i] - sent[i]) * 1000) for i in TIMED if i in headed and i in sent]
    say(f"  W_SET to head events known {to_head} ms")
    say(
        f"  batches emitting minus batches carrying the watermark "
        f"{[emitted_in[i] - carried[i] for i in TIMED if i in emitted_in and i in carried]}; "
        f"batches running with Spark's watermark past the end minus carrying "
        f"{[used[i] - carried[i] for i in TIMED if i in used and i in carried]}"
    )
    how = (
        f"{WINDOWS} windows of {WINDOW_S} s event time on a 2-partition topic, two producers each sending 5 messages "
        "and one W_SET per second (event time one second per W_SET); time from sending the W_SET that passes a "
        f"window's end (the later producer's) to the window's row in foreachBatch; trigger {TRIGGER_S:.0f} s, "
        f"local[2]; timed after the query's first {WARM_BATCHES} batches and {WARM_WINDOWS} windows (start-up); "
        "the timed windows' W_SETs are sent at phases spread evenly over one trigger interval (since issue 14); "
        "the session's second query (after the rate run), as a long-running job is past the JVM's warm-up"
    )
    return {
        "spark_close_from_wset_p50_ms": round(statistics.median(from_wset)),
        "spark_close_from_wset_p50_ms_how": how,
        "spark_close_from_wset_p99_ms": round(_percentile(from_wset, 0.99)),
        "spark_close_from_wset_p99_ms_how": f"as p50; with {len(from_wset)} windows this is the largest of them",
        "spark_close_from_wset_max_ms": round(max(from_wset)),
        "spark_window_close_latency_p50_ms": round(statistics.median(from_published)),
        "spark_window_close_latency_p50_ms_how": (
            "same run; time from the generator publishing the query's subscription's watermark >= the window's end "
            "to the window's row. Since issue 14 the query no longer waits for that (it uses the watermark at the "
            "batch's end and acknowledges afterwards), so this can be negative"
        ),
    }


def _fill(client: pulsar.Client, topic: str, count: int, batching: bool = False) -> None:
    """`count` messages of 100 B over both partitions, one per entry (no batching: an entry is an offset) or
    in the producer's default batches (`batching`: up to 1000 messages an entry)."""
    producer = client.create_producer(
        topic, batching_enabled=batching, block_if_queue_full=True, max_pending_messages=5000,
        message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution,
    )  # fmt: skip
    payload = b"x" * 100
    for i in range(count):
        producer.send_async(payload, None, event_timestamp=BASE + i)
    producer.flush()
    producer.close()


def _plain_readers(client: pulsar.Client, topic: str, partitions: int, count: int) -> float:
    """Rows/s of one plain reader per partition, in parallel threads of this process, reading `count` in all."""
    readers = [client.create_reader(f"{topic}-partition-{p}", pulsar.MessageId.earliest) for p in range(partitions)]
    read = [0] * partitions

    def drain(index: int) -> None:
        reader = readers[index]
        while True:
            try:
                message = reader.read_next(timeout_millis=1000)
            except pulsar.Timeout:
                if reader.has_message_available():
                    continue
                return
            if MARKER_PROPERTY not in message.properties():  # the generator's W_SNAPSHOTs are not rows
                read[index] += 1

    threads = [threading.Thread(target=drain, args=(p,)) for p in range(partitions)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started - 1.0  # the final read timeout of the last reader
    for reader in readers:
        reader.close()
    assert sum(read) == count, f"the plain readers read {sum(read)} of {count}"
    return count / elapsed


def _spark_source(spark: Any, topic: str, count: int) -> tuple[float, float, int]:
    """(steady rows/s from the end of the first batch to the last row, overall rows/s, batches)."""
    import spark_sink

    spark_sink.register(spark)
    done: list[tuple[float, int]] = []  # (when a batch ended, rows so far)

    def counted(df: Any, _batch: int) -> None:
        rows = df.filter("not is_watermark").count()
        done.append((time.perf_counter(), (done[-1][1] if done else 0) + rows))

    started = time.perf_counter()
    query = (
        spark.readStream.format("pulsar-watermark")
        .option("topic", topic)
        .option("subscription", "bench-rate")
        .option("maxOffsetsPerTrigger", str(RATE_LIMIT))
        .load()
        .writeStream.foreachBatch(counted)
        .option("checkpointLocation", tempfile.mkdtemp(prefix="wm-bench-rate-"))
        .start()
    )
    deadline = time.monotonic() + 600
    while (not done or done[-1][1] < count) and time.monotonic() < deadline:
        time.sleep(0.1)
    query.stop()
    first = next(i for i, (_, rows) in enumerate(done) if rows > 0)
    (t_first, rows_first), (t_last, rows_last) = done[first], done[-1]
    assert rows_last == count, f"the source read {rows_last} of {count}"
    batches = len([1 for i, (_, rows) in enumerate(done) if rows > (done[i - 1][1] if i else 0)])
    return (rows_last - rows_first) / (t_last - t_first), rows_last / (t_last - started), batches


def source_vs_readers(spark: Any, client: pulsar.Client, admin: PulsarAdmin) -> dict[str, float | int | str]:
    topic = f"persistent://public/default/bench-rate-{uuid.uuid4().hex[:6]}"
    admin.create_topic(topic, partitions=2)
    say(f"  writing {RATE_MESSAGES} messages")
    _fill(client, topic, RATE_MESSAGES)
    # The broker's first read of a fresh topic is much slower than every later one (11.6k against 19.7k rows/s
    # for the same readers): one untimed pass first, so neither side pays the broker's warm-up.
    _plain_readers(client, topic, 2, RATE_MESSAGES)
    readers = _plain_readers(client, topic, 2, RATE_MESSAGES)
    steady, overall, batches = _spark_source(spark, topic, RATE_MESSAGES)
    readers_after = _plain_readers(client, topic, 2, RATE_MESSAGES)
    baseline = statistics.mean([readers, readers_after])
    say(f"  plain readers {readers:.0f} then {readers_after:.0f} rows/s; Spark steady {steady:.0f} rows/s "
        f"({batches} batches), overall {overall:.0f} rows/s")  # fmt: skip
    return {
        "spark_source_steady_vs_readers_ratio": round(steady / baseline, 3),
        "spark_source_steady_vs_readers_ratio_how": (
            f"{RATE_MESSAGES} messages of 100 B (one per entry) on a 2-partition topic, maxOffsetsPerTrigger "
            f"{RATE_LIMIT}, no trigger interval, local[2]; rows/s of the pulsar-watermark source (foreachBatch "
            "count) from the end of the first batch to the last row, over one plain Python reader per partition "
            "in parallel threads of one process (mean of a run before and one after the query; one untimed "
            "reader pass before both, as the broker's first read of a topic is slow)"
        ),
        "spark_source_steady_rows_per_s": round(steady),
        "spark_source_rows_per_s": round(overall),
        "plain_reader_rows_per_s": round(baseline),
        "spark_source_vs_reader_ratio": round(overall / baseline, 3),
        "spark_source_vs_reader_ratio_how": (
            "same run as the steady ratio, but from the query's start (Spark start-up and first batch included)"
        ),
    }


SOURCE_ROWS = 1_000_000
SOURCE_ROUNDS = 3


def _client_batch_receive(client: pulsar.Client, topic: str, count: int) -> float:
    """Rows/s of one plain consumer (this process) doing `batch_receive` over the whole topic, each message
    acknowledged, from its first call to its `count`-th message (subscribing is not timed)."""
    consumer = client.subscribe(
        topic, f"bench-plain-{uuid.uuid4().hex[:6]}", initial_position=pulsar.InitialPosition.Earliest
    )
    started = time.perf_counter()
    received = 0
    while received < count:
        for message in consumer.batch_receive():
            consumer.acknowledge(message)
            received += 1
    elapsed = time.perf_counter() - started
    consumer.close()
    return count / elapsed


def _source_one_batch(spark: Any, topic: str, count: int) -> float:
    """Rows/s of a query reading the whole topic in one micro-batch (Trigger.AvailableNow, no limit) to Spark's
    no-op sink: the rows over the batch's `triggerExecution` (its planning, reading and writing)."""
    query = (
        spark.readStream.format("pulsar-watermark")
        .option("topic", topic)
        .option("subscription", f"bench-source-{uuid.uuid4().hex[:6]}")
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", tempfile.mkdtemp(prefix="wm-bench-source-"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(600)
    if query.exception() is not None:
        raise RuntimeError(f"the source bench's query failed: {query.exception()}")
    batches = [batch for batch in query.recentProgress if batch["numInputRows"] > 0]
    assert len(batches) == 1, f"{len(batches)} batches with rows, not one"
    rows, millis = int(batches[0]["numInputRows"]), int(batches[0]["durationMs"]["triggerExecution"])
    assert rows == count, f"the source read {rows} of {count}"
    say(f"    source batch: {rows} rows, phases ms {batches[0]['durationMs']}")
    return rows / (millis / 1000)


def source_vs_client_batch(spark: Any, client: pulsar.Client, admin: PulsarAdmin) -> dict[str, float | int | str]:
    """The source's rows/s in one micro-batch against one plain `batch_receive` reader over the same topic."""
    import spark_sink

    spark_sink.register(spark)
    topic = f"persistent://public/default/bench-source-{uuid.uuid4().hex[:6]}"
    admin.create_topic(topic, partitions=2)
    say(f"  writing {SOURCE_ROWS} messages")
    _fill(client, topic, SOURCE_ROWS, batching=True)
    # Untimed: the broker's first read of a topic is slow, and so is a session's first query.
    _client_batch_receive(client, topic, SOURCE_ROWS)
    _source_one_batch(spark, topic, SOURCE_ROWS)
    pairs: list[tuple[float, float]] = []
    for round_ in range(SOURCE_ROUNDS):
        if round_ % 2 == 0:
            plain = _client_batch_receive(client, topic, SOURCE_ROWS)
            source = _source_one_batch(spark, topic, SOURCE_ROWS)
        else:
            source = _source_one_batch(spark, topic, SOURCE_ROWS)
            plain = _client_batch_receive(client, topic, SOURCE_ROWS)
        pairs.append((source, plain))
        say(f"  round {round_}: source {source:.0f} rows/s, plain batch_receive {plain:.0f} rows/s")
    return {
        "spark_source_vs_client_batch_ratio": round(median_ratio(pairs), 3),
        "spark_source_vs_client_batch_ratio_how": (
            f"{SOURCE_ROWS} messages of 100 B in the producer's default batches on a 2-partition topic; rows/s of a "
            "streaming query reading all of them in one micro-batch (pulsar-watermark source, Trigger.AvailableNow, "
            "Spark's noop sink, local[2]; the rows over the batch's triggerExecution) over one plain consumer "
            "in one process doing pulsar-client batch_receive (default policy) and acknowledging each message; "
            f"median of {SOURCE_ROUNDS} interleaved rounds, after an untimed pass of each (the broker's and the "
            "session's first reads are slow)"
        ),
        "spark_source_one_batch_rows_per_s": round(statistics.median(source for source, _ in pairs)),
        "client_batch_receive_rows_per_s": round(statistics.median(plain for _, plain in pairs)),
    }


def run(settings: PulsarSettings) -> dict[str, float | int | str]:
    spark = _session(settings)
    client = settings.client()
    admin = PulsarAdmin(settings)
    try:
        if os.environ.get("WM_BENCH_SPARK") == "source":  # only the one-batch figure: quick iterations
            say("Spark: the source in one batch against a plain batch_receive")
            return source_vs_client_batch(spark, client, admin)
        # The rate run first: it also warms the session's JVM, whose first query runs each batch 150-200 ms
        # slower than any later one (docs/DECISIONS.md, Spark), which a long-running query does not pay.
        say("Spark: source rate against plain readers")
        figures = source_vs_readers(spark, client, admin)
        say("Spark: the source in one batch against a plain batch_receive")
        figures.update(source_vs_client_batch(spark, client, admin))
        say("Spark: window close latency from the W_SET")
        figures.update(window_close_latency(spark, client, admin))
    finally:
        spark.stop()
        client.close()
        admin.close()
    return figures


SINK_MESSAGES = 200_000
SINK_ROUNDS = 3


def _sink_run(spark: Any, source: str, output: str, guarantee: str) -> float:
    """Rows/s of a query that reads `source` to its end (Trigger.AvailableNow) and writes every row to `output`
    with the pulsar-watermark sink, from the query's start to its end."""
    started = time.perf_counter()
    query = (
        spark.readStream.format("pulsar-watermark")
        .option("topic", source)
        .option("subscription", f"bench-sink-{uuid.uuid4().hex[:6]}")
        .load()
        .filter("not is_watermark")
        .select("value", "event_time")
        .writeStream.format("pulsar-watermark")
        .option("topic", output)
        .option("deliveryGuarantee", guarantee)
        .option("checkpointLocation", tempfile.mkdtemp(prefix="wm-bench-sink-"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(600)
    elapsed = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(f"the sink bench's query failed: {query.exception()}")
    return SINK_MESSAGES / elapsed


def sink_exactly_once_vs_at_least_once(
    spark: Any, client: pulsar.Client, admin: PulsarAdmin
) -> dict[str, float | int | str]:
    import spark_sink
    from spark_sink.sink import ENTRY_ROWS

    spark_sink.register(spark)
    source = f"persistent://public/default/bench-sink-in-{uuid.uuid4().hex[:6]}"
    admin.create_topic(source, partitions=2)
    say(f"  writing {SINK_MESSAGES} messages")
    _fill(client, source, SINK_MESSAGES)

    def output(deduplicated: bool) -> str:
        topic = f"persistent://public/default/bench-sink-out-{uuid.uuid4().hex[:6]}"
        admin.create_topic(topic)
        if deduplicated:
            admin.set_topic_deduplication(topic)
            deadline = time.monotonic() + 30
            while not admin.deduplication_enabled(topic) and time.monotonic() < deadline:
                time.sleep(0.2)
        return topic

    _sink_run(spark, source, output(False), "at-least-once")  # untimed: the JVM's first query is slower
    rates: dict[str, list[float]] = {"exactly-once": [], "at-least-once": []}
    order = ["at-least-once", "exactly-once"]
    for round_ in range(SINK_ROUNDS):
        for guarantee in order if round_ % 2 == 0 else order[::-1]:
            rate = _sink_run(spark, source, output(guarantee == "exactly-once"), guarantee)
            rates[guarantee].append(rate)
            say(f"  {guarantee}: {rate:.0f} rows/s")
    exactly, at_least = statistics.median(rates["exactly-once"]), statistics.median(rates["at-least-once"])
    return {
        "sink_exactly_once_vs_at_least_once_rate": round(exactly / at_least, 3),
        "sink_exactly_once_vs_at_least_once_rate_how": (
            f"{SINK_MESSAGES} messages of 100 B on a 2-partition topic, read to the end (Trigger.AvailableNow, "
            "local[2]) and written to a fresh non-partitioned topic by the pulsar-watermark sink; rows/s from "
            "the query's start to its end, exactly once (deduplication on, sorted rows, sequence ids, entries of up "
            f"to {ENTRY_ROWS} rows cut by a flush) over at least once (deduplication off, client batching); median of "
            f"{SINK_ROUNDS} interleaved rounds each, after an untimed "
            "warm-up query"
        ),
        "sink_exactly_once_rows_per_s": round(exactly),
        "sink_at_least_once_rows_per_s": round(at_least),
    }


def run_sink(settings: PulsarSettings) -> dict[str, float | int | str]:
    spark = _session(settings)
    client = settings.client()
    admin = PulsarAdmin(settings)
    try:
        say("Spark: the sink exactly once against at least once")
        return sink_exactly_once_vs_at_least_once(spark, client, admin)
    finally:
        spark.stop()
        client.close()
        admin.close()
