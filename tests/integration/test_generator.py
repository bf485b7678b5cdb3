"""The watermark generator (`broker-ext serve`) on the real broker, as a real process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import msgpack
import pulsar
import pytest
import requests

from broker_ext.ownership import owner_of
from consumer import WatermarkConsumer
from devtools.local_cluster import free_port
from producer import WatermarkProducer
from pulsar_access.admin import PulsarAdmin
from pulsar_access.settings import PulsarSettings
from tests.integration.generator_process import GeneratorProcess
from tests.integration.helpers import (
    MALFORMED,
    Recorder,
    backlog,
    wait_until,
    watermark_table_reader,
    watermarks,
)
from tests.oracle import TopicOracle, assert_oracle_agrees, keep_history
from watermark_core.protocol import (
    EVENT_PROPERTY,
    GENERATOR_SUBSCRIPTION,
    HEAD_WATERMARK,
    MARKER_PROPERTY,
    SEND_WATERMARK,
    HeadWatermark,
    decode_head,
    decode_table,
    decode_table_with_heads,
)


def assert_monotonic(values: list[int]) -> None:
    assert values == sorted(values), f"watermarks went back: {values}"
    assert len(values) == len(set(values)), f"a watermark was delivered twice: {values}"


@pytest.mark.usefixtures("generator")
def test_watermark_is_the_minimum_over_active_producers_at_each_subscriptions_position(
    pulsar_client: pulsar.Client, admin: PulsarAdmin, topic: str
) -> None:
    keep_history(admin, topic)
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
    # the state there, never above a message it still holds (b1, event time 60). Once it acknowledges
    # everything, its watermark becomes 150: that sentinel arrives after anything published before it.
    wait_until(lambda: watermarks(slow) == [50] and len(slow.held) == 4, what="slow's watermark and messages")
    assert [m.data() for m in slow.held] == [b"a1", b"b1", b"a2", b"b2"]
    for message in slow.held:
        c_slow.acknowledge(message)
    wait_until(lambda: 150 in watermarks(slow), what="slow's watermark 150 once it acknowledged everything")
    assert watermarks(slow) == [50, 150]
    fast.assert_one_thread("fast")
    slow.assert_one_thread("slow")
    assert_oracle_agrees(pulsar_client, admin, topic)
    for closable in (c_fast, c_slow, a, b):
        closable.close()


@pytest.mark.usefixtures("generator")
def test_the_head_watermark_is_published_at_each_entry_that_changes_it_before_anyone_acknowledges(
    pulsar_client: pulsar.Client, topic: str
) -> None:
    nobody_reads = pulsar_client.subscribe(topic, "idle", initial_position=pulsar.InitialPosition.Earliest)
    a = WatermarkProducer(pulsar_client, topic, producer_name="A")
    b = WatermarkProducer(pulsar_client, topic, producer_name="B")
    sent = []
    for producer, event_time in ((a, 100), (b, 50), (a, 200), (b, 150), (b, 300)):
        sent.append(producer.new_watermark().event_time(event_time).send()[0])
    a.new_watermark().mark_idle().send()  # B alone: 300
    reader = watermark_table_reader(pulsar_client, topic)
    heads: list[HeadWatermark] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (not heads or heads[-1].event_time < 300):
        try:
            message = reader.read_next(timeout_millis=500)
        except pulsar.Timeout:
            continue
        event = message.properties().get(EVENT_PROPERTY)
        if event == HEAD_WATERMARK:
            heads.append(decode_head(message.data()))
        elif event == SEND_WATERMARK:  # heads ride on a table published soon after them (dispatch.py HeadPairing)
            heads.extend(decode_table_with_heads(message.data())[1])
    reader.close()
    # A alone: 100; B joins below it (a late joiner does not pull it back); A 200 and B 150: 150;
    # B 300 and A 200: 200; A idle: 300. Each at the entry of the marker that changed it.
    positions = [(message_id.ledger_id(), message_id.entry_id()) for message_id in sent]
    assert [(h.event_time, h.position) for h in heads] == [
        (100, positions[0]), (150, positions[3]), (200, positions[4]), (300, heads[-1].position)
    ]  # fmt: skip
    assert heads[-1].position > positions[4]
    assert {(h.topic, h.partition) for h in heads} == {(topic, -1)}
    nobody_reads.close()
    a.close(idle=False)
    b.close()


@pytest.mark.usefixtures("generator")
def test_a_head_event_rides_on_the_table_when_the_marker_is_acknowledged_at_once(
    pulsar_client: pulsar.Client, topic: str
) -> None:
    """One message on the companion topic for a marker acknowledged soon after the generator folded it, not two."""
    acking = pulsar_client.subscribe(topic, "acking", initial_position=pulsar.InitialPosition.Earliest,
                                     message_listener=lambda c, message: c.acknowledge(message))  # fmt: skip
    producer = WatermarkProducer(pulsar_client, topic, producer_name="A")
    reader = watermark_table_reader(pulsar_client, topic)
    kinds: list[str] = []
    tables: list[int | None] = []
    riding: list[int] = []

    def read_until(done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not done():
            try:
                message = reader.read_next(timeout_millis=500)
            except pulsar.Timeout:
                continue
            kinds.append(message.properties()[EVENT_PROPERTY])
            if kinds[-1] == SEND_WATERMARK:
                events, heads = decode_table_with_heads(message.data())
                tables.extend(event.event_time for event in events)
                riding.extend(head.event_time for head in heads)

    producer.new_watermark().event_time(50).send()
    read_until(lambda: 50 in tables)  # the generator follows the new topic and its subscription
    for event_time in (100, 200, 300):
        producer.new_watermark().event_time(event_time).send()
        read_until(lambda: event_time in tables)  # noqa: B023 (read before the loop moves on)
    reader.close()
    # Acknowledged at once, a head rides on the next table (within HEAD_WAIT_S); one that waited in vain on a
    # loaded machine goes alone, and the next one at once: at least two of three ride.
    assert len(set(riding) & {100, 200, 300}) >= 2, (riding, kinds)
    acking.close()
    producer.close()


@pytest.mark.usefixtures("generator")
def test_a_consumer_of_a_partitioned_topic_sees_the_minimum_over_partitions(
    pulsar_client: pulsar.Client, admin: PulsarAdmin, topic: str
) -> None:
    keep_history(admin, topic, partitions=2)
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
    wait_until(lambda: b"held" in [m.data() for m in held], what="the held message")
    wait_until(lambda: watermarks(recorder) == [100], what="watermark 100: partition 1 still holds a message")
    for message in held:
        consumer.acknowledge(message)
    # the sentinel: 200 once partition 1 is acknowledged; nothing between 100 and it
    wait_until(lambda: 200 in watermarks(recorder), what="watermark 200 once partition 1 is acknowledged")
    assert watermarks(recorder) == [100, 200]
    assert_oracle_agrees(pulsar_client, admin, topic)
    consumer.close()
    producer.close()


@pytest.mark.usefixtures("generator")
def test_shared_subscription_watermark_never_passes_a_dead_consumers_unacked_messages(
    pulsar_client: pulsar.Client, admin: PulsarAdmin, topic: str
) -> None:
    keep_history(admin, topic)
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
    # The sentinel: every message went to one of the two, and the generator published the fold at the
    # subscription's position (the oracle's stuck check waits for that), and the worker got that value.
    wait_until(lambda: len(holder.messages()) + len(worker.messages()) == len(event_times), what="every message")
    oracle = TopicOracle(pulsar_client, admin, topic)
    settled = oracle.check()
    assert settled.stuck == [], settled.problems()
    final = oracle.latest()[(-1, "shared")].event_time
    wait_until(lambda: watermarks(worker)[-1:] == [final], what=f"the worker to see the settled watermark {final}")
    held_times = [event_times[m] for m in holder.messages()]  # type: ignore[index]
    assert worker.messages(), "the worker got nothing"
    assert watermarks(worker), "the worker saw no watermark"
    assert all(w <= min(held_times) for w in watermarks(worker)), (watermarks(worker), min(held_times))

    c_holder.close()  # dies with its messages unacknowledged: they go to the worker
    wait_until(lambda: 4_000 in watermarks(worker), timeout_s=30, what="watermark 4000 after redelivery")
    assert set(worker.messages()) == set(event_times)
    assert_monotonic(watermarks(worker))
    assert_oracle_agrees(pulsar_client, admin, topic, oracle=oracle)
    c_worker.close()
    producer.close()


@pytest.mark.usefixtures("generator")
def test_seek_back_recomputes_the_watermark_and_seek_forward_restores_it(
    pulsar_client: pulsar.Client, admin: PulsarAdmin, topic: str
) -> None:
    keep_history(admin, topic)
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
    assert_oracle_agrees(pulsar_client, admin, topic)
    consumer.close()
    producer.close()


def snapshot_records(client: pulsar.Client, topic: str) -> int:
    """How many W_SNAPSHOT records the topic holds now."""
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    count = 0
    while reader.has_message_available():
        count += reader.read_next(timeout_millis=5_000).properties().get(MARKER_PROPERTY) == "W_SNAPSHOT"
    reader.close()
    return count


@pytest.mark.usefixtures("generator")
def test_a_subscription_created_at_earliest_on_a_topic_with_snapshots(
    pulsar_client: pulsar.Client, admin: PulsarAdmin, topic: str
) -> None:
    keep_history(admin, topic)
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

    wait_until(lambda: snapshot_records(pulsar_client, topic) >= 3, timeout_s=30, what="the generator's snapshots")
    producer.send(b"sentinel", event_timestamp=20_000)  # after W_SET(20000) and the snapshots
    late = WatermarkConsumer(pulsar_client, topic, "late", initial_position=pulsar.InitialPosition.Earliest)
    for _ in range(155):
        late.acknowledge(late.receive(timeout_millis=10_000))
    # acknowledged m0..m154: the last marker before m155 is W_SET(10150)
    wait_until(lambda: late.get_last_watermark() is not None and late.get_last_watermark().event_time == 10_150,
               what="watermark 10150 at m154")  # fmt: skip
    received = [late.receive(timeout_millis=10_000) for _ in range(146)]
    for message in received:
        late.acknowledge(message)
    # receive() acknowledged W_SET(20000) and the snapshots, and handed over nothing but data
    assert [m.data() for m in received] == [f"m{i}".encode() for i in range(155, 300)] + [b"sentinel"]
    wait_until(lambda: late.get_last_watermark().event_time == 20_000, what="watermark 20000 at the end")
    assert_oracle_agrees(pulsar_client, admin, topic)
    for closable in (late, first, producer):
        closable.close()


def test_watermark_transactions_commit_abort_and_timeout(
    pulsar_settings: PulsarSettings, pulsar_client: pulsar.Client, admin: PulsarAdmin, namespace: str, tmp_path: Path
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
        # the sentinel: A's own W_SET(150) outside the transaction shows as 150 only while 200 is pending
        a.new_watermark().event_time(150).send()
        wait_until(lambda: watermarks(recorder)[-1] >= 150, what="the sentinel watermark 150")
        assert watermarks(recorder) == [100, 150], "a pending transactional watermark took effect before its commit"
        committed.commit()
        wait_until(lambda: 200 in watermarks(recorder), what="watermark 200 at the commit")
        assert watermarks(recorder) == [100, 150, 200]

        aborted = a.new_transaction()
        a.new_watermark(aborted).event_time(300).send()
        aborted.abort()
        timed_out = a.new_transaction()
        a.new_watermark(timed_out).event_time(400).send()
        time.sleep(3.5)  # the log's clock, from publish times, must pass the transaction timeout
        b.new_watermark().event_time(1_100).send()  # moves the log's clock past the transaction timeout
        timed_out.commit()
        # the sentinel: 250 shows only if neither 300 nor 400 took effect before it
        a.new_watermark().event_time(250).send()
        wait_until(lambda: watermarks(recorder)[-1] >= 250, what="the sentinel watermark 250")
        assert watermarks(recorder) == [100, 150, 200, 250], "an aborted or timed-out transaction took effect"
        assert_oracle_agrees(pulsar_client, admin, topic, generator.watermark_config)
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
    pulsar_settings: PulsarSettings, pulsar_client: pulsar.Client, admin: PulsarAdmin, namespace: str, tmp_path: Path
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
        # snapshot records wait up to half a second to be written together: the restart below restores from one
        wait_until(lambda: snapshot_records(pulsar_client, topic) >= 1, timeout_s=30, what="a snapshot before the kill")
        gen.kill()
        before = watermarks(checker)[-1]
        time.sleep(1.0)
        gen = GeneratorProcess(pulsar_settings, tmp_path / "gen2.log", "kill-gen-2", WM_NAMESPACES=namespace).start()
        thread.join(timeout=120)
        wait_until(lambda: (watermarks(checker) or [0])[-1] == 1_000_000 + count, timeout_s=30,
                   what="the final watermark after the restart")  # fmt: skip
        assert_oracle_agrees(pulsar_client, admin, topic, gen.watermark_config)
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
            return owner_of(admin, topic)

        wait_until(lambda: owner() in gens, what="an owner")
        victim = owner()
        gens[victim].kill()
        producer.new_watermark().event_time(200).send()
        producer.send(b"y", event_timestamp=200)
        wait_until(lambda: watermarks(recorder) == [100, 200], timeout_s=60, what="a watermark from the survivor")
        assert owner() != victim
        survivor = next(gen for name, gen in gens.items() if name != victim)
        assert_oracle_agrees(pulsar_client, admin, topic, survivor.watermark_config)
    finally:
        for gen in gens.values():
            gen.stop()
    consumer.close()
    producer.close()


def test_metrics_and_status_show_the_watermark(
    pulsar_settings: PulsarSettings, pulsar_client: pulsar.Client, admin: PulsarAdmin, namespace: str, tmp_path: Path
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
        assert_oracle_agrees(pulsar_client, admin, topic, gen.watermark_config)
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


# -- contract clauses on the real generator ------------------------------------------------------------


def test_a_producer_that_dies_without_w_idle_stops_holding_the_watermark_after_the_producer_timeout(
    pulsar_settings: PulsarSettings, pulsar_client: pulsar.Client, admin: PulsarAdmin, namespace: str, tmp_path: Path
) -> None:
    gen = GeneratorProcess(
        pulsar_settings, tmp_path / "gen.log", "timeout-gen", WM_NAMESPACES=namespace, WM_PRODUCER_TIMEOUT_MS="5000"
    ).start()
    topic = f"persistent://{namespace}/producer-timeout"
    recorder = Recorder()
    consumer = WatermarkConsumer(pulsar_client, topic, "sub", listener=recorder)
    dying = WatermarkProducer(pulsar_client, topic, producer_name="dying", keepalive_interval_ms=None)
    living = WatermarkProducer(pulsar_client, topic, producer_name="living", keepalive_interval_ms=None)
    try:
        dying.new_watermark().event_time(100).send()
        living.new_watermark().event_time(500).send()
        wait_until(lambda: watermarks(recorder) == [100], timeout_s=30, what="watermark 100")
        dying.close(idle=False)  # gone without W_IDLE
        living.new_watermark().event_time(600).send()  # within the timeout on the log's clock: 100 holds
        time.sleep(5.5)  # the log's clock (publish times) must pass the producer timeout
        living.new_watermark().event_time(700).send()  # "dying" has been silent for > 5 s of log time
        wait_until(lambda: 700 in watermarks(recorder), timeout_s=30, what="watermark 700 once 'dying' timed out")
        assert watermarks(recorder) == [100, 700]
        assert_oracle_agrees(pulsar_client, admin, topic, gen.watermark_config)
    finally:
        for closable in (consumer, living):
            closable.close()
        gen.stop()


@pytest.mark.usefixtures("generator")
def test_a_late_joiner_does_not_pull_the_watermark_back_and_its_messages_below_it_are_late(
    pulsar_client: pulsar.Client, admin: PulsarAdmin, topic: str
) -> None:
    keep_history(admin, topic)
    recorder = Recorder()
    consumer = WatermarkConsumer(pulsar_client, topic, "sub", listener=recorder)
    early = WatermarkProducer(pulsar_client, topic, producer_name="early")
    early.new_watermark().event_time(1_000).send()
    early.send(b"on time", event_timestamp=1_000)
    wait_until(lambda: watermarks(recorder) == [1_000], what="watermark 1000")
    joiner = WatermarkProducer(pulsar_client, topic, producer_name="joiner")
    joiner.new_watermark().event_time(500).send()  # below the watermark
    joiner.send(b"below", event_timestamp=600)
    early.new_watermark().event_time(2_000).send()  # min(2000, 500) = 500 < 1000: the watermark holds
    joiner.new_watermark().event_time(1_500).send()  # the sentinel: min(2000, 1500)
    wait_until(lambda: 1_500 in watermarks(recorder), what="watermark 1500")
    assert watermarks(recorder) == [1_000, 1_500]
    assert recorder.messages() == [b"on time", b"below"]
    assert consumer.late_messages == 1  # "below" (600) was handed over after watermark 1000
    assert_oracle_agrees(pulsar_client, admin, topic)
    for closable in (consumer, early, joiner):
        closable.close()


@pytest.mark.usefixtures("generator")
def test_malformed_markers_are_skipped_by_the_generator_which_goes_on(
    generator: GeneratorProcess, pulsar_client: pulsar.Client, admin: PulsarAdmin, topic: str
) -> None:
    keep_history(admin, topic)
    recorder = Recorder()
    consumer = WatermarkConsumer(pulsar_client, topic, "sub", listener=recorder)
    good = WatermarkProducer(pulsar_client, topic, producer_name="good")
    raw = pulsar_client.create_producer(topic, producer_name="raw", batching_enabled=False)
    good.new_watermark().event_time(100).send()
    good.send(b"d0", event_timestamp=100)
    wait_until(lambda: watermarks(recorder) == [100], timeout_s=30, what="watermark 100")
    for i, (properties, payload, _) in enumerate(MALFORMED):
        raw.send(payload, properties=properties)
        raw.send(f"raw{i}".encode())
    good.new_watermark().event_time(200).send()  # after every malformed marker: the generator got past them
    wait_until(lambda: 200 in watermarks(recorder), timeout_s=30, what="watermark 200 after the malformed markers")
    assert watermarks(recorder) == [100, 200]
    assert len(recorder.messages()) == 1 + len(MALFORMED)
    assert generator.running
    skipped = [line for line in generator.log_text().splitlines() if topic in line and "malformed marker" in line]
    reasons = {reason for _, _, reason in MALFORMED}
    assert {reason for reason in reasons if any(f"({reason})" in line for line in skipped)} == reasons, skipped
    report = assert_oracle_agrees(pulsar_client, admin, topic)
    assert report.malformed_markers == len(MALFORMED)
    for closable in (consumer, good, raw):
        closable.close()


def test_a_pending_watermark_transaction_survives_kill_9_of_the_generator(
    pulsar_settings: PulsarSettings, pulsar_client: pulsar.Client, admin: PulsarAdmin, namespace: str, tmp_path: Path
) -> None:
    topic = f"persistent://{namespace}/txn-kill"
    gen = GeneratorProcess(pulsar_settings, tmp_path / "gen1.log", "txn-kill-1", WM_NAMESPACES=namespace).start()
    recorder = Recorder()
    consumer = WatermarkConsumer(pulsar_client, topic, "sub", listener=recorder)
    a = WatermarkProducer(pulsar_client, topic, producer_name="A")
    b = WatermarkProducer(pulsar_client, topic, producer_name="B")
    try:
        a.new_watermark().event_time(100).send()
        b.new_watermark().event_time(1_000).send()
        wait_until(lambda: watermarks(recorder) == [100], timeout_s=30, what="watermark 100")
        txn = a.new_transaction()
        txn_at = a.new_watermark(txn).event_time(200).send()[0]
        b.new_watermark().event_time(1_050).send()

        def pending_in_a_snapshot() -> bool:
            """A W_SNAPSHOT after the transaction's W_SET states it as pending: the restart must use it."""
            reader = pulsar_client.create_reader(topic, txn_at)
            try:
                while reader.has_message_available():
                    message = reader.read_next(timeout_millis=5_000)
                    if message.properties().get(MARKER_PROPERTY) == "W_SNAPSHOT":
                        body = msgpack.unpackb(msgpack.unpackb(message.data())["signed"])  # a signed snapshot
                        if body["state"]["pending"]:
                            return True
                return False
            finally:
                reader.close()

        wait_until(pending_in_a_snapshot, timeout_s=30, what="a snapshot with the pending transaction")
        gen.kill()
        gen = GeneratorProcess(pulsar_settings, tmp_path / "gen2.log", "txn-kill-2", WM_NAMESPACES=namespace).start()
        txn.commit()
        wait_until(lambda: 200 in watermarks(recorder), timeout_s=60, what="watermark 200 at the commit after kill -9")
        assert watermarks(recorder) == [100, 200]
        assert_oracle_agrees(pulsar_client, admin, topic, gen.watermark_config)
    finally:
        for closable in (consumer, a, b):
            closable.close()
        gen.stop()


