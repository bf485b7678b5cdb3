"""A hand-written stand-in for the parts of `pulsar.Client` the consumer's shell uses (no broker).

`FakeClient` answers `get_topic_partitions`, `create_reader` (the companion topic: a `FakeReader` fed with
`publish_table`) and `subscribe` (a `pulsar.Consumer` around a `FakeBinding`, the binding object the shell
calls on its hot path, fed with `send`). Everything is thread-safe enough for the feed's and the listener's
threads: queues and a lock.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import _pulsar
import pulsar
import pulsar.schema

from watermark_core.protocol import (
    EVENT_PROPERTY,
    MARKER_PROPERTY,
    SEND_WATERMARK,
    WatermarkEvent,
    encode_set,
    encode_table,
    table_key,
)

TOPIC = "persistent://public/default/fake-topic"
SUBSCRIPTION = "sub"
UNREACHABLE_ADMIN = "http://127.0.0.1:9"
"""An admin URL nothing answers at (the discard port): incarnations go unchecked, nothing leaves the machine."""
L = 7


@dataclass(frozen=True)
class FakeId:
    """A message id: what `message_id()` returns, with the binding's accessors."""

    ledger: int
    entry: int
    batch: int = -1
    index: int = -1

    def partition(self) -> int:
        return self.index

    def ledger_id(self) -> int:
        return self.ledger

    def entry_id(self) -> int:
        return self.entry

    def batch_index(self) -> int:
        return self.batch


@dataclass
class FakeRaw:
    """A message as the client's binding returns it (wrapped by `pulsar.Message`)."""

    id: FakeId
    payload: bytes = b""
    props: dict[str, str] = field(default_factory=dict)
    event_time: int = 0
    calls: list[str] = field(default_factory=list)
    """The accessors asked, in order (`message_id` counts the position's cost)."""
    key: str = ""

    def partition_key(self) -> str:
        return self.key

    def message_id(self) -> Any:
        """The binding's own message id (the consumer's lanes compare it with `<`, consumer/trust.py `Lane`)."""
        self.calls.append("message_id")
        return _pulsar.MessageId(self.id.index, self.id.ledger, self.id.entry, self.id.batch)

    def properties(self) -> dict[str, str]:
        return self.props

    def data(self) -> bytes:
        return self.payload

    def length(self) -> int:
        return len(self.payload)

    def event_timestamp(self) -> int:
        return self.event_time

    def publish_timestamp(self) -> int:
        return 0

    def producer_name(self) -> str:
        return "producer"

    def topic_name(self) -> str:
        return TOPIC


def data(entry: int, event_time: int = 0, partition: int = -1) -> FakeRaw:
    return FakeRaw(FakeId(L, entry, -1, partition), b"data-%d" % entry, event_time=event_time)


def marker(entry: int, event_time: int, partition: int = -1) -> FakeRaw:
    return FakeRaw(FakeId(L, entry, -1, partition), encode_set(event_time), {MARKER_PROPERTY: "W_SET"})


class FakeReader:
    """The companion topic's reader: what was published, in order; `read_next` waits for the next.

    While `unanswered` > 0, asking whether more is there fails as the client's does when its connection
    goes while it asks: the plain call answers False, the binding's asynchronous one a failed result."""

    def __init__(self) -> None:
        self.queue: queue.Queue[FakeRaw] = queue.Queue()
        self.availability_asked = 0
        self.unanswered = 0
        self.closed = False
        self._reader = self  # `pulsar.Reader._reader`: the binding, with `has_message_available_async`

    def has_message_available(self) -> bool:
        result, available = self._ask()
        return available and result == pulsar.Result.Ok

    def has_message_available_async(self, callback: Callable[[Any, bool], None]) -> None:
        callback(*self._ask())

    def _ask(self) -> tuple[Any, bool]:
        self.availability_asked += 1
        if self.unanswered > 0:
            self.unanswered -= 1
            return pulsar.Result.Timeout, False
        return pulsar.Result.Ok, not self.queue.empty()

    def read_next(self, timeout_millis: int | None = None) -> FakeRaw:
        try:
            return self.queue.get(timeout=None if timeout_millis is None else timeout_millis / 1000)
        except queue.Empty:
            raise pulsar.Timeout("read_next timed out") from None

    def close(self) -> None:
        self.closed = True


