"""The exactly-once sink's pure parts: sequence ids, what a task run again still sends, stable names, routing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("pyspark")

from spark_sink.sink import (
    ROW_BITS,
    SinkOptions,
    first_unsent,
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


@given(batches, st.integers(min_value=0, max_value=10_000), st.data())
def test_a_task_run_again_sends_exactly_the_rows_the_broker_does_not_have(
    batch: int, count: int, data: st.DataObject
) -> None:
    """Whatever the broker persisted of this producer's rows (none, a prefix, all, or only earlier batches),
    the rows sent again are exactly the rest: together each row once."""
    persisted = data.draw(st.integers(min_value=0, max_value=count))  # a prefix: Pulsar persists in order
    if persisted:
        last = sequence_id(batch, persisted - 1)
    elif batch:
        last = data.draw(st.one_of(st.just(-1), st.builds(sequence_id, st.integers(0, batch - 1), rows)))
    else:
        last = -1
    start = first_unsent(batch, count, last)
    assert start == persisted
    assert all(sequence_id(batch, row) > last for row in range(start, count))


def test_a_later_batch_already_persisted_sends_nothing_of_an_earlier_one() -> None:
    assert first_unsent(3, 10, sequence_id(4, 0)) == 10


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
