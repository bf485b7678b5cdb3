"""Issue 33: thousands of topics and a topic created after the generator started, with the broker plugin.

- 5000 topics: non-partitioned, one subscription each acknowledging at once, one `W_SET` each. Idle: the
  broker's process CPU over `IDLE_S` without a generator, then with one (after its take-over), and the
  generator's CPU. Then one `W_SET` per topic every 10 s (at a random time of each period): from each
  acknowledgement to the value at the consumer's `WatermarkFeed`, sampled on `FEEDS` topics.
- a new topic: a generator follows a namespace; for each of `NEW_TOPICS` topics created one after another, a
  `WatermarkConsumer` with a listener attaches and a `WatermarkProducer` sends its first `W_SET`: from that send
  to the watermark at the listener, as a user typing the README's example would see it.
"""

from __future__ import annotations

import os
import random
import statistics
import threading
import time
import uuid
from pathlib import Path

import pulsar

from bench.burst import (
    Topics,
    acknowledging_listener,
    broker_pid,
    generator_env,
    latency_quantiles,
    spread_wsets,
)
from bench.common import broker_cpu_seconds, machine_busy_seconds, process_cpu_seconds, say
from bench.generator import Generator, new_namespace
from bench.generator_scale import Latencies
from consumer import Watermark, WatermarkConsumer, WatermarkListener
from producer import WatermarkProducer
from pulsar_access.admin import PulsarAdmin
from pulsar_access.settings import PulsarSettings

TOPICS = 5000
IDLE_S = 30.0
SETTLE_S = 20.0
PERIOD_S = 10.0
MEASURE_S = 40.0
FEEDS = 100
NEW_TOPICS = 10


def _take_over(settings: PulsarSettings, namespace: str, log_dir: Path, broker: int,
               topics: int) -> tuple[Generator, float, float, float]:  # fmt: skip
    """A generator started on the namespace: it, the seconds until every topic has a watermark, and the broker's and
    its own CPU seconds meanwhile."""
    broker_before = broker_cpu_seconds(broker)
    gen = Generator(settings, namespace, log_dir, generator_env("auto"))
    seconds = gen.wait_published(topics, within_s=1200)
    return gen, seconds, broker_cpu_seconds(broker) - broker_before, gen.cpu_seconds()


