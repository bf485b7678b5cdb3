"""The consumer's shell (consumer/watermark_consumer.py, consumer/watermark_feed.py, pulsar_access/companion.py)
against a hand-written fake client (tests/unit/fake_pulsar.py): threads, the inbox, what the client is asked."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pulsar
import pytest

from consumer.dispatcher import Dispatcher
from consumer.engine import Deliver, HandWatermark, Sought
from consumer.lateness import Lateness
from consumer.listener import WatermarkListener
from consumer.watermark_consumer import WatermarkConsumer
from consumer.watermark_feed import WatermarkFeed
from pulsar_access.topics import watermark_topic_for
from tests.unit.fake_pulsar import (
    SUBSCRIPTION,
    TOPIC,
    UNREACHABLE_ADMIN,
    FakeClient,
    data,
    eventually,
    marker,
)
from watermark_core.protocol import Watermark, table_key

pytestmark = pytest.mark.unit

KEY = table_key(TOPIC, -1)
"""The key of the fake topic's tables on its companion topic."""


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


def listening(
    client: FakeClient, closing: list[WatermarkFeed | WatermarkConsumer]
) -> tuple[Recorder, WatermarkConsumer]:
    """A consumer of the fake topic with a `Recorder` as its listener, closed after the test."""
    listener = Recorder()
    consumer = WatermarkConsumer(client, TOPIC, SUBSCRIPTION, listener, admin_url=UNREACHABLE_ADMIN)
    closing.append(consumer)
    return listener, consumer


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
    listener, _ = listening(client, closing)
    assert eventually(lambda: listener.watermarks() == [500, 600]), listener.watermarks()
    threading.Event().wait(0.2)
    assert listener.watermarks() == [500, 600]


def test_a_listener_gets_data_and_watermarks_in_order_and_markers_are_hidden(
    client: FakeClient, closing: list[WatermarkFeed | WatermarkConsumer]
) -> None:
    client.publish_table(0, 1000)
    listener, consumer = listening(client, closing)
    client.send(data(1, 1000), marker(2, 2000), data(3, 2000))
    assert eventually(lambda: len(listener.seen) == 3)
    assert listener.seen == [1000, b"data-1", b"data-3"]
    assert eventually(lambda: len(client.binding.acknowledged) == 3)  # both data messages and the marker
    assert consumer.markers_hidden == 1


# -- WatermarkConsumer without a listener ------------------------------------------------------------------------


def test_receive_hides_markers_and_acknowledges_them_and_the_hot_path_acknowledges_through_the_binding(
    client: FakeClient, closing: list[WatermarkFeed | WatermarkConsumer]
) -> None:
    client.publish_table(0, 1000)
    consumer = WatermarkConsumer(client, TOPIC, SUBSCRIPTION, admin_url=UNREACHABLE_ADMIN)
    closing.append(consumer)
    client.send(marker(2, 2000), data(3, 500), data(5, 2500))
    first = consumer.receive(1000)
    assert first.data() == b"data-3" and consumer.markers_hidden == 1
    assert consumer.is_late(first)  # 500 under the watermark 1000
    second = consumer.receive(1000)
    assert second.data() == b"data-5" and not consumer.is_late(second)
    consumer.acknowledge(first)
    consumer.acknowledge(second)
    assert [raw.id.entry for raw in client.binding.acknowledged] == [2, 3, 5]
    assert consumer.get_last_watermark() == Watermark(1000, computed_at=((-1, 7, 0),))
    with pytest.raises(pulsar.Timeout):
        consumer.receive(50)


