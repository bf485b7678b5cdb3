"""WatermarkProducer and WatermarkConsumer on the real broker (no generator needed here)."""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
import traceback

import msgpack
import pulsar
import pytest

from consumer import WatermarkConsumer
from producer import TransactionClosedError, WatermarkProducer
from pulsar_access.admin import PulsarAdmin
from pulsar_access.settings import PulsarSettings
from pulsar_access.topics import watermark_topic_for
from tests.integration.helpers import Recorder, backlog, partition_backlogs, wait_until, watermarks
from tests.oracle import assert_oracle_agrees, keep_history
from watermark_core.protocol import MARKER_PROPERTY


def test_markers_never_reach_the_listener_and_the_backlog_drains(
    pulsar_client: pulsar.Client, admin: PulsarAdmin, namespace: str
) -> None:
    topic = f"persistent://{namespace}/hidden"  # no generator follows it: no W_SNAPSHOT joins the 9 markers
    recorder = Recorder()
    consumer = WatermarkConsumer(pulsar_client, topic, "sub", listener=recorder)
    producer = WatermarkProducer(pulsar_client, topic, producer_name="p1")
    expected = []
    for i in range(30):
        producer.send(f"m{i}".encode(), event_timestamp=1_000 + i)
        expected.append(f"m{i}".encode())
        if i % 5 == 4:
            producer.new_watermark().event_time(1_000 + i).send()
    txn = producer.new_transaction()
    producer.new_watermark(txn).event_time(2_000).send()
    txn.commit()
    producer.new_watermark().mark_idle().send()

    wait_until(lambda: len(recorder.messages()) == 30, what="30 data messages")
    assert recorder.messages() == expected
    wait_until(lambda: backlog(admin, topic, "sub") == 0, what="backlog 0")
    assert consumer.markers_hidden == 6 + 2 + 1
    assert not consumer.malformed_markers
    consumer.close()
    producer.close()


def test_receive_returns_only_data_and_acks_markers(
    pulsar_client: pulsar.Client, admin: PulsarAdmin, namespace: str
) -> None:
    topic = f"persistent://{namespace}/no-generator"  # no generator follows this namespace
    consumer = WatermarkConsumer(pulsar_client, topic, "sub")
    producer = WatermarkProducer(pulsar_client, topic)
    producer.new_watermark().event_time(5).send()
    producer.send(b"a", event_timestamp=10)
    producer.new_watermark().event_time(10).send()
    producer.send(b"b", event_timestamp=11)
    producer.new_watermark().event_time(11).send()
    producer.send(b"sentinel", event_timestamp=12)  # the W_SET(11) before it is hidden too
    got = []
    for _ in range(3):
        message = consumer.receive(timeout_millis=10_000)
        got.append(message.data())
        consumer.acknowledge(message)
    assert got == [b"a", b"b", b"sentinel"]
    wait_until(lambda: backlog(admin, topic, "sub") == 0, what="backlog 0")
    assert consumer.get_last_watermark() is None  # no generator runs in this test
    consumer.close()
    producer.close()


def test_batch_receive_returns_only_data_and_acks_markers(
    pulsar_client: pulsar.Client, admin: PulsarAdmin, namespace: str
) -> None:
    topic = f"persistent://{namespace}/no-generator-batch"  # no generator follows this namespace
    consumer = WatermarkConsumer(pulsar_client, topic, "sub")
    producer = WatermarkProducer(pulsar_client, topic)
    expected = []
    for i in range(20):
        producer.new_watermark().event_time(i).send()
        producer.send(f"m{i}".encode(), event_timestamp=i)
        expected.append(f"m{i}".encode())
    got: list[bytes] = []
    deadline = time.monotonic() + 20
    while len(got) < len(expected) and time.monotonic() < deadline:
        for message in consumer.batch_receive():
            got.append(message.data())
            consumer.acknowledge(message)
    assert got == expected
    assert consumer.markers_hidden == 20
    wait_until(lambda: backlog(admin, topic, "sub") == 0, what="backlog 0")
    consumer.close()
    producer.close()


