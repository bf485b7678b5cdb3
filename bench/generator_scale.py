"""Issue 13: what the generator costs at a realistic scale, most partitions idle, markers at a human cadence.

- idle cost: 1000 partitions (10 partitioned topics of 100), each with a subscription and one `W_SET`,
  then nothing for 30 s: the generator's CPU share and its thread count (and the threads at 10 partitions);
- cadence latency: 200 topics, each producer sends one `W_SET` a second and its consumer acknowledges it;
  from that acknowledgement to the watermark at the consumer's feed;
- CPU per 1000 `W_SET`/s: the same 1000 partitions, each getting one `W_SET` a second;
- ownership: 300 non-partitioned topics followed by 3 instances: the largest share one instance owns.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pulsar

from bench.common import say
from bench.generator import Generator, new_namespace
from broker_ext.ownership import owner_of
from consumer.watermark_feed import WatermarkFeed
from producer import WatermarkProducer
from pulsar_access.admin import PulsarAdmin
from pulsar_access.settings import PulsarSettings
from watermark_core.protocol import MARKER_PROPERTY, Watermark, decode_marker

SETTLE_S = 20.0
OWNERSHIP_SETTLE_S = 40.0
IDLE_S = 30.0
CADENCE_S = 60.0
CADENCE_WARMUP_S = 10.0


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _acknowledging(client: pulsar.Client, topic: str, subscription: str, on_ack: Callable[[pulsar.Message], None]
                   | None = None) -> pulsar.Consumer:  # fmt: skip
    """A plain consumer that acknowledges every message as it comes (markers included), on the client's thread."""

    def listener(consumer: pulsar.Consumer, message: pulsar.Message) -> None:
        consumer.acknowledge(message)
        if on_ack is not None:
            on_ack(message)

    return client.subscribe(topic, subscription, message_listener=listener,
                            initial_position=pulsar.InitialPosition.Earliest)  # fmt: skip


@contextmanager
def partitioned_topics(client: pulsar.Client, admin: PulsarAdmin, namespace: str, topics: int,
                       partitions: int) -> Iterator[list[WatermarkProducer]]:  # fmt: skip
    """`topics` partitioned topics, each with an acknowledging subscription and a producer that sent one W_SET."""
    names = [f"persistent://{namespace}/scale-{i}" for i in range(topics)]
    for name in names:
        admin.create_topic(name, partitions)
    consumers = [_acknowledging(client, name, "app") for name in names]
    producers = [WatermarkProducer(client, name, producer_name=f"p{i}", keepalive_interval_ms=None)
                 for i, name in enumerate(names)]  # fmt: skip
    for producer in producers:
        producer.new_watermark().event_time(1_000).send()
    try:
        yield producers
    finally:
        for producer in producers:
            producer.close(idle=False)
        for consumer in consumers:
            consumer.close()


def idle_cost(settings: PulsarSettings, client: pulsar.Client, admin: PulsarAdmin, log_dir: Path,
              topics: int, partitions: int) -> tuple[float, int, float, float]:  # fmt: skip
    """(CPU share while idle, threads, CPU share while every partition gets one W_SET a second, take-over s).

    Idle is measured once the generator has taken over every partition (a watermark published for each),
    and `SETTLE_S` after that: the take-over's own cost is its time, reported apart.
    """
    namespace = new_namespace(admin)
    with partitioned_topics(client, admin, namespace, topics, partitions) as producers:
        gen = Generator(settings, namespace, log_dir)
        try:
            takeover = gen.wait_published(topics * partitions, within_s=600)
            say(
                f"  {topics * partitions} partitions taken over in {takeover:.1f} s; settling {SETTLE_S:.0f} s, "
                f"then {IDLE_S:.0f} s idle"
            )
            time.sleep(SETTLE_S)
            before = gen.cpu_seconds()
            time.sleep(IDLE_S)
            idle = (gen.cpu_seconds() - before) / IDLE_S
            threads = threads_of(gen.proc.pid)
            say(f"  idle: {idle:.3f} of a core, {threads} threads; now one W_SET/s per partition for {IDLE_S:.0f} s")
            stop = threading.Event()

            def cadence() -> None:
                t = 2_000
                while not stop.wait(1.0):
                    t += 1_000
                    for producer in producers:
                        producer.new_watermark().event_time(t).send_async()

            ticker = threading.Thread(target=cadence, daemon=True)
            ticker.start()
            time.sleep(5)
            before = gen.cpu_seconds()
            time.sleep(IDLE_S)
            busy = (gen.cpu_seconds() - before) / IDLE_S
            stop.set()
            ticker.join()
        finally:
            gen.kill()
    return idle, threads, busy, takeover


