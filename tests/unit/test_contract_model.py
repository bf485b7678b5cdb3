"""The state machine's watermark against a reference written from the contract's words, not from the code.

Issue #17: the property "the watermark is never above an active producer's assertion" was checked
with the code's own `active_producers()`, so a bug in it would hide itself. The reference below
uses nothing from `watermark_core.state`. It is written from the contract (section 1 and 2) and,
where the contract leaves the mechanics open, from docs/PROTOCOL.md:

- a producer's assertion is its latest W_SET; W_IDLE takes it out until its next W_SET; a producer
  that never sent W_SET takes no part (contract 1);
- a marker sent inside a watermark transaction takes effect at the transaction's commit, from the
  same producer; abort, or no outcome within the transaction timeout, discards it; inside one
  transaction the latest marker wins (contract 2, PROTOCOL 5);
- the log clock is the largest publish time of the markers so far, snapshots excepted; a producer
  is out when the log clock moved more than the producer timeout past its latest marker (any
  marker of it but a snapshot), and a transaction when it moved more than the transaction timeout
  past the transaction's first marker (contract 1 "decided in a way that keeps the rule above",
  PROTOCOL 4; snapshots change nothing, PROTOCOL 6);
- a producer out (idle, never asserted, or timed out) for longer than the retention on the log
  clock, with no transaction open, is forgotten: what it asserted before no longer counts, and if
  it comes back it starts afresh (contract 1: "a forgotten producer that returns is a late joiner");
- the watermark at a position is the minimum over the active producers' assertions, never going
  back along the log (late joiners do not pull it back), and without active producers the last
  one holds (contract 1). Written here without a fold: the largest such minimum at any position
  up to this one.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.unit.test_state_properties import RELAXED, RandomLog, at_positions, fold, random_logs
from watermark_core.protocol import Marker, MarkerKind
from watermark_core.state import WatermarkConfig, WatermarkState

pytestmark = pytest.mark.unit


@dataclass(frozen=True)
class Effect:
    """A marker that changes its producer's assertion, at the index of the log where it does."""

    index: int
    producer: str
    kind: MarkerKind  # W_SET or W_IDLE
    event_time: int | None


def log_clocks(markers: list[Marker]) -> list[int | None]:
    """The log clock after each marker: the largest publish time so far, snapshots excepted."""
    clocks: list[int | None] = []
    for i in range(len(markers)):
        times = [m.publish_time for m in markers[: i + 1] if m.kind is not MarkerKind.W_SNAPSHOT]
        clocks.append(max(times) if times else None)
    return clocks


def effects(
    markers: list[Marker], clocks: list[int | None], txn_timeout_ms: int
) -> tuple[list[Effect], list[set[str]]]:
    """Plain W_SET/W_IDLE where they are; a transaction's latest marker at its commit, if still open.

    Also, after each marker, the producers with a transaction still open.
    """
    found: list[Effect] = []
    holding: list[set[str]] = []
    open_txns: dict[tuple[str, str], tuple[int, Marker]] = {}  # (producer, txn) -> (clock at its first, latest)
    for i, marker in enumerate(markers):
        clock = clocks[i]
        holding.append({producer for producer, _ in open_txns})
        if marker.kind is MarkerKind.W_SNAPSHOT or clock is None:
            continue
        # Timed out: no outcome within the timeout, on the log clock including this marker.
        open_txns = {key: held for key, held in open_txns.items() if clock - held[0] <= txn_timeout_ms}
        if marker.kind in (MarkerKind.W_SET, MarkerKind.W_IDLE):
            if marker.txn is None:
                found.append(Effect(i, marker.producer, marker.kind, marker.event_time))
            else:
                key = (marker.producer, marker.txn)
                began = open_txns[key][0] if key in open_txns else clock
                open_txns[key] = (began, marker)
        elif marker.txn is not None:  # an outcome: only the producer's own transaction of that id
            held = open_txns.pop((marker.producer, marker.txn), None)
            if held is not None and marker.kind is MarkerKind.W_TXN_COMMIT:
                found.append(Effect(i, marker.producer, held[1].kind, held[1].event_time))
        holding[i] = {producer for producer, _ in open_txns}
    return found, holding


@dataclass(frozen=True)
class Reference:
    watermarks: list[int | None]
    active: list[dict[str, int]]


