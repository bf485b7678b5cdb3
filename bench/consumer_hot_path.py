"""`python -m bench.consumer_hot_path [pull|batch|plain|plain_batch|floor] [messages]`: the consumer's own work per
message, without a broker.

`WatermarkConsumer.receive` + `acknowledge` (or `batch_receive`) against `pulsar.Consumer`'s over the same stand-in
for the client's binding: its `receive`, `batch_receive` and `acknowledge` are C calls that cost next to nothing, and
the messages answer `message_id`, `properties`, `event_timestamp` with real binding objects (a `_pulsar.MessageId`
made per call, built `_pulsar.Message`s), so what is timed is what our code adds, with the binding calls it makes.
Batched entries of 1010 messages, a W_SET per 100 messages, and one watermark published before them (one table on
the companion topic, read when the consumer attaches): a watermark is held throughout, as in `python -m bench client`,
so every data message's event time is read for `late_messages` (issue 48: without one the stand-in left that out).

On this shared 2-core machine CPU time swings by 30 % between runs; instructions do not. Count them with
valgrind, at two sizes, and take the difference per message (issue 34, session 16):

    valgrind --tool=callgrind --callgrind-out-file=/dev/null python -m bench.consumer_hot_path pull 2000
    valgrind --tool=callgrind --callgrind-out-file=/dev/null python -m bench.consumer_hot_path pull 12000

(the "Collected" line; building the stand-in messages is in both, about 19 500 instructions a message).
`floor` is bench/client_throughput.py's position floor (issue 48) over the same stand-in: the plain receive, the
marker property, `message_id()` with its three getters, one comparison, acknowledge; not a correct consumer.

The stand-in's messages are not the binding's (their accessors are slots holding bound calls), so the consumer calls
them by name (`operator.methodcaller`), where a real binding's are called unbound: the stand-in cannot show what that
buys, nor what keeping the binding's message ids costs on a broker. docs/DECISIONS.md ("Session 26") counts the pull
path on the broker instead: one drain under callgrind with `--collect-atstart=no --toggle-collect=builtin_sum`, the
drain run inside `sum(map(step, range(n)))`.
"""

from __future__ import annotations

import functools
import gc
import itertools
import sys
import time
from typing import Any

import _pulsar
import pulsar
import pulsar.schema

from consumer.watermark_consumer import WatermarkConsumer
from watermark_core.protocol import (
    EVENT_PROPERTY,
    MARKER_PROPERTY,
    SEND_WATERMARK,
    WatermarkEvent,
    encode_set,
    encode_table,
)

TOPIC = "persistent://public/default/hot-path"
NOWHERE = "http://127.0.0.1:9"
"""The admin URL: nothing answers at the discard port (no incarnation is read)."""

SUBSCRIPTION = "bench"
PER_ENTRY = 1010
MARKER_EVERY = 100
BATCH = 1000


class _Raw:
    """A message as the binding returns it: each accessor a C callable (a built message's, or a new message id)."""

    __slots__ = ("data", "event_timestamp", "message_id", "producer_name", "properties", "publish_timestamp",
                 "topic_name")  # fmt: skip
    message_id: Any


def _built(properties: dict[str, str], payload: bytes) -> Any:
    builder = _pulsar.MessageBuilder()
    builder.content(payload)
    builder.event_timestamp(1_000_000)
    if properties:
        builder.properties(properties)
    return builder.build()


def messages(data: int) -> list[_Raw]:
    """`data` data messages and a W_SET after every `MARKER_EVERY`, in entries of `PER_ENTRY` messages."""
    plain = _built({}, b"x" * 100)
    marker = _built({MARKER_PROPERTY: "W_SET"}, encode_set(1_000_000))
    out: list[_Raw] = []
    count = 0
    while count < data:
        is_marker = len(out) % (MARKER_EVERY + 1) == MARKER_EVERY
        source = marker if is_marker else plain
        raw = _Raw()
        entry, index = divmod(len(out), PER_ENTRY)
        raw.message_id = functools.partial(_pulsar.MessageId, -1, 7, entry, index)
        for name in ("properties", "event_timestamp", "data", "producer_name", "publish_timestamp", "topic_name"):
            setattr(raw, name, getattr(source, name))
        out.append(raw)
        count += not is_marker
    return out


class _Binding:
    """`pulsar.Consumer._consumer`: C calls only (`receive(timeout)` is `next(iterator, timeout)`)."""

    def __init__(self, raws: list[_Raw]) -> None:
        # after the last message, more of the first (a batch collected with `receive` may ask past the end)
        self.receive = functools.partial(next, itertools.chain(raws, itertools.repeat(raws[0])))
        self.acknowledged: list[Any] = []
        self.acknowledge = self.acknowledged.append
        self._raws, self._at = raws, 0

    def batch_receive(self) -> list[_Raw]:
        at, self._at = self._at, self._at + BATCH
        return self._raws[at : at + BATCH]

    def close(self) -> None:
        pass


