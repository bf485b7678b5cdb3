"""The consumer's shell (consumer/watermark_consumer.py, consumer/watermark_feed.py, pulsar_access/companion.py)
against a hand-written fake client (tests/unit/fake_pulsar.py): threads, the inbox, what the client is asked."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pulsar
import pytest

from consumer.engine import Sought
from consumer.listener import WatermarkListener
from consumer.watermark_consumer import WatermarkConsumer
from consumer.watermark_feed import WatermarkFeed
from tests.unit.fake_pulsar import (
    SUBSCRIPTION,
    TOPIC,
    UNREACHABLE_ADMIN,
    FakeClient,
    data,
    eventually,
    marker,
)
from watermark_core.protocol import Watermark

pytestmark = pytest.mark.unit


class Recorder(WatermarkListener):
    def __init__(self) -> None:
        self.seen: list[object] = []
        self.lock = threading.Lock()

    def received(self, consumer: WatermarkConsumer, message: pulsar.Message) -> None:
        with self.lock:
            self.seen.append(message.data())
        consumer.acknowledge(message)

    def received_watermark(self, consumer: WatermarkConsumer, watermark: Watermark) -> None:
        with self.lock:
            self.seen.append(watermark.event_time)

    def watermarks(self) -> list[object]:
        with self.lock:
            return [item for item in self.seen if isinstance(item, int)]


@pytest.fixture
def client() -> FakeClient:
    return FakeClient()


def feed_of(client: FakeClient, **options: object) -> WatermarkFeed:
    return WatermarkFeed(client, TOPIC, SUBSCRIPTION, lambda _current: None, admin_url=UNREACHABLE_ADMIN, **options)  # type: ignore[arg-type]


@pytest.fixture
def closing() -> Iterator[list[WatermarkFeed | WatermarkConsumer]]:
    opened: list[WatermarkFeed | WatermarkConsumer] = []
    yield opened
    for thing in opened:
        thing.close()


# -- issue 34, fault 2: a busy companion topic ------------------------------------------------------------------


def test_a_seek_by_time_takes_the_generators_next_event_while_the_companion_topic_is_never_quiet(
    client: FakeClient, closing: list[WatermarkFeed | WatermarkConsumer]
) -> None:
    """Failed before: "caught up" needed 200 ms without any event on the companion topic; another subscription's
    table every 50 ms never gave them, so every event after a seek by publish time was refused."""
    client.publish_table(10, 5000)
    feed = feed_of(client)
    closing.append(feed)
    assert feed.current == Watermark(5000, computed_at=((-1, 7, 10),))
    stop = threading.Event()

    def busy() -> None:
        while not stop.wait(0.05):
            client.publish_table(3, 100, subscription="another")

    neighbour = threading.Thread(target=busy, daemon=True)
    neighbour.start()
    try:
        feed.report(Sought(None, None))  # forward by publish time; nothing comes to this consumer
        assert feed.current is None
        threading.Event().wait(1.3)  # the reader has read everything published until a second after the seek
        client.publish_table(30, 9000)  # computed after the seek
        assert eventually(lambda: feed.current is not None, timeout=3.0), "stuck behind a busy companion topic"
        assert feed.current is not None and feed.current.event_time == 9000
    finally:
        stop.set()
        neighbour.join()


# -- issue 34, fault 3: attaching while the feed hands watermarks over ------------------------------------------


def test_a_listener_attached_while_the_feed_reads_gets_each_watermark_once_and_never_older_after_newer(
    client: FakeClient, closing: list[WatermarkFeed | WatermarkConsumer]
) -> None:
    """Failed before: the feed's thread queued 600 while `subscribe` ran, then the constructor queued the current
    watermark (600) again: the listener got [600, 600]; read at another moment, an older value after a newer."""
    client.publish_table(10, 500)  # what the catch-up finds

    def generator_publishes_meanwhile() -> None:
        client.publish_table(12, 600)
        client.read_all()

    client.on_subscribe = generator_publishes_meanwhile
    listener = Recorder()
    consumer = WatermarkConsumer(client, TOPIC, SUBSCRIPTION, listener, admin_url=UNREACHABLE_ADMIN)
    closing.append(consumer)
    assert eventually(lambda: listener.watermarks() == [500, 600]), listener.watermarks()
    threading.Event().wait(0.2)
    assert listener.watermarks() == [500, 600]


def test_a_listener_gets_data_and_watermarks_in_order_and_markers_are_hidden(
    client: FakeClient, closing: list[WatermarkFeed | WatermarkConsumer]
) -> None:
    client.publish_table(0, 1000)
    listener = Recorder()
    consumer = WatermarkConsumer(client, TOPIC, SUBSCRIPTION, listener, admin_url=UNREACHABLE_ADMIN)
    closing.append(consumer)
    client.send(data(1, 1000), marker(2, 2000), data(3, 2000))
    assert eventually(lambda: len(listener.seen) == 3)
    assert listener.seen == [1000, b"data-1", b"data-3"]
    assert eventually(lambda: len(client.binding.acknowledged) == 3)  # both data messages and the marker
    assert consumer.markers_hidden == 1