def reference(markers: list[Marker], config: WatermarkConfig) -> Reference:
    """For each position: the active producers with their assertions, and the watermark."""
    clocks = log_clocks(markers)
    applied, holding = effects(markers, clocks, config.txn_timeout_ms)

    def spoke(producer: str, since: int, upto: int) -> list[int]:
        # A snapshot is the generator's record, not a sign of life of whoever wrote it.
        return [j for j in range(since, upto + 1)
                if markers[j].producer == producer and markers[j].kind is not MarkerKind.W_SNAPSHOT]  # fmt: skip

    def latest(producer: str, since: int, upto: int) -> Effect | None:
        mine = [e for e in applied if e.producer == producer and since <= e.index <= upto]
        return mine[-1] if mine else None

    known: dict[str, int] = {}  # producer -> the index its memory starts at (its first marker, or since forgotten)
    active: list[dict[str, int]] = []
    for i, clock in enumerate(clocks):
        marker = markers[i]
        if marker.kind is not MarkerKind.W_SNAPSHOT and clock is not None:
            for producer, since in list(known.items()):
                # Forgotten: out (idle or never asserted: since its latest marker; asserted: since that plus the
                # producer timeout) for longer than the retention on the log clock, with no transaction open.
                heard = clocks[max(spoke(producer, since, i - 1))]
                effect = latest(producer, since, i - 1)
                assert heard is not None
                out_since = heard + (config.producer_timeout_ms if effect and effect.kind is MarkerKind.W_SET else 0)
                if producer not in holding[i] and clock - out_since > config.producer_retention_ms:
                    del known[producer]  # if it comes back, it starts afresh
            known.setdefault(marker.producer, i)
        now: dict[str, int] = {}
        for producer, since in known.items():
            effect = latest(producer, since, i)
            if effect is None or effect.kind is not MarkerKind.W_SET:
                continue  # never asserted (since forgotten), or idle since
            heard_at = clocks[max(spoke(producer, since, i))]
            assert clock is not None and heard_at is not None
            if clock - heard_at > config.producer_timeout_ms:
                continue  # silent for longer than the timeout on the log clock
            assert effect.event_time is not None
            now[producer] = effect.event_time
        active.append(now)
    candidates = [min(a.values()) if a else None for a in active]
    watermarks = []
    for i in range(len(markers)):
        seen = [c for c in candidates[: i + 1] if c is not None]
        watermarks.append(max(seen) if seen else None)
    return Reference(watermarks, active)


# -- logs aimed at the edges: timeouts hit exactly, transactions reused, publish times going back ---------

PRODUCERS = ("p1", "p2", "p3")
TIMEOUT = 100  # both timeouts; publish times move in steps around it


@st.composite
def edge_logs(draw: st.DrawFn) -> RandomLog:
    config = WatermarkConfig(
        draw(st.sampled_from([TIMEOUT, 2 * TIMEOUT])), draw(st.sampled_from([TIMEOUT, 50])),
        draw(st.sampled_from([50, TIMEOUT, 10**9])),
    )  # fmt: skip
    publish = 0
    markers = []
    for _ in range(draw(st.integers(0, 25))):
        publish = max(0, publish + draw(st.sampled_from([0, 1, 49, 50, 51, 99, 100, 101, -30, -100])))
        producer = draw(st.sampled_from(PRODUCERS))
        kind = draw(
            st.sampled_from(
                [MarkerKind.W_SET] * 3 + [MarkerKind.W_IDLE, MarkerKind.W_TXN_COMMIT, MarkerKind.W_TXN_ABORT]
                + [MarkerKind.W_SNAPSHOT]
            )
        )  # fmt: skip
        if kind is MarkerKind.W_SNAPSHOT:  # also written by a producer: it changes nothing either
            writer = draw(st.sampled_from(["__wm_generator", producer]))
            markers.append(Marker(kind, writer, (0, 0, -1), 10**9, body={"state": {}}))
            continue
        txn = draw(st.sampled_from(["t", "u"])) if kind in (MarkerKind.W_TXN_COMMIT, MarkerKind.W_TXN_ABORT) else None
        if kind in (MarkerKind.W_SET, MarkerKind.W_IDLE):
            txn = draw(st.sampled_from([None, None, "t", "u"]))
        event_time = draw(st.integers(0, 20)) * 10 if kind is MarkerKind.W_SET else None
        markers.append(Marker(kind, producer, (0, 0, -1), publish, event_time, txn))
    return RandomLog(config, at_positions(markers))


