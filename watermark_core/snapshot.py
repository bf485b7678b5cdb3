"""The W_SNAPSHOT record: the one home of the snapshot format (docs/PROTOCOL.md).

A snapshot states the full `WatermarkState` at a position (pending transactions included), so a
restart, a new subscription or a seek starts from the nearest one instead of the topic's start.
Each snapshot names where the previous one of its partition is (`previous`): the snapshots form a
chain that a reader walks back to the nearest one before any position.

Only generators can write a snapshot that a generator restores from. Any role that may produce on
a data topic can write a W_SNAPSHOT under the generator's producer name (Pulsar binds no producer
name to a role), so a record is trusted only if it is written under a generator's producer name
(`is_generator_snapshot`) *and* carries an HMAC-SHA256, with a key only generator instances hold
(`SnapshotKeys`), over its exact bytes, which name the partition it was written to. A record that
fails this (unsigned, another key, copied from another topic) is skipped like a malformed marker,
with reason "bad-signature". Pure: no I/O; the keys are passed in.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from watermark_core.protocol import (
    EVENT_TIME_LIMIT,
    PROTOCOL_VERSION,
    SNAPSHOT_PRODUCER_PREFIX,
    MalformedMarker,
    Marker,
    MarkerKind,
    Position,
    pack,
    unpack,
)
from watermark_core.state import PendingKey, PendingMarker, ProducerRecord, WatermarkConfig, WatermarkState

SNAPSHOT_KEY_MIN_BYTES = 16
"""The shortest key accepted: 128 bits. `make cluster-up` writes 32 random bytes, hex-encoded."""
BAD_SIGNATURE = "bad-signature"
"""The `MalformedMarker` reason (and metric label) of a snapshot no generator key vouches for."""
_MAC_CONTEXT = b"pulsar-watermarks W_SNAPSHOT\x00"
"""Prefixed to what is signed, so the key signs nothing else by accident."""


def _key_id(key: bytes) -> str:
    """A short public name of a key, for logs: which key signed a snapshot, which keys a generator holds."""
    return hashlib.sha256(b"pulsar-watermarks key id\x00" + key).hexdigest()[:12]


@dataclass(frozen=True)
class SnapshotKeys:
    """The keys generator instances share: the first signs, every one verifies (so a key can be rotated).

    Never printed: `repr` shows only the keys' ids.
    """

    keys: tuple[bytes, ...] = field(repr=False)

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValueError("a snapshot key is needed")
        for key in self.keys:
            if len(key) < SNAPSHOT_KEY_MIN_BYTES:
                raise ValueError(
                    f"a snapshot key must have at least {SNAPSHOT_KEY_MIN_BYTES} bytes, got {len(key)}; create one "
                    "with: python -c 'import secrets; print(secrets.token_hex(32))'"
                )

    @classmethod
    def from_text(cls, text: str) -> SnapshotKeys:
        """One key per non-empty line (surrounding blanks dropped), the signing key first; the keys are the
        lines' UTF-8 bytes."""
        return cls(tuple(line.strip().encode() for line in text.splitlines() if line.strip()))

    @classmethod
    def random(cls) -> SnapshotKeys:
        """A key of this process alone: its snapshots verify for itself only (see docs/SECURITY.md)."""
        return cls((secrets.token_hex(32).encode(),))

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(_key_id(key) for key in self.keys)

    def __repr__(self) -> str:
        return f"SnapshotKeys(ids={list(self.ids)})"

    def seal(self, signed: bytes) -> bytes:
        """The W_SNAPSHOT payload around `signed` (the exact bytes the MAC covers)."""
        key = self.keys[0]
        return pack({"signed": signed, "key": _key_id(key), "mac": _mac(key, signed)})

    def unseal(self, body: Mapping[str, Any], topic: str) -> dict[str, Any]:
        """The signed map inside a W_SNAPSHOT payload's map `body`, if one of our keys signed it for `topic`.

        `MalformedMarker("bad-signature")` otherwise: unsigned, signed with a key we do not hold,
        changed since, or signed for another partition (a genuine snapshot copied elsewhere).
        """
        signed, mac = body.get("signed"), body.get("mac")
        if not isinstance(signed, bytes) or not isinstance(mac, bytes):
            raise MalformedMarker(BAD_SIGNATURE, "the snapshot is not signed by a generator")
        if not any(hmac.compare_digest(_mac(key, signed), mac) for key in self.keys):
            claimed = str(body.get("key"))[:40]
            raise MalformedMarker(
                BAD_SIGNATURE,
                f"no key of this generator (ids {', '.join(self.ids)}) signed it (it names key {claimed!r}): forged, "
                "or written with a key that was rotated out",
            )
        inner = unpack(signed)
        if inner.get("topic") != topic:
            raise MalformedMarker(
                BAD_SIGNATURE, f"signed for {str(inner.get('topic'))[:200]!r}, read on {topic!r}: copied from elsewhere"
            )
        return inner


