"""`make demo`: producers with watermarks, a Spark query on the broker watermark, and a comparison.

Three sensors write out-of-order events (up to 8 s late) to a partitioned topic: one goes idle
halfway, one sends its watermarks inside watermark transactions. One Spark query counts events in
10 s windows on the broker watermark (`spark_sink.read_stream`) and writes the results, with its
watermark, to an output topic that a consumer reads. Beside it, the same count with Spark's
heuristic watermark (`withWatermark("event_time", delay)`) at two delays. At the end: a table of
windows against the ground truth, and a PNG plot of event times and watermarks over time.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

WINDOW_S = 10
EVENT_SECONDS = 60  # event time covered by the demo
SPEEDUP = 1  # event-time seconds per wall-clock second: real time, so disorder spans several Spark batches
MAX_DISORDER_MS = 8_000
HEURISTIC_DELAYS_S = (1, 3)
OUT_DIR = Path(__file__).resolve().parent.parent / "docs" / "demo"


def say(message: str) -> None:
    print(f"[demo] {message}", flush=True)


class Sensor(threading.Thread):
    """An honest producer: events up to 8 s out of order, W_SET(clock - 8 s) twice a second."""

    def __init__(
        self,
        client: Any,
        topic: str,
        name: str,
        base: int,
        log: list[tuple[float, int, str]],
        promises: list[tuple[float, str, int | None]],
        idle_at_s: int | None = None,
        transactional: bool = False,
    ) -> None:
        super().__init__(name=name)
        from producer import WatermarkProducer

        self.producer = WatermarkProducer(client, topic, producer_name=name)
        self.base, self.log, self.idle_at_s, self.transactional = base, log, idle_at_s, transactional
        self.promises = promises
        """(wall time, producer, W_SET value or None for W_IDLE) once each marker is sent."""
        self.truth: Counter[int] = Counter()
        self.rng = random.Random(name)

    def run(self) -> None:
        started = time.monotonic()
        step_ms = 250
        for clock in range(0, EVENT_SECONDS * 1000, step_ms):
            if self.idle_at_s is not None and clock >= self.idle_at_s * 1000:
                self.producer.new_watermark().mark_idle().send()
                self.promises.append((time.monotonic(), self.name, None))
                say(f"{self.name} goes idle at event second {self.idle_at_s}")
                return
            event_time = self.base + clock - self.rng.randint(0, MAX_DISORDER_MS)
            self.producer.send(self.name.encode(), partition_key=self.name, event_timestamp=event_time)
            self.truth[(event_time - self.base) // (WINDOW_S * 1000)] += 1
            self.log.append((time.monotonic(), event_time, self.name))
            if clock % 500 == 0:
                promise = self.base + clock - MAX_DISORDER_MS
                if self.transactional:
                    txn = self.producer.new_transaction()
                    self.producer.new_watermark(txn).event_time(promise).send()
                    txn.commit()
                else:
                    self.producer.new_watermark().event_time(promise).send()
                self.promises.append((time.monotonic(), self.name, promise))
            time.sleep(max(0.0, started + (clock + step_ms) / 1000 / SPEEDUP - time.monotonic()))
        final = self.base + (EVENT_SECONDS + 20) * 1000
        self.producer.new_watermark().event_time(final).send()
        self.promises.append((time.monotonic(), self.name, final))


def main() -> int:
    from devtools.local_cluster import ClusterError, LocalCluster

    cluster = LocalCluster.from_env()
    try:
        cluster.up()
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    from pyspark.sql import functions as F

    import spark_sink
    from consumer import Watermark, WatermarkConsumer, WatermarkListener
    from pulsar_access.admin import PulsarAdmin
    from pulsar_access.settings import PulsarSettings

    settings = PulsarSettings(cluster.service_url, cluster.admin_url)
    topic = f"persistent://public/default/demo-{uuid.uuid4().hex[:6]}"
    output = f"{topic}-counts"
    admin = PulsarAdmin(settings)
    admin.create_topic(topic, partitions=2)
    admin.create_topic(output)
    admin.set_topic_deduplication(output)  # the sink writes exactly once through Pulsar's deduplication
    deadline = time.monotonic() + 30
    while not admin.deduplication_enabled(output) and time.monotonic() < deadline:
        time.sleep(0.2)  # a topic policy takes effect once the broker has read it back
    client = settings.client()
    say("starting Spark (local[2]) ...")
    spark = spark_sink.local_session(cluster.service_url, cluster.admin_url)
    checkpoints = Path(f"/tmp/pulsar-wm-demo-{uuid.uuid4().hex[:6]}")

    results: dict[str, dict[int, tuple[int, float]]] = {"broker": {}}  # query -> window -> (count, wall time)
    watermark_log: list[tuple[float, str, int]] = []

    class Downstream(WatermarkListener):
        def received(self, consumer: WatermarkConsumer, message: Any) -> None:
            row = json.loads(message.data())
            results["broker"][row["window"]] = (row["count"], time.monotonic())
            consumer.acknowledge(message)

        def received_watermark(self, consumer: WatermarkConsumer, watermark: Watermark) -> None:
            watermark_log.append((time.monotonic(), "output topic", watermark.event_time))

    downstream = WatermarkConsumer(client, output, "demo-downstream", listener=Downstream())
    events: list[tuple[float, int, str]] = []
    promises: list[tuple[float, str, int | None]] = []
    base = (int(time.time() * 1000) // 60_000) * 60_000 + 60_000
    window_ms = WINDOW_S * 1000

    def window_index(column: Any) -> Any:
        return ((F.col(column).cast("double") * 1000 - F.lit(base)) / F.lit(window_ms)).cast("long")

    broker_counts = (
        spark_sink.read_stream(spark, topic=topic, subscription="demo-broker")
        .groupBy(F.window("event_time", f"{WINDOW_S} seconds"))
        .count()
    )
    queries = [
        broker_counts.select(
            F.to_json(F.struct(window_index("window.start").alias("window"), "count")).alias("value"),
            F.col("window.end").alias("event_time"),
        )
        .writeStream.queryName("broker")
        .format("pulsar-watermark")
        .option("topic", output)
        .outputMode("append")
        .option("checkpointLocation", str(checkpoints / "broker"))
        .trigger(processingTime="1 second")
        .start()
    ]
    for delay in HEURISTIC_DELAYS_S:
        name = f"heuristic {delay}s"
        results[name] = {}
        raw = (
            spark.readStream.format("pulsar-watermark")
            .option("topic", topic)
            .option("subscription", f"demo-heuristic-{delay}")
            .load()
            .filter(~F.col("is_watermark"))
        )
        counts = (
            raw.withWatermark("event_time", f"{delay} seconds")
            .groupBy(F.window("event_time", f"{WINDOW_S} seconds"))
            .count()
        )

        def collect(df: Any, _batch: int, name: str = name) -> None:
            for row in df.collect():
                index = int((row["window"]["start"].timestamp() * 1000 - base) // window_ms)
                results[name][index] = (int(row["count"]), time.monotonic())

        queries.append(
            counts.writeStream.queryName(f"heuristic_{delay}s")
            .foreachBatch(collect)
            .outputMode("append")
            .option("checkpointLocation", str(checkpoints / f"h{delay}"))
            .trigger(processingTime="1 second")
            .start()
        )
    say("waiting for the queries' first batches ...")
    while any(q.lastProgress is None for q in queries):
        _check_running(queries)
        time.sleep(0.5)

    sensors = [
        Sensor(client, topic, "sensor-a", base, events, promises),
        Sensor(client, topic, "sensor-b", base, events, promises, idle_at_s=EVENT_SECONDS // 2),
        Sensor(client, topic, "sensor-c", base, events, promises, transactional=True),
    ]
    say(f"3 sensors write {EVENT_SECONDS} s of event time ({EVENT_SECONDS // SPEEDUP} s of wall time) to {topic}")
    started = time.monotonic()
    for sensor in sensors:
        sensor.start()
    windows = EVENT_SECONDS // WINDOW_S
    deadline = time.monotonic() + EVENT_SECONDS / SPEEDUP + 90
    while time.monotonic() < deadline and len(results["broker"]) < windows:
        for query in queries:
            progress = query.lastProgress or {}
            watermark = (progress.get("eventTime") or {}).get("watermark")
            if watermark:
                watermark_log.append((time.monotonic(), f"Spark {query.name}", _iso_ms(watermark)))
        _check_running(queries)
        say(
            f"{time.monotonic() - started:5.1f} s: windows closed — "
            + ", ".join(f"{name}: {len(found)}" for name, found in results.items())
        )
        time.sleep(2)
    time.sleep(3)
    for query in queries:
        query.stop()
    downstream.close()
    truth: Counter[int] = sum((s.truth for s in sensors), Counter())
    promise = promise_curve(promises)
    _report(truth, results, base, started, windows, promise)
    _plot(events, watermark_log + [(t, "producers' promise (min active W_SET)", wm) for t, wm in promise], base,
          started)  # fmt: skip
    spark.stop()
    client.close()
    say("stop the cluster with 'make cluster-down'")
    return 0


def _check_running(queries: list[Any]) -> None:
    """A query that died stops the demo with its error instead of a wait that never ends."""
    for query in queries:
        if not query.isActive:
            raise SystemExit(f"the Spark query {query.name} stopped: {query.exception()}; see the log above")


def _iso_ms(text: str) -> int:
    from datetime import datetime

    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def promise_curve(promises: list[tuple[float, str, int | None]]) -> list[tuple[float, int]]:
    """The producers' own promise over wall time: the minimum over active producers of their latest
    W_SET (contract section 1), from the markers as they were sent; it never goes back."""
    latest: dict[str, int] = {}
    curve: list[tuple[float, int]] = []
    for at, name, value in sorted(promises, key=lambda p: p[0]):
        if value is None:
            latest.pop(name, None)
        else:
            latest[name] = value
        if latest:
            floor = min(latest.values())
            if not curve or floor > curve[-1][1]:
                curve.append((at, floor))
    return curve


def promise_passed(curve: list[tuple[float, int]], event_time: int) -> float | None:
    """The wall time at which the producers' promise first reached `event_time` (None: never)."""
    return next((at for at, floor in curve if floor >= event_time), None)


