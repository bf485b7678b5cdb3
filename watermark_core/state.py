"""The watermark state machine of one topic partition: markers in, state and watermark out.

Pure and immutable: `state.apply(marker)` returns a new state, so the state at a position is a
function of the markers up to it and the configuration, whoever computes it. Each policy is a small
named piece:

- assertions: a producer's latest `W_SET` is its assertion; `W_IDLE` leaves it out until the next one;
- producer timeout: a producer whose latest marker is older than `producer_timeout_ms` on the
  log's own clock (the largest publish time of the markers so far) is forgotten, as if it had
  never spoken, so a producer that died without `W_IDLE` stops holding the watermark back;
- transactions: a marker sent inside a watermark transaction waits until its `W_TXN_COMMIT` and
  takes effect there; `W_TXN_ABORT` or `txn_timeout_ms` on the log's clock discards it;
- late joiners: the watermark only moves up along the log, so a producer that joins below it
  does not pull it back (its messages below it are late);
- snapshots: `W_SNAPSHOT` records change nothing, so the state does not depend on how often the
  generator snapshots.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from watermark_core.protocol import PROTOCOL_VERSION, MalformedMarker, Marker, MarkerKind, Position


@dataclass(frozen=True)
class WatermarkConfig:
    """The configuration the watermark depends on, besides the log."""

    producer_timeout_ms: int = 60_000
    txn_timeout_ms: int = 60_000

    def __post_init__(self) -> None:
        for name in ("producer_timeout_ms", "txn_timeout_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer of milliseconds, got {value!r}")


@dataclass(frozen=True)
class ProducerState:
    """One producer's latest assertion (None before its first `W_SET`) and liveness."""

    event_time: int | None
    idle: bool
    last_seen: int


@dataclass(frozen=True)
class PendingMarker:
    """A marker sent inside a watermark transaction, waiting for the transaction's outcome."""

    kind: MarkerKind
    event_time: int | None
    started: int


@dataclass(frozen=True)
class WatermarkState:
    """The fold of a partition's markers up to `position`."""

    config: WatermarkConfig = field(default_factory=WatermarkConfig)
    position: Position | None = None
    clock: int | None = None
    watermark: int | None = None
    producers: Mapping[str, ProducerState] = field(default_factory=dict)
    pending_txns: Mapping[tuple[str, str], PendingMarker] = field(default_factory=dict)

    @classmethod
    def initial(cls, config: WatermarkConfig | None = None) -> WatermarkState:
        return cls(config=config or WatermarkConfig())

    # -- the transition ------------------------------------------------------------------------------

    def apply(self, marker: Marker) -> WatermarkState:
        """The state after `marker`; markers must come in increasing position."""
        if self.position is not None and marker.position <= self.position:
            raise ValueError(f"marker at {marker.position} applied after position {self.position}")
        if marker.kind is MarkerKind.W_SNAPSHOT:
            return replace(self, position=marker.position)
        clock = marker.publish_time if self.clock is None else max(self.clock, marker.publish_time)
        producers = dict(self.producers)
        pending = _drop_expired_txns(self.pending_txns, clock, self.config.txn_timeout_ms)
        _apply_marker(producers, pending, marker)
        producers = _forget_expired_producers(producers, clock, self.config.producer_timeout_ms)
        watermark = _advance(self.watermark, producers)
        return WatermarkState(self.config, marker.position, clock, watermark, producers, pending)

    # -- views ---------------------------------------------------------------------------------------

    def active_producers(self) -> dict[str, int]:
        """Producers whose assertion holds the watermark: name -> asserted event time."""
        return {
            name: p.event_time
            for name, p in sorted(self.producers.items())
            if not p.idle and p.event_time is not None
        }

    def idle_producers(self) -> list[str]:
        return sorted(name for name, p in self.producers.items() if p.idle)

    def pending(self) -> dict[tuple[str, str], PendingMarker]:
        return dict(self.pending_txns)

    # -- snapshot and restore ------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A msgpack-able value that `from_dict` turns back into an equal state."""
        return {
            "v": PROTOCOL_VERSION,
            "config": {
                "producer_timeout_ms": self.config.producer_timeout_ms,
                "txn_timeout_ms": self.config.txn_timeout_ms,
            },
            "position": list(self.position) if self.position is not None else None,
            "clock": self.clock,
            "watermark": self.watermark,
            "producers": {
                name: [p.event_time, p.idle, p.last_seen] for name, p in sorted(self.producers.items())
            },
            "pending": [
                [producer, txn, m.kind.value, m.event_time, m.started]
                for (producer, txn), m in sorted(self.pending_txns.items())
            ],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], config: WatermarkConfig | None = None) -> WatermarkState:
        """Restore a snapshot; `config` (the reader's configuration) wins over the recorded one."""
        try:
            if data["v"] != PROTOCOL_VERSION:
                raise ValueError(f"snapshot version {data['v']!r}")
            recorded = data["config"]
            config = config or WatermarkConfig(
                int(recorded["producer_timeout_ms"]), int(recorded["txn_timeout_ms"])
            )
            position = data["position"]
            producers = {
                str(name): ProducerState(_opt_int(values[0]), _bool(values[1]), _int(values[2]))
                for name, values in dict(data["producers"]).items()
            }
            pending = {
                (str(p), str(t)): PendingMarker(MarkerKind(kind), _opt_int(event_time), _int(started))
                for p, t, kind, event_time, started in data["pending"]
            }
            return cls(
                config=config,
                position=None
                if position is None
                else (_int(position[0]), _int(position[1]), _int(position[2])),
                clock=_opt_int(data["clock"]),
                watermark=_opt_int(data["watermark"]),
                producers=producers,
                pending_txns=pending,
            )
        except MalformedMarker:
            raise
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise MalformedMarker("bad-snapshot", f"snapshot state is not valid ({exc!r})") from exc


