"""The oracle's fold and verdicts (tests/oracle.py), without a broker."""

from __future__ import annotations

from tests.oracle import OracleReport, PartitionFold, judge_events, judge_final, percentile, verdict
from watermark_core.protocol import (
    MARKER_PROPERTY,
    WatermarkEvent,
    encode_idle,
    encode_set,
    encode_txn_commit,
    entry_end,
)
from watermark_core.snapshot import SnapshotKeys, encode_snapshot
from watermark_core.state import WatermarkConfig, WatermarkState

TOPIC = "persistent://public/default/t"


def marker(fold: PartitionFold, kind: str, payload: bytes, producer: str, entry: int, publish_time: int = 0,
           batch: int = -1) -> None:  # fmt: skip
    fold.read({MARKER_PROPERTY: kind}, payload, producer, (7, entry, batch), publish_time)


def data(fold: PartitionFold, entry: int) -> None:
    fold.read({}, b"payload", "p", (7, entry, -1), 0)


def event(event_time: int | None, entry: int, subscription: str = "sub", partition: int = -1) -> WatermarkEvent:
    return WatermarkEvent(TOPIC, partition, subscription, event_time, (7, entry), seq=entry)


def test_the_fold_has_no_watermark_before_the_first_w_set_then_the_minimum_over_active_producers() -> None:
    fold = PartitionFold(WatermarkConfig())
    data(fold, 0)
    marker(fold, "W_SET", encode_set(100), "a", 1)
    marker(fold, "W_SET", encode_set(50), "b", 2)  # joins below: does not pull the watermark back
    data(fold, 3)
    marker(fold, "W_SET", encode_set(300), "b", 4)
    marker(fold, "W_IDLE", encode_idle(), "a", 5)
    assert [fold.watermark_at(entry_end(7, e)) for e in range(6)] == [None, 100, 100, 100, 100, 300]
    assert fold.watermark_at((6, 99, 0)) is None
    assert fold.watermark_at((8, 0, -1)) == 300


def test_every_message_of_an_entry_counts_at_its_end_position() -> None:
    fold = PartitionFold(WatermarkConfig())
    marker(fold, "W_SET", encode_set(10), "a", 1, batch=0)
    marker(fold, "W_SET", encode_set(20), "a", 1, batch=1)
    assert fold.watermark_at((7, 1, 0)) == 10
    assert fold.watermark_at(entry_end(7, 1)) == 20


def test_malformed_markers_and_snapshots_change_nothing_and_a_message_read_again_is_ignored() -> None:
    fold = PartitionFold(WatermarkConfig())
    marker(fold, "W_SET", encode_set(100), "a", 1)
    marker(fold, "W_SET", b"\xc1 not msgpack", "a", 2)
    marker(fold, "W_BOGUS", b"\x80", "a", 3)
    claims_999 = WatermarkState(position=(7, 3, -1), clock=0, watermark=999)  # only the fold of the log counts
    signed = encode_snapshot(claims_999, keys=SnapshotKeys.random(), topic="t")
    marker(fold, "W_SNAPSHOT", signed, "__wm_generator-x", 4)
    marker(fold, "W_SET", encode_set(50), "a", 1)  # a redelivery of entry 1: already read
    assert fold.watermark_at(entry_end(7, 4)) == 100
    assert fold.markers == 1
    assert sum(fold.malformed.values()) == 2


def test_the_fold_uses_the_generators_configuration() -> None:
    fold = PartitionFold(WatermarkConfig(producer_timeout_ms=1_000, txn_timeout_ms=1_000))
    marker(fold, "W_SET", encode_set(100), "dies", 1, publish_time=0)
    marker(fold, "W_SET", encode_set(500), "lives", 2, publish_time=10)
    marker(fold, "W_SET", encode_set(600), "lives", 3, publish_time=2_000)  # "dies" is silent for 2 s
    assert fold.watermark_at(entry_end(7, 2)) == 100
    assert fold.watermark_at(entry_end(7, 3)) == 600
    marker(fold, "W_SET", encode_set(900, txn="t"), "lives", 4, publish_time=2_000)
    marker(fold, "W_TXN_COMMIT", encode_txn_commit("t"), "lives", 5, publish_time=4_000)  # timed out first
    assert fold.watermark_at(entry_end(7, 5)) == 600


