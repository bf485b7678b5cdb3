"""Properties of the state machine and the decoder over random logs (hypothesis).

The logs come from a few producers with random marker kinds, transaction ids from a small set,
publish times that mostly move forward but sometimes go back, and random event times, at increasing
positions with room between them for inserted markers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from watermark_core.protocol import (
    MARKER_PROPERTY,
    MalformedMarker,
    Marker,
    MarkerKind,
    Position,
    WatermarkEvent,
    decode_event,
    decode_marker,
    decode_table,
    encode_event,
    encode_idle,
    encode_set,
    encode_txn_abort,
    encode_txn_commit,
)
from watermark_core.snapshot import SnapshotKeys, encode_snapshot, state_from_dict, state_to_dict
from watermark_core.state import PendingMarker, WatermarkConfig, WatermarkState

pytestmark = pytest.mark.unit

RELAXED = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
"""Folds are quadratic in property 1 and timing varies on shared machines: no deadline."""

PRODUCERS = ("p1", "p2", "p3")
KEYS = SnapshotKeys.from_text("the-generators-key-for-properties")
SNAPSHOT_TOPIC = "persistent://public/default/properties"
TXNS = ("a", "b")
KINDS = (MarkerKind.W_SET,) * 4 + (
    MarkerKind.W_IDLE,
    MarkerKind.W_TXN_COMMIT,
    MarkerKind.W_TXN_ABORT,
    MarkerKind.W_SNAPSHOT,
)
EVENT_TIMES = st.integers(0, 1_000)


def position(index: int) -> Position:
    """Where the index-th marker of a generated log sits: ledgers of 8 markers, every other entry."""
    return (1 + index // 8, 2 * (index % 8) + 2, -1)


def between(index: int, n: int) -> Position:
    """The n-th free position just before `position(index)` (after `position(index - 1)`)."""
    ledger, entry, _ = position(index)
    return (ledger, entry - 1, n)


def at_positions(markers: Iterable[Marker]) -> list[Marker]:
    return [replace(m, position=position(i)) for i, m in enumerate(markers)]


@dataclass(frozen=True)
class RandomLog:
    config: WatermarkConfig
    markers: list[Marker]


@st.composite
def random_markers(draw: st.DrawFn, max_size: int = 30) -> list[Marker]:
    """Markers without their final positions (callers place them)."""
    publish = draw(st.integers(0, 5_000))
    markers = []
    for _ in range(draw(st.integers(0, max_size))):
        publish = max(0, publish + draw(st.one_of(st.integers(-3_000, 3_000), st.integers(5_000, 25_000))))
        kind = draw(st.sampled_from(KINDS))
        producer = draw(st.sampled_from(PRODUCERS))
        event_time: int | None = None
        txn: str | None = None
        state: dict[str, Any] | None = None
        if kind is MarkerKind.W_SET:
            event_time = draw(EVENT_TIMES)
        if kind in (MarkerKind.W_SET, MarkerKind.W_IDLE):
            txn = draw(st.none() | st.sampled_from(TXNS))
        elif kind is MarkerKind.W_SNAPSHOT:
            producer, state = "__generator", {}
        else:
            txn = draw(st.sampled_from(TXNS))
        markers.append(Marker(kind, producer, (0, 0, -1), publish, event_time, txn, state))
    return markers


CONFIGS = st.builds(WatermarkConfig, st.integers(1, 40_000), st.integers(1, 30_000), st.integers(1, 60_000))


@st.composite
def random_logs(draw: st.DrawFn) -> RandomLog:
    return RandomLog(draw(CONFIGS), at_positions(draw(random_markers())))


def fold(markers: Sequence[Marker], start: WatermarkState) -> list[WatermarkState]:
    """`start` and the state after each marker."""
    states = [start]
    for marker in markers:
        states.append(states[-1].apply(marker))
    return states


def through_snapshot(state: WatermarkState) -> WatermarkState:
    """What a reader restores from the W_SNAPSHOT record of `state`, bytes and all."""
    payload = encode_snapshot(state, keys=KEYS, topic=SNAPSHOT_TOPIC)
    marker = decode_marker({MARKER_PROPERTY: "W_SNAPSHOT"}, payload, "g", (9, 9, -1), 0)
    assert marker is not None and marker.body is not None
    return state_from_dict(KEYS.unseal(marker.body, SNAPSHOT_TOPIC)["state"])


# -- 1. snapshots restore exactly ------------------------------------------------------------------------


@RELAXED
@given(random_logs())
def test_restore_at_any_position_then_replay_equals_replay_from_the_start(log: RandomLog) -> None:
    full = fold(log.markers, WatermarkState.initial(log.config))
    for q in range(len(full)):
        restored = through_snapshot(full[q])
        assert restored == full[q]
        advanced = through_snapshot(full[q].advanced_to(between(q, 0)))  # as the generator writes it
        for start in (restored, advanced):
            replayed = fold(log.markers[q:], start)
            for state, expected in zip(replayed[1:], full[q + 1 :], strict=True):
                assert state_to_dict(state) == state_to_dict(expected)
                assert state.watermark == expected.watermark


# -- 2 and 3. monotonic, and never above an active producer when it moves ---------------------------------


@RELAXED
@given(random_logs())
def test_the_watermark_never_decreases_along_the_log(log: RandomLog) -> None:
    states = fold(log.markers, WatermarkState.initial(log.config))
    for before, after in pairwise(states):
        if before.watermark is not None:
            assert after.watermark is not None
            assert after.watermark >= before.watermark


@RELAXED
@given(random_logs())
def test_when_the_watermark_moves_it_is_the_minimum_of_the_active_assertions(log: RandomLog) -> None:
    states = fold(log.markers, WatermarkState.initial(log.config))
    for before, after in pairwise(states):
        if after.watermark != before.watermark:
            active = after.active_producers()
            assert active, "the watermark moved with no active producer"
            assert after.watermark == min(active.values())
        if after.active_producers():
            assert after.watermark is not None
            assert after.watermark >= min(after.active_producers().values())


# -- 4. transactions -------------------------------------------------------------------------------------

TXN = "zz"  # never used by the random log, so the inserted transaction is the only one with this id
NEUTRAL = "neutral"  # an unknown transaction: its abort only renews its producer and ticks the clock


@dataclass(frozen=True)
class TxnCase:
    config: WatermarkConfig
    actual: list[Marker]
    expected: list[Marker]
    producer: str


@st.composite
def transaction_cases(draw: st.DrawFn) -> TxnCase:
    """A random log with one transaction of `producer` inserted, and the log it must be equivalent to.

    In the equivalent log each transactional marker is replaced by a neutral one at the same place
    and publish time, and the outcome by the transaction's marker sent without a transaction (when
    the commit found it pending) or by a neutral one (abort, timeout, no outcome).
    """
    config = draw(st.builds(WatermarkConfig, st.integers(1, 40_000), st.integers(1, 12_000)))
    base = draw(random_markers(max_size=20))
    producer = draw(st.sampled_from(PRODUCERS))
    count = draw(st.integers(1, 3))
    spots = sorted(draw(st.lists(st.integers(0, len(base)), min_size=count, max_size=count)))
    outcome = draw(st.sampled_from(["commit", "abort", "none"]))
    outcome_spot = draw(st.integers(spots[-1], len(base)))

    def publish_near(spot: int) -> int:
        near = base[spot - 1].publish_time if spot > 0 else 0
        return max(0, near + draw(st.integers(-6_000, 12_000)))

    inserts: list[tuple[int, Marker]] = []
    for spot in spots:
        kind = draw(st.sampled_from([MarkerKind.W_SET, MarkerKind.W_SET, MarkerKind.W_IDLE]))
        event_time = draw(EVENT_TIMES) if kind is MarkerKind.W_SET else None
        inserts.append((spot, Marker(kind, producer, (0, 0, -1), publish_near(spot), event_time, TXN)))
    if outcome != "none":
        kind = MarkerKind.W_TXN_COMMIT if outcome == "commit" else MarkerKind.W_TXN_ABORT
        inserts.append((outcome_spot, Marker(kind, producer, (0, 0, -1), publish_near(outcome_spot), txn=TXN)))

    actual: list[Marker] = []
    for index in range(len(base) + 1):
        actual.extend(m for spot, m in inserts if spot == index)
        actual.extend(base[index : index + 1])
    actual = at_positions(actual)
    return TxnCase(config, actual, _equivalent(actual, producer, config), producer)


def _equivalent(actual: list[Marker], producer: str, config: WatermarkConfig) -> list[Marker]:
    """The oracle, straight from the protocol's words: clock, transaction start, timeout, outcome."""
    expected, clock, held, started = [], None, None, 0
    for marker in actual:
        if marker.kind is not MarkerKind.W_SNAPSHOT:
            clock = marker.publish_time if clock is None else max(clock, marker.publish_time)
        if held is not None and clock is not None and clock - started > config.txn_timeout_ms:
            held = None
        if marker.txn != TXN:
            expected.append(marker)
            continue
        neutral = replace(marker, kind=MarkerKind.W_TXN_ABORT, event_time=None, txn=NEUTRAL)
        if marker.kind in (MarkerKind.W_SET, MarkerKind.W_IDLE):
            if held is None:
                assert clock is not None
                started = clock
            held = marker
            expected.append(neutral)
        elif marker.kind is MarkerKind.W_TXN_COMMIT and held is not None:
            expected.append(replace(marker, kind=held.kind, event_time=held.event_time, txn=None))
        else:
            expected.append(neutral)
    return expected