class Latencies:
    """Acknowledgement times of W_SETs and when each value reached the feed, per topic."""

    def __init__(self) -> None:
        self.acked: dict[tuple[int, int], float] = {}
        self.seen: dict[tuple[int, int], float] = {}
        self.lock = threading.Lock()

    def ack(self, topic: int) -> Callable[[pulsar.Message], None]:
        def record(message: pulsar.Message) -> None:
            if message.properties().get(MARKER_PROPERTY) == "W_SET":
                marker = decode_marker(message.properties(), message.data(), message.producer_name(), (0, 0, -1), 0)
                if marker is not None and marker.event_time is not None:
                    with self.lock:
                        self.acked.setdefault((topic, marker.event_time), time.perf_counter())

        return record

    def watermark(self, topic: int) -> Callable[[Watermark | None], None]:
        def record(watermark: Watermark | None) -> None:
            if watermark is None:  # distrusted after a move back: nothing to time
                return
            with self.lock:
                self.seen.setdefault((topic, watermark.event_time), time.perf_counter())

        return record


def cadence_latency(settings: PulsarSettings, client: pulsar.Client, admin: PulsarAdmin, log_dir: Path,
                    topics: int = 200) -> tuple[float, float, int, float]:  # fmt: skip
    """(p50 ms, p99 ms, samples, the generator's admin calls per W_SET) from a consumer's acknowledgement of a
    W_SET to the watermark at its feed."""
    namespace = new_namespace(admin)
    names = [f"persistent://{namespace}/cadence-{i}" for i in range(topics)]
    record = Latencies()
    producers = [WatermarkProducer(client, name, producer_name=f"c{i}", keepalive_interval_ms=None)
                 for i, name in enumerate(names)]  # fmt: skip
    consumers = [_acknowledging(client, name, "app", record.ack(i)) for i, name in enumerate(names)]
    gen = Generator(settings, namespace, log_dir)
    feeds = [WatermarkFeed(client, name, "app", record.watermark(i)) for i, name in enumerate(names)]
    stop = threading.Event()

    def cadence() -> None:
        """One W_SET a second per topic, the topics spread over the second (as independent producers are)."""
        t = 0
        while not stop.is_set():
            t += 1_000
            second = time.perf_counter()
            for i, producer in enumerate(producers):
                delay = second + i / topics - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                producer.new_watermark().event_time(t).send_async()
            stop.wait(max(0.0, second + 1.0 - time.perf_counter()))

    ticker = threading.Thread(target=cadence, daemon=True)
    ticker.start()
    time.sleep(CADENCE_S)
    stop.set()
    ticker.join()
    time.sleep(3)
    calls = gen.admin_calls()
    gen.kill()
    for feed in feeds:
        feed.close()
    for consumer in consumers:
        consumer.close()
    for producer in producers:
        producer.close(idle=False)
    with record.lock:
        latencies = [
            (record.seen[key] - acked) * 1000
            for key, acked in record.acked.items()
            if key in record.seen and key[1] > CADENCE_WARMUP_S * 1000
        ]
    quantiles = statistics.quantiles(latencies, n=100)
    return quantiles[49], quantiles[98], len(latencies), calls / max(1, len(record.acked))


