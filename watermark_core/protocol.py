"""The marker protocol: what producers, the generator and consumers write and read (docs/PROTOCOL.md).

Markers are ordinary messages on the data topic, marked by the property `wm.marker`; their payload
is a versioned msgpack map. The producer a marker speaks for is always the Pulsar producer name of
the message, passed in by the caller, never a payload field: a producer can only move its own
assertion. Decoding never raises anything but `MalformedMarker`, whatever the bytes, so one bad
message can be counted and skipped and never stops a component.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeGuard

import msgpack

MARKER_PROPERTY = "wm.marker"
PROTOCOL_VERSION = 1
EVENT_TIME_LIMIT = 2**63
"""Event times are in [0, 2**63): what Pulsar's signed 64-bit `event_timestamp` can carry."""

Position = tuple[int, int, int]
"""(ledger_id, entry_id, batch_index) inside ONE topic partition; batch_index is -1 when not batched."""

LAST_BATCH_INDEX = 2**31 - 1

INCARNATION_PROPERTY = "wm.incarnation"
"""The topic property (admin API) naming the incarnation of a (partition) topic the generator's events are about."""

GENERATOR_SUBSCRIPTION = "__wm_generator"
"""The generator's own durable Failover subscription on every partition it follows."""
INTERNAL_SUBSCRIPTIONS = frozenset({GENERATOR_SUBSCRIPTION, "__compaction"})
"""Subscriptions that are not an application's: the generator follows no watermark for them."""
SNAPSHOT_PRODUCER_PREFIX = "__wm_generator-"
"""The producer names under which generators write W_SNAPSHOT records."""


class MarkerKind(StrEnum):
    """The value of the `wm.marker` property."""

    W_SET = "W_SET"
    W_IDLE = "W_IDLE"
    W_SNAPSHOT = "W_SNAPSHOT"
    W_TXN_COMMIT = "W_TXN_COMMIT"
    W_TXN_ABORT = "W_TXN_ABORT"


class MalformedMarker(ValueError):
    """A message claims to be a marker, a snapshot or a watermark event but is not a valid one.

    `reason` is a short kind ("bad-kind", "bad-payload", "bad-msgpack", "bad-version", "bad-field",
    "bad-snapshot", "bad-event") so that callers count and log once per kind, not per message.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True)
class Watermark:
    """What listeners receive: the broker watermark of their subscription, in ms since the epoch.

    `computed_at` names, for each partition the value comes from, the mark-delete position it was
    computed at: `(partition, ledger, entry)`, partition -1 for a non-partitioned topic. It holds for
    the messages after those positions. Two watermarks are equal when their event times are.
    """

    event_time: int
    computed_at: tuple[tuple[int, int, int], ...] = field(default=(), compare=False)


@dataclass(frozen=True, slots=True)
class Marker:
    """A decoded marker at its place in the log.

    `event_time` is set for W_SET, `txn` for transactional markers, `body` (the payload map, read
    by `watermark_core.snapshot.decode_snapshot`) for W_SNAPSHOT only.
    """

    kind: MarkerKind
    producer: str
    position: Position
    publish_time: int
    event_time: int | None = None
    txn: str | None = None
    body: Mapping[str, Any] | None = None


def position_of(ledger: int, entry: int, batch: int = -1) -> Position:
    """A message's position; `batch` is -1 for a message that is not part of a batch."""
    return (int(ledger), int(entry), int(batch))


def entry_end(ledger: int, entry: int) -> Position:
    """The largest position inside an entry: "everything up to and including this mark-delete entry"."""
    return (int(ledger), int(entry), LAST_BATCH_INDEX)


# -- encoding ------------------------------------------------------------------------------------------


def _check_event_time(event_time: object) -> int:
    if isinstance(event_time, bool) or not isinstance(event_time, int) or not 0 <= event_time < EVENT_TIME_LIMIT:
        raise ValueError(
            f"event_time must be an int of milliseconds since the Unix epoch in [0, 2**63), got {event_time!r}; "
            "pass e.g. int(time.time() * 1000)"
        )
    return event_time