def test_a_message_while_the_engine_decides_goes_the_engines_way_and_the_engine_waits_for_a_pull(
    client: FakeClient, closing: list[WatermarkFeed | WatermarkConsumer]
) -> None:
    """Issue 48: the pull path takes the lanes' token (the feed's `lane_token`) without waiting. While somebody holds
    it (the engine deciding, another pull), the message goes the engine's way (`received`), which waits for the token;
    the engine's every decision waits for it too; every path gives it back."""
    client.publish_table(0, 1000)
    consumer = WatermarkConsumer(client, TOPIC, SUBSCRIPTION, admin_url=UNREACHABLE_ADMIN)
    closing.append(consumer)
    token = consumer._feed.lane_token
    client.send(data(3, 500), marker(4, 2000), data(5, 2500))
    token.pop()  # held elsewhere
    got: list[pulsar.Message] = []
    pulling = threading.Thread(target=lambda: got.append(consumer.receive(1000)))
    pulling.start()
    pulling.join(0.3)
    assert pulling.is_alive() and not got  # the engine's way waits for the token
    token.append(True)
    pulling.join(5)
    assert [message.data() for message in got] == [b"data-3"] and consumer.is_late(got[0])
    second = consumer.receive(1000)  # the marker, then 5: through the lane
    assert second.data() == b"data-5" and consumer.markers_hidden == 1 and token == [True]
    assert consumer.batch_receive() == [] and token == [True]
    consumer.acknowledge(second)
    token.pop()  # a pull between taking the token and giving it back
    client.publish_table(4, 2000)  # computed at 4: 3 (received the engine's way) is outstanding
    time.sleep(0.3)
    assert consumer.get_last_watermark() == Watermark(1000, computed_at=((-1, 7, 0),))  # the feed waits
    token.append(True)
    assert eventually(lambda: consumer.get_last_watermark() is None)  # then distrusts: 3 is outstanding
    assert token == [True]


def test_an_acknowledgement_by_message_id_counts_as_the_messages(
    client: FakeClient, closing: list[WatermarkFeed | WatermarkConsumer]
) -> None:
    """Issue 48: by message id, an acknowledgement goes through the lane as a key of the lanes' kind (the binding's
    message id, whose comparisons take no other type); an event computed after the message is then taken."""
    client.publish_table(0, 1000)
    consumer = WatermarkConsumer(client, TOPIC, SUBSCRIPTION, admin_url=UNREACHABLE_ADMIN)
    closing.append(consumer)
    client.send(data(3, 1500), data(5, 2500))
    first, _second = consumer.receive(1000), consumer.receive(1000)
    consumer.acknowledge(first.message_id())
    client.publish_table(4, 2000)  # computed at 4: after 3 (acknowledged), before 5 (outstanding)
    assert eventually(lambda: consumer.get_last_watermark() == Watermark(2000))
    assert [raw_id.entry_id() for raw_id in client.binding.acknowledged] == [3]


def test_batch_receive_takes_the_markers_out(
    client: FakeClient, closing: list[WatermarkFeed | WatermarkConsumer]
) -> None:
    client.publish_table(0, 1000)
    consumer = WatermarkConsumer(client, TOPIC, SUBSCRIPTION, admin_url=UNREACHABLE_ADMIN)
    closing.append(consumer)
    client.send(data(1, 1000), marker(2, 2000), data(3, 2000), marker(4, 3000))
    assert [message.data() for message in consumer.batch_receive()] == [b"data-1", b"data-3"]
    assert consumer.markers_hidden == 2
    assert [raw.id.entry for raw in client.binding.acknowledged] == [2, 4]


def test_batch_receive_counts_late_messages_and_receive_after_close_raises(
    client: FakeClient, closing: list[WatermarkFeed | WatermarkConsumer]
) -> None:
    """`receive` and `batch_receive` wrap messages inline (issue 34): the same lateness, and the binding's errors."""
    client.publish_table(0, 1000)
    consumer = WatermarkConsumer(client, TOPIC, SUBSCRIPTION, admin_url=UNREACHABLE_ADMIN)
    client.send(data(1, 500), marker(2, 2000), data(3, 1500))
    batch = consumer.batch_receive()
    assert [message.data() for message in batch] == [b"data-1", b"data-3"]
    assert consumer.late_messages == 1 and consumer.is_late(batch[0]) and not consumer.is_late(batch[1])
    consumer.close()
    with pytest.raises(pulsar.AlreadyClosed):
        consumer.receive(50)