def check(log: RandomLog) -> None:
    states = fold(log.markers, WatermarkState.initial(log.config))[1:]
    expected = reference(log.markers, log.config)
    for i, state in enumerate(states):
        assert state.watermark == expected.watermarks[i], (i, log.markers[: i + 1], expected.active[i])
        assert state.active_producers() == expected.active[i], (i, log.markers[: i + 1])
    for i in range(1, len(states)):
        if states[i].watermark != states[i - 1].watermark:  # it moved: to the minimum of the active assertions
            assert expected.active[i] and states[i].watermark == min(expected.active[i].values())


@RELAXED
@given(random_logs())
def test_the_watermark_is_the_contracts_on_random_logs(log: RandomLog) -> None:
    check(log)


def _m(kind: MarkerKind, producer: str, publish: int, event_time: int | None = None, txn: str | None = None) -> Marker:
    return Marker(kind, producer, (0, 0, -1), publish, event_time, txn)


COMMIT_AT_THE_TIMEOUT = RandomLog(  # a commit exactly at the transaction timeout counts; one past it does not
    WatermarkConfig(TIMEOUT, TIMEOUT),
    at_positions([
        _m(MarkerKind.W_SET, "p1", 0, 10, "t"),
        _m(MarkerKind.W_TXN_COMMIT, "p1", TIMEOUT, txn="t"),
        _m(MarkerKind.W_SET, "p2", TIMEOUT, 20, "t"),
        _m(MarkerKind.W_TXN_COMMIT, "p2", 2 * TIMEOUT + 1, txn="t"),
    ]),
)  # fmt: skip
SILENT_FOR_THE_TIMEOUT = RandomLog(  # silent exactly the timeout: active; one ms more: out; any marker renews
    WatermarkConfig(TIMEOUT, TIMEOUT),
    at_positions([
        _m(MarkerKind.W_SET, "p1", 0, 10),
        _m(MarkerKind.W_SET, "p2", TIMEOUT, 30),
        _m(MarkerKind.W_SET, "p2", TIMEOUT + 1, 40),
        _m(MarkerKind.W_TXN_ABORT, "p1", 0, txn="nothing"),
    ]),
)  # fmt: skip

FORGOTTEN_THEN_BACK = RandomLog(  # p1 timed out at 100 and was forgotten 50 later; its abort does not revive 10
    WatermarkConfig(TIMEOUT, TIMEOUT, 50),
    at_positions([
        _m(MarkerKind.W_SET, "p1", 0, 10),
        _m(MarkerKind.W_SET, "p2", 150, 30),
        _m(MarkerKind.W_SET, "p2", 151, 40),
        _m(MarkerKind.W_TXN_ABORT, "p1", 151, txn="nothing"),
        _m(MarkerKind.W_SET, "p2", 152, 50),
    ]),
)  # fmt: skip


@RELAXED
@given(edge_logs())
@example(COMMIT_AT_THE_TIMEOUT)
@example(SILENT_FOR_THE_TIMEOUT)
@example(FORGOTTEN_THEN_BACK)
def test_the_watermark_is_the_contracts_at_the_edges(log: RandomLog) -> None:
    check(log)


def test_the_reference_itself() -> None:
    """The reference on a log worked out by hand."""
    config = WatermarkConfig(producer_timeout_ms=100, txn_timeout_ms=100)
    markers = at_positions([
        _m(MarkerKind.W_SET, "a", 0, 10),  # a asserts 10: watermark 10
        _m(MarkerKind.W_SET, "b", 5, 5),  # a late joiner below: the watermark holds at 10
        _m(MarkerKind.W_SET, "a", 6, 30),  # min(30, 5) = 5 < 10: holds
        _m(MarkerKind.W_IDLE, "b", 7, txn="x"),  # pending
        _m(MarkerKind.W_TXN_COMMIT, "b", 8, txn="x"),  # b idle: 30
        _m(MarkerKind.W_SET, "b", 9, 20),  # b back at 20: holds at 30
        _m(MarkerKind.W_SET, "b", 107, 50),  # a silent 101 > 100: out; only b: 50
        _m(MarkerKind.W_IDLE, "b", 108),  # nobody active: holds
    ])  # fmt: skip
    expected = reference(markers, config)
    assert expected.watermarks == [10, 10, 10, 10, 30, 30, 50, 50]
    assert expected.active[6] == {"b": 50} and expected.active[7] == {}
    assert [s.watermark for s in fold(markers, WatermarkState.initial(config))[1:]] == expected.watermarks
