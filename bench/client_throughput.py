"""Issue 3: what the watermark wrappers cost against the plain `pulsar` client, same topic, same run."""

from __future__ import annotations

import threading
import time
import uuid
from functools import partial

import pulsar

from bench.common import median_ratio, say, timed
from consumer import WatermarkConsumer
from producer import WatermarkProducer
from pulsar_access.settings import PulsarSettings

MESSAGES = 50_000
PAYLOAD = b"x" * 100
ROUNDS = 5


def _produce(producer: WatermarkProducer, count: int, marker_every: int | None) -> None:
    done = threading.Event()
    remaining = [count]
    lock = threading.Lock()

    def on_sent(_result: pulsar.Result, _msg_id: object) -> None:
        with lock:
            remaining[0] -= 1
            if remaining[0] == 0:
                done.set()

    for i in range(count):
        producer.send_async(PAYLOAD, on_sent, event_timestamp=1_000_000 + i)
        if marker_every and i % marker_every == marker_every - 1:
            producer.new_watermark().event_time(1_000_000 + i).send_async()
    producer.flush()
    done.wait(120)


def producer_ratio(client: pulsar.Client) -> float:
    """Rate with one W_SET per 100 messages over the rate with none (both WatermarkProducer, batched)."""
    pairs = []
    for round_ in range(ROUNDS):
        rates = {}
        variants = [("markers", 100), ("plain", None)]
        for variant, every in variants if round_ % 2 == 0 else variants[::-1]:
            topic = f"bench-produce-{uuid.uuid4().hex[:8]}"
            producer = WatermarkProducer(
                client, topic, keepalive_interval_ms=None, batching_enabled=True, block_if_queue_full=True
            )
            rates[variant] = MESSAGES / timed(partial(_produce, producer, MESSAGES, every))
            producer.close(idle=False)
        say(f"producer round {round_ + 1}: {rates['markers']:.0f} msg/s with markers, {rates['plain']:.0f} without")
        pairs.append((rates["markers"], rates["plain"]))
    return median_ratio(pairs)


def _drain(consumer: pulsar.Consumer | WatermarkConsumer, count: int) -> float:
    """Seconds to receive and acknowledge `count` messages (subscribing is not timed)."""
    started = time.perf_counter()
    for _ in range(count):
        consumer.acknowledge(consumer.receive(timeout_millis=30_000))
    elapsed = time.perf_counter() - started
    consumer.close()
    return elapsed


def _drain_raw(client: pulsar.Client, topic: str, total: int) -> float:
    name = f"raw-{uuid.uuid4().hex[:6]}"
    return _drain(client.subscribe(topic, name, initial_position=pulsar.InitialPosition.Earliest), total)


def _drain_watermark(client: pulsar.Client, topic: str, data: int) -> float:
    name = f"wm-{uuid.uuid4().hex[:6]}"
    return _drain(WatermarkConsumer(client, topic, name, initial_position=pulsar.InitialPosition.Earliest), data)


def consumer_ratio(client: pulsar.Client) -> float:
    """WatermarkConsumer's rate over a raw consumer's, reading the same topic (data + markers)."""
    topic = f"bench-consume-{uuid.uuid4().hex[:8]}"
    producer = WatermarkProducer(
        client, topic, keepalive_interval_ms=None, batching_enabled=True, block_if_queue_full=True
    )
    _produce(producer, MESSAGES, 100)
    producer.close(idle=False)
    markers = MESSAGES // 100
    pairs = []
    for round_ in range(ROUNDS):
        if round_ % 2 == 0:
            raw = MESSAGES / _drain_raw(client, topic, MESSAGES + markers)
            wrapped = MESSAGES / _drain_watermark(client, topic, MESSAGES)
        else:
            wrapped = MESSAGES / _drain_watermark(client, topic, MESSAGES)
            raw = MESSAGES / _drain_raw(client, topic, MESSAGES + markers)
        say(f"consumer round {round_ + 1}: WatermarkConsumer {wrapped:.0f} msg/s, raw {raw:.0f} msg/s")
        pairs.append((wrapped, raw))
    return median_ratio(pairs)


def run(settings: PulsarSettings) -> dict[str, float | int | str]:
    client = settings.client()
    try:
        consumer = consumer_ratio(client)
        producer = producer_ratio(client)
    finally:
        client.close()
    return {
        "consumer_throughput_ratio": round(consumer, 3),
        "consumer_throughput_ratio_how": (
            f"{MESSAGES} messages of 100 B with a W_SET per 100, received and acknowledged one by one "
            "(subscribing not timed), generator running; WatermarkConsumer.receive over a raw pulsar consumer "
            f"on the same topic; median of {ROUNDS} rounds in alternating order"
        ),
        "producer_throughput_ratio": round(producer, 3),
        "producer_throughput_ratio_how": f"{MESSAGES} messages of 100 B, send_async with batching; one W_SET per 100 "
        f"messages over none; median of {ROUNDS} interleaved rounds",
    }