def test_verdicts_including_no_watermark() -> None:
    assert verdict(100, 100) == verdict(None, None) == "exact"
    assert verdict(101, 100) == verdict(5, None) == "premature"
    assert verdict(99, 100) == verdict(None, 100) == "late"


def test_every_event_is_judged_at_the_position_it_names_and_late_is_measured() -> None:
    fold = PartitionFold(WatermarkConfig())
    marker(fold, "W_SET", encode_set(100), "a", 1)
    marker(fold, "W_SET", encode_set(250), "a", 3)
    report = OracleReport()
    events = [event(None, 0), event(100, 1), event(100, 2), event(250, 2), event(100, 3), event(None, 3)]
    judge_events({-1: fold}, events, report)
    assert (report.checked, report.exact) == (6, 3)
    assert [(f.position, f.published, f.expected) for f in report.premature] == [((7, 2), 250, 100)]
    assert [(f.published, f.expected) for f in report.late] == [(100, 250), (None, 250)]
    assert report.late_ms() == [150]
    summary = report.summary()
    assert (summary["oracle_premature"], summary["oracle_late"], summary["oracle_late_max_ms"]) == (1, 2, 150)
    assert report.problems() == ["[premature] sub at (7, 2): published 250, the log says 100 (seq 2)"]


def test_stuck_is_a_last_published_watermark_that_is_not_the_fold_at_the_final_position() -> None:
    fold = PartitionFold(WatermarkConfig())
    marker(fold, "W_SET", encode_set(100), "a", 1)
    marker(fold, "W_SET", encode_set(250), "a", 3)
    folds = {-1: fold}
    latest = {(-1, "done"): event(250, 3, "done"), (-1, "behind"): event(100, 1, "behind"),
              (-1, "moved-on"): event(100, 1, "moved-on")}  # fmt: skip
    finals = {(-1, "done"): (7, 9), (-1, "behind"): (7, 3), (-1, "moved-on"): (7, 2), (-1, "never"): (7, 1),
              (-1, "before-any"): (7, 0)}  # fmt: skip
    stuck = judge_final(folds, finals, latest)
    assert [(f.subscription, f.published, f.expected) for f in stuck] == [("behind", 100, 250), ("never", None, 100)]


def test_percentiles_are_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([5], 99) == 5
    assert percentile(range(1, 101), 50) == 50
    assert percentile(range(1, 101), 99) == 99


def test_the_fault_suite_totals_the_reports_of_a_run() -> None:
    from tests.chaos.oracle import describe, totals

    fold = PartitionFold(WatermarkConfig())
    marker(fold, "W_SET", encode_set(100), "a", 1)
    marker(fold, "W_SET", encode_set(400), "a", 3)
    first, second = OracleReport(), OracleReport()
    judge_events({-1: fold}, [event(100, 1), event(100, 3)], first)
    judge_events({-1: fold}, [event(200, 3), event(None, 1)], second)
    assert totals([first, None, second]) == {
        "oracle_scenarios": 2, "oracle_checked": 4, "oracle_premature": 0, "oracle_late": 3,
        "oracle_late_p50_ms": 200, "oracle_late_p99_ms": 300, "oracle_late_max_ms": 300, "oracle_stuck": 0,
    }  # fmt: skip
    assert describe(first) == "oracle: 2 checked, 0 premature, 1 late (max 300 ms), 0 stuck"
    assert describe(None) == "oracle off"


def test_the_chaos_oracle_asks_again_only_while_the_topics_broker_is_away_or_not_its_owner_yet() -> None:
    from pulsar_access.admin import AdminError, BrokerUnreachable, TopicNotFound
    from pulsar_access.readers import NotAnswered
    from tests.chaos.oracle import _transient

    assert _transient(BrokerUnreachable("refused"))
    assert _transient(NotAnswered("reset"))
    assert _transient(AdminError("Can't find owner for topic", status=412))
    assert not _transient(TopicNotFound("gone", status=404))
    assert not _transient(AdminError("server error", status=500))
