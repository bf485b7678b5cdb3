"""The marker protocol: what producers, the generator and consumers write and read (docs/PROTOCOL.md).

Markers are ordinary Pulsar messages marked by the property `wm.marker`; their payload is a
versioned msgpack map. The producer a marker speaks for is always the broker-known Pulsar producer
name of the message, never a payload field, so a producer can only set or idle its own watermark.
Decoding never raises anything but `MalformedMarker`, whatever the bytes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import msgpack

MARKER_PROPERTY = "wm.marker"
PROTOCOL_VERSION = 1
MAX_EVENT_TIME = 2**63 - 1

Position = tuple[int, int, int]
"""(ledger_id, entry_id, batch_index) inside one topic partition; batch_index -1 when not batched."""

LAST_IN_ENTRY = 2**31 - 1


class MarkerKind(StrEnum):
    W_SET = "W_SET"
    W_IDLE = "W_IDLE"
    W_SNAPSHOT = "W_SNAPSHOT"
    W_TXN_COMMIT = "W_TXN_COMMIT"
    W_TXN_ABORT = "W_TXN_ABORT"


class MalformedMarker(ValueError):
    """A message claims to be a marker (or a watermark event) but is not a valid one."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True)
class Watermark:
    """What listeners receive: no honest producer's unacknowledged message is older than `event_time`."""

    event_time: int


@dataclass(frozen=True, slots=True)
class Marker:
    """A decoded marker at its place in the log."""

    kind: MarkerKind
    producer: str
    position: Position
    publish_time: int
    event_time: int | None = None
    txn: str | None = None
    state: dict[str, Any] | None = None


def position_of(ledger: int, entry: int, batch: int = -1) -> Position:
    return (int(ledger), int(entry), int(batch))


def entry_end(ledger: int, entry: int) -> Position:
    """The last position inside an entry: "everything up to and including this mark-delete entry"."""
    return (int(ledger), int(entry), LAST_IN_ENTRY)


# -- encoding ------------------------------------------------------------------------------------------


def check_event_time(event_time: object) -> int:
    if (
        isinstance(event_time, bool)
        or not isinstance(event_time, int)
        or not 0 <= event_time <= MAX_EVENT_TIME
    ):
        raise ValueError(
            "event_time must be a non-negative integer count of milliseconds since the Unix epoch, "
            f"got {event_time!r}"
        )
    return event_time


def _check_txn(txn: object) -> str:
    if not isinstance(txn, str) or not txn:
        raise ValueError(f"a watermark transaction id must be a non-empty string, got {txn!r}")
    return txn


def _pack(body: dict[str, Any]) -> bytes:
    return bytes(msgpack.packb({"v": PROTOCOL_VERSION, **body}, use_bin_type=True))


def encode_set(event_time: int, txn: str | None = None) -> bytes:
    body: dict[str, Any] = {"event_time": check_event_time(event_time)}
    if txn is not None:
        body["txn"] = _check_txn(txn)
    return _pack(body)


def encode_idle(txn: str | None = None) -> bytes:
    return _pack({} if txn is None else {"txn": _check_txn(txn)})


def encode_txn_commit(txn: str) -> bytes:
    return _pack({"txn": _check_txn(txn)})


def encode_txn_abort(txn: str) -> bytes:
    return _pack({"txn": _check_txn(txn)})


def encode_snapshot(state: Mapping[str, Any], at: Position, previous: Position | None) -> bytes:
    """A generator's snapshot: the state at position `at`, and where the previous snapshot is."""
    return _pack(
        {"at": list(at), "previous": list(previous) if previous is not None else None, "state": dict(state)}
    )


# -- decoding ------------------------------------------------------------------------------------------


def is_marker(properties: Mapping[str, str]) -> bool:
    return MARKER_PROPERTY in properties


def _unpack(payload: bytes) -> dict[str, Any]:
    try:
        body = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several types for bad bytes
        raise MalformedMarker("bad-msgpack", f"payload is not msgpack ({type(exc).__name__})") from exc
    if not isinstance(body, dict):
        raise MalformedMarker("bad-payload", f"payload is a {type(body).__name__}, not a map")
    version = body.get("v")
    if isinstance(version, bool) or not isinstance(version, int):
        raise MalformedMarker("bad-version", f"missing or non-integer version {version!r}")
    if version > PROTOCOL_VERSION or version < 1:
        raise MalformedMarker("bad-version", f"version {version} is not supported (this reader knows 1)")
    return body


def _field_event_time(body: dict[str, Any]) -> int:
    value = body.get("event_time")
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_EVENT_TIME:
        raise MalformedMarker("bad-field", f"event_time must be a non-negative integer, got {value!r}")
    return value


def _field_txn(body: dict[str, Any], required: bool) -> str | None:
    value = body.get("txn")
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise MalformedMarker("bad-field", f"txn must be a non-empty string, got {value!r}")
    return value


