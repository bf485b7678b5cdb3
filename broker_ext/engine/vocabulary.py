"""What a partition engine is told (events) and what it asks for (commands).

The engine never does I/O: the shell around it (broker_ext/service.py) turns what Pulsar delivers
and what the admin API answers into events, and carries out the commands, reporting the outcome of
the ones that take time (a snapshot written, a range read) as events again. Reports are commands
too: what the shell counts in metrics.

Positions are `(ledger, entry, batch_index)` of ONE partition (watermark_core/protocol.py);
positions the admin API gives, without a batch index, are `(ledger, entry)`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from watermark_core.incarnation import new_token
from watermark_core.protocol import MalformedMarker, Marker, Position, WatermarkEvent
from watermark_core.snapshot import SnapshotKeys
from watermark_core.state import WatermarkConfig, WatermarkState

AdminPosition = tuple[int, int]
"""(ledger, entry) as the admin API states positions."""


# -- events -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RawMarker:
    """A marker as Pulsar holds it: the kind its `wm.marker` property names, its payload, who sent it, where,
    and when the broker stamped it. The shells hand markers so; the engine decodes them, the one place."""

    kind: str
    payload: bytes
    producer: str
    position: Position
    publish_time: int


@dataclass(frozen=True, slots=True)
class EntryRead:
    """The generator's consumer delivered the entry at `position`: a marker, or data of `producer`.

    A shell hands a marker `raw`; the engine decodes it into `marker` (a malformed one is followed as data
    of its producer, and `MarkerMalformed` tells the shell to count and log it). `event_time` is the data
    message's event timestamp, 0 when it has none.

    From the broker plugin's intake, data comes summed: `stretch` holds, per producer, how many data messages
    and the lowest event time (0: none) since the entry before, with no marker between; `position` is the last
    one's. The watermark changes only at markers, so the lowest judges every message of a stretch alike.
    """

    position: Position
    marker: Marker | None = None
    producer: str = ""
    event_time: int = 0
    stretch: tuple[tuple[str, int, int], ...] = ()
    """(producer, messages, lowest event time) of summed data; empty for one message (`producer`, `event_time`)."""
    raw: RawMarker | None = None

    @property
    def messages(self) -> int:
        return sum(messages for _, messages, _ in self.stretch) if self.stretch else 1


@dataclass(frozen=True)
class CursorsPolled:
    """The partition's cursors and ledgers, read from its internal stats (one admin call).

    `subscriptions` maps every durable application subscription to its mark-delete position, and
    holds all of them: one missing is one removed. `ledgers` are (ledger id, entries), oldest first.
    """

    subscriptions: Mapping[str, AdminPosition]
    generator_cursor: AdminPosition
    last_confirmed: AdminPosition
    ledgers: tuple[tuple[int, int], ...] = ()
    created: int = 0
    """When the topic (this incarnation of it) was created, in ms, as the broker plugin reports it; 0: unknown
    (the admin API does not say). A different one is a topic deleted and created again under its name."""


@dataclass(frozen=True)
class OwnershipLost:
    """Pulsar made another consumer of `__wm_generator` the active one: `owner` (its name)."""

    owner: str


@dataclass(frozen=True)
class SnapshotWritten:
    """The snapshot asked for by the last `WriteSnapshot` is durable; the record landed at `message`."""

    message: Position


@dataclass(frozen=True)
class SnapshotFailed:
    """Writing the snapshot asked for by the last `WriteSnapshot` failed; it is asked for again later."""

    reason: str


@dataclass(frozen=True)
class MarkerFetched:
    """The answer to `ReadMarkerAt(request, position)`.

    `marker` is None when the entry there is not a marker or is gone; `error` is set when the read
    failed (broker away): then the rebuild is retried later.
    """

    request: int
    position: Position
    marker: Marker | None
    error: str | None = None
    raw: RawMarker | None = None
    """As the shell read it (decoded into `marker` by the engine; a malformed one is none)."""


@dataclass(frozen=True)
class RangeRead:
    """The answer to `ReadRange(request, start, stop)`.

    `first` is the first entry the reader delivered after `start` (None: it delivered nothing);
    `markers` the markers it read in (start, stop], in order; `ledgers` the partition's ledger ids
    as the admin API lists them after the read. `error` is set when the read failed. `entries` counts
    the messages the reader delivered (what the read cost the broker; a metric, not used by the engine).
    """

    request: int
    first: Position | None
    markers: tuple[Marker, ...]
    ledgers: frozenset[int]
    error: str | None = None
    entries: int = 0
    raw: tuple[RawMarker, ...] = ()
    """As the shell read them (decoded into `markers` by the engine; malformed ones were counted at the head)."""


@dataclass(frozen=True)
class Tick:
    """Time passed: the engine asked for it (`wakeup_at`); the time itself is `handle`'s `now`."""


@dataclass(frozen=True)
class IncarnationRead:
    """The answer to `ReadIncarnation`: the partition's topic property `wm.incarnation` (None: not set)."""

    token: str | None


@dataclass(frozen=True)
class IncarnationClaimed:
    """The answer to `ClaimIncarnation(token)`: `ok` False when the broker refused to set the property (the
    generator's role may not: a tenant admin's right); `reason` says why."""

    token: str
    ok: bool
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Reported:
    """One answer of the broker plugin about the partition, as one event: the entries its intake read, in log
    order, then the cursors (taken only by an owner, as the shell hands cursors). The same as handing each entry
    and then the cursors as events of their own; one event, so a marker costs the shell and the engine one turn
    (issue 47: the burst's cost per `W_SET`)."""

    entries: tuple[EntryRead, ...]
    cursors: CursorsPolled