def test_broker_ext_serve_without_namespace_or_topic_follows_public_default(
    pulsar_settings: PulsarSettings, pulsar_client: pulsar.Client, admin: PulsarAdmin, topic: str, tmp_path: Path
) -> None:
    """No --namespace, no --topic, no WM_NAMESPACES / WM_TOPICS: public/default (contract 4).

    The session's generator may follow public/default too, so this one must be seen among the
    topic's generator consumers, not just by a watermark arriving.
    """
    keep_history(admin, topic)
    instance = f"default-ns-{uuid.uuid4().hex[:6]}"
    gen = GeneratorProcess(pulsar_settings, tmp_path / "gen.log", instance, WM_NAMESPACES="", WM_TOPICS="").start()
    recorder = Recorder()
    consumer = WatermarkConsumer(pulsar_client, topic, "sub", listener=recorder)
    producer = WatermarkProducer(pulsar_client, topic, producer_name="default-ns")
    try:
        producer.new_watermark().event_time(4_242).send()

        following = f"following {topic}"  # it follows the topic (which instance owns it is Pulsar's choice)
        wait_until(lambda: following in gen.log_text(), timeout_s=30, what=f"generator {instance} on {topic}")
        assert "following namespaces ['public/default']" in gen.log_text()
        wait_until(lambda: watermarks(recorder) == [4_242], timeout_s=30, what="the watermark")
        assert_oracle_agrees(pulsar_client, admin, topic, gen.watermark_config)
    finally:
        for closable in (consumer, producer):
            closable.close()
        gen.stop()


