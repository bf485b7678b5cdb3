"""The sink's exactly-once output when the driver dies at random points of a running pipeline.

source -> 2 s windowed counts per key -> pulsar-watermark sink, in a driver process of its own
(`tests/integration/sink_pipeline.py`: the Python driver, its JVM and its Python workers, one process
group) that is SIGKILLed and restarted from its checkpoint, while producers keep writing. A plain reader
of the output topic must then find each window's row exactly once with the exact count, and a downstream
query on that topic must close the same windows.

Every restart costs a JVM and a Spark session, so the kills are few and placed: every other one lands
inside a batch for certain (at a random point between its plan in the offset log and its commit, any
phase: reading, counting, writing the rows, committing), the others at a random moment up to 4 s after the
restarted driver's first commit (between two batches, or inside one). A kill meant for a batch that the
commit beat by a few milliseconds is followed by another one, so at least one kill leaves a batch to run
again.

`SINK_KILLS=N` changes the number of kills (3); `SINK_DELIVERY_GUARANTEE=at-least-once` runs the same
pipeline without deduplication, to see the test fail when a kill lands between a batch's write and its
commit. The first version of the exactly-once sink (client batching on) failed it: 247 rows written twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import IO

import pulsar
import pytest

from producer import WatermarkProducer
from pulsar_access.admin import PulsarAdmin
from pulsar_access.settings import PulsarSettings
from tests.integration.helpers import wait_until
from watermark_core.protocol import MARKER_PROPERTY

pyspark = pytest.importorskip("pyspark")
from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

import spark_sink  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BASE = 1_700_000_000_000 - 1_700_000_000_000 % 60_000  # on a boundary of every window below
WINDOW_MS = 2_000
DOWNSTREAM_WINDOW_MS = 20_000
KEYS = ("a", "b", "c")
KILLS = int(os.environ.get("SINK_KILLS", "3"))
EXTRA_KILLS = 3
"""Kills inside a batch added at most, should every planned one have been beaten by its batch's commit."""
STEP_S = 0.2
"""Wall time per event-time second: a 2 s window closes about every 0.4 s, so most batches write rows."""


class Driver:
    """The pipeline's driver process group; `kill()` is a SIGKILL of all of it."""

    def __init__(self, settings: PulsarSettings, topic: str, output: str, checkpoint: Path, log: IO[bytes]) -> None:
        env = {
            **os.environ, "PYTHONPATH": str(ROOT), "PULSAR_SERVICE_URL": settings.service_url,
            "PULSAR_ADMIN_URL": settings.admin_url,
        }  # fmt: skip
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.sink_pipeline", topic, output, str(checkpoint),
             str(WINDOW_MS // 1000)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log, start_new_session=True,
        )  # fmt: skip

    def wait_started(self, timeout_s: float = 180) -> None:
        stdout = self.process.stdout
        assert stdout is not None
        ready = threading.Event()

        def watch() -> None:
            for line in stdout:
                if line.strip() == b"started":
                    ready.set()

        threading.Thread(target=watch, daemon=True).start()
        if not ready.wait(timeout_s):
            self.kill()
            raise AssertionError(f"the pipeline's driver did not start within {timeout_s} s (see its log)")

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def _last(checkpoint: Path, kind: str) -> int:
    """The last batch id in the checkpoint's offset log (`offsets`) or commit log (`commits`)."""
    ids = [int(p.name) for p in (checkpoint / kind).glob("*") if p.name.isdigit()]
    return max(ids, default=-1)


def _unfinished_batch(checkpoint: Path) -> bool:
    """A batch was planned (offset log) but not committed: Spark runs it again at the restart."""
    return _last(checkpoint, "offsets") > _last(checkpoint, "commits")


def _batch_seconds(checkpoint: Path) -> float:
    """How long a recent batch took from its plan (offset log) to its commit (commit log), in seconds: the median
    of the last five (a restart's first batches are long, the later ones short)."""
    spans = []
    for batch in range(_last(checkpoint, "commits"), -1, -1)[:5]:
        with contextlib.suppress(FileNotFoundError):
            spans.append(
                (checkpoint / "commits" / str(batch)).stat().st_mtime
                - (checkpoint / "offsets" / str(batch)).stat().st_mtime
            )  # fmt: skip
    return statistics.median(spans) if spans else 1.0


