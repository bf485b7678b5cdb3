"""Partitions added to a live topic (issue #17, counterexample 6) on the real broker.

The Pulsar clients notice new partitions on their own metadata refresh (60 s in the C++ client the
Python client wraps, not configurable from Python). So the scenario runs in two tests: the first one
(ordered first in the session, see tests/conftest.py) grows the topic and leaves the waiting to a
thread of the session's (`growth`); the second (ordered late) joins that thread and checks what
happened once the clients found the new partition. The minute passes while the other tests run.
Run alone, the second test runs the whole scenario itself.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pulsar
import pytest

from consumer import WatermarkConsumer
from producer import WatermarkProducer
from pulsar_access.admin import PulsarAdmin
from tests.integration.generator_process import GeneratorProcess
from tests.integration.helpers import Timeline, wait_until
from watermark_core.protocol import MARKER_PROPERTY

CLIENT_REFRESH_BOUND_S = 150.0
"""The clients' 60 s refresh, then the generator following the new partition's subscription."""


@dataclass
class Growth:
    """A two-partition topic grown to three, and what its consumers saw: the second half runs in `thread`."""

    topic: str
    timeline: Timeline
    consumer: WatermarkConsumer
    polling: WatermarkConsumer
    producer: WatermarkProducer
    clock: int
    joined: int = 0
    """How many watermarks the listener had when partition 2 joined the consumers' feeds."""
    final: int | None = None
    landed: set[int] = field(default_factory=set)
    failure: BaseException | None = None
    thread: threading.Thread | None = None

    def until_partition_2_is_used(self) -> None:
        """The thread: W_SETs and data each half second until the producer's client routes to partition 2."""
        try:
            deadline = time.monotonic() + CLIENT_REFRESH_BOUND_S
            while 2 not in self.landed and time.monotonic() < deadline:
                self.clock += 1_000
                self.producer.new_watermark().event_time(self.clock).send()
                for i in range(6):
                    sent = self.producer.send(
                        f"m{self.clock}-{i}".encode(), event_timestamp=self.clock + i, partition_key=f"k{i}"
                    )
                    self.landed.add(sent.partition())
                time.sleep(0.5)
            if 2 in self.landed:
                self.final = self.clock + 1_000
                self.producer.new_watermark().event_time(self.final).send()
        except BaseException as error:  # reported by the test that joins
            self.failure = error

    def close(self) -> None:
        for closable in (self.consumer, self.polling, self.producer):
            closable.close()


@pytest.fixture(scope="session")
def growth(pulsar_client: pulsar.Client, admin: PulsarAdmin, generator: GeneratorProcess) -> Iterator[Growth]:
    """The scenario's first half, then its second half started in a thread (see the module docstring)."""
    topic = f"persistent://public/default/test-grow-{uuid.uuid4().hex[:12]}"
    admin.create_topic(topic, partitions=2)
    timeline = Timeline()
    grown = Growth(
        topic, timeline,
        WatermarkConsumer(pulsar_client, topic, "grow", listener=timeline),
        WatermarkConsumer(pulsar_client, topic, "grow-polling"),
        WatermarkProducer(pulsar_client, topic, producer_name="P", keepalive_interval_ms=None),
        clock=1_000,
    )  # fmt: skip
    try:
        grown.producer.new_watermark().event_time(grown.clock).send()
        for i in range(10):
            grown.producer.send(f"early-{i}".encode(), event_timestamp=grown.clock + i, partition_key=f"k{i}")
        wait_until(lambda: timeline.values()[-1:] == [1_000], timeout_s=30, what="watermark 1000 over two partitions")
        admin.update_partitions(topic, 3)
        wait_until(lambda: 2 in grown.consumer._feed.partitions and 2 in grown.polling._feed.partitions,
                   timeout_s=30, what="the consumers' feeds following partition 2")  # fmt: skip
        grown.joined = len(timeline.watermarks)
        grown.thread = threading.Thread(target=grown.until_partition_2_is_used, name="partition-growth", daemon=True)
        grown.thread.start()
        yield grown
    finally:
        if grown.thread is not None:
            grown.thread.join(CLIENT_REFRESH_BOUND_S)
        grown.close()


def test_a_partition_added_later_joins_the_feeds_and_holds_the_watermark_back(growth: Growth) -> None:
    assert growth.timeline.values()[-1:] == [1_000]
    assert growth.polling.get_last_watermark() is None, "a partition without a watermark holds the watermark back"


def test_a_partition_added_later_gets_markers_before_data_and_then_moves_the_watermark(
    growth: Growth, pulsar_client: pulsar.Client
) -> None:
    assert growth.thread is not None
    growth.thread.join(CLIENT_REFRESH_BOUND_S)
    assert not growth.thread.is_alive(), "the producer still sending after the bound"
    if growth.failure is not None:
        raise growth.failure
    assert 2 in growth.landed, "the producer's client never routed data to partition 2"
    final = growth.final

    reader = pulsar_client.create_reader(f"{growth.topic}-partition-2", pulsar.MessageId.earliest)
    first = reader.read_next(timeout_millis=10_000)
    assert first.producer_name() == "P" and first.properties().get(MARKER_PROPERTY) == "W_SET", (
        "the producer's assertion reaches a new partition before any of its data"
    )
    reader.close()

    timeline = growth.timeline
    wait_until(lambda: timeline.values()[-1:] == [final], timeout_s=CLIENT_REFRESH_BOUND_S,
               what="the final watermark once the consumer reads partition 2 as well")  # fmt: skip
    timeline.assert_never_below_the_held_watermark()
    with timeline.lock:
        after_join = [w for w in timeline.watermarks[growth.joined :] if w is not None]
    before_partition_2 = [w for w in after_join if all(p != 2 for p, _, _ in w.computed_at)]
    assert all(w.event_time <= 1_000 for w in before_partition_2), "raised while partition 2 had no watermark"
    assert any(p == 2 for w in after_join for p, _, _ in w.computed_at)