def many_topics(settings: PulsarSettings, client: pulsar.Client, admin: PulsarAdmin, log_dir: Path,
                topics: int = TOPICS) -> dict[str, float | int | str]:  # fmt: skip
    broker = broker_pid(settings)
    namespace = new_namespace(admin)
    record = Latencies()
    started = time.perf_counter()
    many = Topics(client, admin, namespace, topics, "many", lambda i: acknowledging_listener(record.ack(i)),
                   record, feeds=FEEDS)  # fmt: skip
    for producer in many.producers:
        producer.new_watermark().event_time(1_000).send_async()
    say(f"  {topics} topics with a producer, a consumer and {FEEDS} feeds in {time.perf_counter() - started:.0f} s")
    stop = threading.Event()
    gen: Generator | None = None
    try:
        time.sleep(5)
        cpu = broker_cpu_seconds(broker)
        time.sleep(IDLE_S)
        without = (broker_cpu_seconds(broker) - cpu) / IDLE_S
        gen, takeover, takeover_broker_cpu, takeover_gen_cpu = _take_over(settings, namespace, log_dir, broker, topics)
        say(f"  the generator took over {topics} topics in {takeover:.0f} s (CPU seconds meanwhile: the broker "
            f"{takeover_broker_cpu:.1f}, the generator {takeover_gen_cpu:.1f})")  # fmt: skip
        time.sleep(SETTLE_S)  # the take-over's tail: each topic's snapshot, 10 s after its last message
        cpu, gen_cpu, own_cpu = broker_cpu_seconds(broker), gen.cpu_seconds(), process_cpu_seconds(os.getpid())
        time.sleep(IDLE_S)
        gen.check_alive()
        with_gen = (broker_cpu_seconds(broker) - cpu) / IDLE_S
        gen_idle = (gen.cpu_seconds() - gen_cpu) / IDLE_S
        clients_idle = (process_cpu_seconds(os.getpid()) - own_cpu) / IDLE_S
        say(f"  idle: broker {without:.4f} of a core without a generator, {with_gen:.4f} with it")
        say(f"  idle: the generator {gen_idle:.4f} of a core; this process's plain clients {clients_idle:.4f}")

        measured_from = time.perf_counter()
        busy = machine_busy_seconds()
        cpu, gen_cpu, own_cpu = process_cpu_seconds(broker), gen.cpu_seconds(), process_cpu_seconds(os.getpid())
        ticker = threading.Thread(target=spread_wsets, args=(many.producers, PERIOD_S, stop), daemon=True)
        ticker.start()
        time.sleep(MEASURE_S)
        stop.set()
        ticker.join()
        gen.check_alive()  # figures of a generator that died meanwhile would be the clients' alone
        ended = time.perf_counter()
        window = ended - measured_from
        loaded = {  # shares of a core over the latency window: is the machine the bound?
            "machine": (machine_busy_seconds() - busy) / window,
            "broker": (process_cpu_seconds(broker) - cpu) / window,
            "generator": (gen.cpu_seconds() - gen_cpu) / window,
            "clients": (process_cpu_seconds(os.getpid()) - own_cpu) / window,
        }
        say("  while measuring, shares of a core: " + ", ".join(f"{k} {v:.2f}" for k, v in loaded.items())
            + f" (of {os.cpu_count()})")  # fmt: skip

        time.sleep(SETTLE_S)  # the last W_SETs' snapshots
        gen.kill()  # -9: a restart (or a standby's take-over) finds the subscriptions, properties and tables in place
        gen, restart, restart_broker_cpu, restart_gen_cpu = _take_over(settings, namespace, log_dir, broker, topics)
        say(f"  after a kill -9, a new generator took over {topics} topics in {restart:.1f} s (CPU seconds "
            f"meanwhile: the broker {restart_broker_cpu:.1f}, the generator {restart_gen_cpu:.1f})")  # fmt: skip
    finally:
        stop.set()
        if gen is not None:
            gen.kill()
        many.close()
    p50, p99, samples = latency_quantiles(record, 1_000, ended, range(FEEDS), settle_s=2.0)
    say(f"  one W_SET per topic per {PERIOD_S:.0f} s: p50 {p50:.0f} ms, p99 {p99:.0f} ms ({samples} samples, "
        f"from {measured_from:.0f})")  # fmt: skip
    return {
        "generator_idle_cpu_5000_topics": round(gen_idle, 4),
        "broker_extra_idle_cpu_5000_topics": round(max(0.0, with_gen - without), 4),
        "broker_idle_cpu_5000_topics_without_generator": round(without, 4),
        "plain_clients_idle_cpu_5000_topics": round(clients_idle, 4),
        "plain_clients_idle_cpu_5000_topics_how": f"the same {IDLE_S:.0f} s: this benchmark's own process, which holds "
        f"the {topics} topics' plain consumers and producers (pulsar-client, one of each per topic) and {FEEDS} feeds, "
        "doing nothing: what holding one consumer per topic costs a client at idle, beside the generator's figure",
        "generator_takeover_s_5000_topics": round(takeover, 1),
        "broker_cpu_s_during_takeover_5000_topics": round(takeover_broker_cpu, 1),
        "broker_cpu_s_during_takeover_5000_topics_how": "the standalone broker's process CPU seconds (less its JIT "
        "compiler threads) from the generator's start to a watermark published for every topic: each topic's "
        "generator subscription and incarnation property, its companion topic created (the claim's producer) and "
        f"its first table; the generator's own: {takeover_gen_cpu:.1f} s",
        "generator_restart_takeover_s_5000_topics": round(restart, 1),
        "generator_restart_takeover_s_5000_topics_how": f"after the latency window and {SETTLE_S:.0f} s more (the last "
        f"snapshots written), the generator is killed with -9 and a new one (the same snapshot key) started: from its "
        f"start to a watermark published for every topic, restored from the snapshots with everything else in place; "
        f"CPU seconds meanwhile: the broker {restart_broker_cpu:.1f} (less its JIT compiler threads), the generator "
        f"{restart_gen_cpu:.1f}",
        "watermark_latency_5000_topics_p50_ms": round(p50, 1),
        "watermark_latency_5000_topics_p99_ms": round(p99, 1),
        "cpu_while_measuring_5000_topics": ", ".join(f"{k} {v:.2f}" for k, v in loaded.items()),
        "cpu_while_measuring_5000_topics_how": f"shares of a core over the latency window, of {os.cpu_count()} cores: "
        "the whole machine (from /proc/stat), the standalone broker, the generator, and this benchmark's own process "
        "(the topics' producers, consumers and feeds)",
        "generator_idle_cpu_5000_topics_how": f"{topics} non-partitioned topics, one subscription each (a plain "
        f"consumer acknowledging at once), one W_SET each, then nothing: the generator's process CPU over "
        f"{IDLE_S:.0f} s after its take-over, in shares of a core; broker_extra_idle_cpu_5000_topics is the "
        f"standalone broker's CPU (less its JIT compiler threads) over {IDLE_S:.0f} s with the generator minus over "
        f"{IDLE_S:.0f} s before it started (same topics, producers, consumers and feeds attached); measured from "
        f"{SETTLE_S:.0f} s after the take-over (each topic's snapshot is written 10 s after its last message); "
        "cursor positions from the broker plugin",
        "watermark_latency_5000_topics_p99_ms_how": f"the same {topics} topics, then one W_SET per topic every "
        f"{PERIOD_S:.0f} s at a random time of each period for {MEASURE_S:.0f} s, each acknowledged at once: from "
        f"that acknowledge() to the value at its WatermarkFeed, sampled on {FEEDS} topics; {samples} samples",
    }


