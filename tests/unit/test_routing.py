"""Partition routing of the watermark producer: markers where they are sent, data only where markers are."""

from __future__ import annotations

from typing import Any

import msgpack

from producer.routing import TARGET_PARTITION_PROPERTY, MarkerAwareRouter, PartitionCount
from producer.watermark_producer import _PartitionMarkers
from producer.writer import MarkerWriter, WatermarkBuilder
from watermark_core.protocol import MARKER_PROPERTY


class FakeMessage:
    """What the router reads of a `pulsar.Message`: its properties and its key (a value, not a broker)."""

    def __init__(self, properties: dict[str, str] | None = None, key: str = "") -> None:
        self._properties = properties or {}
        self._key = key

    def properties(self) -> dict[str, str]:
        return self._properties

    def partition_key(self) -> str:
        return self._key


def route(router: MarkerAwareRouter, message: FakeMessage, num_partitions: int) -> int:
    message_: Any = message
    return router(message_, num_partitions)


def test_data_stays_on_covered_partitions_until_the_producer_covers_the_new_ones() -> None:
    """Issue #17, counterexample 6: partitions added to a live topic."""
    count = PartitionCount(2)
    router = MarkerAwareRouter(partitions=count)
    assert {route(router, FakeMessage(), 3) for _ in range(30)} == {0, 1}, "no data before the markers"
    assert count.uncovered() == range(2, 3)
    assert route(router, FakeMessage({TARGET_PARTITION_PROPERTY: "2"}), 3) == 2, "markers go where they are sent"
    count.cover(3)
    assert count.uncovered() == range(3, 3)
    assert {route(router, FakeMessage(), 3) for _ in range(30)} == {0, 1, 2}


def test_keys_are_hashed_over_the_covered_partitions_and_a_users_router_sees_that_count() -> None:
    count = PartitionCount(2)
    seen: list[int] = []

    def user_router(_message: Any, num_partitions: int) -> int:
        seen.append(num_partitions)
        return num_partitions - 1

    assert route(MarkerAwareRouter(partitions=count), FakeMessage(key="k"), 5) in (0, 1)
    assert route(MarkerAwareRouter(user_router, count), FakeMessage(), 5) == 1
    assert seen == [2]


def test_the_count_only_grows() -> None:
    count = PartitionCount(4)
    count.seen(3)
    count.cover(2)
    assert count.covered == 4 and count.uncovered() == range(4, 4)


class RecordingProducer:
    """What `_PartitionMarkers` uses of a `pulsar.Producer`: `send` and `send_async`, recorded in order."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int | None, int | None]] = []

    def send(self, payload: bytes, properties: dict[str, str]) -> str:
        partition = properties.get(TARGET_PARTITION_PROPERTY)
        body = msgpack.unpackb(payload)
        self.sent.append((properties[MARKER_PROPERTY], None if partition is None else int(partition),
                          body.get("event_time")))  # fmt: skip
        return f"id-{len(self.sent)}"

    def send_async(self, payload: bytes, callback: Any, properties: dict[str, str]) -> None:
        self.send(payload, properties)
        callback("ok", None)


def test_a_partition_added_later_gets_the_current_assertion_before_the_next_marker_or_data() -> None:
    """Issue #17, counterexample 6, through the writer: the W_SET goes to the new partition in order
    with the producer's markers, then the partition counts as covered."""
    count = PartitionCount(2)
    pulsar_producer = RecordingProducer()
    sink = _PartitionMarkers(pulsar_producer, count, "test")  # type: ignore[arg-type]
    writer = MarkerWriter(sink, "test", keepalive_s=None, ingestion_s=None)
    sink.assertion = lambda: writer.last_watermark
    WatermarkBuilder(writer, None).event_time(500).send()
    assert pulsar_producer.sent == [("W_SET", 0, 500), ("W_SET", 1, 500)]

    router = MarkerAwareRouter(partitions=count)
    assert route(router, FakeMessage(), 3) in (0, 1)  # Pulsar now says 3: data stays on 0 and 1
    assert sink.has_new()
    pulsar_producer.sent.clear()
    WatermarkBuilder(writer, None).event_time(700).send()
    assert pulsar_producer.sent == [("W_SET", 2, 500), ("W_SET", 0, 700), ("W_SET", 1, 700), ("W_SET", 2, 700)]
    assert not sink.has_new() and count.covered == 3

    count.seen(4)  # before data: WatermarkProducer.send covers in order with the markers
    pulsar_producer.sent.clear()
    writer.in_order(sink.cover_new)
    assert pulsar_producer.sent == [("W_SET", 3, 700)]


def test_an_idle_producer_covers_a_new_partition_without_asserting_there() -> None:
    count = PartitionCount(1)
    pulsar_producer = RecordingProducer()
    sink = _PartitionMarkers(pulsar_producer, count, "test")  # type: ignore[arg-type]
    writer = MarkerWriter(sink, "test", keepalive_s=None, ingestion_s=None)
    sink.assertion = lambda: writer.last_watermark
    WatermarkBuilder(writer, None).event_time(500).send()
    WatermarkBuilder(writer, None).mark_idle().send()
    count.seen(2)
    pulsar_producer.sent.clear()
    writer.in_order(sink.cover_new)
    assert pulsar_producer.sent == [] and count.covered == 2