def apply_all(state: WatermarkState, markers: Iterable[Marker]) -> WatermarkState:
    for marker in markers:
        state = state.apply(marker)
    return state


def is_broken_assertion(state: WatermarkState, producer: str, event_time: int) -> bool:
    """A data message below its own producer's latest `W_SET`: the producer broke its promise."""
    known = state.producers.get(producer)
    return known is not None and known.event_time is not None and event_time < known.event_time


# -- the policies -----------------------------------------------------------------------------------------


def _apply_marker(
    producers: dict[str, ProducerState], pending: dict[tuple[str, str], PendingMarker], marker: Marker
) -> None:
    """Assertions, idling and transactions: what one marker does to its own producer."""
    name = marker.producer
    previous = producers.get(name)
    last_seen = marker.publish_time if previous is None else max(previous.last_seen, marker.publish_time)
    current = previous or ProducerState(None, False, last_seen)
    if marker.kind in (MarkerKind.W_SET, MarkerKind.W_IDLE) and marker.txn is not None:
        key = (name, marker.txn)
        started = pending[key].started if key in pending else marker.publish_time
        pending[key] = PendingMarker(marker.kind, marker.event_time, started)
        producers[name] = replace(current, last_seen=last_seen)
        return
    effect: tuple[MarkerKind, int | None] | None = (marker.kind, marker.event_time)
    if marker.kind in (MarkerKind.W_TXN_COMMIT, MarkerKind.W_TXN_ABORT):
        committed = pending.pop((name, marker.txn or ""), None)
        effect = (
            (committed.kind, committed.event_time)
            if committed and marker.kind is MarkerKind.W_TXN_COMMIT
            else None
        )
    if effect is None:
        producers[name] = replace(current, last_seen=last_seen)
    elif effect[0] is MarkerKind.W_SET:
        producers[name] = ProducerState(effect[1], False, last_seen)
    else:
        producers[name] = ProducerState(current.event_time, True, last_seen)


def _drop_expired_txns(
    pending: Mapping[tuple[str, str], PendingMarker], clock: int, timeout_ms: int
) -> dict[tuple[str, str], PendingMarker]:
    """A transaction with no outcome within its timeout is discarded."""
    return {key: m for key, m in pending.items() if clock - m.started <= timeout_ms}


def _forget_expired_producers(
    producers: dict[str, ProducerState], clock: int, timeout_ms: int
) -> dict[str, ProducerState]:
    """A producer silent for longer than the timeout is forgotten, as if it had never spoken."""
    return {name: p for name, p in producers.items() if clock - p.last_seen <= timeout_ms}


def _advance(watermark: int | None, producers: Mapping[str, ProducerState]) -> int | None:
    """The minimum over active producers; it never goes back, and holds when nobody is active."""
    active = [p.event_time for p in producers.values() if not p.idle and p.event_time is not None]
    if not active:
        return watermark
    candidate = min(active)
    return candidate if watermark is None else max(watermark, candidate)


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _opt_int(value: Any) -> int | None:
    return None if value is None else _int(value)


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected a boolean, got {value!r}")
    return value