class _Reader:
    """The companion topic's reader: one table (the subscription's watermark 1, computed before every message)."""

    def __init__(self) -> None:
        event = WatermarkEvent(TOPIC, -1, SUBSCRIPTION, 1, (6, 0), 1)
        self._left = [_built({EVENT_PROPERTY: SEND_WATERMARK}, encode_table([event]))]

    def has_message_available(self) -> bool:
        return bool(self._left)

    def read_next(self, timeout_millis: int = 0) -> Any:
        if self._left:
            return self._left.pop()
        time.sleep(timeout_millis / 1000)
        raise pulsar.Timeout("nothing")

    def close(self) -> None:
        pass


class _Client:
    """What `WatermarkConsumer` asks of `pulsar.Client`: a topic without partitions, an empty companion topic."""

    def __init__(self, raws: list[_Raw]) -> None:
        self.raws = raws

    def get_topic_partitions(self, topic: str) -> list[str]:
        return [topic]

    def create_reader(self, *_args: Any, **_options: Any) -> _Reader:
        return _Reader()

    def subscribe(self, *_args: Any, **_options: Any) -> pulsar.Consumer:
        return _plain(self.raws)


def _plain(raws: list[_Raw]) -> pulsar.Consumer:
    consumer = pulsar.Consumer()
    consumer._consumer, consumer._schema = _Binding(raws), pulsar.schema.BytesSchema()
    setattr(consumer, "close", consumer._consumer.close)  # noqa: B010 (no client to leave)
    return consumer


def _ours(raws: list[_Raw]) -> WatermarkConsumer:
    """Batches of `BATCH` messages, as the stand-in's `batch_receive` returns to the plain consumer."""
    policy = pulsar.ConsumerBatchReceivePolicy(BATCH, -1, 100)
    consumer = WatermarkConsumer(_Client(raws), TOPIC, SUBSCRIPTION, admin_url=NOWHERE, batch_receive_policy=policy)
    assert consumer.get_last_watermark() is not None, "the stand-in's watermark was not read"
    return consumer


class _Floor:
    """bench/client_throughput.py's `_PositionFloor` over the stand-in (the same lines)."""

    def __init__(self, consumer: pulsar.Consumer) -> None:
        self._consumer, self._raw, self._schema = consumer, consumer._consumer, consumer._schema
        self._last = (-1, -1, -1)

    def receive(self, timeout_millis: int) -> pulsar.Message:
        while True:
            raw = self._raw.receive(timeout_millis)
            if MARKER_PROPERTY in raw.properties():
                self._raw.acknowledge(raw)
                continue
            msg_id = raw.message_id()
            position = (msg_id.ledger_id(), msg_id.entry_id(), msg_id.batch_index())
            if position > self._last:
                self._last = position
            message = pulsar.Message()
            message._message, message._schema = raw, self._schema
            return message

    def acknowledge(self, message: pulsar.Message) -> None:
        self._raw.acknowledge(message._message)

    def close(self) -> None:
        self._consumer.close()


def run(mode: str, data: int) -> float:
    """CPU seconds of this thread per data message (markers are read too: the plain consumer gets them as data)."""
    raws = messages(data)
    consumer: pulsar.Consumer | WatermarkConsumer | _Floor
    consumer = _ours(raws) if mode in ("pull", "batch") else _Floor(_plain(raws)) if mode == "floor" else _plain(raws)
    count = data if mode in ("pull", "batch", "floor") else len(raws)
    gc.collect()
    gc.freeze()  # the stand-in's own objects (six per message) out of every collection: a real heap has none of them
    started = time.thread_time()
    if mode in ("pull", "plain", "floor"):
        for _ in range(count):
            consumer.acknowledge(consumer.receive(timeout_millis=30_000))
    else:
        assert not isinstance(consumer, _Floor)
        received = 0
        while received < count:
            for message in consumer.batch_receive():
                consumer.acknowledge(message)
                received += 1
    elapsed = (time.thread_time() - started) / data
    consumer.close()
    return elapsed


def main(argv: list[str]) -> None:
    mode = argv[0] if argv else "pull"
    data = int(argv[1]) if len(argv) > 1 else 50_000
    if mode not in ("pull", "batch", "plain", "plain_batch", "floor"):
        raise SystemExit("mode: pull, batch, plain, plain_batch or floor")
    print(f"{mode}: {run(mode, data) * 1e6:.2f} us of CPU per message ({data} messages)")


if __name__ == "__main__":
    main(sys.argv[1:])