def _kill_inside_a_batch(driver: Driver, checkpoint: Path, rng: random.Random) -> None:
    """SIGKILL the driver at a random point of a batch: between its plan and its commit (a batch whose commit
    comes first is let go, and the next one tried). Spans of earlier batches say how long a batch takes."""
    span = _batch_seconds(checkpoint)
    seen = _last(checkpoint, "offsets")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        wait_until(lambda: _last(checkpoint, "offsets") > seen or not driver.alive(), timeout_s=60,  # noqa: B023
                   what="the next batch planned")  # fmt: skip
        assert driver.alive(), "the pipeline's driver died on its own (see driver.log)"
        batch = seen = _last(checkpoint, "offsets")
        kill_at = time.monotonic() + rng.uniform(0.0, span)
        while time.monotonic() < kill_at and _last(checkpoint, "commits") < batch:
            time.sleep(0.005)
        if _last(checkpoint, "commits") < batch:
            driver.kill()
            return
    raise AssertionError("no batch stayed uncommitted long enough to be killed within 120 s")


class Events:
    """Events for every key each event-time second, up to 1.5 s out of order, an honest W_SET after each."""

    def __init__(self, producer: WatermarkProducer) -> None:
        self.producer = producer
        self.truth: Counter[tuple[int, str]] = Counter()
        self.second = 0
        self.rng = random.Random(28)
        self.stop = threading.Event()

    def step(self) -> None:
        for key in KEYS:
            event_time = BASE + self.second * 1000 + self.rng.randint(0, 1_500)
            self.producer.send(key.encode(), partition_key=key, event_timestamp=event_time)
            self.truth[(event_time - event_time % WINDOW_MS, key)] += 1
        self.producer.new_watermark().event_time(BASE + self.second * 1000).send()
        self.second += 1

    def run(self) -> None:
        while not self.stop.wait(STEP_S):
            self.step()


def _output_rows(client: pulsar.Client, output: str) -> tuple[list[tuple[int, str, int]], list[int]]:
    """Every data row of the output topic, and every W_SET value, as a plain reader sees them."""
    import msgpack

    reader = client.create_reader(output, pulsar.MessageId.earliest)
    rows: list[tuple[int, str, int]] = []
    marks: list[int] = []
    try:
        while reader.has_message_available():
            message = reader.read_next(10_000)
            kind = message.properties().get(MARKER_PROPERTY)
            if kind is not None:
                if kind == "W_SET":
                    marks.append(int(msgpack.unpackb(message.data())["event_time"]))
                continue
            row = json.loads(message.data())
            rows.append((int(row["start"]), str(row["key"]), int(row["count"])))
    finally:
        reader.close()
    return rows, marks


@pytest.mark.usefixtures("generator")
def test_each_window_is_written_exactly_once_across_random_sigkills_of_the_driver(
    spark: SparkSession,
    pulsar_settings: PulsarSettings,
    pulsar_client: pulsar.Client,
    admin: PulsarAdmin,
    topic: str,
    tmp_path: Path,
) -> None:
    from tests.integration.test_spark import deduplicated

    output = deduplicated(admin, f"{topic}-counts")
    admin.create_topic(topic, partitions=2)
    producer = WatermarkProducer(pulsar_client, topic, producer_name="sensors")
    producer.new_watermark().event_time(BASE).send()
    events = Events(producer)
    feeder = threading.Thread(target=events.run, daemon=True)
    feeder.start()
    checkpoint = tmp_path / "ckpt"
    rng = random.Random(2828)
    unfinished = 0
    with (tmp_path / "driver.log").open("wb") as log:
        try:
            kills = 0
            while kills < KILLS or (unfinished == 0 and kills < KILLS + EXTRA_KILLS):
                inside = kills % 2 == 0 or kills >= KILLS  # every other kill, and any extra one, inside a batch
                committed = _last(checkpoint, "commits")
                driver = Driver(pulsar_settings, topic, output, checkpoint, log)
                driver.wait_started()
                wait_until(
                    lambda: _last(checkpoint, "commits") > committed or not driver.alive(),  # noqa: B023
                    timeout_s=180, what="a batch of the restarted driver",
                )  # fmt: skip
                assert driver.alive(), "the pipeline's driver died on its own (see driver.log)"
                if inside:
                    _kill_inside_a_batch(driver, checkpoint, rng)
                else:
                    time.sleep(rng.uniform(0.0, 4.0))  # anywhere: between batches or inside one
                    assert driver.alive(), "the pipeline's driver died on its own (see driver.log)"
                    driver.kill()
                kills += 1
                unfinished += _unfinished_batch(checkpoint)
                print(
                    f"kill {kills} ({'inside a batch' if inside else 'at a random moment'}): batches planned "
                    f"{_last(checkpoint, 'offsets') + 1}, committed {_last(checkpoint, 'commits') + 1}"
                )
            events.stop.set()
            feeder.join()
            producer.new_watermark().event_time(BASE + (events.second + 60) * 1000).send()  # closes every window
            expected = {window: count for window, count in events.truth.items()}
            driver = Driver(pulsar_settings, topic, output, checkpoint, log)
            driver.wait_started()
            wait_until(
                lambda: len(_output_rows(pulsar_client, output)[0]) >= len(expected), timeout_s=240,
                what="every window's row in the output topic",
            )  # fmt: skip
            time.sleep(3)  # a row written twice would show now
            driver.kill()
        finally:
            events.stop.set()
    rows, marks = _output_rows(pulsar_client, output)
    log_text = (tmp_path / "driver.log").read_text(errors="replace")
    skipped_rows, skipped_marks = log_text.count("rows from"), log_text.count("its W_SET already written")
    print(
        f"{kills} kills, {unfinished} with a batch planned and not committed, {_last(checkpoint, 'commits') + 1} "
        f"batches; {len(rows)} rows, {len(marks)} W_SETs; tasks that found rows already written: {skipped_rows}, "
        f"W_SETs found written: {skipped_marks}"
    )
    windows = [(start, key) for start, key, _ in rows]
    assert len(windows) == len(set(windows)), f"rows written twice: {[w for w, n in Counter(windows).items() if n > 1]}"
    assert {(start, key): count for start, key, count in rows} == expected
    assert marks == sorted(marks), "the output's watermark went back"
    assert unfinished >= 1, "no kill landed inside a batch: the run did not test a replayed batch"

    # downstream: a query on the output closes its 20 s windows on the upstream query's watermark
    sums: dict[int, int] = {}
    lock = threading.Lock()

    def collect(df: DataFrame, _batch: int) -> None:
        found = {int(r["window"]["start"].timestamp() * 1000): int(r["n"]) for r in df.collect()}
        with lock:
            sums.update(found)

    downstream = (
        spark_sink.read_stream(spark, topic=output, subscription="downstream")
        .withColumn("n", F.get_json_object(F.col("value").cast("string"), "$.count").cast("long"))
        .groupBy(F.window("event_time", "20 seconds")).agg(F.sum("n").alias("n"))
        .writeStream.outputMode("append").foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "down")).trigger(processingTime="500 milliseconds").start()
    )  # fmt: skip
    truth: Counter[int] = Counter()
    for (start, _key), count in expected.items():
        end = start + WINDOW_MS  # the sink's rows carry the window's end as their event time
        truth[end - end % DOWNSTREAM_WINDOW_MS] += count
    try:
        wait_until(lambda: len(sums) >= len(truth), timeout_s=180, what="every downstream window to close")
    finally:
        downstream.stop()
    assert sums == dict(truth)
    producer.close()