def _check_txn(txn: object) -> str:
    if not isinstance(txn, str) or not txn:
        raise ValueError(f"a watermark transaction id must be a non-empty str, got {txn!r}")
    return txn


def pack(body: Mapping[str, Any]) -> bytes:
    """A versioned msgpack map: every payload of the protocol."""
    try:
        return bytes(msgpack.packb({"v": PROTOCOL_VERSION, **body}, use_bin_type=True))
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"cannot encode as msgpack ({exc}); pass only str, int, bool, None, lists and maps") from exc


def encode_set(event_time: int, txn: str | None = None) -> bytes:
    """W_SET: the sender promises that its later messages have event time >= `event_time`."""
    body: dict[str, Any] = {"event_time": _check_event_time(event_time)}
    if txn is not None:
        body["txn"] = _check_txn(txn)
    return pack(body)


def encode_idle(txn: str | None = None) -> bytes:
    """W_IDLE: the sender stops holding the watermark back until its next W_SET."""
    return pack({} if txn is None else {"txn": _check_txn(txn)})


def encode_txn_commit(txn: str) -> bytes:
    """W_TXN_COMMIT: the transaction's pending marker takes effect here."""
    return pack({"txn": _check_txn(txn)})


def encode_txn_abort(txn: str) -> bytes:
    """W_TXN_ABORT: the transaction's pending marker is discarded."""
    return pack({"txn": _check_txn(txn)})


# -- decoding ------------------------------------------------------------------------------------------


def is_marker(properties: Mapping[str, str]) -> bool:
    """Whether a message is a marker (consumers hide it) rather than data."""
    return MARKER_PROPERTY in properties


def unpack(payload: object) -> dict[str, Any]:
    """The versioned msgpack map of a payload; `MalformedMarker` for anything else (what every decoder starts with)."""
    return _unpack(payload)


def _unpack(payload: object) -> dict[str, Any]:
    """A versioned msgpack map; unknown keys are kept (and ignored by readers) for forward compatibility."""
    if not isinstance(payload, bytes | bytearray | memoryview):
        raise MalformedMarker("bad-payload", f"payload is a {type(payload).__name__}, not bytes")
    try:
        body = msgpack.unpackb(bytes(payload), raw=False)
    except Exception as exc:  # msgpack raises many types for bad bytes; any of them means "not msgpack"
        raise MalformedMarker("bad-msgpack", f"payload is not msgpack ({type(exc).__name__})") from None
    if not isinstance(body, dict):
        raise MalformedMarker("bad-payload", f"payload is a msgpack {type(body).__name__}, not a map")
    version = body.get("v")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise MalformedMarker("bad-version", f"missing or invalid version {version!r}")
    if version > PROTOCOL_VERSION:
        raise MalformedMarker("bad-version", f"version {version} is newer than this reader ({PROTOCOL_VERSION})")
    return body


def _event_time_field(body: Mapping[str, Any]) -> int:
    value = body.get("event_time")
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < EVENT_TIME_LIMIT:
        raise MalformedMarker("bad-field", f"event_time must be an int in [0, 2**63), got {value!r}")
    return value


def _txn_field(body: Mapping[str, Any], *, required: bool) -> str | None:
    value = body.get("txn")
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise MalformedMarker("bad-field", f"txn must be a non-empty string, got {value!r}")
    return value


