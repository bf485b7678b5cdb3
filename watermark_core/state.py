"""The watermark state machine of ONE topic partition: markers in, an immutable state out.

`state.apply(marker)` returns a new value, so the state at a position is a pure function of the
markers up to it and the configuration, whoever computes it, before or after a restart. Each policy
is one small named function below:

- assertions (`_assert`): a producer's latest W_SET is its assertion; W_IDLE keeps it but takes the
  producer out until its next W_SET;
- the log clock (`_tick`): the largest publish time of the markers applied so far, W_SNAPSHOT
  excepted, so that timeouts are decided by the log and not by a wall clock;
- producer timeout (`_is_expired`, `_renew`): a producer silent on the log clock for longer than
  `producer_timeout_ms` is not active; any new marker of it renews it;
- forgetting (`_forget`): a producer out of the set (idle, or timed out) for longer than
  `producer_retention_ms` on the log clock is dropped, so the state stays bounded however many
  producers come and go; one that comes back starts afresh, as a late joiner;
- transactions (`_transactions`, `_drop_timed_out_txns`): a marker sent inside a watermark
  transaction waits and takes effect at the transaction's W_TXN_COMMIT; W_TXN_ABORT, or no outcome
  within `txn_timeout_ms` on the log clock, discards it;
- late joiners (`_advance`): the watermark only moves up along the log, so a producer that joins
  below it does not pull it back (its messages below it are late);
- snapshots: W_SNAPSHOT changes nothing but the position, so the state does not depend on how
  often the generator snapshots.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from watermark_core.protocol import Marker, MarkerKind, Position

PendingKey = tuple[str, str]
"""(producer, txn): a transaction id belongs to the producer that sent it."""

_Effect = tuple[MarkerKind, int | None]
"""What a marker does to its producer's assertion: (W_SET, event_time) or (W_IDLE, None)."""


@dataclass(frozen=True)
class WatermarkConfig:
    """The configuration the watermark depends on besides the log; every reader must share it."""

    producer_timeout_ms: int = 60_000
    txn_timeout_ms: int = 60_000
    producer_retention_ms: int = 600_000
    """How long a producer out of the set (idle, or timed out) is remembered, on the log clock."""

    def __post_init__(self) -> None:
        for name in ("producer_timeout_ms", "txn_timeout_ms", "producer_retention_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int of milliseconds, got {value!r}")


@dataclass(frozen=True)
class ProducerRecord:
    """One producer as the log knows it.

    `event_time` is its latest assertion (None before its first W_SET); `last_seen` is the log clock
    when its latest marker was applied (not that marker's own publish time, so that a producer whose
    clock lags the others' is not expired the moment it speaks).
    """

    event_time: int | None
    idle: bool
    last_seen: int


@dataclass(frozen=True)
class PendingMarker:
    """The marker a watermark transaction holds (latest wins), and the log clock when it began."""

    kind: MarkerKind
    event_time: int | None
    started: int


