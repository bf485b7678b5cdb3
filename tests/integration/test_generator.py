"""The watermark generator (`broker-ext serve`) on the real broker, as a real process."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pulsar
import pytest
import requests

from consumer import WatermarkConsumer
from devtools.local_cluster import free_port
from producer import WatermarkProducer
from pulsar_access.admin import PulsarAdmin
from pulsar_access.settings import PulsarSettings
from tests.integration.generator_process import GeneratorProcess
from tests.integration.helpers import Recorder, wait_until, watermarks
from watermark_core.protocol import GENERATOR_SUBSCRIPTION, MARKER_PROPERTY


def assert_monotonic(values: list[int]) -> None:
    assert values == sorted(values), f"watermarks went back: {values}"
    assert len(values) == len(set(values)), f"a watermark was delivered twice: {values}"


@pytest.mark.usefixtures("generator")
def test_watermark_is_the_minimum_over_active_producers_at_each_subscriptions_position(
    pulsar_client: pulsar.Client, topic: str
) -> None:
    fast, slow = Recorder(), Recorder(ack=False)
    c_fast = WatermarkConsumer(pulsar_client, topic, "fast", listener=fast)
    c_slow = WatermarkConsumer(pulsar_client, topic, "slow", listener=slow)
    a = WatermarkProducer(pulsar_client, topic, producer_name="A")
    b = WatermarkProducer(pulsar_client, topic, producer_name="B")
    b.new_watermark().event_time(50).send()
    a.new_watermark().event_time(100).send()
    a.send(b"a1", event_timestamp=120)
    b.send(b"b1", event_timestamp=60)
    wait_until(lambda: 50 in watermarks(fast), what="watermark 50")
    b.new_watermark().event_time(150).send()
    a.send(b"a2", event_timestamp=130)
    wait_until(lambda: 100 in watermarks(fast), what="watermark 100 (B moved, A holds)")
    a.new_watermark().mark_idle().send()
    b.send(b"b2", event_timestamp=160)
    wait_until(lambda: 150 in watermarks(fast), what="watermark 150 (A idle)")
    assert watermarks(fast) == [50, 100, 150]

    # "slow" acknowledged nothing but the markers before its first data message: its watermark is
    # the state there, never above a message it still holds.
    wait_until(lambda: watermarks(slow) == [50], what="slow subscription's watermark")
    time.sleep(1.0)
    assert watermarks(slow) == [50]
    assert max(watermarks(slow)) <= 60
    for closable in (c_fast, c_slow, a, b):
        closable.close()


@pytest.mark.usefixtures("generator")
def test_a_consumer_of_a_partitioned_topic_sees_the_minimum_over_partitions(
    pulsar_client: pulsar.Client, admin: PulsarAdmin, topic: str
) -> None:
    admin.create_topic(topic, partitions=2)
    held: list[pulsar.Message] = []

    class HoldPartitionOne(Recorder):
        def received(self, consumer: WatermarkConsumer, message: pulsar.Message) -> None:
            if message.topic_name().endswith("-partition-1"):
                held.append(message)
                with self.lock:
                    self.events.append(("msg", message.data()))
            else:
                super().received(consumer, message)

    recorder = HoldPartitionOne()
    consumer = WatermarkConsumer(pulsar_client, topic, "sub", listener=recorder)
    producer = WatermarkProducer(pulsar_client, topic, producer_name="P")
    producer.new_watermark().event_time(100).send()
    key_for = {}
    for i in range(20):
        key_for.setdefault(producer.send(b"probe", partition_key=f"k{i}", event_timestamp=100).partition(), f"k{i}")
    assert set(key_for) == {0, 1}
    producer.send(b"held", partition_key=key_for[1], event_timestamp=150)
    producer.new_watermark().event_time(200).send()
    producer.send(b"p0", partition_key=key_for[0], event_timestamp=250)
    wait_until(lambda: watermarks(recorder) == [100], what="watermark 100: partition 1 still holds a message")
    time.sleep(1.0)
    assert watermarks(recorder) == [100]
    for message in held:
        consumer.acknowledge(message)
    wait_until(lambda: watermarks(recorder) == [100, 200], what="watermark 200 once partition 1 is acknowledged")
    consumer.close()
    producer.close()


@pytest.mark.usefixtures("generator")
def test_shared_subscription_watermark_never_passes_a_dead_consumers_unacked_messages(
    pulsar_client: pulsar.Client, topic: str
) -> None:
    holder, worker = Recorder(ack=False), Recorder()
    options = {"consumer_type": pulsar.ConsumerType.Shared, "receiver_queue_size": 5}
    c_holder = WatermarkConsumer(pulsar_client, topic, "shared", listener=holder, **options)
    c_worker = WatermarkConsumer(pulsar_client, topic, "shared", listener=worker, **options)
    producer = WatermarkProducer(pulsar_client, topic, producer_name="S")
    event_times = {}
    for step in range(3):
        base = 1_000 * (step + 1)
        producer.new_watermark().event_time(base).send()
        for i in range(20):
            payload = f"{base}-{i}".encode()
            event_times[payload] = base + i
            producer.send(payload, event_timestamp=base + i)
    producer.new_watermark().event_time(4_000).send()

    wait_until(lambda: len(holder.messages()) > 0, what="the holder to get messages")
    time.sleep(2.0)
    held_times = [event_times[m] for m in holder.messages()]  # type: ignore[index]
    assert worker.messages(), "the worker got nothing"
    assert all(w <= min(held_times) for w in watermarks(worker)), (watermarks(worker), min(held_times))

    c_holder.close()  # dies with its messages unacknowledged: they go to the worker
    wait_until(lambda: 4_000 in watermarks(worker), timeout_s=30, what="watermark 4000 after redelivery")
    assert set(worker.messages()) == set(event_times)
    assert_monotonic(watermarks(worker))
    c_worker.close()
    producer.close()


@pytest.mark.usefixtures("generator")
def test_seek_back_recomputes_the_watermark_and_seek_forward_restores_it(
    pulsar_client: pulsar.Client, topic: str
) -> None:
    consumer = WatermarkConsumer(pulsar_client, topic, "seeker")
    producer = WatermarkProducer(pulsar_client, topic, producer_name="K")
    ids = {}
    for base in (100, 200, 300):
        producer.new_watermark().event_time(base).send()
        ids[base] = producer.send(f"m{base}".encode(), event_timestamp=base + 50)
    for _ in range(3):
        consumer.acknowledge(consumer.receive(timeout_millis=10_000))
    wait_until(lambda: consumer.get_last_watermark() is not None and consumer.get_last_watermark().event_time == 300,
               what="watermark 300")  # fmt: skip

    def watermark_is(value: int) -> bool:  # None while the recomputed watermark is not in yet
        watermark = consumer.get_last_watermark()
        return watermark is not None and watermark.event_time == value

    consumer.seek(ids[200])  # everything before m200 stays acknowledged: W_SET(200) is before it
    wait_until(lambda: watermark_is(200), what="watermark back to 200 after the seek")
    consumer.seek(ids[100])
    wait_until(lambda: watermark_is(100), what="watermark back to 100")
    consumer.seek(pulsar.MessageId.latest)
    wait_until(lambda: watermark_is(300), what="watermark 300 after seeking forward")
    consumer.close()
    producer.close()


@pytest.mark.usefixtures("generator")
def test_a_subscription_created_at_earliest_on_a_topic_with_snapshots(pulsar_client: pulsar.Client, topic: str) -> None:
    producer = WatermarkProducer(pulsar_client, topic, producer_name="E")
    recorder = Recorder()
    first = WatermarkConsumer(pulsar_client, topic, "first", listener=recorder)
    producer.new_watermark().event_time(9_999).send()
    wait_until(lambda: watermarks(recorder) == [9_999], timeout_s=30, what="the generator following the topic")
    for i in range(300):  # in three bursts, so the generator writes several snapshots along the way
        if i % 10 == 0:
            producer.new_watermark().event_time(10_000 + i).send()
        producer.send(f"m{i}".encode(), event_timestamp=10_000 + i)
        if i % 100 == 99:
            time.sleep(1.5)
    producer.new_watermark().event_time(20_000).send()

    def snapshots() -> int:
        reader = pulsar_client.create_reader(topic, pulsar.MessageId.earliest)
        count = 0
        while reader.has_message_available():
            count += reader.read_next(timeout_millis=5_000).properties().get(MARKER_PROPERTY) == "W_SNAPSHOT"
        reader.close()
        return count

    wait_until(lambda: snapshots() >= 3, timeout_s=30, what="the generator's snapshots")
    late = WatermarkConsumer(pulsar_client, topic, "late", initial_position=pulsar.InitialPosition.Earliest)
    for _ in range(155):
        late.acknowledge(late.receive(timeout_millis=10_000))
    # acknowledged m0..m154: the last marker before m155 is W_SET(10150)
    wait_until(lambda: late.get_last_watermark() is not None and late.get_last_watermark().event_time == 10_150,
               what="watermark 10150 at m154")  # fmt: skip
    for _ in range(145):
        late.acknowledge(late.receive(timeout_millis=10_000))
    with pytest.raises(pulsar.Timeout):  # receive() acknowledges the trailing W_SET(20000) and finds no data
        late.receive(timeout_millis=1_000)
    wait_until(lambda: late.get_last_watermark().event_time == 20_000, what="watermark 20000 at the end")
    for closable in (late, first, producer):
        closable.close()


def test_watermark_transactions_commit_abort_and_timeout(
    pulsar_settings: PulsarSettings, pulsar_client: pulsar.Client, namespace: str, tmp_path: Path
) -> None:
    generator = GeneratorProcess(
        pulsar_settings, tmp_path / "gen.log", "txn-gen", WM_NAMESPACES=namespace, WM_TXN_TIMEOUT_MS="3000"
    ).start()
    try:
        topic = f"persistent://{namespace}/txn"
        recorder = Recorder()
        consumer = WatermarkConsumer(pulsar_client, topic, "sub", listener=recorder)
        a = WatermarkProducer(pulsar_client, topic, producer_name="A")
        b = WatermarkProducer(pulsar_client, topic, producer_name="B")
        a.new_watermark().event_time(100).send()
        b.new_watermark().event_time(1_000).send()
        wait_until(lambda: watermarks(recorder) == [100], timeout_s=30, what="watermark 100")

        committed = a.new_transaction()
        a.new_watermark(committed).event_time(200).send()
        b.new_watermark().event_time(1_050).send()
        time.sleep(0.5)
        assert watermarks(recorder) == [100], "a pending transactional watermark took effect before its commit"
        committed.commit()
        wait_until(lambda: watermarks(recorder) == [100, 200], what="watermark 200 at the commit")

        aborted = a.new_transaction()
        a.new_watermark(aborted).event_time(300).send()
        aborted.abort()
        timed_out = a.new_transaction()
        a.new_watermark(timed_out).event_time(400).send()
        time.sleep(3.5)
        b.new_watermark().event_time(1_100).send()  # moves the log's clock past the transaction timeout
        timed_out.commit()
        a.new_watermark().event_time(250).send()
        wait_until(lambda: watermarks(recorder) == [100, 200, 250], what="watermark 250")
        time.sleep(1.0)
        assert watermarks(recorder) == [100, 200, 250], "an aborted or timed-out transaction took effect"
        for closable in (consumer, a, b):
            closable.close()
    finally:
        generator.stop()


def _stream(producer: WatermarkProducer, count: int, stop: threading.Event, pace_s: float = 0.002) -> None:
    """An honest producer: W_SET(t) every 20 messages, event times only go up."""
    for i in range(count):
        if stop.is_set():
            return
        if i % 20 == 0:
            producer.new_watermark().event_time(1_000_000 + i).send()
        producer.send(f"m{i}".encode(), event_timestamp=1_000_000 + i)
        time.sleep(pace_s)
    producer.new_watermark().event_time(1_000_000 + count).send()


class Checker(Recorder):
    """Fails on a message handled after a watermark above its event time."""

    def __init__(self) -> None:
        super().__init__()
        self.violations: list[tuple[int, int]] = []

    def received(self, consumer: WatermarkConsumer, message: pulsar.Message) -> None:
        current = consumer.get_last_watermark()
        if current is not None and message.event_timestamp() < current.event_time:
            self.violations.append((message.event_timestamp(), current.event_time))
        super().received(consumer, message)


def test_kill_9_of_the_generator_mid_stream_then_restart(
    pulsar_settings: PulsarSettings, pulsar_client: pulsar.Client, namespace: str, tmp_path: Path
) -> None:
    topic = f"persistent://{namespace}/killed"
    gen = GeneratorProcess(pulsar_settings, tmp_path / "gen1.log", "kill-gen-1", WM_NAMESPACES=namespace).start()
    checker = Checker()
    consumer = WatermarkConsumer(pulsar_client, topic, "sub", listener=checker)
    producer = WatermarkProducer(pulsar_client, topic, producer_name="honest")
    stop = threading.Event()
    count = 1_500
    thread = threading.Thread(target=_stream, args=(producer, count, stop))
    thread.start()
    try:
        wait_until(lambda: len(watermarks(checker)) >= 3, timeout_s=30, what="watermarks before the kill")
        gen.kill()
        before = watermarks(checker)[-1]
        time.sleep(1.0)
        gen = GeneratorProcess(pulsar_settings, tmp_path / "gen2.log", "kill-gen-2", WM_NAMESPACES=namespace).start()
        thread.join(timeout=120)
        wait_until(lambda: (watermarks(checker) or [0])[-1] == 1_000_000 + count, timeout_s=30,
                   what="the final watermark after the restart")  # fmt: skip
    finally:
        stop.set()
        thread.join(timeout=10)
        gen.stop()
    assert len(checker.messages()) == count
    assert checker.violations == []
    assert_monotonic(watermarks(checker))
    assert watermarks(checker)[-1] > before
    assert "restored from the snapshot" in gen.log_text()
    consumer.close()
    producer.close()


def test_two_generators_one_killed_the_other_takes_over(
    pulsar_settings: PulsarSettings, pulsar_client: pulsar.Client, admin: PulsarAdmin, namespace: str, tmp_path: Path
) -> None:
    topic = f"persistent://{namespace}/ha"
    gens = {
        name: GeneratorProcess(pulsar_settings, tmp_path / f"{name}.log", name, WM_NAMESPACES=namespace).start()
        for name in (f"ha-a-{uuid.uuid4().hex[:4]}", f"ha-b-{uuid.uuid4().hex[:4]}")
    }
    recorder = Recorder()
    consumer = WatermarkConsumer(pulsar_client, topic, "sub", listener=recorder)
    producer = WatermarkProducer(pulsar_client, topic, producer_name="ha-producer")
    try:
        producer.new_watermark().event_time(100).send()
        producer.send(b"x", event_timestamp=100)
        wait_until(lambda: watermarks(recorder) == [100], timeout_s=30, what="first watermark")

        def owner() -> str:
            stats = admin.topic_stats(topic)["subscriptions"][GENERATOR_SUBSCRIPTION]
            return str(stats.get("activeConsumerName", ""))

        wait_until(lambda: owner() in gens, what="an owner")
        victim = owner()
        gens[victim].kill()
        killed_at = time.monotonic()
        producer.new_watermark().event_time(200).send()
        producer.send(b"y", event_timestamp=200)
        wait_until(lambda: watermarks(recorder) == [100, 200], timeout_s=20, what="a watermark from the survivor")
        takeover_s = time.monotonic() - killed_at
        assert owner() != victim
        assert takeover_s < 15
    finally:
        for gen in gens.values():
            gen.stop()
    consumer.close()
    producer.close()


def test_metrics_and_status_show_the_watermark(
    pulsar_settings: PulsarSettings, pulsar_client: pulsar.Client, namespace: str, tmp_path: Path
) -> None:
    port = free_port()
    gen = GeneratorProcess(
        pulsar_settings, tmp_path / "gen.log", "metrics-gen", WM_NAMESPACES=namespace, WM_METRICS_PORT=str(port)
    ).start()
    topic = f"persistent://{namespace}/observed"
    recorder = Recorder()
    consumer = WatermarkConsumer(pulsar_client, topic, "watched", listener=recorder)
    producer = WatermarkProducer(pulsar_client, topic, producer_name="visible")
    idle = WatermarkProducer(pulsar_client, topic, producer_name="resting")
    try:
        producer.new_watermark().event_time(123_456).send()
        idle.new_watermark().event_time(200_000).send()
        idle.new_watermark().mark_idle().send()
        producer.send(b"late", event_timestamp=5)  # below its own W_SET: a broken assertion
        wait_until(lambda: watermarks(recorder) == [123_456], timeout_s=30, what="the watermark")

        def metric(name: str) -> list[str]:
            text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            return [line for line in text.splitlines() if line.startswith(name + "{")]

        wait_until(lambda: metric("wm_broken_assertions_total"), what="the broken assertion metric")
        # the generator publishes the watermark, then records it: the metric may trail the consumer
        wait_until(lambda: metric("wm_watermark_ms"), what="the watermark metric")
        watermark_lines = metric("wm_watermark_ms")
        assert len(watermark_lines) == 1 and 'subscription="watched"' in watermark_lines[0]
        assert float(watermark_lines[0].rsplit(" ", 1)[1]) == 123_456
        assert 'producer="visible"' in metric("wm_broken_assertions_total")[0]
        assert metric("wm_markers_applied_total")

        status = subprocess.run(
            [sys.executable, "-m", "broker_ext.cli", "status", topic], capture_output=True, text=True, timeout=60,
            env={**os.environ, "PULSAR_SERVICE_URL": pulsar_settings.service_url,
                 "PULSAR_ADMIN_URL": pulsar_settings.admin_url},
        )  # fmt: skip
        assert status.returncode == 0, status.stderr
        row = next(line for line in status.stdout.splitlines() if "watched" in line)
        assert "123456" in row and "visible=123456" in row and "resting" in row
    finally:
        for closable in (consumer, producer, idle):
            closable.close()
        gen.stop()


def test_status_of_an_unknown_topic_is_one_clear_error(pulsar_settings: PulsarSettings) -> None:
    status = subprocess.run(
        [sys.executable, "-m", "broker_ext.cli", "status", "persistent://public/default/no-such-topic-xyz"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "PULSAR_SERVICE_URL": pulsar_settings.service_url,
             "PULSAR_ADMIN_URL": pulsar_settings.admin_url},
    )  # fmt: skip
    assert status.returncode == 2
    assert status.stderr.startswith("broker-ext: error:")
    assert "no-such-topic-xyz" in status.stderr
