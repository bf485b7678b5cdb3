"""Seeks and resets with consumers attached (issue #16): never a stale watermark over redelivered messages.

Each test reproduces what an application or an operator does on the real broker with the session's
generator, and checks what a listener saw: no message handed over below the watermark the listener
held at that moment, and the watermark recomputed at the new position arrives (waited for with a
bound, never timed).
"""

from __future__ import annotations

import time
from typing import Any

import pulsar
import pytest

from consumer import WatermarkConsumer
from producer import WatermarkProducer
from pulsar_access.admin import PulsarAdmin
from tests.integration.helpers import Timeline, wait_until
from watermark_core.protocol import MARKER_PROPERTY

pytestmark = pytest.mark.usefixtures("generator")

RECOMPUTED_WITHIN_S = 30.0
LAST = 49_000


def produce_rising(producer: WatermarkProducer, count: int = 50) -> list[pulsar.MessageId]:
    """The issue's topic: W_SET(i * 1000) then message m<i> at i * 1000 + 500, for i < count."""
    ids = []
    for i in range(count):
        producer.new_watermark().event_time(i * 1000).send()
        ids.append(producer.send(f"m{i}".encode(), event_timestamp=i * 1000 + 500))
    return ids


def attach(
    client: pulsar.Client, topic: str, subscription: str, timeline: Timeline, **options: Any
) -> WatermarkConsumer:
    return WatermarkConsumer(client, topic, subscription, listener=timeline, **options)


def wait_for_watermark(timeline: Timeline, value: int, what: str) -> None:
    wait_until(lambda: timeline.values()[-1:] == [value], timeout_s=RECOMPUTED_WITHIN_S, what=what)


def replayed_after(timeline: Timeline, handed_before: int) -> list[bytes]:
    with timeline.lock:
        return [m.payload for m in timeline.messages[handed_before:]]


def test_seek_back_by_message_id_with_the_consumer_attached(pulsar_client: pulsar.Client, topic: str) -> None:
    """The issue's reproduction: the redelivered m11 comes after the watermark recomputed before it."""
    timeline = Timeline()
    consumer = attach(pulsar_client, topic, "reprocess", timeline)
    producer = WatermarkProducer(pulsar_client, topic, producer_name="P", keepalive_interval_ms=None)
    ids = produce_rising(producer)
    wait_for_watermark(timeline, LAST, "watermark 49000 once everything is acknowledged")
    handed_before = len(timeline.messages)

    consumer.seek(ids[10])
    wait_until(lambda: timeline.count(b"m49") == 2, timeout_s=RECOMPUTED_WITHIN_S, what="the replay after m10")
    wait_for_watermark(timeline, LAST, "watermark 49000 again once the replay is acknowledged")

    timeline.assert_never_below_the_held_watermark()
    first = timeline.messages[handed_before]
    assert first.payload == b"m11", "Pulsar resumes after the message id sought to"
    assert first.held is not None and first.held.event_time in (10_000, 11_000), "recomputed before m11"
    assert consumer.late_messages == 0
    consumer.close()
    producer.close()