def test_markers_go_to_every_partition(pulsar_client: pulsar.Client, admin: PulsarAdmin, namespace: str) -> None:
    topic = f"persistent://{namespace}/broadcast"  # no generator follows it: only the producer's markers are there
    admin.create_topic(topic, partitions=3)
    producer = WatermarkProducer(pulsar_client, topic, producer_name="bcast")
    ids = producer.new_watermark().event_time(42).send()
    assert sorted(i.partition() for i in ids) == [0, 1, 2]
    keyed = [producer.send(b"k", partition_key="same-key") for _ in range(5)]
    assert len({i.partition() for i in keyed}) == 1
    spread = [producer.send(b"x") for _ in range(6)]
    assert {i.partition() for i in spread} == {0, 1, 2}
    producer.close()  # sends W_IDLE to every partition too

    for partition in range(3):
        reader = pulsar_client.create_reader(f"{topic}-partition-{partition}", pulsar.MessageId.earliest)
        kinds = []
        while reader.has_message_available():
            message = reader.read_next(timeout_millis=5_000)
            kinds.append(message.properties().get(MARKER_PROPERTY))
            assert message.producer_name() == "bcast"
        reader.close()
        assert kinds[0] == "W_SET"
        assert kinds[-1] == "W_IDLE"


@pytest.mark.parametrize(
    "consumer_type",
    [
        pulsar.ConsumerType.Exclusive,
        pulsar.ConsumerType.Failover,
        pulsar.ConsumerType.Shared,
        pulsar.ConsumerType.KeyShared,
    ],
)
def test_every_subscription_type_gets_all_data_and_no_markers(
    pulsar_client: pulsar.Client, admin: PulsarAdmin, topic: str, consumer_type: pulsar.ConsumerType
) -> None:
    admin.create_topic(topic, partitions=2)
    consumers_count = 1 if consumer_type == pulsar.ConsumerType.Exclusive else 2
    recorders = [Recorder() for _ in range(consumers_count)]
    consumers = [
        WatermarkConsumer(pulsar_client, topic, "sub", listener=r, consumer_type=consumer_type) for r in recorders
    ]
    producer = WatermarkProducer(pulsar_client, topic, producer_name=f"types-{consumer_type}")
    expected = set()
    for i in range(40):
        producer.send(f"m{i}".encode(), partition_key=f"k{i % 7}", event_timestamp=100 + i)
        expected.add(f"m{i}".encode())
        if i % 10 == 0:
            producer.new_watermark().event_time(100 + i).send()
    wait_until(lambda: sum(len(r.messages()) for r in recorders) == 40, what="40 messages")
    got = [m for r in recorders for m in r.messages()]
    assert sorted(got) == sorted(expected)  # each once, no marker among them
    wait_until(lambda: partition_backlogs(admin, topic, 2, "sub") == [0, 0], what="backlogs 0")
    for c in consumers:
        c.close()
    producer.close()