def decode_marker(
    properties: Mapping[str, str], payload: bytes, producer: str, position: Position, publish_time: int
) -> Marker | None:
    """The marker in a message, None for a data message, `MalformedMarker` for a broken marker.

    `producer` is the message's Pulsar producer name: the only identity a marker has.
    """
    if MARKER_PROPERTY not in properties:
        return None
    raw_kind = properties[MARKER_PROPERTY]
    if not isinstance(raw_kind, str) or raw_kind not in MarkerKind.__members__:
        raise MalformedMarker("bad-kind", f"unknown marker kind {raw_kind!r}")
    kind = MarkerKind(raw_kind)
    body = _unpack(payload)
    at = (producer, position, publish_time)
    if kind is MarkerKind.W_SET:
        return Marker(kind, *at, event_time=_event_time_field(body), txn=_txn_field(body, required=False))
    if kind is MarkerKind.W_IDLE:
        return Marker(kind, *at, txn=_txn_field(body, required=False))
    if kind is MarkerKind.W_SNAPSHOT:
        return Marker(kind, *at, body=body)
    return Marker(kind, *at, txn=_txn_field(body, required=True))


# -- SendWatermark events on the companion topic -------------------------------------------------------

EVENT_PROPERTY = "wm.event"
SEND_WATERMARK = "SendWatermark"
"""The value of `EVENT_PROPERTY` on the generator's events."""


def table_key(topic: str, partition: int) -> str:
    """The compaction key of a partition's table, `<topic>:<partition>`: compaction keeps the latest per partition.

    It names the topic so that a companion topic may carry the tables of several (issue 47), and a reader skips
    the others' events by their key, without decoding them (`key_topic`)."""
    return f"{topic}:{partition}"


@dataclass(frozen=True)
class WatermarkEvent:
    """SendWatermark: the watermark of one subscription on one partition at its mark-delete position.

    `topic` is the full base topic name, `partition` -1 for a non-partitioned topic, `position` the
    mark-delete (ledger, entry), `seq` increases with every event the generator publishes for the key.
    """

    topic: str
    partition: int
    subscription: str
    event_time: int | None
    position: tuple[int, int]
    seq: int
    active: Mapping[str, int] = field(default_factory=dict)
    """For `broker-ext status`: the active producers and their assertions at `position`."""
    idle: tuple[str, ...] = ()
    pending: int = 0
    incarnation: str | None = None
    """The generator's token of the topic's incarnation (`INCARNATION_PROPERTY`); None from older generators, or
    one that may not set the property (watermark_core/incarnation.py)."""


def _is_int(value: object) -> TypeGuard[int]:
    return type(value) is int  # not a bool (nor another subclass): msgpack and the engine give plain ints


def _event_body(event: WatermarkEvent) -> dict[str, Any]:
    # Built once per subscription of every table the generator publishes: no copy msgpack does not need (a tuple
    # packs as the array a list does), the optional key set only when there.
    if event.event_time is not None:
        _check_event_time(event.event_time)
    position = event.position
    if not (_is_int(event.partition) and _is_int(event.seq) and all(_is_int(p) for p in position)):
        raise ValueError(f"partition, seq and position of a watermark event must be ints: {event!r}")
    active = event.active
    body = {
        "topic": event.topic,
        "partition": event.partition,
        "subscription": event.subscription,
        "event_time": event.event_time,
        "position": position,
        "seq": event.seq,
        "active": active if type(active) is dict else dict(active),
        "idle": event.idle,
        "pending": event.pending,
    }
    if event.incarnation is not None:
        body["incarnation"] = _checked_incarnation(event.incarnation)
    return body


def _checked_incarnation(incarnation: object) -> str:
    if not isinstance(incarnation, str) or not incarnation:
        raise ValueError(f"an incarnation token is a non-empty str, got {incarnation!r}")
    return incarnation


def _incarnation_from(body: Mapping[str, Any]) -> str | None:
    value = body.get("incarnation")
    if value is not None and (not isinstance(value, str) or not value):
        raise MalformedMarker("bad-event", f"incarnation must be a non-empty string, got {value!r}")
    return value


def encode_event(event: WatermarkEvent) -> bytes:
    """One event on its own (the building block of a table)."""
    return pack(_event_body(event))


def decode_event(payload: bytes) -> WatermarkEvent:
    """One event on its own; `MalformedMarker` for anything else."""
    return _event_from_body(_unpack(payload))