def test_the_pulsar_client_drops_the_entries_up_to_its_seek_target_when_the_subscription_moves_back_over_it(
    pulsar_client: pulsar.Client, admin: PulsarAdmin, topic: str
) -> None:
    """What the next test works around, with a plain `pulsar.Consumer` (pulsar-client 3.13): after `seek(m30)`
    the client keeps m30 as its start message id and drops every later delivery of an entry of that ledger
    up to it, without acknowledging it (and without returning its flow permit: with a small receiver queue
    the consumer stops receiving altogether); a reset-cursor back to m20 leaves m20..m30 unacknowledged.
    If this fails after a client upgrade, the workaround in WatermarkConsumer may be dropped."""
    consumer = pulsar_client.subscribe(topic, "plain", consumer_type=pulsar.ConsumerType.Failover)
    producer = pulsar_client.create_producer(topic, batching_enabled=False)
    ids = [producer.send(f"m{i}".encode()) for i in range(40)]

    def receive_until_m39() -> list[bytes]:
        payloads: list[bytes] = []
        while not payloads or payloads[-1] != b"m39":
            message = consumer.receive(timeout_millis=10_000)
            consumer.acknowledge(message)
            if MARKER_PROPERTY not in message.properties():  # the generator's W_SNAPSHOT records
                payloads.append(message.data())
        return payloads

    assert receive_until_m39()[0] == b"m0"
    consumer.seek(ids[30])
    assert receive_until_m39()[0] == b"m31"
    consumer.acknowledge(ids[30])  # what WatermarkConsumer.seek does: nobody else would
    last = (ids[39].ledger_id(), ids[39].entry_id())
    wait_until(lambda: admin.mark_delete_position(topic, "plain") >= last, what="everything acknowledged")
    time.sleep(1.0)

    admin.reset_cursor(topic, "plain", ids[20])
    assert receive_until_m39()[0] == b"m31", "m20..m30 came again and the client dropped them"
    time.sleep(2.0)  # acknowledgements are grouped (100 ms)
    # just before m20 (the session's generator may have written a record of its own between m19 and m20)
    assert admin.mark_delete_position(topic, "plain") == (ids[20].ledger_id(), ids[20].entry_id() - 1)
    consumer.close()
    producer.close()


def test_a_reset_cursor_back_over_the_consumers_seek_target_leaves_nothing_unacknowledged(
    pulsar_client: pulsar.Client, admin: PulsarAdmin, topic: str
) -> None:
    """Chaos seeds 60559 and 776590: after `seek(m30)` the Pulsar client drops, unacknowledged, every later
    delivery of an entry of m30's ledger up to m30, and does not return the flow permits they used; an
    operator's reset-cursor back to m20 a second later delivers m20..m30 again: the subscription (and its
    watermark) would stay before m20, and with a receiver queue of 5 the consumer would receive nothing more
    at all. WatermarkConsumer subscribes again after a seek by message id, so nothing is dropped."""
    timeline = Timeline()
    consumer = attach(pulsar_client, topic, "reprocess", timeline, consumer_type=pulsar.ConsumerType.Failover,
                      receiver_queue_size=5)  # fmt: skip
    producer = WatermarkProducer(pulsar_client, topic, producer_name="P", keepalive_interval_ms=None)
    ids = produce_rising(producer)
    wait_for_watermark(timeline, LAST, "watermark 49000")
    consumer.seek(ids[30])
    wait_until(lambda: timeline.count(b"m49") == 2, timeout_s=RECOMPUTED_WITHIN_S, what="the replay after m30")
    wait_for_watermark(timeline, LAST, "watermark 49000 again after the seek")
    time.sleep(1.0)  # the chaos suite spaces the moves of one subscription by 1 s

    admin.reset_cursor(topic, "reprocess", ids[20])
    wait_until(lambda: timeline.count(b"m49") == 3, timeout_s=RECOMPUTED_WITHIN_S, what="the replay after the reset")
    last = (ids[49].ledger_id(), ids[49].entry_id())
    wait_until(lambda: admin.mark_delete_position(topic, "reprocess") >= last, timeout_s=RECOMPUTED_WITHIN_S,
               what="everything acknowledged, the entries the client dropped included")  # fmt: skip
    wait_for_watermark(timeline, LAST, "watermark 49000 at the end")
    timeline.assert_never_below_the_held_watermark()
    assert consumer.late_messages == 0
    consumer.close()
    producer.close()


def test_seek_back_by_publish_time_with_the_consumer_attached(pulsar_client: pulsar.Client, topic: str) -> None:
    timeline = Timeline()
    consumer = attach(pulsar_client, topic, "reprocess", timeline)
    producer = WatermarkProducer(pulsar_client, topic, producer_name="P", keepalive_interval_ms=None)
    produce_rising(producer)
    wait_for_watermark(timeline, LAST, "watermark 49000")
    handed_before = len(timeline.messages)
    m10 = next(m for m in timeline.messages if m.payload == b"m10")

    consumer.seek(m10.publish_time)
    wait_until(lambda: timeline.count(b"m49") == 2, timeout_s=RECOMPUTED_WITHIN_S, what="the replay")
    wait_for_watermark(timeline, LAST, "watermark 49000 again")

    timeline.assert_never_below_the_held_watermark()
    replayed = replayed_after(timeline, handed_before)
    assert replayed[replayed.index(b"m10") :] == [f"m{i}".encode() for i in range(10, 50)]
    first = timeline.messages[handed_before]
    assert first.held is not None and first.held.event_time <= first.event_time
    assert consumer.late_messages == 0
    consumer.close()
    producer.close()


