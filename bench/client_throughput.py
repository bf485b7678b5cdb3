"""Issue 3: what the watermark wrappers cost against the plain `pulsar` client, same topic, same run."""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import pulsar

from bench.common import median_ratio, say, timed
from consumer import WatermarkConsumer, WatermarkListener
from producer import WatermarkProducer
from pulsar_access.settings import PulsarSettings
from watermark_core.protocol import MARKER_PROPERTY

MESSAGES = 50_000
PAYLOAD = b"x" * 100
ROUNDS = 5
EARLIEST = pulsar.InitialPosition.Earliest


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


class Timing(NamedTuple):
    """Wall seconds, and this process's CPU seconds (every thread: less noisy on a shared machine)."""

    wall: float
    cpu: float

    @classmethod
    def since(cls, wall: float, cpu: float) -> Timing:
        return cls(time.perf_counter() - wall, time.process_time() - cpu)


def _drain(consumer: pulsar.Consumer | WatermarkConsumer, count: int) -> Timing:
    """Time to receive and acknowledge `count` messages (subscribing is not timed)."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(count):
        consumer.acknowledge(consumer.receive(timeout_millis=30_000))
    elapsed = Timing.since(wall, cpu)
    consumer.close()
    return elapsed


def _drain_batches(consumer: pulsar.Consumer | WatermarkConsumer, count: int) -> Timing:
    """Time to `batch_receive` and acknowledge (one by one) `count` messages (subscribing is not timed)."""
    wall, cpu = time.perf_counter(), time.process_time()
    received = 0
    while received < count:
        for message in consumer.batch_receive():
            consumer.acknowledge(message)
            received += 1
    elapsed = Timing.since(wall, cpu)
    consumer.close()
    return elapsed


class _Counter:
    """Counts acknowledged messages; `done` once `count` came; times from the first one."""

    def __init__(self, count: int) -> None:
        self.count, self.seen, self.started, self.started_cpu = count, 0, 0.0, 0.0
        self.done = threading.Event()

    def one(self) -> None:
        if self.seen == 0:
            self.started, self.started_cpu = time.perf_counter(), time.process_time()
        self.seen += 1
        if self.seen == self.count:
            self.done.set()

    def seconds(self) -> Timing:
        if not self.done.wait(120):
            raise TimeoutError(f"only {self.seen} of {self.count} messages within 120 s")
        return Timing.since(self.started, self.started_cpu)


class _AcknowledgingListener(WatermarkListener):
    def __init__(self, counter: _Counter) -> None:
        self.counter = counter

    def received(self, consumer: WatermarkConsumer, message: pulsar.Message) -> None:
        consumer.acknowledge(message)
        self.counter.one()


def _listen_raw(client: pulsar.Client, topic: str, total: int) -> Timing:
    counter = _Counter(total)

    def on_message(consumer: pulsar.Consumer, message: pulsar.Message) -> None:
        consumer.acknowledge(message)
        counter.one()

    name = f"raw-l-{uuid.uuid4().hex[:6]}"
    consumer = client.subscribe(topic, name, initial_position=EARLIEST, message_listener=on_message)
    elapsed = counter.seconds()
    consumer.close()
    return elapsed


def _listen_watermark(client: pulsar.Client, topic: str, data: int) -> Timing:
    counter = _Counter(data)
    name = f"wm-l-{uuid.uuid4().hex[:6]}"
    consumer = WatermarkConsumer(client, topic, name, listener=_AcknowledgingListener(counter),
                                 initial_position=EARLIEST)  # fmt: skip
    elapsed = counter.seconds()
    consumer.close()
    return elapsed


def _drain_raw(client: pulsar.Client, topic: str, total: int) -> Timing:
    name = f"raw-{uuid.uuid4().hex[:6]}"
    return _drain(client.subscribe(topic, name, initial_position=EARLIEST), total)


def _drain_watermark(client: pulsar.Client, topic: str, data: int) -> Timing:
    name = f"wm-{uuid.uuid4().hex[:6]}"
    return _drain(WatermarkConsumer(client, topic, name, initial_position=EARLIEST), data)


class _MarkerHidingOnly:
    """The floor of any wrapper of `receive`, for comparison only (NOT a correct consumer: no watermark, no
    trust rule): markers hidden by their property, nothing else; the client's own binding calls."""

    def __init__(self, consumer: pulsar.Consumer) -> None:
        self._consumer, self._raw, self._schema = consumer, consumer._consumer, consumer._schema

    def receive(self, timeout_millis: int) -> pulsar.Message:
        while True:
            raw = self._raw.receive(timeout_millis)
            if MARKER_PROPERTY in raw.properties():
                self._raw.acknowledge(raw)
                continue
            message = pulsar.Message()
            message._message, message._schema = raw, self._schema
            return message

    def acknowledge(self, message: pulsar.Message) -> None:
        self._raw.acknowledge(message._message)

    def close(self) -> None:
        self._consumer.close()


