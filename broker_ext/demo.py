"""`make demo`: the local cluster, two producers with watermarks, and a consumer that prints them.

Until the Spark demo lands this shows the broker-side half: out-of-order events from two producers,
one of which goes idle, and the watermark a consumer receives, which never passes an event that
the subscription has not yet acknowledged.
"""

from __future__ import annotations

import random
import sys
import threading
import time
import uuid

import pulsar

from broker_ext.local_cluster import ClusterError, LocalCluster
from broker_ext.settings import PulsarSettings
from consumer import Watermark, WatermarkConsumer, WatermarkListener
from producer import WatermarkProducer

EVENTS_PER_PRODUCER = 60


class PrintingListener(WatermarkListener):
    def __init__(self) -> None:
        self.messages = 0
        self.watermarks: list[int] = []
        self.below_watermark = 0
        self.done = threading.Event()

    def received(self, consumer: WatermarkConsumer, message: pulsar.Message) -> None:
        self.messages += 1
        if self.watermarks and message.event_timestamp() < self.watermarks[-1]:
            self.below_watermark += 1
        consumer.acknowledge(message)

    def received_watermark(self, consumer: WatermarkConsumer, watermark: Watermark) -> None:
        self.watermarks.append(watermark.event_time)
        print(f"[demo] watermark -> {watermark.event_time} ({self.messages} messages so far)", flush=True)


def produce(producer: WatermarkProducer, start: int, idle_after: int | None) -> None:
    """Events arrive up to 2 s out of order; a W_SET every 10 events promises nothing older follows."""
    rng = random.Random(producer.producer_name)
    for i in range(EVENTS_PER_PRODUCER):
        event_time = start + i * 100
        jitter = rng.randint(0, 20) * 100
        producer.send(f"{producer.producer_name}-{i}".encode(), event_timestamp=event_time + jitter)
        if i % 10 == 9:
            producer.new_watermark().event_time(event_time).send()
        if idle_after is not None and i == idle_after:
            producer.new_watermark().mark_idle().send()
            print(f"[demo] {producer.producer_name} goes idle", flush=True)
            return
        time.sleep(0.05)


def main() -> int:
    cluster = LocalCluster.from_env()
    try:
        cluster.up()
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    settings = PulsarSettings(cluster.service_url, cluster.admin_url)
    client = settings.client()
    topic = f"demo-{uuid.uuid4().hex[:8]}"
    listener = PrintingListener()
    consumer = WatermarkConsumer(client, topic, "demo", listener=listener)
    start = 1_700_000_000_000
    producers = [WatermarkProducer(client, topic, producer_name=name) for name in ("sensor-a", "sensor-b")]
    print("[demo] waiting 3 s for the generator to discover the new topic", flush=True)
    time.sleep(3)
    print(f"[demo] two producers write {EVENTS_PER_PRODUCER} out-of-order events each to {topic}", flush=True)
    threads = [
        threading.Thread(target=produce, args=(producers[0], start, None)),
        threading.Thread(target=produce, args=(producers[1], start, 29)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    final = start + (EVENTS_PER_PRODUCER - 1) * 100 - 100
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (not listener.watermarks or listener.watermarks[-1] < final):
        time.sleep(0.2)
    print(
        f"[demo] {listener.messages} messages, {len(listener.watermarks)} watermarks, last "
        f"{listener.watermarks[-1] if listener.watermarks else None}; messages below the watermark when "
        f"handed over: {listener.below_watermark} (late only if a producer broke its promise)",
        flush=True,
    )
    consumer.close()
    for producer in producers:
        producer.close()
    client.close()
    print(f"[demo] see the generator's view: .venv/bin/broker-ext status {topic}; stop with 'make cluster-down'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