def test_batch_receive_follows_the_policy_without_the_clients_batch_receive(
    client: FakeClient, closing: list[WatermarkFeed | WatermarkConsumer]
) -> None:
    """The client's `batch_receive` hung a CI run for an hour: it completes on the client's listener thread and by the
    wall clock. The shell collects a batch with `receive` under the same policy: up to `max_num_message` messages
    (markers count, as in the client), else what comes until `timeout_ms`."""
    client.publish_table(0, 1000)
    policy = pulsar.ConsumerBatchReceivePolicy(3, -1, 300)
    consumer = WatermarkConsumer(client, TOPIC, SUBSCRIPTION, admin_url=UNREACHABLE_ADMIN, batch_receive_policy=policy)
    closing.append(consumer)
    client.send(data(1, 1000), marker(2, 2000), data(3, 2000), data(4, 2000))
    assert [message.data() for message in consumer.batch_receive()] == [b"data-1", b"data-3"]  # 3 messages
    late = threading.Timer(0.1, client.send, (data(5, 2000),))
    late.start()
    started = time.monotonic()
    assert [message.data() for message in consumer.batch_receive()] == [b"data-4", b"data-5"]
    assert 0.25 <= time.monotonic() - started < 2  # waited for the timeout, not for a third message
    started = time.monotonic()
    assert consumer.batch_receive() == []
    assert 0.25 <= time.monotonic() - started < 2


def test_batch_receive_stops_at_the_policys_bytes(
    client: FakeClient, closing: list[WatermarkFeed | WatermarkConsumer]
) -> None:
    client.publish_table(0, 1000)
    policy = pulsar.ConsumerBatchReceivePolicy(-1, 12, 1_000)
    consumer = WatermarkConsumer(client, TOPIC, SUBSCRIPTION, admin_url=UNREACHABLE_ADMIN, batch_receive_policy=policy)
    closing.append(consumer)
    client.send(data(1, 1000), data(2, 1000), data(3, 1000))  # 6 bytes each
    started = time.monotonic()
    assert [message.data() for message in consumer.batch_receive()] == [b"data-1", b"data-2"]
    assert time.monotonic() - started < 0.5  # 12 bytes reached: no wait for the timeout
    assert [message.data() for message in consumer.batch_receive()] == [b"data-3"]


def test_a_reset_back_seen_from_what_comes_again_holds_the_watermark_where_it_was(
    client: FakeClient, closing: list[WatermarkFeed | WatermarkConsumer]
) -> None:
    client.publish_table(2, 1000)
    consumer = WatermarkConsumer(client, TOPIC, SUBSCRIPTION, admin_url=UNREACHABLE_ADMIN)
    closing.append(consumer)
    client.send(*(data(entry, 1000 * entry) for entry in range(3, 9)))
    for _ in range(6):
        consumer.acknowledge(consumer.receive(1000))
    client.send(data(5, 5000))  # an operator's reset-cursor: 5 comes again
    consumer.acknowledge(consumer.receive(1000))
    client.publish_table(8, 8000)  # computed before the reset
    client.read_all()
    current = consumer.get_last_watermark()
    assert current is not None and current.event_time == 1000


def test_a_seek_by_id_subscribes_again_and_acknowledges_the_target_when_it_comes(
    client: FakeClient, closing: list[WatermarkFeed | WatermarkConsumer]
) -> None:
    client.publish_table(10, 5000)
    consumer = WatermarkConsumer(client, TOPIC, SUBSCRIPTION, admin_url=UNREACHABLE_ADMIN)
    closing.append(consumer)
    target = pulsar.MessageId(-1, 7, 4, -1)
    consumer.seek(target)
    assert len(client.consumers) == 2 and client.consumers[0].sought == [target]
    assert consumer.get_last_watermark() is None  # back of the held event: distrusted
    client.send(data(4, 4000), data(5, 5000))
    assert consumer.receive(1000).data() == b"data-5"  # the target is skipped
    assert client.binding.acknowledged == []  # its acknowledgement waits for a watermark computed before it
    client.publish_table(3, 1500)
    assert eventually(lambda: [raw.id.entry for raw in client.binding.acknowledged] == [4])
    assert consumer.get_last_watermark() == Watermark(1500, computed_at=((-1, 7, 3),))