def _report(
    truth: Counter[int], results: dict[str, dict[int, tuple[int, float]]], base: int, started: float, windows: int,
    promise: list[tuple[float, int]],
) -> None:  # fmt: skip
    say(f"windows of {WINDOW_S} s: ground truth vs each query (count, wall seconds after the window's end passed)")
    header = f"{'window':>8} {'truth':>6} " + " ".join(f"{name:>22}" for name in results)
    print(header)
    summary = {name: [0, 0, 0.0, 0] for name in results}  # dropped rows, wrong windows, delay sum, never closed
    beyond: dict[str, list[float]] = {name: [] for name in results}  # close time - time the promise passed the end
    for index in range(windows):
        cells = []
        window_end_wall = started + (index + 1) * WINDOW_S / SPEEDUP
        for name, found in results.items():
            count, at = found.get(index, (0, float("nan")))
            if index in found:
                summary[name][0] += max(0, truth[index] - count)
                summary[name][2] += at - window_end_wall
                promised = promise_passed(promise, base + (index + 1) * WINDOW_S * 1000)
                if promised is not None:
                    beyond[name].append(at - promised)
            else:
                summary[name][3] += 1
            summary[name][1] += count != truth[index]
            cells.append(f"{count:>8} {'ok' if count == truth[index] else 'WRONG':>5} {at - window_end_wall:6.1f}s")
        print(f"{index * WINDOW_S:>7}s {truth[index]:>6} " + " ".join(f"{c:>22}" for c in cells))
    for name, (dropped, wrong, delay, never) in summary.items():
        closed = windows - int(never)
        extra = beyond[name]
        say(
            f"{name}: on-time rows dropped {dropped}, wrong windows {wrong}, windows never closed {never}, "
            f"mean wall delay {delay / max(1, closed):.1f} s, of which beyond the producers' promise "
            f"{sum(extra) / max(1, len(extra)):.1f} s"
        )
    _record({f"demo_ontime_rows_dropped_{_key(name)}": int(d) for name, (d, _, _, _) in summary.items()})
    _record({f"demo_windows_never_closed_{_key(name)}": int(n) for name, (_, _, _, n) in summary.items()})
    _record({
        f"demo_delay_beyond_promise_s_{_key(name)}": round(sum(extra) / len(extra), 2)
        for name, extra in beyond.items() if extra
    })  # fmt: skip
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "summary.json").write_text(
        json.dumps(
            {
                name: {"ontime_rows_dropped": d, "wrong_windows": w, "never_closed": n}
                for name, (d, w, _, n) in summary.items()
            },
            indent=2,
        )
    )


