"""The watermark state machine, by example: one test or more for every policy and branch."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import msgpack
import pytest

from watermark_core.protocol import MalformedMarker, Marker, MarkerKind, decode_marker, position_of
from watermark_core.snapshot import SnapshotKeys, decode_snapshot, encode_snapshot, state_from_dict, state_to_dict
from watermark_core.state import (
    PendingMarker,
    ProducerRecord,
    WatermarkConfig,
    WatermarkState,
    apply_all,
    is_broken_assertion,
)

pytestmark = pytest.mark.unit

CONFIG = WatermarkConfig(producer_timeout_ms=10_000, txn_timeout_ms=5_000)


class Log:
    """Appends markers at increasing positions and keeps the state after the last one."""

    def __init__(self, config: WatermarkConfig = CONFIG) -> None:
        self.state = WatermarkState.initial(config)
        self.entry = 0

    def append(self, kind: MarkerKind, producer: str, at: int, **fields: Any) -> WatermarkState:
        self.entry += 1
        self.state = self.state.apply(Marker(kind, producer, position_of(1, self.entry), at, **fields))
        return self.state

    def set(self, producer: str, event_time: int, at: int, txn: str | None = None) -> int | None:
        return self.append(MarkerKind.W_SET, producer, at, event_time=event_time, txn=txn).watermark

    def idle(self, producer: str, at: int, txn: str | None = None) -> int | None:
        return self.append(MarkerKind.W_IDLE, producer, at, txn=txn).watermark

    def commit(self, producer: str, txn: str, at: int) -> int | None:
        return self.append(MarkerKind.W_TXN_COMMIT, producer, at, txn=txn).watermark

    def abort(self, producer: str, txn: str, at: int) -> int | None:
        return self.append(MarkerKind.W_TXN_ABORT, producer, at, txn=txn).watermark

    def snapshot(self, at: int) -> WatermarkState:
        return self.append(MarkerKind.W_SNAPSHOT, "__wm_generator", at, body={"state": {}})


# -- assertions ------------------------------------------------------------------------------------------


def test_initial_state_has_no_watermark() -> None:
    state = WatermarkState.initial()
    assert state.watermark is None
    assert state.position is None
    assert state.clock is None
    assert state.config == WatermarkConfig()
    assert state.active_producers() == {}
    assert state.idle_producers() == []
    assert state.expired_producers() == []
    assert state.pending() == {}
    assert WatermarkState() == state


def test_one_producer_sets_the_watermark() -> None:
    log = Log()
    assert log.set("p1", 100, at=1_000) == 100
    assert log.state.position == (1, 1, -1)
    assert log.state.clock == 1_000
    assert log.state.active_producers() == {"p1": 100}


def test_the_watermark_is_the_minimum_over_active_producers() -> None:
    log = Log()
    log.set("p1", 100, at=1_000)
    assert log.set("p2", 300, at=1_001) == 100
    assert log.set("p1", 200, at=1_002) == 200
    assert log.set("p1", 400, at=1_003) == 300
    assert log.state.active_producers() == {"p1": 400, "p2": 300}


def test_the_watermark_never_goes_back_when_a_producer_lowers_its_assertion() -> None:
    log = Log()
    log.set("p1", 100, at=1_000)
    assert log.set("p1", 50, at=1_001) == 100
    assert log.state.active_producers() == {"p1": 50}
    assert log.set("p1", 120, at=1_002) == 120


def test_a_producer_that_never_sent_w_set_does_not_take_part() -> None:
    log = Log()
    log.set("p1", 100, at=1_000)
    log.idle("p2", at=1_001)
    log.abort("p3", "t", at=1_002)
    assert log.set("p1", 200, at=1_003) == 200
    assert log.state.producers["p3"] == ProducerRecord(None, False, 1_002)
    assert log.state.active_producers() == {"p1": 200}


def test_idle_alone_makes_no_watermark() -> None:
    log = Log()
    assert log.idle("p1", at=1_000) is None
    assert log.state.idle_producers() == ["p1"]


# -- idle ------------------------------------------------------------------------------------------------


def test_an_idle_producer_stops_holding_the_watermark_back() -> None:
    log = Log()
    log.set("p1", 100, at=1_000)
    log.set("p2", 500, at=1_001)
    assert log.idle("p1", at=1_002) == 500
    assert log.state.idle_producers() == ["p1"]
    assert log.state.active_producers() == {"p2": 500}
    assert log.state.producers["p1"].event_time == 100  # its promise still stands


def test_with_no_active_producer_the_last_watermark_holds() -> None:
    log = Log()
    log.set("p1", 100, at=1_000)
    assert log.idle("p1", at=1_001) == 100
    assert log.state.active_producers() == {}


def test_a_w_set_after_idle_revives_the_producer() -> None:
    log = Log()
    log.set("p1", 100, at=1_000)
    log.set("p2", 500, at=1_001)
    log.idle("p1", at=1_002)
    assert log.set("p1", 700, at=1_003) == 500
    assert log.state.idle_producers() == []
    assert log.state.active_producers() == {"p1": 700, "p2": 500}


def test_other_markers_do_not_end_idling() -> None:
    log = Log()
    log.set("p1", 100, at=1_000)
    log.idle("p1", at=1_001)
    log.abort("p1", "t", at=1_002)
    log.set("p1", 200, at=1_003, txn="t2")
    assert log.state.idle_producers() == ["p1"]


# -- producer timeout --------------------------------------------------------------------------------------


def test_a_silent_producer_expires_after_the_timeout_on_the_log_clock() -> None:
    log = Log()
    log.set("p1", 100, at=1_000)
    log.set("p2", 500, at=1_000)
    assert log.set("p2", 600, at=11_000) == 100  # exactly the timeout: still active
    assert log.state.expired_producers() == []
    assert log.set("p2", 700, at=11_001) == 700  # one ms more: p1 no longer holds it back
    assert log.state.expired_producers() == ["p1"]
    assert log.state.active_producers() == {"p2": 700}


def test_an_expired_producer_is_revived_by_any_marker_without_pulling_the_watermark_back() -> None:
    log = Log()
    log.set("p1", 100, at=1_000)
    log.set("p2", 500, at=20_000)
    assert log.state.watermark == 500
    assert log.abort("p1", "unknown", at=20_001) == 500
    assert log.state.expired_producers() == []
    assert log.state.active_producers() == {"p1": 100, "p2": 500}
    assert log.set("p2", 900, at=20_002) == 500  # p1 holds it again at 500, it does not drop to 100
    assert log.set("p1", 800, at=20_003) == 800


def test_an_expired_idle_producer_is_counted_as_expired_not_idle() -> None:
    log = Log()
    log.idle("p1", at=1_000)
    log.set("p2", 5, at=12_000)
    assert log.state.idle_producers() == []
    assert log.state.expired_producers() == ["p1"]


def test_snapshots_do_not_advance_the_clock() -> None:
    log = Log()
    log.set("p1", 100, at=1_000)
    state = log.snapshot(at=99_000)
    assert state.clock == 1_000
    assert state.position == (1, 2, -1)
    assert state.active_producers() == {"p1": 100}


def test_the_clock_never_goes_back_and_a_lagging_producer_is_still_renewed() -> None:
    log = Log()
    log.set("p1", 100, at=50_000)
    log.set("p2", 300, at=1_000)  # p2's clock lags by far more than the timeout
    assert log.state.clock == 50_000
    assert log.state.producers["p2"].last_seen == 50_000
    assert log.state.active_producers() == {"p1": 100, "p2": 300}


# -- forgetting ------------------------------------------------------------------------------------------

FORGETFUL = WatermarkConfig(producer_timeout_ms=10_000, txn_timeout_ms=5_000, producer_retention_ms=60_000)


def test_an_idle_producer_is_forgotten_once_idle_for_longer_than_the_retention() -> None:
    log = Log(FORGETFUL)
    log.set("p1", 100, at=1_000)
    log.idle("p1", at=2_000)
    log.set("p2", 500, at=62_000)  # idle for exactly the retention: remembered
    assert "p1" in log.state.producers
    log.set("p2", 600, at=62_001)
    assert "p1" not in log.state.producers
    assert log.state.watermark == 600


def test_a_timed_out_producer_is_forgotten_a_retention_after_its_timeout() -> None:
    log = Log(FORGETFUL)
    log.set("p1", 100, at=1_000)
    log.set("p2", 500, at=71_000)  # timed out at 11 000, out for exactly the retention since
    assert log.state.expired_producers() == ["p1"]
    log.set("p2", 600, at=71_001)
    assert list(log.state.producers) == ["p2"]


def test_a_producer_with_an_open_transaction_is_not_forgotten() -> None:
    log = Log(WatermarkConfig(producer_timeout_ms=10_000, txn_timeout_ms=100_000, producer_retention_ms=1_000))
    log.idle("p1", at=1_000)
    log.set("p1", 50, at=1_000, txn="t")
    log.set("p2", 500, at=50_000)
    assert "p1" in log.state.producers
    assert log.commit("p1", "t", at=50_001) == 500  # a late joiner at its commit
    assert log.state.active_producers() == {"p1": 50, "p2": 500}


def test_a_forgotten_producer_that_comes_back_is_a_late_joiner() -> None:
    log = Log(FORGETFUL)
    log.set("p1", 100, at=1_000)
    log.set("p2", 500, at=100_000)
    assert "p1" not in log.state.producers
    assert log.abort("p1", "unknown", at=100_001) == 500  # remembered, this would revive its assertion of 100
    assert log.state.active_producers() == {"p2": 500}
    assert log.set("p1", 200, at=100_002) == 500  # below the watermark: does not pull it back
    assert log.set("p2", 900, at=100_003) == 500
    assert log.set("p1", 700, at=100_004) == 700


def test_forgetting_keeps_the_snapshot_small_whatever_producers_came_and_went() -> None:
    log = Log(FORGETFUL)
    for i in range(2_000):
        log.set(f"pod-{i}", 1_000 + i, at=1_000 + i)
        log.idle(f"pod-{i}", at=1_000 + i)
    assert len(log.state.producers) == 2_000
    log.set("steady", 5_000, at=100_000)
    assert list(log.state.producers) == ["steady"]
    keys = SnapshotKeys.from_text("the-generators-key-in-test-state")
    assert len(encode_snapshot(log.state, keys=keys, topic="persistent://public/default/t")) < 1_000


# -- late joiners ----------------------------------------------------------------------------------------


def test_a_late_joiner_below_the_watermark_does_not_pull_it_back() -> None:
    log = Log()
    log.set("p1", 1_000, at=1_000)
    assert log.set("p3", 10, at=1_001) == 1_000
    assert log.state.active_producers() == {"p1": 1_000, "p3": 10}
    assert log.set("p1", 2_000, at=1_002) == 1_000  # p3 now holds it at the old value
    assert log.set("p3", 1_500, at=1_003) == 1_500


def test_is_broken_assertion_compares_with_the_producers_own_latest_w_set() -> None:
    log = Log()
    log.set("p1", 100, at=1_000)
    log.set("p1", 80, at=1_001)
    log.idle("p2", at=1_002)
    before = log.state
    assert is_broken_assertion(log.state, "p1", 79)
    assert not is_broken_assertion(log.state, "p1", 80)
    assert not is_broken_assertion(log.state, "p1", 99)  # below the watermark (late) but not broken
    assert not is_broken_assertion(log.state, "p2", 0)  # never sent W_SET
    assert not is_broken_assertion(log.state, "nobody", 0)
    assert log.state == before


# -- transactions ----------------------------------------------------------------------------------------


def test_a_transactional_w_set_waits_for_its_commit_and_takes_effect_there() -> None:
    log = Log()
    log.set("p1", 100, at=1_000)
    assert log.set("p1", 200, at=1_001, txn="t") == 100
    assert log.state.pending() == {("p1", "t"): PendingMarker(MarkerKind.W_SET, 200, 1_001)}
    assert log.state.active_producers() == {"p1": 100}
    assert log.commit("p1", "t", at=1_002) == 200
    assert log.state.pending() == {}
    assert log.state.position == (1, 3, -1)


def test_the_latest_marker_inside_a_transaction_wins_and_keeps_its_start() -> None:
    log = Log()
    log.set("p1", 100, at=1_000)
    log.set("p1", 300, at=1_001, txn="t")
    log.set("p1", 250, at=1_002, txn="t")
    assert log.state.pending() == {("p1", "t"): PendingMarker(MarkerKind.W_SET, 250, 1_001)}
    assert log.commit("p1", "t", at=1_003) == 250


def test_a_committed_transactional_idle_idles_the_producer() -> None:
    log = Log()
    log.set("p1", 100, at=1_000)
    log.set("p2", 500, at=1_000)
    log.idle("p1", at=1_001, txn="t")
    assert log.state.idle_producers() == []
    assert log.commit("p1", "t", at=1_002) == 500
    assert log.state.idle_producers() == ["p1"]


def test_an_aborted_transaction_is_discarded() -> None:
    log = Log()
    log.set("p1", 100, at=1_000)
    log.set("p1", 200, at=1_001, txn="t")
    assert log.abort("p1", "t", at=1_002) == 100
    assert log.state.pending() == {}
    assert log.commit("p1", "t", at=1_003) == 100  # the commit after an abort has nothing to apply


def test_a_transaction_without_outcome_times_out() -> None:
    log = Log()
    log.set("p1", 100, at=1_000)
    log.set("p1", 200, at=1_000, txn="t")
    log.set("p2", 900, at=6_000)  # exactly the txn timeout: still pending
    assert log.state.pending() != {}
    log.set("p2", 900, at=6_001)
    assert log.state.pending() == {}
    assert log.commit("p1", "t", at=6_002) == 100


def test_a_commit_that_itself_arrives_too_late_is_ignored() -> None:
    log = Log()
    log.set("p1", 100, at=1_000)
    log.set("p1", 200, at=1_000, txn="t")
    assert log.commit("p1", "t", at=6_001) == 100
    assert log.state.pending() == {}


def test_a_transaction_starts_at_the_log_clock_even_when_its_producer_lags() -> None:
    log = Log()
    log.set("p2", 900, at=50_000)
    log.set("p1", 100, at=1_000, txn="t")  # p1's clock lags by far more than the txn timeout
    assert log.state.pending() == {("p1", "t"): PendingMarker(MarkerKind.W_SET, 100, 50_000)}
    assert log.commit("p1", "t", at=1_001) == 900  # applies (a late joiner: it does not pull 900 back)
    assert log.state.active_producers() == {"p1": 100, "p2": 900}


def test_a_transaction_id_reused_after_a_timeout_starts_afresh() -> None:
    log = Log()
    log.set("p1", 100, at=1_000)
    log.set("p1", 200, at=1_000, txn="t")
    log.set("p1", 300, at=7_000, txn="t")
    assert log.state.pending() == {("p1", "t"): PendingMarker(MarkerKind.W_SET, 300, 7_000)}
    assert log.commit("p1", "t", at=7_001) == 300


def test_a_commit_of_an_unknown_transaction_does_nothing() -> None:
    log = Log()
    log.set("p1", 100, at=1_000)
    before = log.state
    assert log.commit("p1", "nope", at=1_000) == 100
    assert log.state.producers == before.producers
    assert log.state.pending() == {}


def test_a_commit_by_another_producer_does_not_apply() -> None:
    log = Log()
    log.set("p1", 100, at=1_000)
    log.set("p1", 200, at=1_001, txn="t")
    assert log.commit("p2", "t", at=1_002) == 100
    assert log.state.pending() == {("p1", "t"): PendingMarker(MarkerKind.W_SET, 200, 1_001)}
    assert log.abort("p2", "t", at=1_003) == 100
    assert ("p1", "t") in log.state.pending()
    assert log.commit("p1", "t", at=1_004) == 200


def test_the_same_transaction_id_of_two_producers_is_two_transactions() -> None:
    log = Log()
    log.set("p1", 100, at=1_000, txn="t")
    log.set("p2", 200, at=1_000, txn="t")
    assert log.commit("p2", "t", at=1_001) == 200
    assert log.state.pending() == {("p1", "t"): PendingMarker(MarkerKind.W_SET, 100, 1_000)}
    assert log.commit("p1", "t", at=1_002) == 200  # p1 asserts 100: below the watermark, a late joiner
    assert log.state.active_producers() == {"p1": 100, "p2": 200}


# -- order and hand-built markers ------------------------------------------------------------------------


def test_markers_must_be_applied_in_increasing_position() -> None:
    state = WatermarkState.initial().apply(Marker(MarkerKind.W_SET, "p1", (1, 5, -1), 1, event_time=1))
    for position in [(1, 5, -1), (1, 4, 0), (0, 9, -1)]:
        with pytest.raises(ValueError, match="log order"):
            state.apply(Marker(MarkerKind.W_SET, "p1", position, 2, event_time=2))
    assert state.apply(Marker(MarkerKind.W_SET, "p1", (1, 5, 0), 2, event_time=2)).watermark == 2


@pytest.mark.parametrize(
    "marker",
    [
        Marker(MarkerKind.W_SET, "p1", (1, 1, -1), 1),
        Marker(MarkerKind.W_TXN_COMMIT, "p1", (1, 1, -1), 1),
        Marker(MarkerKind.W_TXN_ABORT, "p1", (1, 1, -1), 1),
    ],
)
def test_hand_built_markers_must_be_complete(marker: Marker) -> None:
    with pytest.raises(ValueError, match="needs"):
        WatermarkState.initial().apply(marker)


def test_advanced_to_states_the_same_fold_at_a_later_position() -> None:
    log = Log()
    log.set("p1", 100, at=1_000)
    state = log.state.advanced_to((1, 1, 7))
    assert state.position == (1, 1, 7)
    assert replace(state, position=log.state.position) == log.state
    assert log.state.advanced_to(log.state.position or (0, 0, 0)) == log.state
    with pytest.raises(ValueError, match="back"):
        log.state.advanced_to((1, 0, -1))
    with pytest.raises(ValueError, match="log order"):
        state.apply(Marker(MarkerKind.W_SET, "p1", (1, 1, 3), 2, event_time=2))
    nxt = Marker(MarkerKind.W_SET, "p1", (1, 2, -1), 2, event_time=200)
    assert state.apply(nxt) == log.state.apply(nxt)
    assert WatermarkState.initial().advanced_to((5, 0, -1)).position == (5, 0, -1)


def test_apply_all_folds_in_order() -> None:
    markers = [
        Marker(MarkerKind.W_SET, "p1", (1, 1, -1), 1, event_time=10),
        Marker(MarkerKind.W_SET, "p2", (1, 2, -1), 2, event_time=20),
        Marker(MarkerKind.W_IDLE, "p1", (1, 3, -1), 3),
    ]
    state = apply_all(WatermarkState.initial(), markers)
    assert state.watermark == 20
    assert apply_all(state, []) is state


def test_states_are_immutable_values() -> None:
    log = Log()
    log.set("p1", 100, at=1_000)
    before = log.state
    log.set("p1", 200, at=1_001)
    assert before.watermark == 100
    with pytest.raises(TypeError):
        before.producers["p9"] = ProducerRecord(1, False, 1)  # type: ignore[index]
    mutable = {"p1": ProducerRecord(1, False, 1)}
    state = WatermarkState(clock=1, producers=mutable)
    mutable.clear()
    assert state.producers == {"p1": ProducerRecord(1, False, 1)}


# -- configuration ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "60000"])
def test_config_needs_positive_int_timeouts(value: Any) -> None:
    with pytest.raises(ValueError, match="producer_timeout_ms"):
        WatermarkConfig(producer_timeout_ms=value)
    with pytest.raises(ValueError, match="txn_timeout_ms"):
        WatermarkConfig(txn_timeout_ms=value)


def test_config_defaults_to_sixty_seconds() -> None:
    assert WatermarkConfig() == WatermarkConfig(60_000, 60_000, 600_000)


@pytest.mark.parametrize("value", [0, -1, True, 1.5])
def test_config_needs_a_positive_int_retention(value: Any) -> None:
    with pytest.raises(ValueError, match="producer_retention_ms"):
        WatermarkConfig(producer_retention_ms=value)


# -- snapshots -------------------------------------------------------------------------------------------


def busy_state() -> WatermarkState:
    log = Log()
    log.set("p1", 100, at=1_000)
    log.set("p2", 300, at=1_001)
    log.idle("p3", at=1_002)
    log.set("p1", 400, at=1_003, txn="a")
    log.idle("p2", at=1_004, txn="b")
    log.snapshot(at=1_005)
    return log.state


def test_to_dict_is_msgpack_able_and_round_trips_exactly() -> None:
    state = busy_state()
    data = state_to_dict(state)
    assert state_from_dict(data) == state
    through_bytes = msgpack.unpackb(msgpack.packb(data, use_bin_type=True), raw=False)
    assert state_from_dict(through_bytes) == state
    assert state_from_dict(state_to_dict(WatermarkState.initial())) == WatermarkState.initial()


def test_a_snapshot_marker_carries_the_state() -> None:
    state = busy_state()
    keys, topic = SnapshotKeys.from_text("the-generators-key-in-test-state"), "persistent://public/default/t"
    payload = encode_snapshot(state, keys=keys, topic=topic)
    marker = decode_marker({"wm.marker": "W_SNAPSHOT"}, payload, "g", (2, 0, -1), 5)
    assert marker is not None
    assert decode_snapshot(marker, keys=keys, topic=topic).state == state


def test_to_dict_layout() -> None:
    data = state_to_dict(busy_state())
    assert data["v"] == 1
    assert data["config"] == {"producer_timeout_ms": 10_000, "txn_timeout_ms": 5_000, "producer_retention_ms": 600_000}
    assert data["position"] == [1, 6, -1]
    assert data["clock"] == 1_004
    assert data["watermark"] == 100
    assert data["producers"]["p3"] == {"event_time": None, "idle": True, "last_seen": 1_002}
    assert data["pending"][0] == {"producer": "p1", "txn": "a", "kind": "W_SET", "event_time": 400, "started": 1_003}


def test_from_dict_with_the_readers_config() -> None:
    config = WatermarkConfig(1, 2)
    restored = state_from_dict(state_to_dict(busy_state()), config)
    assert restored.config == config
    assert restored.watermark == 100


def test_from_dict_ignores_unknown_keys() -> None:
    data = {**state_to_dict(busy_state()), "future": 1}
    assert state_from_dict(data) == busy_state()


def broken(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """state_to_dict(busy_state()) with the item at `path` replaced by `value` (or deleted when it is DELETE)."""
    data = state_to_dict(busy_state())
    node = data
    for key in path[:-1]:
        node = node[key]
    if value is DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return data


DELETE = object()


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("v",), 2),
        (("v",), True),
        (("v",), DELETE),
        (("config",), None),
        (("config", "producer_timeout_ms"), 0),
        (("config", "txn_timeout_ms"), "5"),
        (("config", "txn_timeout_ms"), DELETE),
        (("position",), [1, 2]),
        (("position",), "1:2:3"),
        (("position",), [1, 2, True]),
        (("position",), DELETE),
        (("clock",), "1"),
        (("clock",), 1_003),
        (("clock",), None),
        (("watermark",), -1),
        (("watermark",), 2**63),
        (("watermark",), 1.0),
        (("producers",), [1]),
        (("producers", "p1"), [100, False, 1]),
        (("producers", "p1", "idle"), 0),
        (("producers", "p1", "event_time"), -5),
        (("producers", "p1", "last_seen"), None),
        (("producers", "p1"), DELETE),
        (("pending",), {}),
        (("pending", 0), "x"),
        (("pending", 0, "kind"), "W_SNAPSHOT"),
        (("pending", 0, "kind"), "W_IDLE"),
        (("pending", 1, "event_time"), 5),
        (("pending", 0, "txn"), ""),
        (("pending", 0, "producer"), 1),
        (("pending", 0, "producer"), "ghost"),
        (("pending", 0, "started"), 9_999),
        (("pending", 1), {"producer": "p1", "txn": "a", "kind": "W_SET", "event_time": 1, "started": 1_003}),
    ],
)
def test_from_dict_rejects_what_is_not_a_state(path: tuple[Any, ...], value: Any) -> None:
    with pytest.raises(MalformedMarker) as caught:
        state_from_dict(broken(path, value))
    assert caught.value.reason == "bad-snapshot"


def test_from_dict_rejects_non_maps_and_non_str_names() -> None:
    junks: list[Any] = [[], None, "state"]
    for junk in junks:
        with pytest.raises(MalformedMarker, match="bad-snapshot"):
            state_from_dict(junk)
    data = state_to_dict(busy_state())
    data["producers"][5] = data["producers"].pop("p3")
    with pytest.raises(MalformedMarker, match="str name"):
        state_from_dict(data)


def test_from_dict_rejects_a_state_with_producers_but_no_clock() -> None:
    data = state_to_dict(WatermarkState.initial())
    data["producers"] = {"p1": {"event_time": 1, "idle": False, "last_seen": 1}}
    with pytest.raises(MalformedMarker, match="without a clock"):
        state_from_dict(data)