# -- the listener's dispatcher -----------------------------------------------------------------------------------


def test_pausing_the_listener_receives_nothing_until_resumed(
    client: FakeClient, closing: list[WatermarkFeed | WatermarkConsumer]
) -> None:
    client.publish_table(0, 1000)
    listener, consumer = listening(client, closing)
    assert eventually(lambda: listener.seen == [1000])
    consumer.pause_message_listener()
    client.send(data(1, 1000))
    threading.Event().wait(0.3)
    assert listener.seen == [1000]
    consumer.resume_message_listener()
    assert eventually(lambda: listener.seen == [1000, b"data-1"])


def test_closing_stops_the_listeners_thread_and_the_feeds(
    client: FakeClient, closing: list[WatermarkFeed | WatermarkConsumer]
) -> None:
    listener = Recorder()
    consumer = WatermarkConsumer(client, TOPIC, SUBSCRIPTION, listener, admin_url=UNREACHABLE_ADMIN)
    ours = {f"wm-listener-{SUBSCRIPTION}", f"wm-companion-{watermark_topic_for(TOPIC)}"}
    assert ours <= {thread.name for thread in threading.enumerate()}
    consumer.close()
    assert eventually(lambda: not ours & {thread.name for thread in threading.enumerate()})
    assert client.reader.closed and client.binding.closed


# -- WatermarkFeed ------------------------------------------------------------------------------------------------


def test_the_feed_tells_a_change_and_the_hot_path_delivers_without_commands(
    client: FakeClient, closing: list[WatermarkFeed | WatermarkConsumer]
) -> None:
    changes: list[Watermark | None] = []
    client.publish_table(0, 1000)
    feed = WatermarkFeed(client, TOPIC, SUBSCRIPTION, changes.append, admin_url=UNREACHABLE_ADMIN)
    closing.append(feed)
    assert changes == [] and feed.current is not None  # the catch-up is history: not told
    assert feed.received(-1, (7, 1, -1), "m1")
    assert feed.acknowledged_quietly(-1, (7, 1, -1))
    assert not feed.received(-1, (7, 2, -1), "marker", marker=True)
    lane = feed.lanes[-1]  # what the consumer's pull path does itself, holding the lanes' token
    feed.lane_token.pop()
    try:
        assert lane.receiving and lane.after < (7, 3, -1)
        lane.after = (7, 3, -1)
        lane.arrived.append((7, 3, -1))
    finally:
        feed.lane_token.append(True)
    assert feed.received(-1, (7, 5, -1), "m5")
    client.publish_table(4, 3000)
    assert eventually(lambda: len(changes) == 1)  # 3 (through the lane) is outstanding: distrusted, None
    assert changes == [None]
    assert not feed.acknowledged_quietly(-1, (7, 3, -1))  # distrusting: the full path


def test_with_a_listener_the_hot_path_hands_over_only_while_nothing_waits_in_the_inbox(
    client: FakeClient, closing: list[WatermarkFeed | WatermarkConsumer]
) -> None:
    """A message the engine lets go at once is handed over by the caller, without the inbox, only when everything
    commanded before it was carried out; else it goes through the engine and the inbox, after what waits there."""
    performed: list[object] = []
    inbox_empty = True
    client.publish_table(0, 1000)
    feed = WatermarkFeed(
        client, TOPIC, SUBSCRIPTION, lambda _current: None, admin_url=UNREACHABLE_ADMIN, listener=True,
        perform=performed.extend, idle=lambda: inbox_empty,
    )  # fmt: skip
    closing.append(feed)
    performed.clear()  # the watermark handed on attaching
    assert feed.received(-1, (7, 1, -1), "m1")
    assert performed == []
    inbox_empty = False  # e.g. a watermark the feed's reader queued, not handed yet
    assert not feed.received(-1, (7, 2, -1), "m2")
    assert [type(c).__name__ for c in performed] == ["Deliver"] and performed[0].token == "m2"  # type: ignore[attr-defined]
    inbox_empty = True  # m2 handed over: the hot path again
    assert feed.received(-1, (7, 3, -1), "m3")
    assert len(performed) == 1