@settings(RELAXED, max_examples=300)
@given(transaction_cases())
def test_a_transaction_takes_effect_exactly_at_its_commit_and_otherwise_never(case: TxnCase) -> None:
    actual = fold(case.actual, WatermarkState.initial(case.config))
    expected = fold(case.expected, WatermarkState.initial(case.config))
    for a, e in zip(actual, expected, strict=True):
        assert a.watermark == e.watermark
        assert a.producers == e.producers
        assert a.clock == e.clock
        assert {k: v for k, v in a.pending().items() if k != (case.producer, TXN)} == e.pending()


def test_the_transaction_oracle_itself() -> None:
    """The oracle applies a live commit's marker and neutralises a timed-out one."""
    config = WatermarkConfig(txn_timeout_ms=10)
    live = at_positions([
        Marker(MarkerKind.W_SET, "p1", (0, 0, -1), 0, 5, TXN),
        Marker(MarkerKind.W_TXN_COMMIT, "p1", (0, 0, -1), 10, txn=TXN),
    ])  # fmt: skip
    assert [m.kind for m in _equivalent(live, "p1", config)] == [MarkerKind.W_TXN_ABORT, MarkerKind.W_SET]
    late = [live[0], replace(live[1], publish_time=11)]
    assert [m.txn for m in _equivalent(late, "p1", config)] == [NEUTRAL, NEUTRAL]