def _payloads(client: pulsar.Client, topic: str) -> list[str]:
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    try:
        return [reader.read_next(10_000).data().decode() for _ in iter(reader.has_message_available, False)]
    finally:
        reader.close()


def test_entries_run_again_after_a_death_are_dropped_whole_or_written_whole(
    pulsar_client: pulsar.Client, admin: PulsarAdmin, namespace: str
) -> None:
    """What the sink's batching rests on, on the real broker and client: the broker keeps an entry's first
    sequence id only, drops an entry sent again whole, and takes an entry that straddles it whole (rows
    twice: why a run again must cut the very same entries)."""
    from spark_sink.sink import ENTRY_PRODUCER, entries_to_send, send_entries, sequence_id
    from tests.integration.test_spark import deduplicated

    output = deduplicated(admin, f"persistent://{namespace}/entries")  # no generator: only the sink's entries
    batch, limits = 7, (3, 1 << 20)
    messages = [(f"r{row}".encode(), {}) for row in range(10)]
    sizes = [len(payload) for payload, _ in messages]

    def run(entries_sent: int | None) -> list[range]:
        """A task's run that dies (its producer gone) after `entries_sent` entries; the entries it sent."""
        producer = pulsar_client.create_producer(output, producer_name="task-0", **ENTRY_PRODUCER)
        try:
            entries = entries_to_send(batch, sizes, producer.last_sequence_id(), *limits)[:entries_sent]
            send_entries(producer, batch, messages, entries)
            return entries
        finally:
            producer.close()

    assert run(2) == [range(0, 3), range(3, 6)]
    producer = pulsar_client.create_producer(output, producer_name="task-0", **ENTRY_PRODUCER)
    assert producer.last_sequence_id() == sequence_id(batch, 3), "the broker keeps an entry's first sequence id"
    send_entries(producer, batch, messages, [range(0, 3), range(3, 6)])  # the same entries again: dropped whole
    producer.close()
    assert _payloads(pulsar_client, output) == [f"r{row}" for row in range(6)]
    assert run(None) == [range(6, 9), range(9, 10)]
    assert run(None) == []
    assert _payloads(pulsar_client, output) == [f"r{row}" for row in range(10)]

    producer = pulsar_client.create_producer(output, producer_name="task-1", **ENTRY_PRODUCER)
    send_entries(producer, batch, messages, [range(0, 3)])
    send_entries(producer, batch, messages, [range(1, 5)])  # straddles the last entry: taken whole
    producer.close()
    assert _payloads(pulsar_client, output)[10:] == ["r0", "r1", "r2", "r1", "r2", "r3", "r4"]