class _PositionFloor(_MarkerHidingOnly):
    """The floor of a correct consumer's `receive` (issue 48), for comparison only (no trust rule, no watermark): what
    none can skip per message: markers hidden by their property, the message's position (`message_id` and its three
    getters, as the trust rule needs it to see a move back it did not make) and one comparison with the latest."""

    def __init__(self, consumer: pulsar.Consumer) -> None:
        super().__init__(consumer)
        self._last = (-1, -1, -1)

    def receive(self, timeout_millis: int) -> pulsar.Message:
        while True:
            raw = self._raw.receive(timeout_millis)
            if MARKER_PROPERTY in raw.properties():
                self._raw.acknowledge(raw)
                continue
            msg_id = raw.message_id()
            position = (msg_id.ledger_id(), msg_id.entry_id(), msg_id.batch_index())
            if position > self._last:
                self._last = position
            message = pulsar.Message()
            message._message, message._schema = raw, self._schema
            return message


def _drain_position_floor(client: pulsar.Client, topic: str, data: int) -> Timing:
    name = f"pos-{uuid.uuid4().hex[:6]}"
    return _drain(_PositionFloor(client.subscribe(topic, name, initial_position=EARLIEST)), data)


def _drain_marker_hiding(client: pulsar.Client, topic: str, data: int) -> Timing:
    name = f"hide-{uuid.uuid4().hex[:6]}"
    return _drain(_MarkerHidingOnly(client.subscribe(topic, name, initial_position=EARLIEST)), data)


def _batches_raw(client: pulsar.Client, topic: str, total: int) -> Timing:
    name = f"raw-b-{uuid.uuid4().hex[:6]}"
    return _drain_batches(client.subscribe(topic, name, initial_position=EARLIEST), total)


def _batches_watermark(client: pulsar.Client, topic: str, data: int) -> Timing:
    name = f"wm-b-{uuid.uuid4().hex[:6]}"
    return _drain_batches(WatermarkConsumer(client, topic, name, initial_position=EARLIEST), data)


Drain = Callable[[pulsar.Client, str, int], Timing]


class Ratio(NamedTuple):
    """Medians of WatermarkConsumer's rate over the plain client's, per wall and per CPU second, and each round's."""

    wall: float
    cpu: float
    walls: list[float]
    cpus: list[float]

    def rounds(self, which: str = "wall") -> str:
        return ", ".join(f"{value:.3f}" for value in (self.walls if which == "wall" else self.cpus))


def _ratio(client: pulsar.Client, topic: str, what: str, wrapped_drain: Drain, raw_drain: Drain) -> Ratio:
    """WatermarkConsumer's rate over the plain client's doing the same work, same topic, alternating order:
    per wall second, and per CPU second of this process."""
    total = MESSAGES + MESSAGES // 100  # the plain client gets the markers as messages
    walls, cpus = [], []
    for round_ in range(ROUNDS):
        if round_ % 2 == 0:
            raw = raw_drain(client, topic, total)
            wrapped = wrapped_drain(client, topic, MESSAGES)
        else:
            wrapped = wrapped_drain(client, topic, MESSAGES)
            raw = raw_drain(client, topic, total)
        say(
            f"consumer {what} round {round_ + 1}: WatermarkConsumer {MESSAGES / wrapped.wall:.0f} msg/s "
            f"({MESSAGES / wrapped.cpu:.0f} per CPU s), plain {MESSAGES / raw.wall:.0f} msg/s "
            f"({MESSAGES / raw.cpu:.0f} per CPU s)"
        )
        walls.append(raw.wall / wrapped.wall)
        cpus.append(raw.cpu / wrapped.cpu)
    return Ratio(statistics.median(walls), statistics.median(cpus), walls, cpus)