@pytest.mark.parametrize("by", ["message id", "publish time"])
def test_admin_reset_cursor_while_two_shared_consumers_are_attached(
    pulsar_client: pulsar.Client, admin: PulsarAdmin, topic: str, by: str
) -> None:
    """An operator's reset-cursor reaches attached consumers like a seek they did not ask for."""
    options = {"consumer_type": pulsar.ConsumerType.Shared, "receiver_queue_size": 10}
    timelines = [Timeline(), Timeline()]
    consumers = [attach(pulsar_client, topic, "shared", t, **options) for t in timelines]
    producer = WatermarkProducer(pulsar_client, topic, producer_name="P", keepalive_interval_ms=None)
    ids = produce_rising(producer)
    for timeline in timelines:
        wait_for_watermark(timeline, LAST, "watermark 49000 on both consumers")
    publish_times = {m.payload: m.publish_time for t in timelines for m in t.messages}

    admin.reset_cursor(topic, "shared", ids[10] if by == "message id" else publish_times[b"m10"])

    def replayed(payload: bytes) -> int:
        return sum(t.count(payload) for t in timelines)

    wait_until(lambda: all(replayed(f"m{i}".encode()) >= 2 for i in range(10, 50)), timeout_s=RECOMPUTED_WITHIN_S,
               what="the replay from m10 over both consumers")  # fmt: skip
    for timeline in timelines:
        wait_for_watermark(timeline, LAST, "watermark 49000 again on both consumers")
        timeline.assert_never_below_the_held_watermark()
    assert any(v is not None and v <= 10_000 for t in timelines for v in t.values()), "no recomputed watermark"
    for consumer in consumers:
        assert consumer.late_messages == 0
        consumer.close()
    producer.close()


def test_seek_forward_hands_over_the_watermark_at_the_end(pulsar_client: pulsar.Client, topic: str) -> None:
    timeline = Timeline(ack=False)  # holds everything: the subscription stays at W_SET(1000)
    consumer = attach(pulsar_client, topic, "skipper", timeline)
    producer = WatermarkProducer(pulsar_client, topic, producer_name="P", keepalive_interval_ms=None)
    for i in (1, 2, 3):
        producer.new_watermark().event_time(i * 1000).send()
        producer.send(f"m{i}".encode(), event_timestamp=i * 1000 + 500)
    wait_until(lambda: len(timeline.messages) == 3, what="the three messages")
    wait_for_watermark(timeline, 1000, "watermark 1000: nothing after W_SET(1000) acknowledged")

    consumer.seek(pulsar.MessageId.latest)
    wait_for_watermark(timeline, 3000, "watermark 3000 at the end")
    producer.send(b"m4", event_timestamp=3600)
    wait_until(lambda: timeline.count(b"m4") == 1, what="a message after the seek")
    timeline.assert_never_below_the_held_watermark()
    assert [v for v in timeline.values()] == [1000, 3000], "a forward seek takes nothing away"
    consumer.close()
    producer.close()


