"""The exactly-once sink's pure parts: sequence ids, entries, what a task run again still sends, stable names,
routing."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("pyspark")

import pyarrow as pa

from spark_sink.sink import (
    ENTRY_BYTES,
    ENTRY_ROWS,
    ROW_BITS,
    SinkOptions,
    _canonical,
    _column,
    _message,
    _message_size,
    entries_to_send,
    entry_starts,
    query_producer_name,
    sequence_id,
    target_partitions,
    writer_name,
)

pytestmark = pytest.mark.unit

batches = st.integers(min_value=0, max_value=(1 << 31) - 1)
rows = st.integers(min_value=0, max_value=(1 << ROW_BITS) - 1)


@given(batches, rows, batches, rows)
def test_sequence_ids_grow_with_the_batch_then_the_row(b1: int, r1: int, b2: int, r2: int) -> None:
    assert (sequence_id(b1, r1) < sequence_id(b2, r2)) == ((b1, r1) < (b2, r2))
    assert sequence_id(b1, r1) < 1 << 63  # Pulsar's sequence id is a signed 64-bit integer


def test_sequence_ids_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError, match="rows per batch"):
        sequence_id(0, 1 << ROW_BITS)
    with pytest.raises(ValueError, match="batch id"):
        sequence_id(1 << 31, 0)


sizes = st.lists(st.integers(min_value=0, max_value=300), max_size=60)
limits = st.tuples(st.integers(min_value=1, max_value=8), st.integers(min_value=1, max_value=600))


@given(sizes, limits)
def test_entries_are_cut_greedily_within_the_limits(row_sizes: list[int], limit: tuple[int, int]) -> None:
    """Every row in one entry; an entry stays within both limits (a bigger row alone) and ends only when the
    next row would break one: the bounds follow from the rows alone, the same on every run."""
    max_rows, max_bytes = limit
    starts = entry_starts(row_sizes, max_rows, max_bytes)
    bounds = [*starts, len(row_sizes)]
    assert starts == sorted(set(starts)) and (starts[:1] == [0] if row_sizes else starts == [])
    for start, end in itertools.pairwise(bounds):
        weight = sum(row_sizes[start:end])
        assert end - start <= max_rows and (weight <= max_bytes or end - start == 1)
        if end < len(row_sizes):
            assert end - start == max_rows or weight + row_sizes[end] > max_bytes
    assert entry_starts(row_sizes[:7], max_rows, max_bytes) == [s for s in starts if s < 7]  # a prefix cuts alike


def test_the_default_limits_cut_after_a_thousand_rows_or_128_kib() -> None:
    assert entry_starts([1] * 2500) == [0, ENTRY_ROWS, 2 * ENTRY_ROWS]
    assert entry_starts([ENTRY_BYTES // 2 + 1] * 3) == [0, 1, 2]
    assert entry_starts([10, ENTRY_BYTES * 3, 10]) == [0, 1, 2]


class Broker:
    """Pulsar's deduplication for one producer name as the Python client meets it: an entry whose first
    sequence id is at most the last persisted one is dropped whole, else persisted whole (and it becomes the
    last: the client does not send a batch's highest sequence id)."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.last = -1

    def persist(self, batch: int, entry: range) -> None:
        first = sequence_id(batch, entry[0])
        if first > self.last:
            self.rows.extend(entry)
            self.last = first


@given(batches, sizes, limits, st.lists(st.integers(min_value=0, max_value=12), max_size=4), st.data())
def test_a_batch_run_again_after_any_death_writes_each_row_once(
    batch: int, row_sizes: list[int], limit: tuple[int, int], deaths: list[int], data: st.DataObject
) -> None:
    """Runs of one task that die after any number of entries (a flushed entry is persisted whole, the rest of
    a dying run never), then one that finishes: the broker holds each row once, in order, and no entry sent
    is dropped by it; also when the broker's last sequence id is from an earlier batch."""
    broker = Broker()
    if batch:
        broker.last = data.draw(st.one_of(st.just(-1), st.builds(sequence_id, st.integers(0, batch - 1), rows)))
    for persisted in [*deaths, None]:
        entries = entries_to_send(batch, row_sizes, broker.last, *limit)
        assert all(sequence_id(batch, entry[0]) > broker.last for entry in entries[:1])
        for entry in entries[:persisted]:
            before = len(broker.rows)
            broker.persist(batch, entry)
            assert len(broker.rows) == before + len(entry), "an entry sent was dropped"
    assert broker.rows == list(range(len(row_sizes)))


def test_a_later_batch_already_persisted_sends_nothing_of_an_earlier_one() -> None:
    assert entries_to_send(3, [1] * 10, sequence_id(4, 0)) == []


def test_names_are_stable_per_query_topic_and_partition_and_differ_otherwise() -> None:
    name = query_producer_name("query-1", "persistent://public/default/out")
    assert name == query_producer_name("query-1", "persistent://public/default/out")
    assert name != query_producer_name("query-2", "persistent://public/default/out")
    assert name != query_producer_name("query-1", "persistent://public/default/other")
    assert writer_name(name, 0) != writer_name(name, 1) != name


def test_rows_route_by_key_as_the_java_client_and_round_robin_without_one() -> None:
    # "k" hashes to 107 in Java: partition 107 % 3 == 2
    assert target_partitions(["k", None, "k", None, None], 3) == [2, 1, 2, 0, 1]
    assert target_partitions(["k", None], 0) == [-1, -1]


def test_the_delivery_guarantee_is_exactly_once_unless_asked_otherwise() -> None:
    assert SinkOptions({"topic": "out"}).exactly_once
    assert not SinkOptions({"topic": "out", "deliveryGuarantee": "AT-LEAST-ONCE"}).exactly_once
    with pytest.raises(ValueError, match="'exactly-once' or 'at-least-once'"):
        SinkOptions({"topic": "out", "deliveryGuarantee": "twice"})


ROW_SCHEMA = pa.schema([
    ("value", pa.binary()), ("key", pa.string()), ("event_time", pa.timestamp("us", tz="UTC")),
    ("properties", pa.map_(pa.string(), pa.string())),
])  # fmt: skip


def written(rows: list[tuple[Any, ...]], batch_rows: int = 300) -> list[tuple[bytes, dict[str, Any]]]:
    """What a task writes for `rows` (value, key, event time, properties) arriving in this order, row by row."""
    dicts = [dict(zip(ROW_SCHEMA.names, row, strict=True)) for row in rows]
    batches = [
        pa.RecordBatch.from_pylist(dicts[i : i + batch_rows], ROW_SCHEMA) for i in range(0, len(dicts), batch_rows)
    ]
    table = _canonical(batches)
    columns = (_column(table, name) for name in ("value", "key", "event_time", "properties"))
    return [_message(*row) for row in zip(*columns, strict=True)]


def test_rows_tied_but_for_their_properties_are_each_written_once_when_a_replay_swaps_them() -> None:
    """Issue 35, fault 2: two rows equal in value, key and event time, A and B differing in their properties,
    fall at rows 999 and 1000, across the boundary of two entries. The first run dies after entry 0; the replay
    gets its input in another order (Spark does not promise one). The topic must hold A once and B once."""
    when = datetime(2024, 1, 1, tzinfo=UTC)
    others = [(b"a%04d" % row, "k", when, None) for row in range(ENTRY_ROWS - 1)]
    a, b = (b"tied", "k", when, [("who", "A")]), (b"tied", "k", when, [("who", "B")])
    first, replay = written([*others, a, b]), written([b, *reversed(others), a])

    topic: list[tuple[bytes, dict[str, Any]]] = []
    last = -1
    for run, entries_persisted in ((first, 1), (replay, None)):  # the first run dies after its first entry
        for entry in entries_to_send(7, [_message_size(*m) for m in run], last)[:entries_persisted]:
            topic += [run[row] for row in entry]
            last = sequence_id(7, entry.start)
    assert sorted(kwargs["properties"]["who"] for payload, kwargs in topic if payload == b"tied") == ["A", "B"]
    assert len(topic) == len(first)
    assert replay == first, "a batch run again numbers each row as the first run did"


def test_rows_that_write_the_same_message_may_come_in_any_order() -> None:
    """The order is total over what a row writes: rows still tied write the very same message (properties are
    written as a dict, so their order and an empty map against none do not count)."""
    when = datetime(2024, 1, 1, tzinfo=UTC)
    rows = [(b"v", "k", when, [("x", "1"), ("y", "2")]), (b"v", "k", when, [("y", "2"), ("x", "1")]),
            (b"v", None, when, None), (b"v", None, when, []), (b"v", "k", None, [("x", "0")])]  # fmt: skip
    assert written(rows) == written(rows[::-1]) == written(rows[2:] + rows[:2], batch_rows=2)


WHEN = datetime(2024, 1, 1, tzinfo=UTC)
TIED_ROWS = st.tuples(
    st.sampled_from([b"a", b"b"]), st.sampled_from([None, "k"]), st.sampled_from([None, WHEN]),
    st.sampled_from([None, [], [("x", "1")], [("x", "2")], [("x", "1"), ("y", "2")], [("y", "2"), ("x", "1")]]),
)  # fmt: skip


@given(st.lists(TIED_ROWS, min_size=1, max_size=40), st.randoms(use_true_random=False))
def test_any_input_order_writes_the_same_messages_in_the_same_order(rows: list[tuple[Any, ...]], rng: Any) -> None:
    shuffled = list(rows)
    rng.shuffle(shuffled)
    assert written(shuffled, batch_rows=7) == written(rows)
