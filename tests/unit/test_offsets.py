"""The Spark source's offset (spark_sink/offsets.py): one JSON form, compatible with existing checkpoints."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from spark_sink.offsets import NO_WATERMARK, SourceOffset

ENTRIES = st.none() | st.tuples(st.integers(0, 10**6), st.integers(-1, 10**6))
OFFSETS = st.builds(SourceOffset, st.dictionaries(st.integers(-1, 64), ENTRIES, max_size=8), st.integers(-1, 2**62))


@given(OFFSETS)
def test_json_round_trips_through_text(offset: SourceOffset) -> None:
    assert SourceOffset.from_json(json.loads(json.dumps(offset.to_json()))) == offset


def test_the_checkpoint_layout_is_the_one_earlier_versions_wrote() -> None:
    written_before = {"partitions": {"0": [12, 7], "1": None}, "wm": 1_700_000_000_000}
    offset = SourceOffset.from_json(written_before)
    assert offset == SourceOffset({0: (12, 7), 1: None}, 1_700_000_000_000)
    assert offset.to_json() == written_before
    assert SourceOffset.from_json({"wm": 5}) == SourceOffset({}, 5)  # a watermarks-only stream's offset
    assert SourceOffset.from_json(None) == SourceOffset({}, NO_WATERMARK)


def test_ranges_are_the_partitions_with_entries_after_the_start() -> None:
    start = SourceOffset({0: (3, 5), 1: (3, 9), 2: None})
    end = SourceOffset({0: (3, 8), 1: (3, 9), 2: (4, 0), 3: None})
    assert end.ranges_after(start) == [(0, (3, 5), (3, 8)), (2, None, (4, 0))]


def test_a_cap_shares_the_entries_over_partitions_within_a_ledger() -> None:
    start = SourceOffset({0: (3, 0), 1: (3, 0), 2: (3, 0)})
    end = SourceOffset({0: (3, 100), 1: (3, 2), 2: (5, 1)}, watermark=9)
    assert end.capped(start, 20) == SourceOffset({0: (3, 6), 1: (3, 2), 2: (5, 1)}, watermark=9)  # 20 // 3 each