Event = (
    EntryRead | CursorsPolled | Reported | OwnershipLost | SnapshotWritten | SnapshotFailed | MarkerFetched | RangeRead
    | Tick | IncarnationRead | IncarnationClaimed
)  # fmt: skip


# -- commands ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WriteSnapshot:
    """Write `state` as a W_SNAPSHOT naming `previous`; answer `SnapshotWritten` or `SnapshotFailed`.

    At most one is outstanding. A `periodic` one states the head's read position, the entry the
    shell fed last: the shell keeps that message, to acknowledge it on `AcknowledgeUpTo`.
    """

    state: WatermarkState
    previous: Position | None
    periodic: bool
    incarnation: str | None = None
    """The token the snapshot carries (watermark_core/incarnation.py)."""
    created: int = 0
    """The topic's creation time the state was computed under (0: unknown), carried by the snapshot."""


@dataclass(frozen=True)
class AcknowledgeUpTo:
    """Move the generator's cursor (`__wm_generator`) up to `position`: a snapshot there is durable."""

    position: Position


@dataclass(frozen=True)
class PublishTable:
    """Publish the partition's table (one event per subscription) on the companion topic.

    `changed` names the subscriptions whose watermark this table changes (for the metrics).
    """

    events: tuple[WatermarkEvent, ...]
    changed: tuple[str, ...] = ()


@dataclass(frozen=True)
class ReadRange:
    """Read the partition in (start, stop] with a reader of its own; answer `RangeRead`."""

    request: int
    start: Position
    stop: Position


@dataclass(frozen=True)
class ReadMarkerAt:
    """Read the one entry at `position` (a snapshot of the chain); answer `MarkerFetched`."""

    request: int
    position: Position


@dataclass(frozen=True)
class PollCursors:
    """Read the partition's cursors now (answer `CursorsPolled`): a take-over needs them."""


@dataclass(frozen=True)
class HeadWatermark:
    """The watermark of the head state changed: `watermark` holds from `position` on (in the log)."""

    position: Position
    watermark: int | None
    incarnation: str | None = None
    """The token the head event carries."""


@dataclass(frozen=True)
class ReadIncarnation:
    """Read the partition's topic property `wm.incarnation`; answer `IncarnationRead` (retrying while the admin API
    does not answer)."""


@dataclass(frozen=True)
class ClaimIncarnation:
    """Set the partition's topic property `wm.incarnation` to `token`; answer `IncarnationClaimed`."""

    token: str


@dataclass(frozen=True)
class Restart:
    """The topic was deleted and created again under us: drop this partition's consumer and state and follow it
    anew (discovery does)."""

    reason: str


# reports: what the shell counts and forgets in metrics


@dataclass(frozen=True)
class MarkerFolded:
    """A marker was folded into the head state."""

    position: Position


@dataclass(frozen=True)
class BrokenAssertion:
    """A data message below its own producer's latest W_SET (a late message)."""

    producer: str
    event_time: int
    position: Position


@dataclass(frozen=True)
class MarkerMalformed:
    """A marker the head read does not decode: followed as data; the shell counts and logs it."""

    error: MalformedMarker
    producer: str
    position: Position


@dataclass(frozen=True)
class UnusableSnapshot:
    """A generator's W_SNAPSHOT that does not decode (e.g. an incompatible version): skipped."""

    position: Position
    reason: str


@dataclass(frozen=True)
class ReadLag:
    """Entries between the head and the partition's last entry, at the latest cursor poll: told at every poll while
    the head is behind, and once when it reaches the tail."""

    entries: int


@dataclass(frozen=True)
class SubscriptionRemoved:
    """A subscription is gone: its metrics go too."""

    name: str


@dataclass(frozen=True)
class RebuildRefused:
    """A state rebuilt from the log was not used (it could be premature); retried later."""

    target: Position
    reason: str


Command = (
    WriteSnapshot | AcknowledgeUpTo | PublishTable | ReadRange | ReadMarkerAt | PollCursors | HeadWatermark
    | ReadIncarnation | ClaimIncarnation | Restart | MarkerFolded | BrokenAssertion | UnusableSnapshot | ReadLag
    | SubscriptionRemoved | RebuildRefused | MarkerMalformed
)  # fmt: skip


@dataclass(frozen=True)
class EngineConfig:
    """How often an engine snapshots and how patient it is; the watermark's own configuration inside."""

    watermark: WatermarkConfig = field(default_factory=WatermarkConfig)
    """What every fold of the partition's markers uses (producer and transaction timeouts)."""
    snapshot_keys: SnapshotKeys = field(default_factory=SnapshotKeys.random)
    """Verify the snapshots restored from (the shell signs with the same keys); docs/SECURITY.md."""
    snapshot_interval_messages: int = 1_000
    snapshot_interval_s: float = 10.0
    marker_log_limit: int = 10_000
    """Markers kept in memory for subscriptions behind the head; one further behind is rebuilt from snapshots."""
    takeover_idle_s: float = 0.2
    """A take-over stops looking for a snapshot in what is delivered after this long without an entry."""
    retry_initial_s: float = 0.5
    retry_max_s: float = 10.0
    new_incarnation: Callable[[], str] = new_token
    """A fresh incarnation token, for a partition folded from its very start (tests pass their own)."""