# -- 5. snapshots change nothing -------------------------------------------------------------------------


@RELAXED
@given(random_logs(), st.data())
def test_inserting_snapshots_anywhere_changes_no_watermark(log: RandomLog, data: st.DataObject) -> None:
    with_snapshots: list[Marker] = []
    for index, marker in enumerate(log.markers):
        for n in range(data.draw(st.integers(0, 2))):
            state = data.draw(st.sampled_from([{}, {"v": 1}, state_to_dict(WatermarkState.initial())]))
            with_snapshots.append(Marker(MarkerKind.W_SNAPSHOT, "g", between(index, n), 10**12, body={"state": state}))
        with_snapshots.append(marker)
    plain = fold(log.markers, WatermarkState.initial(log.config))
    snapped = fold(with_snapshots, WatermarkState.initial(log.config))
    at = {s.position: s for s in snapped}
    for state in plain[1:]:
        assert state_to_dict(at[state.position]) == state_to_dict(state)


# -- 5b. forgetting --------------------------------------------------------------------------------------


@RELAXED
@given(random_logs())
def test_no_state_remembers_a_producer_out_for_longer_than_the_retention(log: RandomLog) -> None:
    config = log.config
    for state in fold(log.markers, WatermarkState.initial(config))[1:]:
        if state.clock is None:
            continue
        holding = {producer for producer, _ in state.pending_txns}
        for name, record in state.producers.items():
            out_since = record.last_seen
            if record.event_time is not None and not record.idle:
                out_since += config.producer_timeout_ms
            assert name in holding or state.clock - out_since <= config.producer_retention_ms, (name, record)


@RELAXED
@given(random_logs())
def test_without_transactions_forgetting_changes_no_watermark(log: RandomLog) -> None:
    """Only a transactional marker can revive a remembered assertion; W_SET replaces it and W_IDLE idles it."""
    plain = [m for m in log.markers if m.txn is None]
    remembering = replace(log.config, producer_retention_ms=10**15)
    forgetting = fold(plain, WatermarkState.initial(log.config))
    for state, expected in zip(forgetting, fold(plain, WatermarkState.initial(remembering)), strict=True):
        assert state.watermark == expected.watermark
        assert state.active_producers() == expected.active_producers()


# -- 6. the decoder --------------------------------------------------------------------------------------

MSGPACK_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(["v", "event_time", "txn", "state", "x"]) | st.text(max_size=4), children)
    ),
    max_leaves=12,
)
MARKER_LIKE_MAPS = st.fixed_dictionaries(
    {"v": st.sampled_from([1, 1, 1, 2, 0, True, "1"])},
    optional={"event_time": MSGPACK_VALUES, "txn": MSGPACK_VALUES, "state": MSGPACK_VALUES},
)
PAYLOADS = st.binary(max_size=64) | (MSGPACK_VALUES | MARKER_LIKE_MAPS).map(
    lambda value: bytes(msgpack.packb(value, use_bin_type=True))
)
PROPERTIES = st.dictionaries(st.text(max_size=10), st.text(max_size=10)) | st.fixed_dictionaries(
    {MARKER_PROPERTY: st.sampled_from([k.value for k in MarkerKind]) | st.text(max_size=12)},
    optional={"other": st.text(max_size=4)},
)