def _frozen(mapping: Mapping[Any, Any]) -> Mapping[Any, Any]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class WatermarkState:
    """The fold of one partition's markers up to `position` (None before the first marker).

    `watermark` is None until a producer first asserts; `clock` is the log clock (None before the
    first marker that is not a snapshot).
    """

    config: WatermarkConfig = field(default_factory=WatermarkConfig)
    position: Position | None = None
    clock: int | None = None
    watermark: int | None = None
    producers: Mapping[str, ProducerRecord] = field(default_factory=dict)
    pending_txns: Mapping[PendingKey, PendingMarker] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Read-only copies: a value that is shared between readers must not change under them.
        object.__setattr__(self, "producers", _frozen(self.producers))
        object.__setattr__(self, "pending_txns", _frozen(self.pending_txns))

    @classmethod
    def initial(cls, config: WatermarkConfig | None = None) -> WatermarkState:
        """The state before any marker."""
        return cls(config=config or WatermarkConfig())

    # -- the transition ------------------------------------------------------------------------------

    def apply(self, marker: Marker) -> WatermarkState:
        """The state after `marker`; a marker at or before `self.position` is a caller bug (ValueError)."""
        if self.position is not None and marker.position <= self.position:
            raise ValueError(f"marker at {marker.position} applied after position {self.position}: apply in log order")
        _check_marker(marker)
        if marker.kind is MarkerKind.W_SNAPSHOT:
            return self._made(marker.position, self.clock, self.watermark, self.producers, self.pending_txns)
        clock = _tick(self.clock, marker.publish_time)
        pending = _drop_timed_out_txns(self.pending_txns, clock, self.config.txn_timeout_ms)
        effect = _transactions(marker, pending, clock)
        producers = _forget(self.producers, pending, clock, self.config)
        producers[marker.producer] = _assert(_renew(producers.get(marker.producer), clock), effect)
        watermark = _advance(self.watermark, _active(producers, clock, self.config.producer_timeout_ms))
        return self._made(marker.position, clock, watermark, MappingProxyType(producers), MappingProxyType(pending))

    def advanced_to(self, position: Position) -> WatermarkState:
        """The same fold, stated at a later `position` the caller has read up to without meeting a marker.

        Data messages do not change the state, so this is exact; the generator snapshots the state
        advanced to its read position, so that a reader restoring it resumes there and never
        re-reads the data between the last marker and the snapshot.
        """
        if self.position is not None and position < self.position:
            raise ValueError(f"cannot move the state at {self.position} back to {position}")
        return self._made(position, self.clock, self.watermark, self.producers, self.pending_txns)

    def _made(
        self,
        position: Position,
        clock: int | None,
        watermark: int | None,
        producers: Mapping[str, ProducerRecord],
        pending_txns: Mapping[PendingKey, PendingMarker],
    ) -> WatermarkState:
        """The next state, from read-only mappings nobody else can change (this state's, or fresh ones behind a
        `MappingProxyType`): the constructor's copies skipped, as `apply` runs for every marker of every
        subscription."""
        state = object.__new__(WatermarkState)
        put = object.__setattr__
        put(state, "config", self.config)
        put(state, "position", position)
        put(state, "clock", clock)
        put(state, "watermark", watermark)
        put(state, "producers", producers)
        put(state, "pending_txns", pending_txns)
        return state

    # -- views ---------------------------------------------------------------------------------------

    def active_producers(self) -> dict[str, int]:
        """The producers that hold the watermark: name -> asserted event time."""
        if self.clock is None:
            return {}
        return dict(sorted(_active(self.producers, self.clock, self.config.producer_timeout_ms).items()))

    def idle_producers(self) -> list[str]:
        """Producers out by W_IDLE (and not expired)."""
        return sorted(name for name, r in self.producers.items() if r.idle and not self._expired(r))

    def expired_producers(self) -> list[str]:
        """Producers silent for longer than the producer timeout; their next marker renews them."""
        return sorted(name for name, r in self.producers.items() if self._expired(r))

    def pending(self) -> dict[PendingKey, PendingMarker]:
        """Open watermark transactions: (producer, txn) -> the marker their commit would apply."""
        return dict(sorted(self.pending_txns.items()))

    def _expired(self, record: ProducerRecord) -> bool:
        return self.clock is not None and _is_expired(record, self.clock, self.config.producer_timeout_ms)


def apply_all(state: WatermarkState, markers: Iterable[Marker]) -> WatermarkState:
    """The state after all `markers`, in order."""
    for marker in markers:
        state = state.apply(marker)
    return state


def is_broken_assertion(state: WatermarkState, producer: str, event_time: int) -> bool:
    """A data message below its own producer's latest W_SET: the producer broke its promise (count it)."""
    record = state.producers.get(producer)
    return record is not None and record.event_time is not None and event_time < record.event_time


# -- the policies -----------------------------------------------------------------------------------------


def _check_marker(marker: Marker) -> None:
    """A hand-built Marker must look like a decoded one."""
    if marker.kind is MarkerKind.W_SET and marker.event_time is None:
        raise ValueError("a W_SET marker needs an event_time")
    if marker.kind in (MarkerKind.W_TXN_COMMIT, MarkerKind.W_TXN_ABORT) and marker.txn is None:
        raise ValueError(f"a {marker.kind} marker needs a txn")


