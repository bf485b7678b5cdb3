"""The foundation: a real broker that produces, consumes and reports cursor positions."""

from __future__ import annotations

import time

import pulsar
import pytest

from pulsar_access.admin import PulsarAdmin, TopicNotFound


@pytest.fixture
def topic(namespace: str) -> str:
    """A topic in a namespace no generator follows: these tests read every message with a plain client, where the
    session generator's `W_SNAPSHOT` would otherwise come among them (it writes one as soon as it owns a topic)."""
    return f"persistent://{namespace}/plain"


def _wait_mark_delete(admin: PulsarAdmin, topic: str, subscription: str, expected: tuple[int, int]) -> tuple[int, int]:
    """Acks are grouped by the client; poll until the cursor shows the expected position."""
    deadline = time.monotonic() + 10
    position = admin.mark_delete_position(topic, subscription)
    while position != expected and time.monotonic() < deadline:
        time.sleep(0.1)
        position = admin.mark_delete_position(topic, subscription)
    return position


def test_plain_topic_round_trip_and_mark_delete(pulsar_client: pulsar.Client, admin: PulsarAdmin, topic: str) -> None:
    consumer = pulsar_client.subscribe(topic, "sub")
    producer = pulsar_client.create_producer(topic, producer_name="p-plain")
    sent = [producer.send(f"m{i}".encode(), event_timestamp=1_000 + i) for i in range(10)]

    received = []
    for _ in range(10):
        message = consumer.receive(timeout_millis=10_000)
        received.append(message)
        if len(received) <= 6:
            consumer.acknowledge(message)
    assert [m.data() for m in received] == [f"m{i}".encode() for i in range(10)]
    assert {m.producer_name() for m in received} == {"p-plain"}
    assert [m.event_timestamp() for m in received] == list(range(1_000, 1_010))

    sixth = sent[5]
    assert _wait_mark_delete(admin, topic, "sub", (sixth.ledger_id(), sixth.entry_id())) == (
        sixth.ledger_id(),
        sixth.entry_id(),
    )
    consumer.close()
    producer.close()


def test_partitioned_topic_has_a_cursor_per_partition(
    pulsar_client: pulsar.Client, admin: PulsarAdmin, topic: str
) -> None:
    admin.create_topic(topic, partitions=3)
    assert admin.partitions(topic) == 3
    consumer = pulsar_client.subscribe(topic, "sub")
    producer = pulsar_client.create_producer(
        topic,
        message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution,
        batching_enabled=False,
    )
    sent = [producer.send(f"m{i}".encode()) for i in range(9)]
    assert {m.partition() for m in sent} == {0, 1, 2}

    seen = set()
    for _ in range(9):
        message = consumer.receive(timeout_millis=10_000)
        seen.add(message.data())
        consumer.acknowledge(message)
    assert seen == {f"m{i}".encode() for i in range(9)}

    for partition in range(3):
        last = max((m for m in sent if m.partition() == partition), key=lambda m: (m.ledger_id(), m.entry_id()))
        name = f"{topic}-partition-{partition}"
        expected = (last.ledger_id(), last.entry_id())
        assert _wait_mark_delete(admin, name, "sub", expected) == expected
    consumer.close()
    producer.close()


def test_unknown_subscription_is_a_clear_error(admin: PulsarAdmin, pulsar_client: pulsar.Client, topic: str) -> None:
    pulsar_client.create_producer(topic).close()
    with pytest.raises(TopicNotFound, match="nobody"):
        admin.mark_delete_position(topic, "nobody")