def test_the_dispatcher_delivers_what_receive_lets_go_after_the_inbox_and_before_what_comes_later() -> None:
    order: list[object] = []

    class Message:
        def __init__(self, name: str) -> None:
            self.name, self._message = name, self

        def event_timestamp(self) -> int:
            return 0

    class Listener:
        def received(self, _consumer: object, message: Message) -> None:
            order.append(message.name)

        def received_watermark(self, _consumer: object, watermark: Watermark) -> None:
            order.append(watermark.event_time)

        def watermark_withdrawn(self, _consumer: object) -> None:
            order.append(None)

    tokens = iter([Message("direct"), None])
    dispatcher: Dispatcher

    def receive(_timeout: int) -> Any:
        token = next(tokens, None)
        if token is not None:
            dispatcher.put([HandWatermark(Watermark(7))])  # commanded after the message was let go
        return token

    dispatcher = Dispatcher(
        "test-dispatcher", listener=Listener(), consumer=None, receive=receive, full=lambda: False,
        lateness=Lateness(),
    )  # fmt: skip
    dispatcher.put([Deliver(Message("queued")), HandWatermark(Watermark(5))])
    dispatcher.start()
    try:
        assert eventually(lambda: len(order) == 4), order
        assert order == ["queued", 5, "direct", 7]
        assert dispatcher.handed == Watermark(7)
    finally:
        dispatcher.stop()


def test_the_consumer_goes_through_the_feeds_api_only() -> None:
    """Issue 34: the feed is the one owner of the engine. Issue 48: the pull path shares the engine's lanes and the
    token they are written with (consumer/trust.py `Lane`, the feed's `lane_token`; `deciding` over a batch), and
    nothing else of it."""
    from pathlib import Path

    source = (Path(__file__).parents[2] / "consumer" / "watermark_consumer.py").read_text()
    for reach_in in ("feed.engine", "_feed._", "ConsumerEngine", "quietly(", "engine.trust", "WatermarkTrust"):
        assert reach_in not in source, reach_in
    assert set(re.findall(r"feed\.(l\w+|lock|deciding)", source)) <= {"lane_token", "lanes", "deciding"}


# -- CompanionReader ----------------------------------------------------------------------------------------------


def test_the_companion_reader_asks_for_more_only_while_someone_waits_for_caught_up(client: FakeClient) -> None:
    from pulsar_access.companion import CompanionReader
    from pulsar_access.incarnations import Incarnations

    wants = threading.Event()
    caught_up: list[float] = []
    tables: list[object] = []
    reader = CompanionReader(
        client, TOPIC, Incarnations(None), on_table=tables.append, on_head=tables.append,
        on_caught_up=caught_up.append, wants_caught_up=wants.is_set,
    )  # fmt: skip
    client.publish_table(3, 100)
    reader.catch_up()
    asked = client.reader.availability_asked  # the catch-up's questions
    reader.start()
    try:
        threading.Event().wait(0.3)
        assert client.reader.availability_asked == asked and caught_up == []
        wants.set()
        assert eventually(lambda: len(caught_up) >= 2)
        assert len(tables) == 1
    finally:
        reader.close()