def _first_message_ms(client: pulsar.Client, topic: str, wrapped: bool) -> float:
    """Milliseconds from constructing a consumer of `topic` (read from its start) to its first message."""
    name = f"first-{uuid.uuid4().hex[:6]}"
    started = time.perf_counter()
    consumer: pulsar.Consumer | WatermarkConsumer
    if wrapped:
        consumer = WatermarkConsumer(client, topic, name, initial_position=EARLIEST)
    else:
        consumer = client.subscribe(topic, name, initial_position=EARLIEST)
    consumer.receive(timeout_millis=30_000)
    elapsed = (time.perf_counter() - started) * 1000
    consumer.close()
    return elapsed


def start_to_first_message(client: pulsar.Client, topic: str) -> tuple[float, float, list[tuple[float, float]]]:
    """Medians (WatermarkConsumer, plain) over alternating rounds, and each round's pair, in ms."""
    pairs = []
    for round_ in range(ROUNDS):
        order = [True, False] if round_ % 2 else [False, True]
        times = {wrapped: _first_message_ms(client, topic, wrapped) for wrapped in order}
        say(
            f"start to first message round {round_ + 1}: WatermarkConsumer {times[True]:.1f} ms, "
            f"plain {times[False]:.1f} ms"
        )
        pairs.append((times[True], times[False]))
    return statistics.median(w for w, _ in pairs), statistics.median(p for _, p in pairs), pairs


def consumer_ratios(client: pulsar.Client) -> tuple[dict[str, Ratio], tuple[float, float, list[tuple[float, float]]]]:
    """WatermarkConsumer's rates over the plain client's, reading the same topic (data + markers); the start to
    the first message."""
    topic = f"bench-consume-{uuid.uuid4().hex[:8]}"
    producer = WatermarkProducer(
        client, topic, keepalive_interval_ms=None, batching_enabled=True, block_if_queue_full=True
    )
    _produce(producer, MESSAGES, 100)
    producer.close(idle=False)
    ratios = {
        "pull": _ratio(client, topic, "receive", _drain_watermark, _drain_raw),
        "listener": _ratio(client, topic, "listener", _listen_watermark, _listen_raw),
        "listener_vs_receive": _ratio(client, topic, "listener vs plain receive", _listen_watermark, _drain_raw),
        "batch": _ratio(client, topic, "batch_receive", _batches_watermark, _batches_raw),
        "floor": _ratio(client, topic, "marker-hiding floor", _drain_marker_hiding, _drain_raw),
        "position_floor": _ratio(client, topic, "position floor", _drain_position_floor, _drain_raw),
    }
    return ratios, start_to_first_message(client, topic)


