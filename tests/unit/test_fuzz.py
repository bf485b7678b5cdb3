"""Bad input into the decoders and the state machine (hypothesis): only the documented error escapes.

`test_state_properties.py` checks the laws of the fold over well-formed logs and the decoders over
random msgpack values. Here the input is hostile: property values of any type, payloads that are
not bytes, valid encodings with bytes flipped, cut or spliced, msgpack extension types, and logs
that mix valid and malformed markers fed the way the generator and the consumer feed them (decode,
skip a `MalformedMarker`, apply the rest). Whatever comes in, the decoders return a well-formed
value or raise `MalformedMarker` with a documented reason, and the state stays consistent.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from watermark_core.protocol import (
    EVENT_TIME_LIMIT,
    MARKER_PROPERTY,
    HeadWatermark,
    MalformedMarker,
    Marker,
    MarkerKind,
    Position,
    WatermarkEvent,
    decode_event,
    decode_head,
    decode_marker,
    decode_table,
    decode_table_with_heads,
    encode_event,
    encode_head,
    encode_idle,
    encode_set,
    encode_table,
    encode_txn_abort,
    encode_txn_commit,
    pack,
)
from watermark_core.snapshot import (
    BAD_SIGNATURE,
    SnapshotKeys,
    decode_snapshot,
    encode_snapshot,
    state_from_dict,
    state_to_dict,
)
from watermark_core.state import WatermarkConfig, WatermarkState

pytestmark = pytest.mark.unit

FUZZ = settings(
    deadline=None,
    max_examples=300,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)

MARKER_REASONS = {"bad-kind", "bad-payload", "bad-msgpack", "bad-version", "bad-field"}
KEYS = SnapshotKeys.from_text("the-fuzzed-generators-key-0001")
SNAPSHOT_TOPIC = "persistent://public/default/fuzz-partition-0"
"""Where the fuzzed snapshots are written and read: what their signature names."""
KINDS = [k.value for k in MarkerKind]


# -- hostile bytes ---------------------------------------------------------------------------------------


@st.composite
def mutated(draw: st.DrawFn, payload: bytes) -> bytes:
    """`payload` with one corruption: a flipped byte, a cut, a splice of random bytes, or a duplicate."""
    how = draw(st.sampled_from(["flip", "cut", "splice", "append", "double", "none"]))
    if how == "none" or not payload:
        return payload
    at = draw(st.integers(0, len(payload) - 1))
    if how == "flip":
        return payload[:at] + bytes([payload[at] ^ draw(st.integers(1, 255))]) + payload[at + 1 :]
    if how == "cut":
        return payload[:at]
    if how == "splice":
        return payload[:at] + draw(st.binary(min_size=1, max_size=8)) + payload[at + 1 :]
    if how == "append":
        return payload + draw(st.binary(min_size=1, max_size=8))
    return payload + payload


SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=6)
    | st.binary(max_size=6)
)
EXTENSIONS = st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=8)) | st.builds(
    msgpack.Timestamp, st.integers(0, 2**33), st.integers(0, 999_999_999)
)
VALUES = st.recursive(
    SCALARS | EXTENSIONS,
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(["v", "event_time", "txn", "state", "previous", "events"]), children, max_size=4
        )
    ),
    max_leaves=10,
)


def packed(value: Any) -> bytes:
    return bytes(msgpack.packb(value, use_bin_type=True, datetime=False))


@st.composite
def valid_marker_payloads(draw: st.DrawFn) -> tuple[str, bytes]:
    """(kind, payload) as a WatermarkProducer or the generator writes them."""
    kind = draw(st.sampled_from(list(MarkerKind)))
    txn = draw(st.none() | st.sampled_from(["a", "b"]))
    if kind is MarkerKind.W_SET:
        return kind.value, encode_set(draw(st.integers(0, EVENT_TIME_LIMIT - 1)), txn)
    if kind is MarkerKind.W_IDLE:
        return kind.value, encode_idle(txn)
    if kind is MarkerKind.W_SNAPSHOT:
        previous = draw(st.none() | st.just((1, 2, -1)))
        return kind.value, encode_snapshot(WatermarkState.initial(), previous, keys=KEYS, topic=SNAPSHOT_TOPIC)
    encode = encode_txn_commit if kind is MarkerKind.W_TXN_COMMIT else encode_txn_abort
    return kind.value, encode(txn or "a")


PAYLOAD_OBJECTS = (
    st.binary(max_size=48)
    | VALUES.map(packed)
    | st.fixed_dictionaries({"v": st.sampled_from([1, 2, -1, 0, 1.0, None])}, optional={"event_time": VALUES}).map(
        packed
    )
    | st.builds(bytearray, st.binary(max_size=16))
    | st.builds(memoryview, st.binary(max_size=16))
    | SCALARS.filter(lambda v: not isinstance(v, bytes))  # not bytes at all: a str, an int, None
)
PROPERTY_VALUES = st.sampled_from(KINDS) | st.text(max_size=10) | SCALARS | st.lists(st.integers(), max_size=2)


@FUZZ
@given(
    st.dictionaries(st.text(max_size=6), st.text(max_size=6)),
    PROPERTY_VALUES,
    PAYLOAD_OBJECTS | valid_marker_payloads().flatmap(lambda kp: mutated(kp[1])),
    st.text(max_size=8),
    st.tuples(st.integers(-1, 2**63), st.integers(-1, 2**63), st.integers(-1, 2**31)),
    st.integers(0, 2**63),
)
def test_decode_marker_raises_only_malformed_marker_whatever_comes_in(
    others: dict[str, str], kind: Any, payload: Any, producer: str, position: Position, publish_time: int
) -> None:
    properties: dict[str, Any] = {**others, MARKER_PROPERTY: kind}
    try:
        marker = decode_marker(properties, payload, producer, position, publish_time)
    except MalformedMarker as exc:
        assert exc.reason in MARKER_REASONS
        assert str(exc).startswith(exc.reason)
        return
    assert marker is not None
    assert_well_formed(marker)
    assert (marker.kind.value, marker.producer, marker.position) == (kind, producer, position)


@FUZZ
@given(valid_marker_payloads().flatmap(lambda kp: st.tuples(st.just(kp[0]), mutated(kp[1]))))
def test_a_corrupted_marker_is_either_malformed_or_still_a_well_formed_marker(case: tuple[str, bytes]) -> None:
    kind, payload = case
    try:
        marker = decode_marker({MARKER_PROPERTY: kind}, payload, "p", (1, 1, -1), 5)
    except MalformedMarker as exc:
        assert exc.reason in MARKER_REASONS
        return
    assert marker is not None
    assert_well_formed(marker)


def assert_well_formed(marker: Marker) -> None:
    """What the state machine relies on: the fields of each kind, in range."""
    if marker.kind is MarkerKind.W_SET:
        assert isinstance(marker.event_time, int) and not isinstance(marker.event_time, bool)
        assert 0 <= marker.event_time < EVENT_TIME_LIMIT
    else:
        assert marker.event_time is None
    if marker.kind in (MarkerKind.W_TXN_COMMIT, MarkerKind.W_TXN_ABORT):
        assert isinstance(marker.txn, str) and marker.txn
    else:
        assert marker.txn is None or (isinstance(marker.txn, str) and marker.txn)
    if marker.kind is MarkerKind.W_SNAPSHOT:
        assert isinstance(marker.body, dict)
    else:
        assert marker.body is None


# -- hostile watermark events ----------------------------------------------------------------------------

EVENTS = st.builds(
    WatermarkEvent,
    st.text(min_size=1, max_size=12),
    st.integers(-1, 64),
    st.text(min_size=1, max_size=12),
    st.none() | st.integers(0, EVENT_TIME_LIMIT - 1),
    st.tuples(st.integers(-1, 2**40), st.integers(-1, 2**40)),
    st.integers(0, 2**62),
    st.dictionaries(st.text(max_size=4), st.integers(0, 2**40), max_size=2),
    st.lists(st.text(max_size=4), max_size=2).map(tuple),
    st.integers(0, 5),
)


@st.composite
def table_with_a_replaced_field(draw: st.DrawFn) -> bytes:
    """A real table with one field of one event replaced by a random value (or removed)."""
    events = [msgpack.unpackb(encode_event(e)) for e in draw(st.lists(EVENTS, min_size=1, max_size=3))]
    event = draw(st.sampled_from(events))
    key = draw(st.sampled_from(sorted(event)))
    if draw(st.booleans()):
        del event[key]
    else:
        event[key] = draw(VALUES)
    return packed({"v": 1, "events": events})


HOSTILE_TABLES = (
    PAYLOAD_OBJECTS
    | table_with_a_replaced_field()
    | st.lists(EVENTS, min_size=1, max_size=3).map(encode_table).flatmap(mutated)
    | EVENTS.map(encode_event).flatmap(mutated)
)


@FUZZ
@given(HOSTILE_TABLES)
def test_the_event_decoders_raise_only_malformed_marker_whatever_comes_in(payload: Any) -> None:
    for decode in (decode_table, decode_event):
        try:
            decoded = decode(payload)
        except MalformedMarker as exc:
            assert exc.reason in MARKER_REASONS | {"bad-event"}
            continue
        events = decoded if isinstance(decoded, list) else [decoded]
        assert events
        for event in events:
            assert isinstance(event, WatermarkEvent)
            assert event.topic and event.subscription and event.partition >= -1
            assert event.event_time is None or 0 <= event.event_time < EVENT_TIME_LIMIT
            assert len(event.position) == 2
            assert isinstance(event.idle, tuple)
            assert all(isinstance(name, str) for name in event.idle)
            assert all(isinstance(name, str) and isinstance(t, int) for name, t in event.active.items())


HEADS = st.builds(
    HeadWatermark,
    st.text(min_size=1, max_size=12),
    st.integers(-1, 64),
    st.tuples(st.integers(-1, 2**40), st.integers(-1, 2**40)),
    st.integers(0, EVENT_TIME_LIMIT - 1),
)


TABLES_WITH_HEADS = (
    st.tuples(st.lists(EVENTS, min_size=1, max_size=3), HEADS)
    .map(lambda table: encode_table(table[0], [table[1]]))
    .flatmap(mutated)
)


@FUZZ
@given(PAYLOAD_OBJECTS | HEADS.map(encode_head).flatmap(mutated) | HOSTILE_TABLES | TABLES_WITH_HEADS)
def test_the_head_decoders_raise_only_malformed_marker_whatever_comes_in(payload: Any) -> None:
    for decode in (lambda payload: [decode_head(payload)], lambda payload: decode_table_with_heads(payload)[1]):
        try:
            heads = decode(payload)
        except MalformedMarker as exc:
            assert exc.reason in MARKER_REASONS | {"bad-event"}
            continue
        for head in heads:
            assert isinstance(head, HeadWatermark) and head.topic and head.partition >= -1
            assert 0 <= head.event_time < EVENT_TIME_LIMIT
            assert len(head.position) == 2 and all(isinstance(p, int) for p in head.position)


# -- logs that mix valid and malformed markers, fed as the generator feeds them --------------------------

PRODUCERS = ("p1", "p2", "p3")
GENERATOR = "__wm_generator-fuzz"


@dataclass(frozen=True)
class Message:
    """A message as a component reads it from a partition."""

    properties: dict[str, Any]
    payload: Any
    producer: str
    publish_time: int


@st.composite
def hostile_logs(draw: st.DrawFn) -> tuple[WatermarkConfig, list[Message]]:
    config = draw(st.builds(WatermarkConfig, st.integers(1, 20_000), st.integers(1, 20_000)))
    publish = draw(st.integers(0, 1_000))
    messages = []
    for _ in range(draw(st.integers(0, 40))):
        publish = max(0, publish + draw(st.integers(-2_000, 8_000)))
        producer = draw(st.sampled_from(PRODUCERS))
        what = draw(st.sampled_from(["data", "set", "set", "set", "idle", "commit", "abort", "snapshot", "bad"]))
        txn = draw(st.none() | st.sampled_from(["a", "b"]))
        properties: dict[str, Any] = {}
        payload: Any = b"data"
        if what == "set":
            properties[MARKER_PROPERTY] = "W_SET"
            payload = encode_set(draw(st.integers(0, 10_000)), txn)
        elif what == "idle":
            properties[MARKER_PROPERTY] = "W_IDLE"
            payload = encode_idle(txn)
        elif what in ("commit", "abort"):
            properties[MARKER_PROPERTY] = "W_TXN_COMMIT" if what == "commit" else "W_TXN_ABORT"
            payload = (encode_txn_commit if what == "commit" else encode_txn_abort)(txn or "a")
        elif what == "snapshot":
            properties[MARKER_PROPERTY] = "W_SNAPSHOT"
            producer = draw(st.sampled_from([GENERATOR, producer]))
            state = draw(VALUES.filter(lambda v: isinstance(v, dict)) | st.just({"v": 1}))
            body = pack({"topic": SNAPSHOT_TOPIC, "state": state})
            payload = KEYS.seal(body) if draw(st.booleans()) else body  # signed (a generator's) or forged
        elif what == "bad":
            properties[MARKER_PROPERTY] = draw(PROPERTY_VALUES)
            payload = draw(PAYLOAD_OBJECTS)
        if properties and draw(st.integers(0, 3)) == 0:
            payload = draw(mutated(payload)) if isinstance(payload, bytes) else payload
        messages.append(Message(properties, payload, producer, publish))
    return config, messages


@dataclass
class Fed:
    """What a component ends up with after reading a log: the states along it and what it skipped."""

    states: list[WatermarkState]
    applied: list[Marker]
    skipped: dict[str, int]
    unusable_snapshots: int


def feed(config: WatermarkConfig, messages: list[Message]) -> Fed:
    """Decode each message, skip (and count) malformed markers and unusable snapshots, fold the rest."""
    state = WatermarkState.initial(config)
    fed = Fed([state], [], {}, 0)
    for index, message in enumerate(messages):
        position = (1, index, -1)
        try:
            marker = decode_marker(
                message.properties, message.payload, message.producer, position, message.publish_time
            )
        except MalformedMarker as exc:
            fed.skipped[exc.reason] = fed.skipped.get(exc.reason, 0) + 1
            continue
        if marker is None:
            continue
        if marker.kind is MarkerKind.W_SNAPSHOT and marker.producer == GENERATOR:
            try:  # as the generator indexes a trusted snapshot: restorable or skipped
                decode_snapshot(marker, config, keys=KEYS, topic=SNAPSHOT_TOPIC)
            except MalformedMarker as exc:
                assert exc.reason in ("bad-snapshot", BAD_SIGNATURE) or exc.reason in MARKER_REASONS
                fed.unusable_snapshots += 1
        state = state.apply(marker)
        fed.states.append(state)
        fed.applied.append(marker)
    return fed


def assert_consistent(state: WatermarkState) -> None:
    """The invariants of every folded state (what `from_dict` checks, and more)."""
    again = decode_snapshot_payload(encode_snapshot(state, keys=KEYS, topic=SNAPSHOT_TOPIC))
    assert again == state and state_to_dict(again) == state_to_dict(state)
    if state.clock is None:
        assert state.watermark is None and not state.producers and not state.pending_txns
        return
    for record in state.producers.values():
        assert record.last_seen <= state.clock
        assert record.event_time is None or 0 <= record.event_time < EVENT_TIME_LIMIT
    for (producer, txn), held in state.pending_txns.items():
        assert producer in state.producers and txn
        assert held.started <= state.clock
        assert state.clock - held.started <= state.config.txn_timeout_ms
        assert (held.kind, held.event_time is None) in ((MarkerKind.W_SET, False), (MarkerKind.W_IDLE, True))
    active = state.active_producers()
    assert set(active) <= set(state.producers)
    assert not set(active) & set(state.idle_producers())
    assert not set(active) & set(state.expired_producers())


def decode_snapshot_payload(payload: bytes) -> WatermarkState:
    """The state a signed W_SNAPSHOT payload carries (also one without a position, as the initial state has)."""
    marker = decode_marker({MARKER_PROPERTY: "W_SNAPSHOT"}, payload, GENERATOR, (9, 9, -1), 0)
    assert marker is not None and marker.body is not None
    return state_from_dict(KEYS.unseal(marker.body, SNAPSHOT_TOPIC).get("state"))  # type: ignore[arg-type]


@FUZZ
@given(hostile_logs())
def test_a_log_mixing_valid_and_malformed_markers_keeps_the_state_consistent(
    case: tuple[WatermarkConfig, list[Message]],
) -> None:
    config, messages = case
    fed = feed(config, messages)
    asserted: set[int] = set()
    for marker, (before, after) in zip(fed.applied, pairwise(fed.states), strict=True):
        assert_consistent(after)
        if marker.kind is MarkerKind.W_SET:
            asserted.add(marker.event_time)  # type: ignore[arg-type]
        if before.watermark is not None:
            assert after.watermark is not None and after.watermark >= before.watermark, "the watermark went back"
        if after.watermark != before.watermark:
            active = after.active_producers()
            assert active and after.watermark == min(active.values()), "moved, but not to the minimum of the active"
        assert after.watermark is None or after.watermark in asserted, "a watermark nobody asserted"
    # a skipped marker is as if it was never there: the same fold without it gives the same states
    clean = [m for m in messages if _decodes(m)]
    assert [s.watermark for s in feed(config, clean).states] == [s.watermark for s in fed.states]


def _decodes(message: Message) -> bool:
    try:
        decode_marker(message.properties, message.payload, message.producer, (0, 0, -1), message.publish_time)
    except MalformedMarker:
        return False
    return True


@FUZZ
@given(hostile_logs(), st.data())
def test_restoring_from_any_snapshot_of_a_hostile_log_resumes_the_same_fold(
    case: tuple[WatermarkConfig, list[Message]], data: st.DataObject
) -> None:
    """A generator that restarts anywhere (from the snapshot it wrote there) continues exactly."""
    config, messages = case
    fed = feed(config, messages)
    assume(fed.applied)
    cut = data.draw(st.integers(0, len(fed.applied)))
    restored = decode_snapshot_payload(encode_snapshot(fed.states[cut], keys=KEYS, topic=SNAPSHOT_TOPIC))
    for marker, expected in zip(fed.applied[cut:], fed.states[cut + 1 :], strict=True):
        restored = restored.apply(marker)
        assert restored == expected


# -- hostile snapshots -----------------------------------------------------------------------------------


@st.composite
def corrupted_snapshots(draw: st.DrawFn) -> Any:
    """A real state's to_dict() payload, corrupted as bytes and then signed (a generator's bug, not a forgery: those
    stop at the signature); or the state map with one value of another type."""
    config, messages = draw(hostile_logs())
    state = state_to_dict(feed(config, messages).states[-1])
    if draw(st.booleans()):
        return KEYS.seal(draw(mutated(pack({"topic": SNAPSHOT_TOPIC, "state": state}))))
    key = draw(st.sampled_from(sorted(state)))
    state[key] = draw(VALUES | st.builds(datetime.datetime.fromtimestamp, st.integers(0, 2**31)))
    return state


# Found by this test: a snapshot holding a transaction already past the recorded txn_timeout_ms (which no
# fold can produce: the fold drops it at once) was accepted by from_dict.
EXPIRED_PENDING = KEYS.seal(pack({"topic": SNAPSHOT_TOPIC, "state": {
    "v": 1, "config": {"producer_timeout_ms": 256, "txn_timeout_ms": 128}, "position": [1, 2, -1], "clock": 256,
    "watermark": 0, "producers": {"p1": {"event_time": 0, "idle": False, "last_seen": 256}},
    "pending": [{"producer": "p1", "txn": "a", "kind": "W_SET", "event_time": 0, "started": 0}],
}}))  # fmt: skip


@FUZZ
@given(corrupted_snapshots())
@example(EXPIRED_PENDING)
def test_a_corrupted_snapshot_is_restored_exactly_or_rejected_as_bad_snapshot(snapshot: Any) -> None:
    try:
        restored = state_from_dict(snapshot) if isinstance(snapshot, dict) else decode_snapshot_payload(snapshot)
    except MalformedMarker as exc:
        assert exc.reason in MARKER_REASONS | {"bad-snapshot", BAD_SIGNATURE}
        return
    assert_consistent(restored)