def _mac(key: bytes, signed: bytes) -> bytes:
    return hmac.new(key, _MAC_CONTEXT + signed, hashlib.sha256).digest()


@dataclass(frozen=True)
class Snapshot:
    """A decoded W_SNAPSHOT: `state` at its stated position `at`, the record itself at `message`."""

    state: WatermarkState
    message: Position
    previous: Position | None
    incarnation: str | None = None
    """The token of the topic's incarnation the state belongs to (watermark_core/incarnation.py); None when
    written by an older generator, or by one that could not claim the topic property."""
    created: int = 0
    """When the topic's incarnation the state belongs to was created (ms), as the broker plugin said; 0: unknown
    (an older generator, or cursors read through the admin API). Tells incarnations apart where no token does."""

    @property
    def at(self) -> Position:
        """The position the state is stated at (always set: a snapshot without one is malformed)."""
        assert self.state.position is not None
        return self.state.position


def encode_snapshot(
    state: WatermarkState, previous: Position | None = None, *, keys: SnapshotKeys, topic: str,
    incarnation: str | None = None, created: int = 0,
) -> bytes:  # fmt: skip
    """The signed W_SNAPSHOT payload for `state` on partition `topic`, naming the partition's previous snapshot and
    the incarnation of the topic it belongs to (its token, its creation time)."""
    body: dict[str, Any] = {"topic": topic, "state": state_to_dict(state)}
    if previous is not None:
        body["previous"] = list(previous)
    if incarnation is not None:
        body["incarnation"] = incarnation
    if created:
        body["created"] = created
    return keys.seal(pack(body))


def is_generator_snapshot(marker: Marker) -> bool:
    """Whether a marker is a W_SNAPSHOT written under a generator's producer name."""
    return marker.kind is MarkerKind.W_SNAPSHOT and marker.producer.startswith(SNAPSHOT_PRODUCER_PREFIX)


def decode_snapshot(
    marker: Marker, config: WatermarkConfig | None = None, *, keys: SnapshotKeys, topic: str
) -> Snapshot:
    """The snapshot a W_SNAPSHOT marker read on partition `topic` carries, if `keys` vouch for it.

    MalformedMarker "bad-signature" for a record no key of ours signed for `topic`, "bad-snapshot"
    (or a decoding reason) for a signed one that is not a snapshot. `config`, when given, replaces
    the recorded one: the state so far was computed with the recorded configuration, the markers
    after it are folded with `config`.
    """
    if marker.kind is not MarkerKind.W_SNAPSHOT or marker.body is None:
        raise _bad(f"a {marker.kind} marker is not a snapshot")
    body = keys.unseal(marker.body, topic)
    state = state_from_dict(_map(body.get("state"), "state"), config)
    if state.position is None:
        raise _bad("a snapshot must state its position")
    incarnation = body.get("incarnation")
    if incarnation is not None and (not isinstance(incarnation, str) or not incarnation):
        raise _bad(f"incarnation must be a non-empty string, got {incarnation!r}")
    created = body.get("created", 0)
    if type(created) is not int or created < 0:
        raise _bad(f"created must be a creation time in ms, got {created!r}")
    return Snapshot(state, marker.position, _previous_from(body.get("previous")), incarnation, created)


def state_to_dict(state: WatermarkState) -> dict[str, Any]:
    """A msgpack-able value that `state_from_dict` turns back into an equal state."""
    return {
        "v": PROTOCOL_VERSION,
        "config": {
            "producer_timeout_ms": state.config.producer_timeout_ms,
            "txn_timeout_ms": state.config.txn_timeout_ms,
            "producer_retention_ms": state.config.producer_retention_ms,
        },
        "position": None if state.position is None else list(state.position),
        "clock": state.clock,
        "watermark": state.watermark,
        "producers": {
            name: {"event_time": r.event_time, "idle": r.idle, "last_seen": r.last_seen}
            for name, r in sorted(state.producers.items())
        },
        "pending": [
            {"producer": p, "txn": t, "kind": m.kind.value, "event_time": m.event_time, "started": m.started}
            for (p, t), m in sorted(state.pending_txns.items())
        ],
    }


def state_from_dict(data: Mapping[str, Any], config: WatermarkConfig | None = None) -> WatermarkState:
    """Restore `state_to_dict()`; MalformedMarker("bad-snapshot") for anything that is not one.

    `config`, when given, replaces the recorded one (see `decode_snapshot`).
    """
    if not isinstance(data, Mapping):
        raise _bad(f"a snapshot state is a map, got {type(data).__name__}")
    version = _need(data, "v")
    if isinstance(version, bool) or version != PROTOCOL_VERSION:
        raise _bad(f"snapshot version {version!r} is not {PROTOCOL_VERSION}")
    recorded = _config_from(_need(data, "config"))
    state = WatermarkState(
        config=config or recorded,
        position=_position_from(_need(data, "position")),
        clock=_opt_int(_need(data, "clock"), "clock"),
        watermark=_opt_time(_need(data, "watermark"), "watermark"),
        producers=_producers_from(_need(data, "producers")),
        pending_txns=_pending_from(_need(data, "pending")),
    )
    _check_consistent(state, recorded)
    return state