def _latest_table(client: pulsar.Client, topic: str) -> dict[str, int | None]:
    """The latest SendWatermark table of a non-partitioned topic: what compaction keeps for it."""
    reader = watermark_table_reader(client, topic)
    latest: dict[str, int | None] = {}
    try:
        while reader.has_message_available():
            message = reader.read_next(timeout_millis=5_000)
            if message.properties().get(EVENT_PROPERTY) == SEND_WATERMARK:
                latest = {event.subscription: event.event_time for event in decode_table(message.data())}
    finally:
        reader.close()
    return latest


def test_every_table_names_a_subscription_acknowledged_ahead_of_the_generators_head(
    pulsar_settings: PulsarSettings, pulsar_client: pulsar.Client, admin: PulsarAdmin, namespace: str, tmp_path: Path
) -> None:
    """Issue #26 (2): the generator is held back (SIGSTOP) while "ahead" acknowledges a backlog it has not read;
    then a new subscription makes it publish a table while it reads the backlog. That table left "ahead" out, and
    "ahead", ready later with its unchanged watermark, was never published again: compaction would keep no
    watermark for it."""
    gen = GeneratorProcess(pulsar_settings, tmp_path / "gen.log", "every-table", WM_NAMESPACES=namespace).start()
    topic = f"persistent://{namespace}/every-table"
    earliest = pulsar.InitialPosition.Earliest
    ahead = pulsar_client.subscribe(topic, "ahead", initial_position=earliest)
    other = pulsar_client.subscribe(topic, "other", initial_position=earliest)
    a = WatermarkProducer(pulsar_client, topic, producer_name="A", keepalive_interval_ms=None)
    b = WatermarkProducer(pulsar_client, topic, producer_name="B", keepalive_interval_ms=None)
    plain = pulsar_client.create_producer(
        topic, batching_enabled=True, batching_max_messages=1_000, block_if_queue_full=True
    )
    stopped = False
    try:
        a.new_watermark().event_time(100).send()
        for consumer in (ahead, other):
            consumer.acknowledge_cumulative(consumer.receive(timeout_millis=10_000))
        wait_until(lambda: _latest_table(pulsar_client, topic) == {"ahead": 100, "other": 100}, timeout_s=30,
                   what="the table with both subscriptions at 100")  # fmt: skip
        assert gen.proc is not None
        gen.proc.send_signal(signal.SIGSTOP)
        stopped = True
        b.new_watermark().event_time(50).send()  # a late joiner: no watermark changes, but a marker waits
        for _ in range(30_000):
            plain.send_async(b"x", lambda result, _id: None)
        plain.flush()
        last, received = None, 0
        while received < 30_001 or last is not None:  # the generator's snapshots are messages too
            try:
                last = ahead.receive(timeout_millis=2_000)
                received += 1
            except pulsar.Timeout:
                assert received >= 30_001, f"'ahead' received {received} messages only"
                break
        assert last is not None
        ahead.acknowledge_cumulative(last)
        wait_until(lambda: backlog(admin, topic, "ahead") == 0, timeout_s=30, what="'ahead' acknowledged it all")
        newcomer = pulsar_client.subscribe(topic, "new", initial_position=earliest)  # its first table goes out soon
        gen.proc.send_signal(signal.SIGCONT)
        stopped = False
        wait_until(lambda: "new" in _latest_table(pulsar_client, topic), timeout_s=30, what="a table naming 'new'")
        wait_until(lambda: backlog(admin, topic, GENERATOR_SUBSCRIPTION) < 100, timeout_s=60,
                   what="the generator read the backlog")  # fmt: skip
        time.sleep(1.0)  # "ahead" is ready now: a table naming it would have gone out by now
        assert _latest_table(pulsar_client, topic) == {"ahead": 100, "other": 100, "new": None}
        newcomer.close()
    finally:
        if stopped and gen.proc is not None:
            gen.proc.send_signal(signal.SIGCONT)
        for closable in (ahead, other, a, b, plain):
            closable.close()
        gen.stop()


