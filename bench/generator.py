"""Issue 4: the generator's latency, read rate, per-subscription cost and restart time."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pulsar
import requests

from bench.common import metric_samples, process_cpu_seconds, say
from broker_ext.config import GeneratorConfig
from broker_ext.service import GeneratorService
from consumer.watermark_feed import WatermarkFeed
from devtools.local_cluster import free_port
from producer import WatermarkProducer
from pulsar_access.admin import PulsarAdmin
from pulsar_access.settings import PulsarSettings
from pulsar_access.topics import watermark_topic_for
from watermark_core.protocol import EVENT_PROPERTY, MARKER_PROPERTY, SEND_WATERMARK, Watermark, key_topic

FAST_ENV = {"WM_POLL_INTERVAL_S": "0.05", "WM_IDLE_POLL_INTERVAL_S": "1", "WM_SNAPSHOT_INTERVAL_MESSAGES": "10000"}
SHARED_SNAPSHOT_KEY = "the-bench-generators-shared-snapshot-key"
"""Every bench generator signs with it, as the instances of a deployment do (docs/SECURITY.md): a restart or a standby
restores from the snapshots the one before wrote instead of rebuilding each partition from the log."""


class Generator:
    """A `broker-ext serve` process following one namespace; its CPU time is read from /proc.

    `config_env`: its WM_* settings (default: FAST_ENV; {} for the generator's own defaults), over the shared
    snapshot key.
    """

    def __init__(
        self, settings: PulsarSettings, namespace: str, log_dir: Path, config_env: dict[str, str] | None = None
    ) -> None:
        self.instance_id = f"bench-{uuid.uuid4().hex[:6]}"
        self.metrics_port = free_port()
        env = {
            **os.environ, "WM_SNAPSHOT_KEY": SHARED_SNAPSHOT_KEY, **(FAST_ENV if config_env is None else config_env),
            "PULSAR_SERVICE_URL": settings.service_url, "PULSAR_ADMIN_URL": settings.admin_url,
            "WM_NAMESPACES": namespace, "WM_METRICS_PORT": str(self.metrics_port),
            "WM_INSTANCE_ID": self.instance_id,
        }  # fmt: skip
        self.log = (log_dir / f"generator-{uuid.uuid4().hex[:6]}.log").open("wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "broker_ext.cli", "serve"], env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT)  # fmt: skip

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.proc.pid)

    def subscriptions_published(self) -> int:
        """How many (partition, subscription) pairs this process has published a watermark for (its /metrics)."""
        try:
            return len(metric_samples(self.metrics_port, "wm_watermarks_published_total"))
        except requests.RequestException:
            return 0

    def admin_calls(self) -> float:
        """The admin calls this process made to follow cursors (its wm_admin_calls counters, every call kind)."""
        return sum(metric_samples(self.metrics_port, "wm_admin_calls_total"))

    def wait_published(self, pairs: int, within_s: float) -> float:
        """Seconds until a watermark was published for `pairs` (partition, subscription) pairs: the take-over done."""
        started = time.monotonic()
        while self.subscriptions_published() < pairs:
            self.check_alive()
            if time.monotonic() - started > within_s:
                raise TimeoutError(f"the generator published for {self.subscriptions_published()} of {pairs} "
                                   f"subscriptions within {within_s:.0f} s")  # fmt: skip
            time.sleep(0.5)
        return time.monotonic() - started

    def check_alive(self) -> None:
        """Raise if the process has ended: a bench waiting for its watermarks would otherwise wait out its limit."""
        code = self.proc.poll()
        if code is not None:
            raise RuntimeError(f"the generator exited with {code} (a negative code is the signal that ended it); "
                               f"its log is {self.log.name}")  # fmt: skip

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.log.close()


def new_namespace(admin: PulsarAdmin) -> str:
    namespace = f"public/bench-{uuid.uuid4().hex[:8]}"
    admin.create_namespace(namespace)
    return namespace


class WatermarkTimes:
    """When each watermark value was first seen by a consumer-side feed."""

    def __init__(self) -> None:
        self.seen: dict[int, float] = {}
        self.changed = threading.Condition()

    def __call__(self, watermark: Watermark | None) -> None:
        if watermark is None:
            return
        with self.changed:
            self.seen.setdefault(watermark.event_time, time.perf_counter())
            self.changed.notify_all()

    def wait_for(self, event_time: int, timeout_s: float) -> float | None:
        with self.changed:
            self.changed.wait_for(lambda: event_time in self.seen, timeout=timeout_s)
            return self.seen.get(event_time)


def watermark_latency(
    client: pulsar.Client, admin: PulsarAdmin, namespace: str, samples: int = 200
) -> dict[str, float]:
    """From the acknowledgement of a W_SET (that moves the mark-delete position past it) to the watermark."""
    topic = f"persistent://{namespace}/latency"
    producer = WatermarkProducer(client, topic, producer_name="lat", keepalive_interval_ms=None)
    consumer = client.subscribe(topic, "lat")
    times = WatermarkTimes()
    feed = WatermarkFeed(client, topic, "lat", times)
    latencies, ack_visible = [], []
    producer.new_watermark().event_time(1).send()
    consumer.acknowledge(consumer.receive(timeout_millis=10_000))
    times.wait_for(1, 30)  # the generator has found the topic
    for i in range(2, samples + 2):
        producer.new_watermark().event_time(i).send()
        marker = consumer.receive(timeout_millis=10_000)
        while marker.properties().get(MARKER_PROPERTY) != "W_SET":  # the generator's own snapshots
            consumer.acknowledge(marker)
            marker = consumer.receive(timeout_millis=10_000)
        acked = time.perf_counter()
        consumer.acknowledge(marker)
        if i % 10 == 0:  # the share of ack grouping: when the broker shows the position (sampled, it polls)
            target = (marker.message_id().ledger_id(), marker.message_id().entry_id())
            while admin.mark_delete_position(topic, "lat") < target:
                time.sleep(0.002)
            ack_visible.append((time.perf_counter() - acked) * 1000)
            times.wait_for(i, 10)
            continue
        seen = times.wait_for(i, 10)
        if seen is not None:
            latencies.append((seen - acked) * 1000)
    feed.close()
    consumer.close()
    producer.close(idle=False)
    quantiles = statistics.quantiles(latencies, n=100)
    return {
        "watermark_latency_p50_ms": round(quantiles[49], 1),
        "watermark_latency_p99_ms": round(quantiles[98], 1),
        "ack_to_mark_delete_p50_ms": round(statistics.median(ack_visible), 1),
    }


def _fill(client: pulsar.Client, topic: str, count: int, marker_every: int = 100) -> float:
    """Produce `count` messages as fast as one producer can; returns its rate (msg/s)."""
    producer = WatermarkProducer(
        client, topic, producer_name="fill", keepalive_interval_ms=None,
        batching_enabled=True, block_if_queue_full=True, max_pending_messages=10_000,
    )  # fmt: skip
    done = threading.Semaphore(0)

    def on_sent(_result: pulsar.Result, _msg_id: object) -> None:
        done.release()

    started = time.perf_counter()
    for i in range(count):
        producer.send_async(b"x" * 100, on_sent, event_timestamp=1_000_000 + i)
        if i % marker_every == marker_every - 1:
            producer.new_watermark().event_time(1_000_000 + i).send_async()
    producer.flush()
    for _ in range(count):
        done.acquire(timeout=60)
    rate = count / (time.perf_counter() - started)
    producer.new_watermark().event_time(1_000_000 + count).send()
    producer.close(idle=False)
    return rate


def generator_read_rate(
    settings: PulsarSettings, client: pulsar.Client, admin: PulsarAdmin, count: int
) -> dict[str, float]:
    """The generator's read rate on a full topic against the fastest single producer's rate."""
    namespace = new_namespace(admin)
    topic = f"persistent://{namespace}/read-rate"
    producer_rate = _fill(client, topic, count)
    service = GeneratorService(GeneratorConfig(namespaces=(namespace,), metrics_port=0), settings)
    runner = threading.Thread(target=service.run, daemon=True)
    started = time.perf_counter()
    runner.start()
    tail = admin.internal_stats(topic)["lastConfirmedEntry"]
    ledger, entry = (int(x) for x in tail.split(":"))
    while True:
        head = service.head_position(topic)
        if head is not None and head[:2] >= (ledger, entry):
            break
        time.sleep(0.01)
    read_rate = count / (time.perf_counter() - started)
    service.stop()
    runner.join(timeout=30)
    return {"producer_rate_msgs": round(producer_rate), "generator_read_rate_msgs": round(read_rate),
            "generator_vs_producer_rate_ratio": round(read_rate / producer_rate, 3)}  # fmt: skip


def drain_until(consumer: pulsar.Consumer, stop: threading.Event) -> None:
    """Receive and acknowledge everything until `stop`."""
    while not stop.is_set():
        try:
            consumer.acknowledge(consumer.receive(timeout_millis=200))
        except pulsar.Timeout:
            continue


def subscription_cost(settings: PulsarSettings, client: pulsar.Client, admin: PulsarAdmin, log_dir: Path) -> float:
    """Generator CPU seconds for the same stream followed by 10 subscriptions over 1."""
    costs: dict[int, list[float]] = {}
    for subscriptions in (1, 10, 1, 10):
        namespace = new_namespace(admin)
        topic = f"persistent://{namespace}/subs"
        gen = Generator(settings, namespace, log_dir)
        consumers = [client.subscribe(topic, f"s{i}") for i in range(subscriptions)]
        times = WatermarkTimes()
        feed = WatermarkFeed(client, topic, "s0", times)
        time.sleep(3)  # discovery
        before = gen.cpu_seconds()
        stop = threading.Event()
        threads = [threading.Thread(target=drain_until, args=(c, stop), daemon=True) for c in consumers]
        for thread in threads:
            thread.start()
        count = 20_000
        _fill(client, topic, count)
        times.wait_for(1_000_000 + count, 60)
        cost = gen.cpu_seconds() - before
        stop.set()
        for thread in threads:
            thread.join()
        feed.close()
        for consumer in consumers:
            consumer.close()
        gen.kill()
        costs.setdefault(subscriptions, []).append(cost)
        say(f"  {subscriptions} subscription(s): generator used {cost:.2f} CPU s for {count} messages")
    return statistics.median(costs[10]) / statistics.median(costs[1])


def restart_time(settings: PulsarSettings, client: pulsar.Client, admin: PulsarAdmin, log_dir: Path,
                 count: int) -> float:  # fmt: skip
    """Seconds from starting a generator on an already-followed topic to its first published watermark."""
    namespace = new_namespace(admin)
    topic = f"persistent://{namespace}/restart"
    gen = Generator(settings, namespace, log_dir)
    consumer = client.subscribe(topic, "r")
    times = WatermarkTimes()
    feed = WatermarkFeed(client, topic, "r", times)
    stop = threading.Event()
    drainer = threading.Thread(target=drain_until, args=(consumer, stop), daemon=True)
    drainer.start()
    _fill(client, topic, count)
    times.wait_for(1_000_000 + count, 600)
    time.sleep(2)  # a snapshot after the last message
    gen.kill()
    stop.set()
    drainer.join()
    feed.close()
    reader = client.create_reader(watermark_topic_for(topic), pulsar.MessageId.latest)
    started = time.perf_counter()
    gen = Generator(settings, namespace, log_dir)
    while True:  # HeadWatermark events and the tables of the other topics of its group do not count
        message = reader.read_next(timeout_millis=120_000)
        if message.properties().get(EVENT_PROPERTY) == SEND_WATERMARK and key_topic(message.partition_key()) == topic:
            break
    elapsed = time.perf_counter() - started
    gen.kill()
    reader.close()
    consumer.close()
    return elapsed


def run(settings: PulsarSettings, big: int = 1_000_000, small: int = 10_000) -> dict[str, float | int | str]:
    client = settings.client()
    admin = PulsarAdmin(settings)
    figures: dict[str, float | int | str] = {}
    with tempfile.TemporaryDirectory(prefix="wm-bench-gen-") as logs:
        log_dir = Path(logs)
        namespace = new_namespace(admin)
        gen = Generator(settings, namespace, log_dir)
        try:
            say("watermark latency")
            figures.update(watermark_latency(client, admin, namespace))
        finally:
            gen.kill()
        say("generator read rate against the producer rate")
        figures.update(generator_read_rate(settings, client, admin, 200_000))
        say("cost of 10 subscriptions over 1")
        figures["subscriptions_10_vs_1_cost"] = round(subscription_cost(settings, client, admin, log_dir), 3)
        say(f"restart to first watermark: {small} messages, then {big}")
        short = restart_time(settings, client, admin, log_dir, small)
        long = restart_time(settings, client, admin, log_dir, big)
        figures.update({
            "restart_10k_s": round(short, 2), "restart_1m_s": round(long, 2),
            "restart_1m_vs_10k_ratio": round(long / short, 3),
        })  # fmt: skip
    client.close()
    admin.close()
    figures.update({
        "watermark_latency_p50_ms_how": "one producer, W_SET then wait; time from the consumer's acknowledge() of "
        "the marker to the watermark arriving through the companion topic; 180 samples, generator polling every 50 ms",
        "ack_to_mark_delete_p50_ms_how": "share of the latency before the broker shows the new mark-delete position "
        "(the client's 100 ms ack grouping); sampled every 10th marker by polling the admin API every 2 ms",
        "generator_vs_producer_rate_ratio_how": "200000 messages of 100 B (a W_SET per 100) produced by one batched "
        "producer as fast as it goes, then a generator started in-process reads them: read rate over producer rate",
        "subscriptions_10_vs_1_cost_how": "generator process CPU seconds while 20000 messages are produced and "
        "consumed by 10 subscriptions over 1; median of 2 runs each",
        "restart_1m_vs_10k_ratio_how": f"kill -9 the generator after a topic of {big} (resp. {small}) messages "
        "is fully acknowledged, start a new one, time to its first SendWatermark event",
    })  # fmt: skip
    return figures
