"""Partitions added to a live topic (issue #17, counterexample 6) on the real broker.

The Pulsar clients notice new partitions on their own metadata refresh (60 s in the C++ client the
Python client wraps, not configurable from Python), so this test waits for that, with a bound.
"""

from __future__ import annotations

import time

import pulsar
import pytest

from consumer import WatermarkConsumer
from producer import WatermarkProducer
from pulsar_access.admin import PulsarAdmin
from tests.integration.helpers import Timeline, wait_until
from watermark_core.protocol import MARKER_PROPERTY

CLIENT_REFRESH_BOUND_S = 150.0
"""The clients' 60 s refresh, then the generator following the new partition's subscription."""


@pytest.mark.usefixtures("generator")
def test_a_partition_added_later_gets_markers_before_data_and_holds_the_watermark_back(
    pulsar_client: pulsar.Client, admin: PulsarAdmin, topic: str
) -> None:
    admin.create_topic(topic, partitions=2)
    timeline = Timeline()
    consumer = WatermarkConsumer(pulsar_client, topic, "grow", listener=timeline)
    polling = WatermarkConsumer(pulsar_client, topic, "grow-polling")
    producer = WatermarkProducer(pulsar_client, topic, producer_name="P", keepalive_interval_ms=None)
    clock = 1_000
    producer.new_watermark().event_time(clock).send()
    for i in range(10):
        producer.send(f"early-{i}".encode(), event_timestamp=clock + i, partition_key=f"k{i}")
    wait_until(lambda: timeline.values()[-1:] == [1_000], timeout_s=30, what="watermark 1000 over two partitions")

    admin.update_partitions(topic, 3)
    wait_until(lambda: 2 in consumer._feed.partitions and 2 in polling._feed.partitions, timeout_s=30,
               what="the consumers' feeds following partition 2")  # fmt: skip
    joined = len(timeline.watermarks)
    assert polling.get_last_watermark() is None, "a partition without a watermark holds the watermark back"

    landed: set[int] = set()
    deadline = time.monotonic() + CLIENT_REFRESH_BOUND_S
    while 2 not in landed and time.monotonic() < deadline:  # until the producer's client routes to partition 2
        clock += 1_000
        producer.new_watermark().event_time(clock).send()
        for i in range(6):
            sent = producer.send(f"m{clock}-{i}".encode(), event_timestamp=clock + i, partition_key=f"k{i}")
            landed.add(sent.partition())
        time.sleep(0.5)
    assert 2 in landed, "the producer's client never routed data to partition 2"
    final = clock + 1_000
    producer.new_watermark().event_time(final).send()

    reader = pulsar_client.create_reader(f"{topic}-partition-2", pulsar.MessageId.earliest)
    first = reader.read_next(timeout_millis=10_000)
    assert first.producer_name() == "P" and first.properties().get(MARKER_PROPERTY) == "W_SET", (
        "the producer's assertion reaches a new partition before any of its data"
    )
    reader.close()

    wait_until(lambda: timeline.values()[-1:] == [final], timeout_s=CLIENT_REFRESH_BOUND_S,
               what="the final watermark once the consumer reads partition 2 as well")  # fmt: skip
    timeline.assert_never_below_the_held_watermark()
    with timeline.lock:
        after_join = [w for w in timeline.watermarks[joined:] if w is not None]
    before_partition_2 = [w for w in after_join if all(p != 2 for p, _, _ in w.computed_at)]
    assert all(w.event_time <= 1_000 for w in before_partition_2), "raised while partition 2 had no watermark"
    assert any(p == 2 for w in after_join for p, _, _ in w.computed_at)
    for closable in (consumer, polling, producer):
        closable.close()