def test_seek_to_before_the_first_w_set_hands_over_no_watermark_above_the_replayed_messages(
    pulsar_client: pulsar.Client, topic: str
) -> None:
    """Issue #17, counterexample 1: at the start of the topic the subscription has no watermark at all.

    A generator that publishes that state lets the replay go on at once; one that publishes nothing
    for it makes the consumer wait `recompute_wait_s` (short here) and go on without a watermark.
    Either way no replayed message is handed over under the watermark from before the seek.
    """
    timeline = Timeline()
    consumer = attach(pulsar_client, topic, "restart", timeline, recompute_wait_s=5.0)
    producer = WatermarkProducer(pulsar_client, topic, producer_name="P", keepalive_interval_ms=None)
    for i in range(5):
        producer.send(f"m{i}".encode(), event_timestamp=100 * (i + 1))
    producer.new_watermark().event_time(1000).send()
    for i in range(5, 10):
        producer.send(f"m{i}".encode(), event_timestamp=1000 + 100 * i)
    producer.new_watermark().event_time(2000).send()
    wait_for_watermark(timeline, 2000, "watermark 2000")
    handed_before = len(timeline.messages)
    changes_before = len(timeline.watermarks)

    consumer.seek(pulsar.MessageId.earliest)
    wait_until(lambda: timeline.count(b"m9") == 2, timeout_s=RECOMPUTED_WITHIN_S, what="the replay")
    wait_for_watermark(timeline, 2000, "watermark 2000 again")

    timeline.assert_never_below_the_held_watermark()
    assert timeline.messages[handed_before].payload == b"m0"
    assert timeline.messages[handed_before].held is None, "no watermark at the start of the topic"
    after = timeline.values()[changes_before:]
    assert after[0] is None and after[-1] == 2000, after
    assert all(v is not None for v in after[1:]) and after[1:] == sorted(after[1:]), after  # type: ignore[type-var]
    consumer.close()
    producer.close()


def test_seek_by_time_on_a_partitioned_topic(pulsar_client: pulsar.Client, admin: PulsarAdmin, topic: str) -> None:
    admin.create_topic(topic, partitions=2)
    timeline = Timeline()
    consumer = attach(pulsar_client, topic, "reprocess", timeline)
    producer = WatermarkProducer(pulsar_client, topic, producer_name="P", keepalive_interval_ms=None)
    for i in range(20):
        producer.new_watermark().event_time(i * 1000).send()
        producer.send(f"m{i}".encode(), event_timestamp=i * 1000 + 500, partition_key=f"k{i}")
    wait_for_watermark(timeline, 19_000, "watermark 19000: the minimum over both partitions")
    handed_before = len(timeline.messages)
    m10 = next(m for m in timeline.messages if m.payload == b"m10")

    consumer.seek(m10.publish_time)
    wait_until(lambda: all(timeline.count(f"m{i}".encode()) == 2 for i in range(10, 20)),
               timeout_s=RECOMPUTED_WITHIN_S, what="the replay on both partitions")  # fmt: skip
    wait_for_watermark(timeline, 19_000, "watermark 19000 again")
    timeline.assert_never_below_the_held_watermark()
    assert len(timeline.messages) > handed_before
    assert consumer.late_messages == 0
    consumer.close()
    producer.close()


def test_without_a_listener_the_watermark_is_none_until_recomputed(pulsar_client: pulsar.Client, topic: str) -> None:
    consumer = WatermarkConsumer(pulsar_client, topic, "polling")
    producer = WatermarkProducer(pulsar_client, topic, producer_name="P", keepalive_interval_ms=None)
    ids = produce_rising(producer)
    for _ in range(50):
        consumer.acknowledge(consumer.receive(timeout_millis=10_000))
    wait_until(lambda: (w := consumer.get_last_watermark()) is not None and w.event_time == LAST,
               timeout_s=RECOMPUTED_WITHIN_S, what="watermark 49000")  # fmt: skip

    consumer.seek(ids[10])
    right_after = consumer.get_last_watermark()
    assert right_after is None or right_after.event_time == 10_000, right_after
    message = consumer.receive(timeout_millis=10_000)
    assert message.data() == b"m11"
    assert not consumer.is_late(message)
    held = consumer.get_last_watermark()
    assert held is None or held.event_time <= 11_500, "never a watermark above the message just received"
    consumer.acknowledge(message)
    for _ in range(38):
        message = consumer.receive(timeout_millis=10_000)
        assert not consumer.is_late(message), message.data()
        consumer.acknowledge(message)
    wait_until(lambda: (w := consumer.get_last_watermark()) is not None and w.event_time == LAST,
               timeout_s=RECOMPUTED_WITHIN_S, what="watermark 49000 again")  # fmt: skip
    assert consumer.late_messages == 0
    consumer.close()
    producer.close()