class _FirstWatermark(WatermarkListener):
    def __init__(self) -> None:
        self.at: float | None = None
        self.got = threading.Event()

    def received(self, consumer: WatermarkConsumer, message: pulsar.Message) -> None:
        consumer.acknowledge(message)

    def received_watermark(self, consumer: WatermarkConsumer, watermark: Watermark) -> None:
        if watermark.event_time > 0 and self.at is None:
            self.at = time.perf_counter()
            self.got.set()


def new_topic(settings: PulsarSettings, client: pulsar.Client, admin: PulsarAdmin, log_dir: Path,
              cursor_source: str = "auto", count: int = NEW_TOPICS) -> dict[str, float | int | str]:  # fmt: skip
    """From the first W_SET on a topic created after the generator started to the watermark at a listener."""
    namespace = new_namespace(admin)
    gen = Generator(settings, namespace, log_dir, generator_env(cursor_source))
    times: list[float] = []
    try:
        time.sleep(5)  # the generator is up and following the (empty) namespace
        for i in range(count):
            topic = f"persistent://{namespace}/new-{uuid.uuid4().hex[:8]}"
            listener = _FirstWatermark()
            consumer = WatermarkConsumer(client, topic, "app", listener=listener, admin_url=settings.admin_url)
            producer = WatermarkProducer(client, topic, producer_name="sensor-1")
            sent = time.perf_counter()
            producer.new_watermark().event_time(1_700_000_000_000 + i).send()
            if not listener.got.wait(30):
                raise RuntimeError(f"no watermark at a new topic's consumer within 30 s (see {log_dir})")
            assert listener.at is not None
            times.append((listener.at - sent) * 1000)
            consumer.close()
            producer.close()
            time.sleep(random.uniform(0.5, 2.0))  # topics come at any moment, not in step with discovery
    finally:
        gen.kill()
    say(f"  first watermark of a new topic ({cursor_source}): {[round(t) for t in times]} ms")
    suffix = "" if cursor_source == "auto" else "_no_plugin"
    return {
        f"first_watermark_new_topic_p50_ms{suffix}": round(statistics.median(times), 1),
        f"first_watermark_new_topic_max_ms{suffix}": round(max(times), 1),
        f"first_watermark_new_topic_p50_ms{suffix}_how": f"{count} topics created one after another (0.5-2 s apart) "
        "in a namespace a running generator follows: a WatermarkConsumer with a listener attaches, a "
        "WatermarkProducer sends the topic's first W_SET; from that send() to received_watermark; cursor positions "
        + ("from the broker plugin" if cursor_source == "auto" else "through the admin API"),
    }


def run(settings: PulsarSettings, log_dir: Path) -> dict[str, float | int | str]:
    client = settings.client(message_listener_threads=4)
    admin = PulsarAdmin(settings)
    figures: dict[str, float | int | str] = {}
    try:
        for source in ("auto", "admin"):
            say(f"a new topic's first watermark ({source})")
            figures.update(new_topic(settings, client, admin, log_dir, source))
        say(f"{TOPICS} non-partitioned topics with the broker plugin")
        figures.update(many_topics(settings, client, admin, log_dir))
    finally:
        client.close()
        admin.close()
    return figures