def test_the_companion_reader_is_not_caught_up_when_the_broker_did_not_answer(client: FakeClient) -> None:
    """The client answers "nothing more" when its connection goes while it asks; taken as caught up, a consumer
    would take a stale latest event for the current one (premature): the fault of chaos seed 951483's fold."""
    from pulsar_access.companion import CompanionReader
    from pulsar_access.incarnations import Incarnations

    caught_up: list[float] = []
    reader = CompanionReader(
        client, TOPIC, Incarnations(None), on_table=lambda _: None, on_head=lambda _: None,
        on_caught_up=caught_up.append, wants_caught_up=lambda: True,
    )  # fmt: skip
    client.reader.unanswered = 3
    reader.start()
    try:
        assert eventually(lambda: client.reader.unanswered == 0)
        assert caught_up == []  # not on the three failed questions
        assert eventually(lambda: len(caught_up) >= 1)  # the broker answers again: caught up
    finally:
        reader.close()


def test_the_companion_reader_skips_malformed_events_and_other_topics(client: FakeClient) -> None:
    from pulsar_access.companion import CompanionReader
    from pulsar_access.incarnations import Incarnations
    from tests.unit.fake_pulsar import FakeId, FakeRaw
    from watermark_core.protocol import EVENT_PROPERTY, SEND_WATERMARK, WatermarkEvent, encode_table

    tables: list[object] = []
    reader = CompanionReader(client, TOPIC, Incarnations(None), on_table=tables.append, on_head=tables.append)
    other = WatermarkEvent(TOPIC + "-other", -1, SUBSCRIPTION, 5, (7, 1), 1)
    client.reader.queue.put(FakeRaw(FakeId(1, 1), encode_table([other]), {EVENT_PROPERTY: SEND_WATERMARK}, key=KEY))
    client.reader.queue.put(FakeRaw(FakeId(1, 2), b"\x00garbage", {EVENT_PROPERTY: SEND_WATERMARK}, key=KEY))
    client.publish_table(3, 100)
    reader.catch_up()
    reader.close()
    assert reader.malformed_events == 1 and len(tables) == 1


def test_the_companion_reader_decodes_nothing_under_another_topics_key_nor_an_older_key(client: FakeClient) -> None:
    """Issue 47: a companion topic shared by a group of topics; the key says whose event it is before decoding."""
    from pulsar_access.companion import CompanionReader
    from pulsar_access.incarnations import Incarnations
    from tests.unit.fake_pulsar import FakeId, FakeRaw
    from watermark_core.protocol import EVENT_PROPERTY, SEND_WATERMARK, WatermarkEvent, encode_table, table_key

    tables: list[object] = []
    reader = CompanionReader(client, TOPIC, Incarnations(None), on_table=tables.append, on_head=tables.append)
    ours = encode_table([WatermarkEvent(TOPIC, -1, SUBSCRIPTION, 5, (7, 1), 1)])
    other_key = table_key(TOPIC + "-other", -1)
    client.reader.queue.put(FakeRaw(FakeId(1, 1), b"\x00unread", {EVENT_PROPERTY: SEND_WATERMARK}, key=other_key))
    client.reader.queue.put(FakeRaw(FakeId(1, 2), ours, {EVENT_PROPERTY: SEND_WATERMARK}, key="-1"))  # an older key
    client.publish_table(3, 100)
    reader.catch_up()
    reader.close()
    assert reader.malformed_events == 0 and len(tables) == 1


def test_the_companion_reader_takes_a_head_event_riding_on_a_table_before_the_table(client: FakeClient) -> None:
    from pulsar_access.companion import CompanionReader
    from pulsar_access.incarnations import Incarnations
    from tests.unit.fake_pulsar import FakeId, FakeRaw
    from watermark_core.protocol import EVENT_PROPERTY, SEND_WATERMARK, HeadWatermark, WatermarkEvent, encode_table

    seen: list[object] = []
    reader = CompanionReader(client, TOPIC, Incarnations(None), on_table=seen.append, on_head=seen.append)
    event = WatermarkEvent(TOPIC, -1, SUBSCRIPTION, 5, (7, 1), 1)
    head, elsewhere = HeadWatermark(TOPIC, -1, (7, 3), 9), HeadWatermark(TOPIC + "-other", -1, (7, 3), 9)
    client.reader.queue.put(
        FakeRaw(FakeId(7, 4), encode_table([event], [head]), {EVENT_PROPERTY: SEND_WATERMARK}, key=KEY)
    )
    client.reader.queue.put(
        FakeRaw(FakeId(7, 5), encode_table([event], [elsewhere]), {EVENT_PROPERTY: SEND_WATERMARK}, key=KEY)
    )
    reader.catch_up()
    reader.close()
    assert seen == [head, [event], [event]]