def _pass_through(spark: SparkSession, topic: str, output: str, checkpoint: Path, min_partitions: int) -> None:
    """One run of a pass-through query over what `topic` holds now (Trigger.AvailableNow), to its end: no
    shuffle, so each task of the source's batch is a task of the sink, writing under its own producer name."""
    query = (
        spark_sink.read_stream(spark, topic=topic, subscription="replay", minPartitions=str(min_partitions))
        .select("value", "key", "event_time")
        .writeStream.format("pulsar-watermark")
        .option("topic", output)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(300), "the pass-through query did not finish within 300 s"
    assert query.exception() is None, f"the pass-through query failed: {query.exception()}"


def _rows(client: pulsar.Client, topic: str) -> Counter[str]:
    """How often each data row (payload) is in `topic`, markers left out."""
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    found: Counter[str] = Counter()
    try:
        while reader.has_message_available():
            message = reader.read_next(10_000)
            if MARKER_PROPERTY not in message.properties():
                found[message.data().decode()] += 1
    finally:
        reader.close()
    return found


def _write_entries(client: pulsar.Client, topic: str, partitions: int, rows: range) -> list[str]:
    """One message per entry (no client batching) on every partition of `topic`; the payloads written."""
    from pulsar_access.topics import partition_name

    written = []
    for partition in range(partitions):
        # blocking when the client's queue (1000 by default) is full: a send_async that fails is lost unseen
        producer = client.create_producer(partition_name(topic, partition), batching_enabled=False,
                                          block_if_queue_full=True)  # fmt: skip
        for row in rows:
            payload = f"{partition}-{row:05d}"
            producer.send_async(payload.encode(), None)
            written.append(payload)
        producer.flush()
        producer.close()
    return written


def test_a_batch_replayed_with_another_min_partitions_writes_each_row_exactly_once(
    spark: SparkSession, pulsar_client: pulsar.Client, admin: PulsarAdmin, namespace: str, tmp_path: Path
) -> None:
    """Issue 35, fault 1: the replay of a batch is cut into the tasks it was planned with, not into what the
    restarted driver would choose (its CPU count, its `minPartitions`).

    Batch 1 (4 partitions of 3000 entries) is written by 4 tasks. Its commit is then taken out of the checkpoint:
    what a driver killed after the write and before the commit leaves behind, so Spark runs batch 1 again at the
    restart, here with `minPartitions` 2. Cut into 2 tasks, the first would have covered partitions 0 and 1
    under the producer name of the first run's partition 0 alone, and the broker's last sequence id of that
    name would have let half of its rows through again. Every row of the output is checked, each exactly once.
    """
    from tests.integration.test_spark import deduplicated

    # No generator follows this namespace: a W_SNAPSHOT written into the topic would be new data for the run again
    # (Trigger.AvailableNow), and make a batch 2 that this test counts out.
    topic = f"persistent://{namespace}/replayed-source"
    spark_sink.register(spark)
    admin.create_topic(topic, partitions=4)
    output = deduplicated(admin, f"{topic}-replayed")
    checkpoint = tmp_path / "ckpt"
    expected = _write_entries(pulsar_client, topic, 4, range(10))
    _pass_through(spark, topic, output, checkpoint, min_partitions=4)  # batch 0: a start kept in the checkpoint
    expected += _write_entries(pulsar_client, topic, 4, range(10, 3010))
    _pass_through(spark, topic, output, checkpoint, min_partitions=4)  # batch 1
    assert (_last(checkpoint, "offsets"), _last(checkpoint, "commits")) == (1, 1)
    planned = json.loads((checkpoint / "offsets" / "1").read_text().splitlines()[2])
    assert planned["tasks"] == 4, "batch 1 was planned for 4 tasks"
    assert _rows(pulsar_client, output) == Counter(expected), "the first runs did not write each row once"

    for name in ("1", ".1.crc"):  # the driver died between batch 1's write and its commit
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    _pass_through(spark, topic, output, checkpoint, min_partitions=2)  # a driver with other options runs it again
    assert (_last(checkpoint, "offsets"), _last(checkpoint, "commits")) == (1, 1), "batch 1 was not run again"

    written = _rows(pulsar_client, output)
    twice = sorted(payload for payload, count in written.items() if count > 1)
    missing = sorted(set(expected) - set(written))
    assert not twice and not missing, f"{len(twice)} rows written twice (e.g. {twice[:5]}), {len(missing)} lost"
    assert written == Counter(expected)
