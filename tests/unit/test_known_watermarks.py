"""What the Spark source knows of the broker watermark at positions (spark_sink/watermarks.py), pure."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_sink.watermarks import KnownWatermarks

pytestmark = pytest.mark.unit

A = ("persistent://public/default/t", 0)
B = ("persistent://public/default/t", 1)
C = ("persistent://public/default/u", -1)


def test_the_watermark_at_a_position_is_the_latest_known_at_or_before_it() -> None:
    known = KnownWatermarks()
    known.add(A, (5, 10), 1_000)
    known.add(A, (5, 20), 2_000)
    known.add(A, (6, 0), 3_000)
    assert known.at(A, None) is None
    assert known.at(A, (5, 9)) is None
    assert known.at(A, (5, 10)) == 1_000
    assert known.at(A, (5, 19)) == 1_000
    assert known.at(A, (5, 99)) == 2_000
    assert known.at(A, (7, 0)) == 3_000
    assert known.at(B, (7, 0)) is None


def test_a_batch_end_takes_the_minimum_over_every_partition_of_every_topic() -> None:
    known = KnownWatermarks()
    known.add(A, (5, 10), 1_000)
    known.add(B, (8, 3), 4_000)
    ends = {A: (5, 10), B: (8, 3), C: (2, 0)}
    assert known.watermark(ends) is None  # topic u has none yet: no watermark
    known.add(C, (1, 0), 500)
    assert known.watermark(ends) == 500
    known.add(C, (2, 0), 9_000)
    assert known.watermark(ends) == 1_000
    assert known.watermark({A: (5, 10), B: (8, 2)}) is None  # partition 1's value comes after that end
    assert known.watermark({}) is None


def test_an_empty_partition_takes_no_part_and_one_with_messages_but_no_watermark_holds_it_back_by_name() -> None:
    """Issue #26 (4): a topic matched by a pattern that is empty, or written only by plain producers, held the
    query's watermark back for good, silently."""
    known = KnownWatermarks()
    known.add(A, (5, 10), 1_000)
    known.add(B, (8, 3), 4_000)
    assert known.watermark({A: (5, 10), B: (8, 3), C: None}) == 1_000  # u is empty: nothing of it can be late
    assert known.held_back_by({A: (5, 10), B: (8, 3), C: None}) == []
    assert known.watermark({A: (5, 10), B: (8, 3), C: (2, 0)}) is None  # u has messages, no watermark: held
    assert known.held_back_by({A: (5, 10), B: (8, 3), C: (2, 0)}) == [C]
    assert known.held_back_by({A: (5, 9), B: (8, 3), C: (2, 0)}) == [A, C]
    assert known.watermark({C: None}) is None and known.held_back_by({C: None}) == []


def test_lower_bounds_and_repeats_change_nothing() -> None:
    known = KnownWatermarks()
    known.add(A, (5, 10), 2_000)
    known.add(A, (5, 12), 1_500)  # a table folded short of its position: below what is known before
    known.add(A, (5, 10), 2_000)  # the same head event from a new owner of the partition
    assert known.at(A, (5, 12)) == 2_000
    known.add(A, (5, 10), 2_500)  # a higher value for the same entry (a later marker of a batched entry)
    assert known.at(A, (5, 10)) == 2_500
    known.add(A, (5, 8), 3_000)  # an earlier position with a higher value makes the later ones redundant
    assert known.at(A, (5, 8)) == 3_000 and known.at(A, (5, 30)) == 3_000


def test_what_no_batch_can_need_is_forgotten_and_the_history_is_bounded() -> None:
    known = KnownWatermarks(limit=3)
    for entry in range(10):
        known.add(A, (1, entry), 100 * entry)
    assert known.at(A, (1, 6)) is None  # only the latest three are kept
    assert known.at(A, (1, 7)) == 700 and known.at(A, (1, 9)) == 900
    known = KnownWatermarks()
    for entry in range(10):
        known.add(A, (1, entry), 100 * entry)
    known.forget_before({A: (1, 5), B: None})
    assert known.at(A, (1, 5)) == 500 and known.at(A, (1, 4)) is None
    assert known.at(A, (1, 9)) == 900


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 1_000)), max_size=40), st.randoms())
def test_any_order_of_facts_gives_the_highest_lower_bound(facts: list[tuple[int, int]], rng: random.Random) -> None:
    known = KnownWatermarks()
    shuffled = list(facts)
    rng.shuffle(shuffled)
    for entry, value in shuffled:
        known.add(A, (1, entry), value)
    for probe in range(52):
        below = [value for entry, value in facts if entry <= probe]
        assert known.at(A, (1, probe)) == (max(below) if below else None)