def _tick(clock: int | None, publish_time: int) -> int:
    """The log clock: the largest publish time so far, so it never goes back when a producer's clock lags."""
    return publish_time if clock is None else max(clock, publish_time)


def _renew(record: ProducerRecord | None, clock: int) -> ProducerRecord:
    """Producer timeout: any marker of a producer (re)starts its timeout at the log clock."""
    if record is None:
        return ProducerRecord(None, False, clock)
    return ProducerRecord(record.event_time, record.idle, clock)  # not `dataclasses.replace`: 5x slower, per marker


def _is_expired(record: ProducerRecord, clock: int, timeout_ms: int) -> bool:
    """Producer timeout: a producer that died without W_IDLE stops holding the watermark back."""
    return clock - record.last_seen > timeout_ms


def _forget(
    producers: Mapping[str, ProducerRecord],
    pending: Mapping[PendingKey, PendingMarker],
    clock: int,
    config: WatermarkConfig,
) -> dict[str, ProducerRecord]:
    """Forgetting: drop producers out of the set for longer than the retention on the log clock.

    Out since: its W_IDLE (or its last marker, if it never asserted), or the moment its producer
    timeout ran out. A producer that takes no part does not hold the watermark, so dropping it
    changes no watermark; if it comes back, it starts afresh like a new producer (a late joiner: its
    W_SET below the watermark does not pull it back). One with an open transaction is kept until
    the transaction ends or times out.
    """
    holding = {producer for producer, _ in pending}
    kept = {}
    for name, record in producers.items():
        out_since = record.last_seen
        if record.event_time is not None and not record.idle:
            out_since += config.producer_timeout_ms
        if name in holding or clock - out_since <= config.producer_retention_ms:
            kept[name] = record
    return kept


def _drop_timed_out_txns(
    pending: Mapping[PendingKey, PendingMarker], clock: int, timeout_ms: int
) -> dict[PendingKey, PendingMarker]:
    """Transactions: one with no outcome within its timeout on the log clock is discarded."""
    return {key: held for key, held in pending.items() if clock - held.started <= timeout_ms}


def _transactions(marker: Marker, pending: dict[PendingKey, PendingMarker], clock: int) -> _Effect | None:
    """Transactions: what `marker` asserts now; a marker inside a transaction waits in `pending`.

    Inside one transaction the latest marker wins; COMMIT applies it as if it were sent at the
    commit; ABORT drops it; a commit of an unknown or timed-out transaction does nothing.
    """
    if marker.kind in (MarkerKind.W_SET, MarkerKind.W_IDLE):
        if marker.txn is None:
            return (marker.kind, marker.event_time)
        key = (marker.producer, marker.txn)
        started = pending[key].started if key in pending else clock
        pending[key] = PendingMarker(marker.kind, marker.event_time, started)
        return None
    held = pending.pop((marker.producer, marker.txn or ""), None)
    if held is None or marker.kind is MarkerKind.W_TXN_ABORT:
        return None
    return (held.kind, held.event_time)


def _assert(record: ProducerRecord, effect: _Effect | None) -> ProducerRecord:
    """Assertions and idling: W_SET replaces the assertion and ends idling; W_IDLE keeps it but idles."""
    if effect is None:
        return record
    kind, event_time = effect
    if kind is MarkerKind.W_SET:
        return ProducerRecord(event_time, False, record.last_seen)
    return ProducerRecord(record.event_time, True, record.last_seen)


def _active(producers: Mapping[str, ProducerRecord], clock: int, timeout_ms: int) -> dict[str, int]:
    """Producers that take part: asserted, not idle, not expired."""
    return {
        name: r.event_time
        for name, r in producers.items()
        if r.event_time is not None and not r.idle and not _is_expired(r, clock, timeout_ms)
    }


def _advance(watermark: int | None, active: Mapping[str, int]) -> int | None:
    """Late joiners: the minimum over active producers, never below the previous watermark.

    With no active producer there is no new watermark and the previous one holds.
    """
    if not active:
        return watermark
    candidate = min(active.values())
    return candidate if watermark is None else max(watermark, candidate)