def test_malformed_markers_from_a_raw_producer_are_skipped_and_nothing_is_lost(
    pulsar_client: pulsar.Client, admin: PulsarAdmin, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = Recorder()
    consumer = WatermarkConsumer(pulsar_client, topic, "sub", listener=recorder)
    raw = pulsar_client.create_producer(topic, producer_name="raw")
    bad = [
        ({MARKER_PROPERTY: "W_SET"}, b"\xc1not msgpack"),
        ({MARKER_PROPERTY: "W_BOGUS"}, b"\x80"),
        ({MARKER_PROPERTY: "W_SET"}, b"\x81\xa1v\x01"),  # no event_time
        ({MARKER_PROPERTY: "W_SET"}, b"\x81\xa1v\x01"),
    ]
    with caplog.at_level(logging.WARNING, logger="consumer"):
        for i, (properties, payload) in enumerate(bad):
            raw.send(f"d{i}".encode())
            raw.send(payload, properties=properties)
        raw.send(b"last")
        wait_until(lambda: len(recorder.messages()) == 5, what="5 data messages")
    assert recorder.messages() == [b"d0", b"d1", b"d2", b"d3", b"last"]
    assert sum(consumer.malformed_markers.values()) == 4
    wait_until(lambda: backlog(admin, topic, "sub") == 0, what="backlog 0")
    malformed_logs = [r for r in caplog.records if "malformed marker" in r.getMessage()]
    assert len(malformed_logs) == len(consumer.malformed_markers)  # once per kind, not once per marker
    consumer.close()
    raw.close()


def test_no_generator_still_delivers_and_warns_once(
    pulsar_client: pulsar.Client, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    topic = f"persistent://{namespace}/no-generator"  # no generator follows this namespace
    recorder = Recorder()

    def warnings(subscription: str) -> list[str]:
        return [r.getMessage() for r in caplog.records
                if f"no watermark arrived for subscription {subscription!r}" in r.getMessage()]  # fmt: skip

    with caplog.at_level(logging.WARNING, logger="consumer"):
        consumer = WatermarkConsumer(pulsar_client, topic, "sub", listener=recorder, no_watermark_warning_s=0.5)
        # the sentinel: a consumer that warns three times later; a repeating warning of "sub" comes before it
        sentinel = WatermarkConsumer(pulsar_client, topic, "sentinel", no_watermark_warning_s=1.5)
        producer = WatermarkProducer(pulsar_client, topic)
        producer.send(b"x")
        producer.new_watermark().event_time(1).send()
        wait_until(lambda: recorder.messages() == [b"x"], what="the message")
        wait_until(lambda: warnings("sentinel"), what="the sentinel's warning")
    assert len(warnings("sub")) == 1
    assert "broker-ext serve" in warnings("sub")[0]
    for closable in (consumer, sentinel, producer):
        closable.close()


def test_producer_validates_inputs(pulsar_client: pulsar.Client, topic: str) -> None:
    producer = WatermarkProducer(pulsar_client, topic)
    for bad in (-1, 1.5, "10", True, None):
        with pytest.raises(ValueError, match="event_time"):
            producer.new_watermark().event_time(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"\.event_time\(t_ms\) or \.mark_idle\(\)"):
        producer.new_watermark().send()
    with pytest.raises(ValueError, match="reserved"):
        producer.send(b"x", properties={MARKER_PROPERTY: "W_SET"})
    txn = producer.new_transaction()
    producer.new_watermark(txn).event_time(5).send()
    txn.commit()
    with pytest.raises(TransactionClosedError, match="already committed"):
        producer.new_watermark(txn).event_time(6).send()
    with pytest.raises(TransactionClosedError):
        txn.abort()
    producer.close()
    with pytest.raises(RuntimeError, match="closed"):
        producer.new_watermark().event_time(7).send()


def test_ingestion_time_watermarks_and_stamps(pulsar_client: pulsar.Client, namespace: str) -> None:
    topic = f"persistent://{namespace}/ingestion"

    def read_topic() -> tuple[list[int], list[int]]:
        """The event times of the data messages and the W_SETs' event times, in log order."""
        reader = pulsar_client.create_reader(topic, pulsar.MessageId.earliest)
        stamps, sets = [], []
        while reader.has_message_available():
            message = reader.read_next(timeout_millis=5_000)
            if message.properties().get(MARKER_PROPERTY) == "W_SET":
                sets.append(msgpack.unpackb(message.data())["event_time"])
            elif MARKER_PROPERTY not in message.properties():
                stamps.append(message.event_timestamp())
        reader.close()
        return stamps, sets

    before = int(time.time() * 1000)
    producer = WatermarkProducer(pulsar_client, topic, producer_name="clock", ingestion_time_interval_ms=100)
    producer.send(b"now")
    wait_until(lambda: len(read_topic()[1]) >= 5, timeout_s=30, what="5 ingestion-time W_SETs")
    producer.close(idle=False)
    stamps, sets = read_topic()
    assert len(stamps) == 1 and before <= stamps[0] <= int(time.time() * 1000)
    assert len(sets) >= 5, sets
    assert sets == sorted(sets) and sets[0] >= before


@pytest.mark.usefixtures("generator")
def test_a_message_below_the_watermark_is_counted_late(pulsar_client: pulsar.Client, topic: str) -> None:
    consumer = WatermarkConsumer(pulsar_client, topic, "sub")
    producer = WatermarkProducer(pulsar_client, topic, producer_name="breaks-promise")
    producer.new_watermark().event_time(1_000).send()
    producer.send(b"on time", event_timestamp=1_000)
    first = consumer.receive(timeout_millis=10_000)
    consumer.acknowledge(first)
    wait_until(lambda: consumer.get_last_watermark() is not None, timeout_s=30, what="the watermark")
    producer.send(b"late", event_timestamp=500)
    late = consumer.receive(timeout_millis=10_000)
    assert late.data() == b"late"
    assert consumer.is_late(late) and not consumer.is_late(first)
    assert consumer.late_messages == 1
    consumer.close()
    producer.close()


def test_close_after_the_client_closed_still_stops_the_consumers_threads(
    pulsar_settings: PulsarSettings, topic: str
) -> None:
    """What the fault suite's crashed consumer does: the client (the connection) goes first.

    The wrapper's watermark reader and listener thread must stop all the same, whether the
    underlying close then succeeds or fails, not linger for the process's life.
    """
    client = pulsar_settings.client()
    before = set(threading.enumerate())
    consumer = WatermarkConsumer(client, topic, "closing", listener=Recorder())
    # its own threads, not another test's of the same name (a companion topic's reader is named after the group)
    ours = [t for t in set(threading.enumerate()) - before
            if t.name in {"wm-listener-closing", f"wm-companion-{watermark_topic_for(topic)}"}]  # fmt: skip
    assert len(ours) == 2
    client.close()
    with contextlib.suppress(pulsar.PulsarException):
        consumer.close()
    left = [t for t in ours if t.is_alive()]
    frames = sys._current_frames()  # where a thread that outlived close waits: what to fix
    assert left == [], "".join(
        f"{t.name}:\n{''.join(traceback.format_stack(frames[t.ident]))}" for t in left if t.ident in frames
    )


@pytest.mark.usefixtures("generator")
def test_a_watermark_sent_with_send_async_reaches_every_partition(
    pulsar_client: pulsar.Client, admin: PulsarAdmin, topic: str
) -> None:
    keep_history(admin, topic, partitions=2)
    recorder = Recorder()
    consumer = WatermarkConsumer(pulsar_client, topic, "sub", listener=recorder)
    producer = WatermarkProducer(pulsar_client, topic, producer_name="async")
    outcome: list[pulsar.Result] = []
    done = threading.Event()

    def on_sent(result: pulsar.Result, _message_id: object) -> None:
        outcome.append(result)
        done.set()

    producer.new_watermark().event_time(777).send_async(on_sent)
    assert done.wait(30), "send_async never called back"
    assert outcome == [pulsar.Result.Ok]  # once, after both partitions answered
    assert producer.last_watermark == 777
    producer.send(b"after", partition_key="k", event_timestamp=800)
    # a consumer of both partitions sees the minimum over them: 777 only if both got the W_SET
    wait_until(lambda: watermarks(recorder) == [777] and recorder.messages() == [b"after"], timeout_s=30,
               what="watermark 777 and the message")  # fmt: skip
    recorder.assert_one_thread("sub")
    assert_oracle_agrees(pulsar_client, admin, topic)
    consumer.close()
    producer.close()