class FakeBinding:
    """`pulsar.Consumer._consumer`: what the shell calls per message."""

    def __init__(self) -> None:
        self.inbox: queue.Queue[FakeRaw] = queue.Queue()
        self.acknowledged: list[FakeRaw] = []
        self.cumulative: list[Any] = []
        self.negative: list[Any] = []
        self.closed = False
        self.lock = threading.Lock()

    def receive(self, timeout_millis: int | None = None) -> FakeRaw:
        if self.closed:
            raise pulsar.AlreadyClosed("closed")
        try:
            return self.inbox.get(timeout=None if timeout_millis is None else timeout_millis / 1000)
        except queue.Empty:
            raise pulsar.Timeout("receive timed out") from None

    def batch_receive(self) -> list[FakeRaw]:
        """The client's own: it waits on the client's listener thread and the wall clock (a listener busy elsewhere or
        the clock stepped back stalls it), so the shell must not call it."""
        raise AssertionError("the shell called the client's batch_receive")

    def acknowledge(self, message: Any) -> None:
        with self.lock:
            self.acknowledged.append(message._message if isinstance(message, pulsar.Message) else message)

    def acknowledge_cumulative(self, message: Any) -> None:
        with self.lock:
            self.cumulative.append(message)

    def negative_acknowledge(self, message: Any) -> None:
        with self.lock:
            self.negative.append(message)

    def close(self) -> None:
        self.closed = True


class FakeConsumer(pulsar.Consumer):
    """A `pulsar.Consumer` whose binding is a `FakeBinding` (the methods the shell calls on it, not the binding)."""

    def __init__(self, binding: FakeBinding) -> None:
        self._consumer = binding
        self._schema = pulsar.schema.BytesSchema()
        self.sought: list[Any] = []

    def acknowledge(self, message: Any) -> None:
        self._consumer.acknowledge(message)

    def acknowledge_cumulative(self, message: Any) -> None:
        self._consumer.acknowledge_cumulative(message)

    def negative_acknowledge(self, message: Any) -> None:
        self._consumer.negative_acknowledge(message)

    def seek(self, messageid: Any) -> None:
        self.sought.append(messageid)

    def close(self) -> None:
        self._consumer.close()


class FakeClient:
    """`pulsar.Client` as the consumer's shell uses it: one non-partitioned topic and its companion topic."""

    def __init__(self, partitions: list[str] | None = None) -> None:
        self.partitions = partitions if partitions is not None else [TOPIC]
        self.reader = FakeReader()
        self.binding = FakeBinding()
        self.consumers: list[FakeConsumer] = []
        self.on_subscribe: Callable[[], None] | None = None
        """Runs inside `subscribe`, before it returns (what happens meanwhile on other threads)."""
        self._seq = 0
        self.readers_created = 0

    def get_topic_partitions(self, topic: str) -> list[str]:
        return list(self.partitions)

    def create_reader(self, topic: str, start: Any, **options: Any) -> FakeReader:
        self.readers_created += 1
        return self.reader

    def subscribe(self, topic: str, subscription: str, **options: Any) -> FakeConsumer:
        if self.on_subscribe is not None:
            self.on_subscribe()
        if self.consumers:  # subscribed again (a seek by id): the same queue of messages goes on
            self.binding.closed = False
        consumer = FakeConsumer(self.binding)
        self.consumers.append(consumer)
        return consumer

    def publish_table(
        self, entry: int, event_time: int | None, *, subscription: str = SUBSCRIPTION, partition: int = -1
    ) -> None:
        """The generator publishes `subscription`'s watermark `event_time`, computed at (L, entry)."""
        self._seq += 1
        event = WatermarkEvent(TOPIC, partition, subscription, event_time, (L, entry), self._seq)
        self.reader.queue.put(
            FakeRaw(FakeId(1, self._seq), encode_table([event]), {EVENT_PROPERTY: SEND_WATERMARK},
                    key=table_key(TOPIC, partition))
        )  # fmt: skip

    def send(self, *messages: FakeRaw) -> None:
        """The broker dispatches these to the consumer."""
        for message in messages:
            self.binding.inbox.put(message)

    def read_all(self, timeout: float = 2.0) -> None:
        """Wait until the companion reader has taken everything published (and a little for its handling)."""
        deadline = time.monotonic() + timeout
        while not self.reader.queue.empty() and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.05)


def eventually(condition: Callable[[], bool], timeout: float = 3.0) -> bool:
    """Whether `condition()` holds within `timeout` seconds (polled)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()
