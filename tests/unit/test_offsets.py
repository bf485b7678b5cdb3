"""The Spark source's offset and entry arithmetic (spark_sink/offsets.py): one JSON form that still reads
the one-topic checkpoints, counting and cutting entries across ledgers, sharing a read limit."""

from __future__ import annotations

import json
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_sink.offsets import NO_WATERMARK, Ledgers, SourceOffset, group_pieces, share_limit

pytestmark = pytest.mark.unit

T = "persistent://public/default/t"
U = "persistent://public/default/u"
ENTRIES = st.none() | st.tuples(st.integers(0, 10**6), st.integers(-1, 10**6))
KEYS = st.tuples(st.sampled_from([T, U, "persistent://tenant/ns/x"]), st.integers(-1, 64))
OFFSETS = st.builds(
    SourceOffset,
    st.dictionaries(KEYS, ENTRIES, max_size=8),
    st.integers(-1, 2**62),
    tasks=st.none() | st.integers(1, 64),
)


@given(OFFSETS)
def test_json_round_trips_through_text(offset: SourceOffset) -> None:
    assert SourceOffset.from_json(json.loads(json.dumps(offset.to_json()))) == offset


def test_partitions_are_keyed_by_topic() -> None:
    offset = SourceOffset({(T, 0): (12, 7), (T, 1): None, (U, -1): (3, 4)}, 1_700_000_000_000)
    assert offset.to_json() == {
        "topics": {T: {"0": [12, 7], "1": None}, U: {"-1": [3, 4]}},
        "wm": 1_700_000_000_000,
    }


def test_the_partitions_holding_the_watermark_back_are_named_in_the_offset_progress_shows() -> None:
    offset = SourceOffset({(T, 0): (12, 7), (U, -1): (3, 4)}, NO_WATERMARK, ((U, -1), (T, 0)))
    data = offset.to_json()
    assert data["heldBackBy"] == {T: [0], U: [-1]}
    assert sorted(SourceOffset.from_json(json.loads(json.dumps(data))).held_back_by) == [(T, 0), (U, -1)]
    assert "heldBackBy" not in SourceOffset({(T, 0): (12, 7)}, 5).to_json()
    assert offset == SourceOffset({(T, 0): (12, 7), (U, -1): (3, 4)}, NO_WATERMARK)  # not part of the position


def test_checkpoints_in_the_one_topic_layout_still_restore() -> None:
    written_before = {"partitions": {"0": [12, 7], "1": None}, "wm": 1_700_000_000_000}
    offset = SourceOffset.from_json(written_before, legacy_topic=T)
    assert offset == SourceOffset({(T, 0): (12, 7), (T, 1): None}, 1_700_000_000_000)
    assert SourceOffset.from_json({"wm": 5}) == SourceOffset({}, 5)  # the former watermarks-only stream's offset
    assert SourceOffset.from_json(None) == SourceOffset({}, NO_WATERMARK)
    with pytest.raises(ValueError, match="option 'topic'"):
        SourceOffset.from_json(written_before)


def test_ranges_are_the_partitions_with_entries_after_the_start() -> None:
    start = SourceOffset({(T, 0): (3, 5), (T, 1): (3, 9), (T, 2): None})
    end = SourceOffset({(T, 0): (3, 8), (T, 1): (3, 9), (T, 2): (4, 0), (T, 3): None, (U, 0): (1, 1)})
    assert end.ranges_after(start) == [((T, 0), (3, 5), (3, 8)), ((T, 2), None, (4, 0)), ((U, 0), None, (1, 1))]


# -- entries across ledgers -------------------------------------------------------------------------------

LEDGERS = Ledgers([(3, 10), (7, 5), (9, 0), (12, 20)])  # ledger 9 is empty; 4-6, 8, 10, 11 are not this topic's


def test_entries_are_counted_across_ledgers() -> None:
    assert LEDGERS.total == 35
    assert LEDGERS.count_to(None) == 0
    assert LEDGERS.count_to((3, 0)) == 1
    assert LEDGERS.count_to((3, -1)) == 0
    assert LEDGERS.count_to((3, 9)) == 10
    assert LEDGERS.count_to((5, 2)) == 10  # a ledger not there (deleted, or another topic's) counts as the next start
    assert LEDGERS.count_to((7, 4)) == 15
    assert LEDGERS.count_to((12, 19)) == 35
    assert LEDGERS.count_to((20, 0)) == 35
    assert LEDGERS.between((3, 8), (12, 1)) == 1 + 5 + 2
    assert LEDGERS.between((12, 1), (3, 8)) == 0