@RELAXED
@given(PROPERTIES, PAYLOADS)
def test_the_decoder_returns_a_marker_or_none_or_raises_malformed_marker_only(
    properties: dict[str, str], payload: bytes
) -> None:
    try:
        marker = decode_marker(properties, payload, "p1", (1, 2, -1), 3)
    except MalformedMarker as exc:
        assert exc.reason in {"bad-kind", "bad-payload", "bad-msgpack", "bad-version", "bad-field"}
        return
    assert (marker is None) == (MARKER_PROPERTY not in properties)
    if marker is not None:
        assert marker.producer == "p1"
        assert marker.kind == properties[MARKER_PROPERTY]


@RELAXED
@given(PAYLOADS)
def test_the_event_decoder_returns_an_event_or_raises_malformed_marker_only(payload: bytes) -> None:
    with suppress(MalformedMarker):
        assert isinstance(decode_event(payload), WatermarkEvent)
    with suppress(MalformedMarker):
        assert all(isinstance(event, WatermarkEvent) for event in decode_table(payload))


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place inside a nested structure of maps and lists."""
    children: Iterable[Any] = (
        value.keys() if isinstance(value, dict) else range(len(value)) if isinstance(value, list) else ()
    )
    found = [prefix] if prefix else []
    for key in children:
        found.extend(paths(value[key], (*prefix, key)))
    return found


@st.composite
def mutated_states(draw: st.DrawFn) -> Any:
    """A real state's to_dict() with one place replaced by a random value."""
    log = draw(random_logs())
    data = state_to_dict(fold(log.markers, WatermarkState.initial(log.config))[-1])
    path = draw(st.sampled_from(paths(data)))
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = draw(MSGPACK_VALUES)
    return data


@RELAXED
@given(MSGPACK_VALUES | MARKER_LIKE_MAPS | mutated_states())
def test_from_dict_returns_a_state_or_raises_malformed_marker_only(data: Any) -> None:
    try:
        assert isinstance(state_from_dict(data), WatermarkState)
    except MalformedMarker as exc:
        assert exc.reason == "bad-snapshot"


TXN_IDS = st.none() | st.text(min_size=1, max_size=8)
VALID_EVENT_TIMES = st.integers(0, 2**63 - 1)


@st.composite
def encoded_markers(draw: st.DrawFn) -> tuple[Marker, bytes]:
    kind = draw(st.sampled_from(list(MarkerKind)))
    marker = Marker(kind, draw(st.text(max_size=8)), (1, 2, draw(st.integers(-1, 5))), draw(st.integers(0, 2**40)))
    if kind is MarkerKind.W_SET:
        event_time, txn = draw(VALID_EVENT_TIMES), draw(TXN_IDS)
        return replace(marker, event_time=event_time, txn=txn), encode_set(event_time, txn)
    if kind is MarkerKind.W_IDLE:
        txn = draw(TXN_IDS)
        return replace(marker, txn=txn), encode_idle(txn)
    if kind is MarkerKind.W_SNAPSHOT:
        state = fold(at_positions(draw(random_markers(max_size=8))), WatermarkState.initial())[-1]
        payload = encode_snapshot(state, keys=KEYS, topic=SNAPSHOT_TOPIC)
        return replace(marker, body=msgpack.unpackb(payload)), payload
    txn = draw(st.text(min_size=1, max_size=8))
    encode = encode_txn_commit if kind is MarkerKind.W_TXN_COMMIT else encode_txn_abort
    return replace(marker, txn=txn), encode(txn)


@RELAXED
@given(encoded_markers())
def test_encode_then_decode_round_trips(case: tuple[Marker, bytes]) -> None:
    marker, payload = case
    decoded = decode_marker(
        {MARKER_PROPERTY: marker.kind.value}, payload, marker.producer, marker.position, marker.publish_time
    )
    assert decoded == marker
    assert decoded is not None
    if decoded.body is not None:
        signed = KEYS.unseal(decoded.body, SNAPSHOT_TOPIC)
        assert state_to_dict(state_from_dict(signed["state"])) == signed["state"]


@RELAXED
@given(
    st.builds(
        WatermarkEvent,
        st.text(min_size=1, max_size=20),
        st.integers(-1, 1_000),
        st.text(min_size=1, max_size=20),
        st.none() | VALID_EVENT_TIMES,
        st.tuples(st.integers(-1, 2**62), st.integers(-1, 2**62)),
        st.integers(0, 2**62),
    )
)
def test_events_round_trip(event: WatermarkEvent) -> None:
    assert decode_event(encode_event(event)) == event


def test_pending_markers_survive_a_snapshot() -> None:
    """A pending transaction is part of the snapshot, so a restart does not lose it."""
    state = WatermarkState.initial().apply(Marker(MarkerKind.W_SET, "p1", position(0), 1, 7, "a"))
    assert through_snapshot(state).pending() == {("p1", "a"): PendingMarker(MarkerKind.W_SET, 7, 1)}