def encode_table(events: Sequence[WatermarkEvent], heads: Sequence[HeadWatermark] = ()) -> bytes:
    """The payload of a SendWatermark message: the watermarks of every subscription of one partition.

    One message per change of the partition, however many subscriptions it has, keyed by
    `table_key(topic, partition)`: the latest table per partition is all a consumer needs to read. `heads`: the
    partition's head events riding along, in order (key "heads"), so a marker acknowledged soon after it was
    folded costs the broker one message, not two (readers of tables alone ignore them).
    """
    if not events:
        raise ValueError("a watermark table needs at least one event")
    body: dict[str, Any] = {"events": [_event_body(event) for event in events]}
    if heads:
        body["heads"] = [_head_body(head) for head in heads]
    return pack(body)


def decode_table(payload: bytes, subscription: str | None = None) -> list[WatermarkEvent]:
    """The events of a SendWatermark table (only `subscription`'s, if given); `MalformedMarker` for anything else.

    With `subscription` the other events are neither built nor checked: a table lists every subscription of the
    partition, and a consumer's feed reads one table per acknowledgement past a marker (issue 34: tens of events
    decoded per table cost its reading thread more than the consumer's own hot path)."""
    return _events_of(_unpack(payload), subscription)


def decode_table_with_heads(
    payload: bytes, subscription: str | None = None
) -> tuple[list[WatermarkEvent], list[HeadWatermark]]:
    """The events of a SendWatermark table (as `decode_table`) and the head events riding on it, in order."""
    body = _unpack(payload)
    heads = body.get("heads", [])
    if not isinstance(heads, list) or not all(isinstance(head, dict) for head in heads):
        raise MalformedMarker("bad-event", f"a table's heads must be a list of maps, got {heads!r}")
    return _events_of(body, subscription), [_head_from_body(head) for head in heads]


def _events_of(body: Mapping[str, Any], subscription: str | None) -> list[WatermarkEvent]:
    events = body.get("events")
    if not isinstance(events, list) or not events or not all(isinstance(e, dict) for e in events):
        raise MalformedMarker("bad-event", "a watermark table needs a non-empty list of events")
    if subscription is not None:
        return [_event_from_body(event) for event in events if event.get("subscription") == subscription]
    return [_event_from_body(event) for event in events]


def _event_from_body(body: Mapping[str, Any]) -> WatermarkEvent:
    topic, partition, subscription = body.get("topic"), body.get("partition"), body.get("subscription")
    event_time, position, seq = body.get("event_time"), body.get("position"), body.get("seq")
    if not isinstance(topic, str) or not topic or not isinstance(subscription, str) or not subscription:
        raise MalformedMarker("bad-event", "a watermark event needs a topic and a subscription")
    if not _is_int(partition) or partition < -1 or not _is_int(seq):
        raise MalformedMarker("bad-event", f"bad partition {partition!r} or seq {seq!r}")
    if event_time is not None and (not _is_int(event_time) or not 0 <= event_time < EVENT_TIME_LIMIT):
        raise MalformedMarker("bad-event", f"bad event_time {event_time!r}")
    if not isinstance(position, list) or len(position) != 2 or not all(_is_int(p) for p in position):
        raise MalformedMarker("bad-event", f"position must be [ledger, entry], got {position!r}")
    active, idle, pending = body.get("active") or {}, body.get("idle") or [], body.get("pending", 0)
    if not isinstance(active, dict) or not all(isinstance(k, str) and _is_int(v) for k, v in active.items()):
        raise MalformedMarker("bad-event", f"active must map producer names to event times, got {active!r}")
    if not isinstance(idle, list) or not all(isinstance(p, str) for p in idle) or not _is_int(pending):
        raise MalformedMarker("bad-event", f"bad idle {idle!r} or pending {pending!r}")
    position_pair = (position[0], position[1])
    incarnation = _incarnation_from(body)
    return WatermarkEvent(topic, partition, subscription, event_time, position_pair, seq, active, tuple(idle), pending,
                          incarnation)  # fmt: skip


