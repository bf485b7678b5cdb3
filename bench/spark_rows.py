"""`python -m bench.spark_rows`: the Spark source's executor work per message, without a broker.

Rates are per CPU second of this process (the machine may be busy), the best of several rounds. A fake
reader hands out messages whose accessors return stored values (as cheap as Python calls get; the
binding's own calls cost more, and are the same whatever our code does). Measured: `read_range` turning
them into Arrow record batches, against the floor of calling the accessors a correct read loop needs
(position, properties for the marker check, and each column's value) and keeping nothing.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time

from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_sink.clients import keep_reader
from spark_sink.options import SourceOptions
from spark_sink.ranges import TopicRange
from spark_sink.rows import ArrowRows, read_range
from spark_sink.source import SCHEMA

TOPIC = "persistent://public/default/bench-rows"
LEDGER = 7
TYPES = {
    "string": StringType(), "binary": BinaryType(), "timestamp": TimestampType(), "int": IntegerType(),
    "boolean": BooleanType(), "map<string,string>": MapType(StringType(), StringType()),
}  # fmt: skip
SPARK_SCHEMA = StructType([StructField(n, TYPES[k]) for n, k in (f.split(" ", 1) for f in SCHEMA.split(", "))])


class FakeId:
    __slots__ = ("_entry",)

    def __init__(self, entry: int) -> None:
        self._entry = entry

    def ledger_id(self) -> int:
        return LEDGER

    def entry_id(self) -> int:
        return self._entry

    def batch_index(self) -> int:
        return -1


class FakeMessage:
    __slots__ = ("_id", "_key", "_payload", "_properties")

    def __init__(self, entry: int, properties: dict[str, str]) -> None:
        self._id = FakeId(entry)
        self._payload = b"x" * 100
        self._key = f"key-{entry % 100}"
        self._properties = properties

    def message_id(self) -> FakeId:
        return self._id

    def properties(self) -> dict[str, str]:
        return dict(self._properties)  # the binding builds a new dict per call

    def partition_key(self) -> str:
        return self._key

    def data(self) -> bytes:
        return self._payload

    def event_timestamp(self) -> int:
        return 1_700_000_000_000 + self._id._entry

    def publish_timestamp(self) -> int:
        return 1_700_000_000_500 + self._id._entry

    def producer_name(self) -> str:
        return "producer-1"


class FakeReader:
    def __init__(self, messages: list[FakeMessage]) -> None:
        self._messages = iter(messages)

    def read_next(self, timeout_ms: int = 0) -> FakeMessage:
        return next(self._messages)

    def has_message_available(self) -> bool:
        return True

    def close(self) -> None:
        pass


def _messages(count: int, with_properties: float) -> list[FakeMessage]:
    every = int(1 / with_properties) if with_properties else 0
    return [FakeMessage(entry, {"a": "b"} if every and entry % every == 0 else {}) for entry in range(count + 1)]


def _settle() -> None:
    """The fake messages out of the garbage collector's sight: real ones are the binding's, which it never scans."""
    gc.collect()
    gc.freeze()


def source_rate(count: int, with_properties: float = 0.0) -> float:
    """Messages per second through `read_range` (one range of `count` entries), Arrow batches included."""
    options = SourceOptions({"topic": TOPIC, "subscription": "bench", "serviceUrl": "pulsar://localhost:6650",
                             "adminUrl": "http://localhost:8080"})  # fmt: skip
    part = TopicRange((TOPIC, -1), (LEDGER, -1), (LEDGER, count - 1), 1_700_000_000_000, 1_700_000_000_000, False)
    keep_reader(options.settings(), options.client_options, TOPIC, FakeReader(_messages(count, with_properties)),
                (LEDGER, -1))  # fmt: skip
    _settle()
    started = time.process_time()
    rows = sum(batch.num_rows for batch in read_range(options, part, ArrowRows(SPARK_SCHEMA, part)))
    elapsed = time.process_time() - started
    assert rows == count, rows
    return count / elapsed


def floor_rate(count: int, with_properties: float = 0.0) -> float:
    """Messages per second calling only the accessors a correct read loop needs."""
    reader = FakeReader(_messages(count, with_properties))
    _settle()
    started = time.process_time()
    for _ in range(count):
        message = reader.read_next(30_000)
        msg_id = message.message_id()
        msg_id.ledger_id(), msg_id.entry_id(), msg_id.batch_index()
        if "wm.marker" not in message.properties():
            message.partition_key(), message.data(), message.event_timestamp(), message.publish_timestamp()
            message.producer_name()
    return count / (time.process_time() - started)


def main(count: int = 200_000, rounds: int = 7) -> None:
    for share in (0.0, 0.1):
        source = [source_rate(count, share) for _ in range(rounds)]
        floor = [floor_rate(count, share) for _ in range(rounds)]
        print(
            f"{count} messages, {share:.0%} with properties: read_range {max(source) / 1000:.0f} k/s "
            f"(median {statistics.median(source) / 1000:.0f}), accessor floor {max(floor) / 1000:.0f} k/s "
            f"(median {statistics.median(floor) / 1000:.0f}); best of {rounds} rounds, per CPU second"
        )


if __name__ == "__main__":
    main(*(int(arg) for arg in sys.argv[1:]))
