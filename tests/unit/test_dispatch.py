"""The dispatcher without a broker: head events and tables share one producer per companion topic, in order."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import pulsar
import pytest

from broker_ext.dispatch import WatermarkDispatcher
from broker_ext.engine.vocabulary import PublishTable
from broker_ext.metrics import GeneratorMetrics
from pulsar_access.topics import watermark_topic_for
from watermark_core.protocol import (
    EVENT_PROPERTY,
    HEAD_WATERMARK,
    SEND_WATERMARK,
    HeadWatermark,
    WatermarkEvent,
    decode_head,
    head_key,
)

pytestmark = pytest.mark.unit

TOPIC = "persistent://public/default/orders"


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes, str, dict[str, str]]] = []
        self.results: list[pulsar.Result] = []
        self.callbacks: list[Callable[[pulsar.Result, Any], None]] = []

    def send_async(
        self, payload: bytes, callback: Callable[[pulsar.Result, Any], None], partition_key: str,
        properties: dict[str, str],
    ) -> None:  # fmt: skip
        self.sent.append((payload, partition_key, properties))
        self.callbacks.append(callback)

    def complete(self, result: pulsar.Result = pulsar.Result.Ok) -> None:
        callbacks, self.callbacks = self.callbacks, []
        for callback in callbacks:
            callback(result, None)

    def close(self) -> None:
        pass


class FakeClient:
    def __init__(self) -> None:
        self.producers: dict[str, FakeProducer] = {}

    def create_producer(self, topic: str, **_: Any) -> FakeProducer:
        return self.producers.setdefault(topic, FakeProducer())


class FakeLoop:
    """Runs posted work at once; timers wait until `fire`."""

    def __init__(self) -> None:
        self.timers: dict[Hashable, Callable[[], None]] = {}

    def post(self, work: Callable[[], None]) -> None:
        work()

    def call_at(self, _when: float, key: Hashable, work: Callable[[], None]) -> None:
        self.timers[key] = work

    def fire(self) -> None:
        timers, self.timers = self.timers, {}
        for work in timers.values():
            work()


class InlinePool:
    def submit(self, work: Callable[..., None], *args: Any) -> None:
        work(*args)


class FakeAdmin:
    def create_namespace(self, _namespace: str) -> None:
        pass

    def trigger_compaction(self, _topic: str) -> None:
        pass


def _dispatcher() -> tuple[WatermarkDispatcher, FakeClient, FakeLoop]:
    client, loop = FakeClient(), FakeLoop()
    dispatcher = WatermarkDispatcher(
        client, FakeAdmin(), "gen-a", GeneratorMetrics(), loop, InlinePool()  # type: ignore[arg-type]
    )
    return dispatcher, client, loop


def _table(seq: int) -> PublishTable:
    return PublishTable((WatermarkEvent(TOPIC, 0, "sub", 100, (1, 2), seq),), ("sub",))


def test_head_events_and_tables_go_out_on_one_producer_in_the_order_published() -> None:
    dispatcher, client, _ = _dispatcher()
    dispatcher.publish_head(HeadWatermark(TOPIC, 0, (1, 2), 100))
    dispatcher.publish(_table(1))
    dispatcher.publish_head(HeadWatermark(TOPIC, 0, (1, 5), 200))
    producer = client.producers[watermark_topic_for(TOPIC)]
    kinds = [(properties[EVENT_PROPERTY], key) for _, key, properties in producer.sent]
    assert kinds == [(HEAD_WATERMARK, head_key(0)), (SEND_WATERMARK, "0"), (HEAD_WATERMARK, head_key(0))]
    assert decode_head(producer.sent[2][0]) == HeadWatermark(TOPIC, 0, (1, 5), 200)


def test_a_failed_head_event_is_sent_again_unless_a_later_one_went_out() -> None:
    dispatcher, client, loop = _dispatcher()
    dispatcher.publish_head(HeadWatermark(TOPIC, 1, (1, 2), 100))
    producer = client.producers[watermark_topic_for(TOPIC)]
    producer.complete(pulsar.Result.Timeout)
    loop.fire()
    assert [decode_head(payload).event_time for payload, _, _ in producer.sent] == [100, 100]
    producer.complete(pulsar.Result.Timeout)  # fails again, but a later one goes out meanwhile
    dispatcher.publish_head(HeadWatermark(TOPIC, 1, (1, 9), 300))
    loop.fire()
    assert [decode_head(payload).event_time for payload, _, _ in producer.sent] == [100, 100, 300]