def test_positions_are_found_by_count() -> None:
    assert LEDGERS.at(0) is None
    assert LEDGERS.at(1) == (3, 0)
    assert LEDGERS.at(10) == (3, 9)
    assert LEDGERS.at(11) == (7, 0)
    assert LEDGERS.at(16) == (12, 0)
    assert LEDGERS.at(99) == (12, 19)
    assert LEDGERS.advance((3, 8), 4, (12, 19)) == (7, 2)
    assert LEDGERS.advance(None, 100, (12, 3)) == (12, 3)  # never past the end asked for
    for count in range(1, 36):
        position = LEDGERS.at(count)
        assert LEDGERS.count_to(position) == count


def test_the_open_ledger_counts_up_to_its_last_confirmed_entry() -> None:
    stats = {"ledgers": [{"ledgerId": 3, "entries": 10}, {"ledgerId": 7, "entries": 0}], "lastConfirmedEntry": "7:4"}
    ledgers = Ledgers.from_stats(stats)
    assert ledgers.total == 15 and ledgers.first == 3
    assert Ledgers.from_stats({"ledgers": [], "lastConfirmedEntry": "-1:-1"}).first is None


@given(st.integers(0, 34), st.integers(1, 35), st.integers(1, 8))
def test_a_range_is_split_into_consecutive_pieces_that_cover_it(first: int, last: int, pieces: int) -> None:
    after, upto = LEDGERS.at(first), LEDGERS.at(max(last, first + 1))
    assert upto is not None
    ranges = LEDGERS.split(after, upto, pieces)
    assert 1 <= len(ranges) <= pieces
    assert ranges[0][0] == after and ranges[-1][1] == upto
    for (_, end), (begin, _) in pairwise(ranges):
        assert end == begin
    assert sum(LEDGERS.between(a, b) for a, b in ranges) == LEDGERS.between(after, upto)
    sizes = [LEDGERS.between(a, b) for a, b in ranges]
    assert max(sizes) - min(sizes) <= 1


def test_a_limit_is_shared_in_proportion_to_the_backlog_across_ledgers() -> None:
    ledgers = {(T, 0): LEDGERS, (T, 1): Ledgers([(4, 1000)]), (T, 2): Ledgers([(5, 3)])}
    starts = {(T, 0): (3, 4), (T, 1): (4, 99), (T, 2): (5, 2)}
    ends = {(T, 0): (12, 19), (T, 1): (4, 999), (T, 2): (5, 2)}
    # backlogs 30 + 900 + 0: 93 entries go 3 : 90
    assert share_limit(starts, ends, ledgers, 93) == {(T, 0): (3, 7), (T, 1): (4, 189), (T, 2): (5, 2)}
    # across a ledger boundary: 5 entries left in ledger 3, then ledger 7
    assert share_limit(starts, ends, ledgers, 310) == {(T, 0): (7, 4), (T, 1): (4, 399), (T, 2): (5, 2)}
    assert share_limit(starts, ends, ledgers, 10_000) == ends  # under the limit: everything
    tiny = share_limit(starts, ends, ledgers, 1)  # every partition with a backlog moves by at least one entry
    assert tiny[(T, 0)] == (3, 5) and tiny[(T, 1)] == (4, 100)


@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=40), st.integers(1, 8), st.integers(1, 3000))
def test_pieces_are_grouped_into_tasks_in_order_each_piece_once(sizes: list[int], tasks: int, least: int) -> None:
    groups = group_pieces(sizes, tasks, least)
    assert [index for group in groups for index in group] == list(range(len(sizes)))
    assert 1 <= len(groups) <= max(1, min(tasks, sum(sizes) // least))


def test_a_small_batch_is_one_task_and_a_large_one_is_shared_by_the_cores() -> None:
    assert group_pieces([5, 5], tasks=2, min_entries=2000) == [[0, 1]]  # one Python worker round trip
    assert group_pieces([50_000, 50_000], tasks=2, min_entries=2000) == [[0], [1]]
    halves = group_pieces([100] * 1000, tasks=2, min_entries=2000)  # many partitions, few messages each
    assert [len(group) for group in halves] == [500, 500]


def test_the_task_count_a_batch_was_planned_for_is_kept_in_its_offset() -> None:
    offset = SourceOffset({(T, 0): (12, 7)}, 5, tasks=4)
    assert offset.to_json()["tasks"] == 4
    assert SourceOffset.from_json(json.loads(json.dumps(offset.to_json()))) == offset
    assert offset.with_watermark(9).tasks == 4
    older = {"topics": {T: {"0": [12, 7]}}, "wm": 5}  # written before the count was recorded
    assert SourceOffset.from_json(older).tasks is None and "tasks" not in SourceOffset.from_json(older).to_json()