def run(settings: PulsarSettings) -> dict[str, float | int | str]:
    client = settings.client()
    try:
        consumer, (first_wm, first_plain, first_rounds) = consumer_ratios(client)
        producer = producer_ratio(client)
    finally:
        client.close()
    rounds = f"median of {ROUNDS} rounds in alternating order"
    first = ", ".join(f"{w:.0f}/{p:.0f}" for w, p in first_rounds)
    figures: dict[str, float | int | str] = {
        "consumer_throughput_ratio": round(consumer["pull"].wall, 3),
        "consumer_throughput_ratio_how": "= consumer_pull_throughput_ratio",
        "consumer_pull_throughput_ratio": round(consumer["pull"].wall, 3),
        "consumer_pull_throughput_ratio_how": (
            f"{MESSAGES} messages of 100 B with a W_SET per 100, received and acknowledged one by one "
            "(subscribing not timed), generator running; WatermarkConsumer.receive over a plain pulsar consumer "
            f"on the same topic; median of {ROUNDS} rounds in alternating order"
        ),
        "consumer_listener_throughput_ratio": round(consumer["listener"].wall, 3),
        "consumer_listener_throughput_ratio_how": (
            f"same topic; a WatermarkListener that acknowledges each message over a plain message_listener that "
            f"does, timed from the first message to the last; median of {ROUNDS} rounds in alternating order"
        ),
        "consumer_batch_receive_ratio": round(consumer["batch"].wall, 3),
        "consumer_batch_receive_ratio_how": (
            "same topic; WatermarkConsumer.batch_receive (markers hidden) over the plain batch_receive, default "
            f"policy, each message acknowledged; median of {ROUNDS} rounds in alternating order"
        ),
        "consumer_marker_hiding_floor_ratio": round(consumer["floor"].wall, 3),
        "consumer_marker_hiding_floor_ratio_how": (
            "same topic, same work as the pull figure, by a wrapper that only hides markers (their property "
            "checked per message; no watermark, no position: not a correct consumer) over the plain client: what "
            f"any wrapper of receive costs at least; median of {ROUNDS} rounds in alternating order"
        ),
        "consumer_position_floor_ratio": round(consumer["position_floor"].wall, 3),
        "consumer_position_floor_ratio_how": (
            "same topic, same work as the pull figure, by a loop that does only what a correct consumer cannot skip "
            "(the plain receive, the marker property, message_id() with its three getters, one comparison with the "
            "latest position, acknowledge; no trust rule, no watermark) over the plain client: the pull figure's "
            f"ceiling (issue 48); median of {ROUNDS} rounds in alternating order"
        ),
        "consumer_position_floor_cpu_ratio": round(consumer["position_floor"].cpu, 3),
        "consumer_position_floor_cpu_ratio_how": "the position floor's rounds, per CPU second of the reading process",
        "consumer_pull_cpu_ratio": round(consumer["pull"].cpu, 3),
        "consumer_pull_cpu_ratio_how": (
            "the pull figure's rounds, per CPU second of the reading process (every thread) instead of per wall "
            "second: what the wrapper costs, less swayed by other load on a shared machine"
        ),
        "consumer_listener_cpu_ratio": round(consumer["listener"].cpu, 3),
        "consumer_listener_cpu_ratio_how": "the listener figure's rounds, per CPU second of the reading process",
        "consumer_batch_receive_cpu_ratio": round(consumer["batch"].cpu, 3),
        "consumer_batch_receive_cpu_ratio_how": "the batch_receive figure's rounds, per CPU second of the process",
        "consumer_marker_hiding_floor_cpu_ratio": round(consumer["floor"].cpu, 3),
        "consumer_marker_hiding_floor_cpu_ratio_how": "the floor's rounds, per CPU second of the reading process",
        "consumer_listener_vs_plain_receive_ratio": round(consumer["listener_vs_receive"].wall, 3),
        "consumer_listener_vs_plain_receive_ratio_how": (
            "same topic; the WatermarkListener (timed from the first message to the last) over the plain client's own "
            f"receive loop that acknowledges each message (subscribing not timed); {rounds}"
        ),
        "consumer_listener_vs_plain_receive_cpu_ratio": round(consumer["listener_vs_receive"].cpu, 3),
        "consumer_listener_vs_plain_receive_cpu_ratio_how": "the same rounds, per CPU second of the reading process",
        "consumer_start_to_first_message_ms": round(first_wm, 1),
        "consumer_start_to_first_message_ms_how": (
            "the same topic read from its start: from constructing WatermarkConsumer(...) (the companion topic's "
            f"history read, the subscription made) to its first message from receive(); {rounds} with the plain "
            f"client (WatermarkConsumer/plain per round, ms: {first})"
        ),
        "plain_start_to_first_message_ms": round(first_plain, 1),
        "plain_start_to_first_message_ms_how": (
            "the same topic read from its start: from client.subscribe(...) to its first message from receive(); "
            + rounds
        ),
        "producer_throughput_ratio": round(producer, 3),
        "producer_throughput_ratio_how": f"{MESSAGES} messages of 100 B, send_async with batching; one W_SET per 100 "
        f"messages over none; median of {ROUNDS} interleaved rounds",
    }
    keys = {
        "pull": "consumer_pull_throughput_ratio",
        "listener": "consumer_listener_throughput_ratio",
        "listener_vs_receive": "consumer_listener_vs_plain_receive_ratio",
        "batch": "consumer_batch_receive_ratio",
        "floor": "consumer_marker_hiding_floor_ratio",
        "position_floor": "consumer_position_floor_ratio",
    }
    for name, key in keys.items():
        figures[f"{key}_rounds"] = consumer[name].rounds("wall")
        figures[f"{key}_rounds_how"] = "each round's ratio per wall second, in the order run"
        figures[f"{key.removesuffix('_ratio').removesuffix('_throughput')}_cpu_ratio_rounds"] = consumer[name].rounds(
            "cpu"
        )
    return figures