def ownership_share(settings: PulsarSettings, client: pulsar.Client, admin: PulsarAdmin, log_dir: Path,
                    topics: int = 300, instances: int = 3,
                    instance_settings: list[PulsarSettings] | None = None) -> tuple[float, dict[str, int]]:  # fmt: skip
    """The largest share of `topics` non-partitioned topics that one of `instances` generators owns
    (`instance_settings`: where each instance finds Pulsar, e.g. each its own broker first)."""
    namespace = new_namespace(admin)
    names = [f"persistent://{namespace}/own-{i}" for i in range(topics)]
    for name in names:
        admin.create_topic(name)
    generators = [Generator(s, namespace, log_dir) for s in (instance_settings or [settings] * instances)]
    try:
        time.sleep(OWNERSHIP_SETTLE_S)
        owners: Counter[str] = Counter(owner_of(admin, name) for name in names)
    finally:
        for gen in generators:
            gen.kill()
    return max(owners.values()) / topics, dict(owners)


def run(settings: PulsarSettings, log_dir: Path) -> dict[str, float | int | str]:
    client = settings.client(message_listener_threads=4)
    admin = PulsarAdmin(settings)
    figures: dict[str, float | int | str] = {}
    try:
        say("idle cost at 10 partitions (1 topic of 10)")
        _, threads_10, _, _ = idle_cost(settings, client, admin, log_dir, 1, 10)
        say("idle cost at 1000 partitions (10 topics of 100)")
        idle, threads_1000, busy, takeover = idle_cost(settings, client, admin, log_dir, 10, 100)
        say("ack -> watermark at one W_SET a second on 200 topics")
        p50, p99, samples, calls_per_wset = cadence_latency(settings, client, admin, log_dir)
        say("ownership over 3 instances, 300 topics")
        share, owners = ownership_share(settings, client, admin, log_dir)
    finally:
        client.close()
        admin.close()
    figures.update({
        "generator_idle_cpu_1000_partitions": round(idle, 4),
        "generator_threads_1000_partitions": threads_1000,
        "generator_threads_10_partitions": threads_10,
        "generator_cpu_per_1000_wset_per_s": round(busy, 4),
        "generator_takeover_1000_partitions_s": round(takeover, 1),
        "generator_takeover_1000_partitions_s_how": "from the generator's start to a watermark published for each "
        "of the 1000 partitions' subscriptions (its wm_watermarks_published series), one instance",
        "watermark_latency_cadence_p50_ms": round(p50, 1),
        "watermark_latency_cadence_p99_ms": round(p99, 1),
        "generator_admin_calls_per_wset_cadence": round(calls_per_wset, 2),
        "generator_admin_calls_per_wset_cadence_how": "in the cadence run: the generator's admin calls (internal "
        "stats, stats) over the W_SETs acknowledged",
        "generator_ownership_max_share_3_instances": round(share, 3),
        "generator_idle_cpu_1000_partitions_how": "10 partitioned topics of 100 partitions, each with an "
        f"acknowledging subscription and one W_SET; {SETTLE_S:.0f} s after the take-over, generator process CPU "
        f"seconds over {IDLE_S:.0f} s idle (share of one core); threads from /proc/PID/task",
        "generator_cpu_per_1000_wset_per_s_how": "the same 1000 partitions, each getting one W_SET a second (one "
        f"W_SET per topic per second, sent to its 100 partitions); CPU share over {IDLE_S:.0f} s",
        "watermark_latency_cadence_p50_ms_how": f"200 topics, one W_SET per topic per second spread over the second, "
        f"an acknowledging consumer each; from the acknowledgement to the value at the consumer's WatermarkFeed; "
        f"{CADENCE_S:.0f} s, the first {CADENCE_WARMUP_S:.0f} s left out; {samples} samples",
        "generator_ownership_max_share_3_instances_how": f"300 non-partitioned topics, 3 generator instances, after "
        f"{OWNERSHIP_SETTLE_S:.0f} s: the largest count of topics one instance owns (broker_ext/ownership.py owner_of: "
        f"the claim's holder, or the Failover active consumer) over 300 ({owners})",
    })  # fmt: skip
    return figures


if __name__ == "__main__":
    import tempfile

    from bench.common import bench_cluster, write_results

    with bench_cluster() as cluster_settings, tempfile.TemporaryDirectory(prefix="wm-bench-scale-") as logs:
        write_results(run(cluster_settings, Path(logs)))