# -- HeadWatermark events on the companion topic -------------------------------------------------------

HEAD_WATERMARK = "HeadWatermark"
"""The value of `EVENT_PROPERTY` on a head event (SendWatermark tables are untouched by them)."""


HEAD_KEY_PREFIX = "head:"
"""Head events are keyed `head:<topic>:<partition>`; tables `<topic>:<partition>` (`table_key`)."""


def head_key(topic: str, partition: int) -> str:
    """The compaction key of a partition's head events: compaction keeps the latest per partition."""
    return f"{HEAD_KEY_PREFIX}{topic}:{partition}"


def key_topic(key: str) -> str | None:
    """The topic a table's or a head event's key names; None for a key of a generator before issue 47.

    A topic's name may hold ':' (the scheme's, and Pulsar allows it in a local name); the partition, after the
    last one, never does."""
    named = key[len(HEAD_KEY_PREFIX) :] if key.startswith(HEAD_KEY_PREFIX) else key
    topic, colon, partition = named.rpartition(":")
    if not colon or not topic or not partition.lstrip("-").isdigit():
        return None
    return topic


@dataclass(frozen=True)
class HeadWatermark:
    """The watermark at a position of the log: the fold of every marker of the partition up to it.

    The generator publishes one whenever folding a marker changes the watermark of the partition's
    head, at that marker's entry. The watermark only changes at markers and never goes down along
    the log, so the latest event at or before a position p gives the watermark at p, and any event
    at or before p is a lower bound of it (contract section 1: a pure function of the log). When
    several markers of one (batched) entry change it, the last event of the entry is the one at the
    entry's end. `topic` is the full base topic name, `partition` -1 for a non-partitioned topic.
    """

    topic: str
    partition: int
    position: tuple[int, int]
    event_time: int
    incarnation: str | None = None
    """As `WatermarkEvent.incarnation`."""


def encode_head(event: HeadWatermark) -> bytes:
    """The payload of a HeadWatermark message, keyed by `head_key(topic, partition)`."""
    return pack(_head_body(event))


def _head_body(event: HeadWatermark) -> dict[str, Any]:
    _check_event_time(event.event_time)
    if not isinstance(event.topic, str) or not event.topic:
        raise ValueError(f"a head event needs a topic: {event!r}")
    if not (_is_int(event.partition) and event.partition >= -1 and len(event.position) == 2
            and all(_is_int(p) for p in event.position)):  # fmt: skip
        raise ValueError(f"partition and position of a head event must be ints: {event!r}")
    body = {"topic": event.topic, "partition": event.partition, "position": event.position,
            "event_time": event.event_time}  # fmt: skip
    if event.incarnation is not None:
        body["incarnation"] = _checked_incarnation(event.incarnation)
    return body


def decode_head(payload: bytes) -> HeadWatermark:
    """A HeadWatermark event; `MalformedMarker` ("bad-event" and the payload reasons) for anything else."""
    return _head_from_body(_unpack(payload))


def _head_from_body(body: Mapping[str, Any]) -> HeadWatermark:
    topic, partition, position, event_time = (
        body.get("topic"), body.get("partition"), body.get("position"), body.get("event_time")
    )  # fmt: skip
    if not isinstance(topic, str) or not topic:
        raise MalformedMarker("bad-event", "a head event needs a topic")
    if not _is_int(partition) or partition < -1:
        raise MalformedMarker("bad-event", f"bad partition {partition!r}")
    if not _is_int(event_time) or not 0 <= event_time < EVENT_TIME_LIMIT:
        raise MalformedMarker("bad-event", f"bad event_time {event_time!r}")
    if not isinstance(position, list) or len(position) != 2 or not all(_is_int(p) for p in position):
        raise MalformedMarker("bad-event", f"position must be [ledger, entry], got {position!r}")
    return HeadWatermark(topic, partition, (position[0], position[1]), event_time, _incarnation_from(body))