def _key(name: str) -> str:
    return name.replace("heuristic ", "heuristic_").replace(" ", "_")


def _record(figures: dict[str, int] | dict[str, float]) -> None:
    """Add the comparison to docs/benchmarks.json when run from the repository (`make demo`)."""
    try:
        from bench.common import write_results
    except ImportError:
        return
    write_results(
        {
            **figures,
            "demo_ontime_rows_dropped_broker_how": f"make demo: 3 sensors, {EVENT_SECONDS} s of event time at "
            f"{SPEEDUP}x speed, up to {MAX_DISORDER_MS // 1000} s out of order; rows of emitted windows missing "
            "against the ground truth, per query",
            "demo_delay_beyond_promise_s_broker_how": "make demo: per query, the mean over closed windows of the "
            "wall time from the moment the producers' promise (the minimum active W_SET, as sent) passed the "
            "window's end to the window's row",
        }
    )


def _plot(
    events: list[tuple[float, int, str]], watermarks: list[tuple[float, str, int]], base: int, started: float
) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        say("matplotlib is not installed: no plot")
        return
    figure, axes = plt.subplots(figsize=(10, 5))
    for name in sorted({e[2] for e in events}):
        points = [(t - started, (et - base) / 1000) for t, et, n in events if n == name]
        xs, ys = zip(*points, strict=True)
        axes.scatter(xs, ys, s=6, label=f"events {name}")
    for name in sorted({w[1] for w in watermarks}):
        points = sorted(
            (t - started, (wm - base) / 1000) for t, n, wm in watermarks if n == name and wm >= base - 60_000
        )
        if points:
            xs, ys = zip(*points, strict=True)
            axes.step(xs, ys, where="post", label=f"watermark: {name}")
    axes.set_xlabel("wall clock (s)")
    axes.set_ylabel("event time (s)")
    axes.legend(fontsize=7)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    figure.savefig(OUT_DIR / "watermarks.png", dpi=110)
    say(f"plot written to {OUT_DIR / 'watermarks.png'}")


if __name__ == "__main__":
    sys.exit(main())
