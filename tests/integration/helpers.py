"""Shared helpers of the integration tests: a recording listener and waiting for the broker."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import msgpack
import pulsar

from consumer import Watermark, WatermarkConsumer, WatermarkListener
from producer import WatermarkProducer
from pulsar_access.admin import AdminError, PulsarAdmin
from pulsar_access.readers import has_message_available
from pulsar_access.topics import base_topic_and_partition, watermark_topic_for
from watermark_core.protocol import EVENT_PROPERTY, MARKER_PROPERTY, SEND_WATERMARK, decode_table, key_topic

MALFORMED: list[tuple[dict[str, str], bytes, str]] = [
    ({MARKER_PROPERTY: "W_SET"}, b"\xc1not msgpack", "bad-msgpack"),
    ({MARKER_PROPERTY: "W_BOGUS"}, b"\x80", "bad-kind"),
    ({MARKER_PROPERTY: "W_SET"}, b"\x81\xa1v\x01", "bad-field"),  # no event_time
    ({MARKER_PROPERTY: "W_SET"}, msgpack.packb({"v": 99, "event_time": 1_000}), "bad-version"),
    ({MARKER_PROPERTY: "W_TXN_COMMIT"}, b"\x81\xa1v\x01", "bad-field"),  # no txn
]
"""Malformed markers a raw producer can write, with the reason every component skips each for."""


class Recorder(WatermarkListener):
    """Records what the listener sees, with the thread it ran on; with `ack=False` keeps what it holds."""

    def __init__(self, ack: bool = True) -> None:
        self.ack = ack
        self.events: list[tuple[str, object]] = []
        self.threads: set[str] = set()
        self.held: list[pulsar.Message] = []
        self.lock = threading.Lock()

    def received(self, consumer: WatermarkConsumer, message: pulsar.Message) -> None:
        with self.lock:
            self.events.append(("msg", message.data()))
            self.threads.add(threading.current_thread().name)
            if not self.ack:
                self.held.append(message)
        if self.ack:
            consumer.acknowledge(message)

    def assert_one_thread(self, subscription: str) -> None:
        """Contract 3: messages and watermarks reach the listener on one thread (the consumer's dispatcher)."""
        with self.lock:
            kinds = {kind for kind, _ in self.events}
            threads = set(self.threads)
        assert kinds == {"msg", "wm"}, f"the listener needs both messages and watermarks to show this: {kinds}"
        assert threads == {f"wm-listener-{subscription}"}, threads

    def received_watermark(self, consumer: WatermarkConsumer, watermark: Watermark) -> None:
        with self.lock:
            self.events.append(("wm", watermark.event_time))
            self.threads.add(threading.current_thread().name)

    def watermark_withdrawn(self, consumer: WatermarkConsumer) -> None:
        with self.lock:
            self.events.append(("withdrawn", None))
            self.threads.add(threading.current_thread().name)

    def messages(self) -> list[object]:
        with self.lock:
            return [value for kind, value in self.events if kind == "msg"]


@dataclass(frozen=True)
class HandedOver:
    """A message as a listener got it, with the watermark the listener held at that moment."""

    payload: bytes
    event_time: int
    publish_time: int
    position: tuple[int, int, int, int]
    """(partition, ledger, entry, batch index)."""
    held: Watermark | None


class Timeline(WatermarkListener):
    """Records every message with the watermark held when it was handed over, and every watermark change."""

    def __init__(self, ack: bool = True) -> None:
        self.ack = ack
        self.lock = threading.Lock()
        self.held: Watermark | None = None
        self.messages: list[HandedOver] = []
        self.watermarks: list[Watermark | None] = []
        """Every watermark handed over, None for a withdrawal, in order."""

    def received(self, consumer: WatermarkConsumer, message: pulsar.Message) -> None:
        msg_id = message.message_id()
        position = (msg_id.partition(), msg_id.ledger_id(), msg_id.entry_id(), msg_id.batch_index())
        with self.lock:
            self.messages.append(
                HandedOver(message.data(), message.event_timestamp(), message.publish_timestamp(), position, self.held)
            )
        if self.ack:
            consumer.acknowledge(message)

    def received_watermark(self, consumer: WatermarkConsumer, watermark: Watermark) -> None:
        with self.lock:
            self.held = watermark
            self.watermarks.append(watermark)

    def watermark_withdrawn(self, consumer: WatermarkConsumer) -> None:
        with self.lock:
            self.held = None
            self.watermarks.append(None)

    def count(self, payload: bytes) -> int:
        with self.lock:
            return sum(m.payload == payload for m in self.messages)

    def values(self) -> list[int | None]:
        with self.lock:
            return [None if w is None else w.event_time for w in self.watermarks]

    def assert_never_below_the_held_watermark(self) -> None:
        """The contract, as a listener sees it: no message handed over below the watermark it held then."""
        with self.lock:
            below = [m for m in self.messages if m.held is not None and m.event_time < m.held.event_time]
        assert not below, f"{len(below)} messages handed over below the watermark held then, e.g. {below[:3]}"


def wait_until(predicate: Callable[[], object], timeout_s: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def backlog(admin: PulsarAdmin, topic: str, subscription: str) -> int:
    return int(admin.topic_stats(topic)["subscriptions"][subscription]["msgBacklog"])


def partition_backlogs(admin: PulsarAdmin, topic: str, partitions: int, subscription: str) -> list[int]:
    return [backlog(admin, f"{topic}-partition-{i}", subscription) for i in range(partitions)]


def watermarks(recorder: Recorder) -> list[int]:
    with recorder.lock:
        return [int(value) for kind, value in recorder.events if kind == "wm"]  # type: ignore[call-overload]


def recomputed_watermark(
    reader: TopicEvents, subscription: str, at_or_before: tuple[int, int], after_us: int, within_s: float
) -> int | None:
    """The first watermark of `subscription` published after `after_us` (the generator's clock, in
    microseconds) at a position at or before `at_or_before`, read from a reader of the companion
    topic; None if none comes within `within_s`. What a seek back waits for."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            message = reader.read_next(timeout_millis=200)
        except pulsar.Timeout:
            continue
        if message.properties().get(EVENT_PROPERTY) != SEND_WATERMARK:
            continue  # a HeadWatermark event
        for event in decode_table(message.data()):
            if event.subscription == subscription and event.seq > after_us and tuple(event.position) <= at_or_before:
                return event.event_time
    return None


class TopicEvents:
    """A reader of a companion topic that hands out only the events whose key names one topic (the companion
    carries its group's): `read_next`, `has_message_available` and `close`, as a `pulsar.Reader`'s."""

    def __init__(self, reader: pulsar.Reader, topic: str) -> None:
        self._whole = reader
        self.topic = base_topic_and_partition(topic)[0]
        self._ahead: pulsar.Message | None = None
        """One of ours read by `has_message_available`, for the next `read_next`."""

    def _ours(self, message: pulsar.Message) -> bool:
        return key_topic(message.partition_key()) == self.topic

    def read_next(self, timeout_millis: int | None = None) -> pulsar.Message:
        if self._ahead is not None:
            message, self._ahead = self._ahead, None
            return message
        deadline = None if timeout_millis is None else time.monotonic() + timeout_millis / 1000
        while True:
            left = None if deadline is None else max(1, int((deadline - time.monotonic()) * 1000))
            message = self._whole.read_next(timeout_millis=left)
            if self._ours(message):
                return message
            if deadline is not None and time.monotonic() >= deadline:
                raise pulsar.Timeout("no event of the topic within the timeout")

    def has_message_available(self) -> bool:
        """Whether one of ours is there (the others before it are read and passed over); raises as
        `pulsar_access.readers.has_message_available` when the broker does not answer."""
        while self._ahead is None and has_message_available(self._whole):
            message = self._whole.read_next(timeout_millis=10_000)
            if self._ours(message):
                self._ahead = message
        return self._ahead is not None

    def close(self) -> None:
        self._whole.close()


def watermark_table_reader(client: pulsar.Client, topic: str) -> TopicEvents:
    """A reader of `topic`'s events on its companion watermark topic, from its start."""
    return TopicEvents(client.create_reader(watermark_topic_for(topic), pulsar.MessageId.earliest), topic)


HOUR_MS = 3_600_000


def recreate_after_a_high_watermark(
    pulsar_client: pulsar.Client, admin: PulsarAdmin, topic: str, base: int, subscription: str
) -> WatermarkProducer:
    """Issue #26 (1): `topic`'s watermark reaches `base` + 10 h; the topic is deleted (force) and created again
    under its name; a new producer asserts `base` and writes from there. Returns that producer."""
    admin_url = admin.base_url
    old_recorder = Recorder()
    old_consumer = WatermarkConsumer(pulsar_client, topic, subscription, listener=old_recorder, admin_url=admin_url)
    old = WatermarkProducer(pulsar_client, topic, producer_name="old")
    old.new_watermark().event_time(base + 10 * HOUR_MS).send()
    old.send(b"old", event_timestamp=base + 10 * HOUR_MS)
    wait_until(lambda: base + 10 * HOUR_MS in watermarks(old_recorder), timeout_s=30, what="the old topic at T+10 h")
    old_consumer.close()
    old.close()
    admin.delete_topic(topic, force=True)
    try:
        admin.create_topic(topic)
    except AdminError as exc:  # a client that reconnected (the generator's consumer) may have created it already
        if exc.status != 409:
            raise
    new = WatermarkProducer(pulsar_client, topic, producer_name="new")
    new.new_watermark().event_time(base).send()
    return new