def test_the_companion_reader_of_one_subscription_hands_on_only_its_events(client: FakeClient) -> None:
    """A feed's reader gets one subscription's events of each table (the rest of it is not decoded)."""
    from pulsar_access.companion import CompanionReader
    from pulsar_access.incarnations import Incarnations
    from tests.unit.fake_pulsar import FakeId, FakeRaw
    from watermark_core.protocol import EVENT_PROPERTY, SEND_WATERMARK, WatermarkEvent, encode_table

    tables: list[list[WatermarkEvent]] = []
    reader = CompanionReader(
        client, TOPIC, Incarnations(None), on_table=tables.append, on_head=lambda _head: None,
        subscription=SUBSCRIPTION,
    )  # fmt: skip
    ours = WatermarkEvent(TOPIC, -1, SUBSCRIPTION, 5, (7, 1), 1)
    others = [WatermarkEvent(TOPIC, -1, f"other-{i}", 5, (7, 1), 1) for i in range(3)]
    client.reader.queue.put(
        FakeRaw(FakeId(1, 1), encode_table([*others, ours]), {EVENT_PROPERTY: SEND_WATERMARK}, key=KEY)
    )
    client.reader.queue.put(FakeRaw(FakeId(1, 2), encode_table(others), {EVENT_PROPERTY: SEND_WATERMARK}, key=KEY))
    reader.catch_up()
    reader.close()
    assert tables == [[ours]]


def test_feeds_of_one_client_share_the_companion_topics_reader_and_one_that_comes_later_starts_from_the_latest(
    client: FakeClient,
) -> None:
    """Issue 47: a companion topic carries a group's tables; a process with a consumer per topic reads it once."""
    from pulsar_access.companion import CompanionReader
    from pulsar_access.incarnations import Incarnations
    from watermark_core.protocol import WatermarkEvent

    first: list[list[WatermarkEvent]] = []
    later: list[list[WatermarkEvent]] = []

    def reader(tables: list[list[WatermarkEvent]], subscription: str) -> CompanionReader:
        return CompanionReader(client, TOPIC, Incarnations(None), on_table=tables.append, on_head=lambda _: None,
                               subscription=subscription, shared=True)  # fmt: skip

    one = reader(first, SUBSCRIPTION)
    client.publish_table(3, 100)
    client.publish_table(4, 200)
    one.catch_up()
    one.start()
    assert [t[0].event_time for t in first] == [100, 200]
    two = reader(later, SUBSCRIPTION)
    two.catch_up()  # from what the shared reader kept: the latest table of each key, not the history
    assert [t[0].event_time for t in later] == [200] and client.readers_created == 1
    two.start()
    one.close()  # the other still reads
    client.publish_table(5, 300)
    assert eventually(lambda: [t[0].event_time for t in later] == [200, 300])
    assert not client.reader.closed
    two.close()
    assert client.reader.closed and [t[0].event_time for t in first] == [100, 200]


def test_the_consumer_has_the_clients_whole_api_and_no_getattr() -> None:
    """Issue 48: a `__getattr__` makes every attribute read on the consumer the slow, unspecialized kind (3.4 k
    instructions a message on the pull path); the rest of `pulsar.Consumer`'s API is written out instead."""
    assert "__getattr__" not in vars(WatermarkConsumer)
    missing = [
        name for name in dir(pulsar.Consumer)
        if not name.startswith("_") and name != "topic" and not callable(getattr(WatermarkConsumer, name, None))
    ]  # fmt: skip
    assert missing == []