def test_a_deleted_and_recreated_topic_starts_without_the_old_watermark_for_consumers_and_status(
    pulsar_settings: PulsarSettings, pulsar_client: pulsar.Client, admin: PulsarAdmin, namespace: str, tmp_path: Path
) -> None:
    """Issue #26 (1): before, a new consumer got T+10 h from the companion topic, handed the new messages over under
    it and kept it; `broker-ext status` showed it too."""
    from broker_ext.status import status_rows
    from tests.integration.helpers import recreate_after_a_high_watermark

    gen = GeneratorProcess(pulsar_settings, tmp_path / "gen.log", "recreate", "DEBUG", WM_NAMESPACES=namespace).start()
    topic = f"persistent://{namespace}/recreated"
    base = 1_700_000_000_000
    new = recreate_after_a_high_watermark(pulsar_client, admin, topic, base, "sub")
    recorder = Recorder()
    consumer = WatermarkConsumer(pulsar_client, topic, "sub", listener=recorder, admin_url=pulsar_settings.admin_url)
    try:
        for i in range(5):
            new.send(f"new-{i}".encode(), event_timestamp=base + i)
        new.new_watermark().event_time(base + 5).send()
        wait_until(lambda: len(recorder.messages()) == 5, timeout_s=30, what="the new messages")
        wait_until(lambda: base + 5 in watermarks(recorder), timeout_s=60, what="the new topic's own watermark")
        assert all(w <= base + 5 for w in watermarks(recorder)), watermarks(recorder)
        # before the new messages, nothing from the old incarnation stood over them
        assert recorder.events[0][0] != "wm" or recorder.events[0][1] <= base, recorder.events
        rows = status_rows(pulsar_settings, topic)
        assert [row["watermark"].split()[0] for row in rows if row["subscription"] == "sub"] == [str(base + 5)], rows
        fresh = Recorder()
        attached = WatermarkConsumer(  # attaches after it all
            pulsar_client, topic, "later", listener=fresh, admin_url=pulsar_settings.admin_url
        )
        time.sleep(1.0)
        assert all(w <= base + 5 for w in watermarks(fresh)), watermarks(fresh)
        attached.close()
    finally:
        consumer.close()
        new.close()
        gen.stop()


