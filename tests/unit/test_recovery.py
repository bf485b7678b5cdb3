"""The checks of a state rebuilt from the log against what the generator read itself (pure)."""

from __future__ import annotations

import pytest

from broker_ext.engine.recovery import BEFORE_EVERYTHING, history_deleted, rebuilt_is_consistent
from watermark_core.protocol import Marker, MarkerKind, position_of
from watermark_core.state import WatermarkState, apply_all

pytestmark = pytest.mark.unit


def markers() -> list[Marker]:
    """Seed 7007's shape: p3 joins, goes idle and rejoins early; p0 keeps asserting higher later."""
    sequence = [
        ("p0", MarkerKind.W_SET, 1_000),
        ("p3", MarkerKind.W_SET, 900),
        ("p3", MarkerKind.W_IDLE, None),
        ("p3", MarkerKind.W_SET, 1_000),
        ("p0", MarkerKind.W_SET, 2_000),
        ("p0", MarkerKind.W_SET, 3_000),
    ]
    return [
        Marker(kind, producer, position_of(1, entry), 10 * entry, event_time=event_time)
        for entry, (producer, kind, event_time) in enumerate(sequence)
    ]


def test_a_correct_rebuild_at_any_earlier_position_is_consistent_with_the_head() -> None:
    log = markers()
    head = apply_all(WatermarkState.initial(), log)
    for cut in range(len(log) + 1):
        assert rebuilt_is_consistent(apply_all(WatermarkState.initial(), log[:cut]), head)


def test_a_rebuild_that_missed_a_producers_early_markers_is_refused() -> None:
    log = markers()
    head = apply_all(WatermarkState.initial(), log)  # our own reading: p3 active at 1000, p0 at 3000
    missing_p3 = [m for m in log[:5] if m.producer != "p3"]  # a rebuild at entry 4 that missed p3's markers
    rebuilt = apply_all(WatermarkState.initial(), missing_p3)
    assert head.watermark == 1_000
    assert rebuilt.watermark == 2_000  # premature for p3's messages between 1000 and 2000
    assert not rebuilt_is_consistent(rebuilt, head)


def test_a_rebuild_with_a_watermark_where_the_head_has_none_is_refused() -> None:
    rebuilt = apply_all(WatermarkState.initial(), markers()[:1])
    assert not rebuilt_is_consistent(rebuilt, WatermarkState.initial())
    assert rebuilt_is_consistent(WatermarkState.initial(), WatermarkState.initial())


def test_a_fold_from_the_start_that_begins_after_what_we_read_earlier_has_lost_history() -> None:
    earliest_read = position_of(148, 0)
    assert history_deleted(BEFORE_EVERYTHING, position_of(169, 0), earliest_read)  # ledger 148 was deleted
    assert not history_deleted(BEFORE_EVERYTHING, position_of(148, 0), earliest_read)
    assert not history_deleted(BEFORE_EVERYTHING, position_of(140, 3), earliest_read)
    assert not history_deleted(position_of(169, 10), position_of(169, 11), earliest_read)  # not from the start


def test_a_deleted_ledgers_snapshots_known_from_an_earlier_ownership_give_way_to_the_chain() -> None:
    """Found in the suite with ownership by claim: an engine that followed ledger 521, lost the topic and took it
    over again after Pulsar deleted 521 still knew 521's snapshots; a rebuild at (632, 0) chose one of them (the
    nearest before the target), was refused (ledger deleted) and chose it again, forever. Once a rebuild from a
    ledger is refused as deleted, no snapshot stating a position in it or before is used again: the chain is
    walked back from the earliest snapshot left, to the start of ledger 632."""
    from broker_ext.engine.recovery import ReadSnapshotAt, SnapshotCatalog
    from watermark_core.snapshot import Snapshot

    catalog = SnapshotCatalog()
    old = Snapshot(WatermarkState(position=(521, 4, -1), watermark=1_000), message=(521, 5, -1), previous=None)
    latest = Snapshot(WatermarkState(position=(632, 6, -1), watermark=1_000), message=(632, 7, -1),
                      previous=(632, 2, -1))  # fmt: skip
    catalog.add(old)
    catalog.add(latest)
    assert catalog.nearest((632, 0, -1)) == old
    catalog.forget_walked_through(521)  # the rebuild from `old` was refused: ledger 521 is gone
    assert catalog.nearest((632, 0, -1)) == ReadSnapshotAt((632, 2, -1))