def decode_marker(
    properties: Mapping[str, str], payload: bytes, producer: str, position: Position, publish_time: int
) -> Marker | None:
    """The marker in a message, None for a data message; `MalformedMarker` for a broken marker."""
    if MARKER_PROPERTY not in properties:
        return None
    raw_kind = properties[MARKER_PROPERTY]
    try:
        kind = MarkerKind(raw_kind)
    except ValueError:
        raise MalformedMarker("bad-kind", f"unknown marker kind {raw_kind!r}") from None
    if not isinstance(payload, bytes | bytearray):
        raise MalformedMarker("bad-payload", "payload is not bytes")
    body = _unpack(bytes(payload))
    if kind is MarkerKind.W_SET:
        event_time: int | None = _field_event_time(body)
        txn = _field_txn(body, required=False)
    elif kind is MarkerKind.W_IDLE:
        event_time, txn = None, _field_txn(body, required=False)
    elif kind in (MarkerKind.W_TXN_COMMIT, MarkerKind.W_TXN_ABORT):
        event_time, txn = None, _field_txn(body, required=True)
    else:
        return Marker(kind, producer, position, publish_time, state=_snapshot_fields(body))
    return Marker(kind, producer, position, publish_time, event_time=event_time, txn=txn)


def _position_field(value: Any) -> Position:
    if (
        not isinstance(value, list | tuple)
        or len(value) != 3
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise MalformedMarker(
            "bad-field", f"a snapshot position must be [ledger, entry, batch], got {value!r}"
        )
    return (value[0], value[1], value[2])


def _snapshot_fields(body: dict[str, Any]) -> dict[str, Any]:
    """A snapshot's `at`, `previous` (positions) and `state` (a map for `WatermarkState.from_dict`)."""
    state = body.get("state")
    if not isinstance(state, dict):
        raise MalformedMarker("bad-field", "a snapshot needs a 'state' map")
    previous = body.get("previous")
    return {
        "at": _position_field(body.get("at")),
        "previous": None if previous is None else _position_field(previous),
        "state": state,
    }


# -- SendWatermark events on the companion topic -------------------------------------------------------

WATERMARK_TOPIC_SUFFIX = "__watermarks"
EVENT_PROPERTY = "wm.event"
_PARTITION_SUFFIX = re.compile(r"-partition-(\d+)$")


def _full_name(topic: str) -> str:
    if "://" in topic:
        return topic
    parts = topic.split("/")
    if len(parts) == 3:
        return f"persistent://{topic}"
    return f"persistent://public/default/{topic}"


def base_topic_and_partition(topic: str) -> tuple[str, int]:
    """(full base topic name, partition index or -1)."""
    full = _full_name(topic)
    match = _PARTITION_SUFFIX.search(full)
    if match is None:
        return full, -1
    return full[: match.start()], int(match.group(1))


def watermark_topic_for(topic: str) -> str:
    """The companion topic where the generator publishes a topic's watermarks."""
    return base_topic_and_partition(topic)[0] + WATERMARK_TOPIC_SUFFIX


def is_watermark_topic(topic: str) -> bool:
    return base_topic_and_partition(topic)[0].endswith(WATERMARK_TOPIC_SUFFIX)


def event_key(partition: int, subscription: str) -> str:
    """The compaction key: one latest event per partition and subscription."""
    return f"{partition}/{subscription}"


@dataclass(frozen=True)
class WatermarkEvent:
    """`SendWatermark`: the watermark of one subscription on one partition, at its mark-delete position."""

    topic: str
    partition: int
    subscription: str
    event_time: int | None
    position: tuple[int, int]
    seq: int
    active: dict[str, int] | None = None
    idle: tuple[str, ...] | None = None
    pending: int = 0


def encode_event(event: WatermarkEvent) -> bytes:
    return _pack({
        "topic": event.topic,
        "partition": event.partition,
        "subscription": event.subscription,
        "event_time": event.event_time,
        "position": list(event.position),
        "seq": event.seq,
        "active": event.active or {},
        "idle": list(event.idle or ()),
        "pending": event.pending,
    })  # fmt: skip


def decode_event(payload: bytes) -> WatermarkEvent:
    body = _unpack(payload)
    try:
        event_time = body.get("event_time")
        if event_time is not None:
            event_time = _field_event_time(body)
        position = body["position"]
        active = body.get("active") or {}
        event = WatermarkEvent(
            topic=str(body["topic"]),
            partition=int(body["partition"]),
            subscription=str(body["subscription"]),
            event_time=event_time,
            position=(int(position[0]), int(position[1])),
            seq=int(body["seq"]),
            active={str(k): int(v) for k, v in active.items()},
            idle=tuple(str(p) for p in body.get("idle") or ()),
            pending=int(body.get("pending", 0)),
        )
    except MalformedMarker:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise MalformedMarker("bad-event", f"watermark event is incomplete ({exc!r})") from exc
    return event