def test_the_spark_sources_follower_reads_a_groups_companion_topic_once_for_the_topics_it_starts_with(
    generator: GeneratorProcess, pulsar_client: pulsar.Client, topic: str
) -> None:
    """A companion topic carries the tables of a group of topics (issue 47); a query reading several of them read it
    once per topic, with a reader and a thread each. The topics it starts following together share one."""
    from pulsar_access.topics import full_name, watermark_topic_for
    from spark_sink.watermarks import CompanionFollower, KnownWatermarks

    first = full_name(topic)
    second = next(t for i in range(1000) if watermark_topic_for(t := f"{first}-{i}") == watermark_topic_for(first))
    producers = [WatermarkProducer(pulsar_client, t, producer_name=f"group-{i}") for i, t in enumerate((first, second))]
    known = KnownWatermarks()
    follower = CompanionFollower(pulsar_client, known)
    before = {thread.ident for thread in threading.enumerate()}
    try:
        for time_ms, producer in zip((100, 200), producers, strict=True):
            producer.new_watermark().event_time(time_ms).send()  # its head event: published with nobody acknowledging
        follower.follow([first, second])
        wait_until(lambda: [known.watermark({(t, -1): (2**62, 0)}) for t in (first, second)] == [100, 200],
                   what="both topics' head watermarks at the follower")  # fmt: skip
        started = [thread.name for thread in threading.enumerate() if thread.ident not in before]
        assert len(started) == 1, started
    finally:
        follower.close()
        for producer in producers:
            producer.close()