def _previous_from(value: Any) -> Position | None:
    """The optional position of the previous snapshot (absent in the chain's first one)."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != 3:
        raise _bad(f"a snapshot's 'previous' must be [ledger, entry, batch], got {value!r}")
    return (_int(value[0], "ledger"), _int(value[1], "entry"), _int(value[2], "batch"))


def _bad(detail: str) -> MalformedMarker:
    return MalformedMarker("bad-snapshot", detail)


def _need(data: Mapping[str, Any], key: str) -> Any:
    if key not in data:
        raise _bad(f"missing {key!r}")
    return data[key]


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"{what} must be an int, got {value!r}")
    return value


def _opt_int(value: Any, what: str) -> int | None:
    return None if value is None else _int(value, what)


def _opt_time(value: Any, what: str) -> int | None:
    time = _opt_int(value, what)
    if time is not None and not 0 <= time < EVENT_TIME_LIMIT:
        raise _bad(f"{what} must be in [0, 2**63), got {value!r}")
    return time


def _map(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _bad(f"{what} must be a map, got {type(value).__name__}")
    return value


def _config_from(value: Any) -> WatermarkConfig:
    recorded = _map(value, "config")
    try:
        retention = recorded.get("producer_retention_ms", WatermarkConfig.producer_retention_ms)  # absent before it
        return WatermarkConfig(
            _int(_need(recorded, "producer_timeout_ms"), "producer_timeout_ms"),
            _int(_need(recorded, "txn_timeout_ms"), "txn_timeout_ms"),
            _int(retention, "producer_retention_ms"),
        )
    except MalformedMarker:
        raise
    except ValueError as exc:
        raise _bad(str(exc)) from None


def _position_from(value: Any) -> Position | None:
    if value is None:
        return None
    if not isinstance(value, list | tuple) or len(value) != 3:
        raise _bad(f"position must be [ledger, entry, batch], got {value!r}")
    return (_int(value[0], "ledger"), _int(value[1], "entry"), _int(value[2], "batch"))


def _producers_from(value: Any) -> dict[str, ProducerRecord]:
    producers = {}
    for name, raw in _map(value, "producers").items():
        record = _map(raw, f"producer {name!r}")
        idle = _need(record, "idle")
        if not isinstance(name, str) or not isinstance(idle, bool):
            raise _bad(f"producer {name!r} needs a str name and a bool 'idle'")
        event_time = _opt_time(_need(record, "event_time"), "event_time")
        producers[name] = ProducerRecord(event_time, idle, _int(_need(record, "last_seen"), "last_seen"))
    return producers


def _pending_from(value: Any) -> dict[PendingKey, PendingMarker]:
    if not isinstance(value, list | tuple):
        raise _bad(f"pending must be a list, got {type(value).__name__}")
    pending = {}
    for raw in value:
        entry = _map(raw, "a pending transaction")
        producer, txn, kind = _need(entry, "producer"), _need(entry, "txn"), _need(entry, "kind")
        event_time = _opt_time(_need(entry, "event_time"), "event_time")
        if not isinstance(producer, str) or not isinstance(txn, str) or not txn:
            raise _bad(f"pending transaction {producer!r}/{txn!r} needs str producer and txn")
        if (kind, event_time is None) not in ((MarkerKind.W_SET.value, False), (MarkerKind.W_IDLE.value, True)):
            raise _bad(f"pending transaction {producer!r}/{txn!r} holds {kind!r} with event_time {event_time!r}")
        if (producer, txn) in pending:
            raise _bad(f"pending transaction {producer!r}/{txn!r} appears twice")
        pending[(producer, txn)] = PendingMarker(MarkerKind(kind), event_time, _int(_need(entry, "started"), "started"))
    return pending


def _check_consistent(state: WatermarkState, recorded: WatermarkConfig) -> None:
    """What every folded state satisfies: nothing before the first clock tick, nothing after the clock,
    no transaction still open past the timeout it was computed with (a fold drops those at once)."""
    if state.clock is None:
        if state.producers or state.pending_txns or state.watermark is not None:
            raise _bad("producers, transactions or a watermark without a clock")
        return
    if any(producer not in state.producers for producer, _ in state.pending_txns):
        raise _bad("a pending transaction of an unknown producer")
    times = [r.last_seen for r in state.producers.values()] + [m.started for m in state.pending_txns.values()]
    if any(t > state.clock for t in times):
        raise _bad(f"a producer or transaction time is after the clock {state.clock}")
    if any(state.clock - m.started > recorded.txn_timeout_ms for m in state.pending_txns.values()):
        raise _bad(f"a pending transaction older than the recorded txn_timeout_ms {recorded.txn_timeout_ms}")
