"""The generator's logic for ONE topic partition: events in, commands out; no I/O, no threads, no clock.

In the spirit of Flink's `WatermarkGenerator` and Beam's watermark manager: the shell feeds it
what Pulsar delivered and what the admin API answered (`handle(event, now)`, with the time passed
in) and carries out the commands it returns (broker_ext/engine/vocabulary.py). Everything with many
cases — taking a partition over, rebuilding states from snapshots, subscriptions that move back —
lives here and is tested without a broker (tests/unit/test_partition_engine.py).

Ownership: every generator instance subscribes to the partition with the same Failover
subscription (`__wm_generator`); Pulsar delivers to exactly one active consumer, so the first entry
delivered to an engine makes it the owner (`Unowned` -> `AwaitingCursor`). The owner moves that
subscription's cursor only to the stated position of a snapshot it has written, so a new owner finds,
among the first entries delivered after the cursor, a snapshot of the state at (or after) where its
delivery starts (`TakingOver`), and never reads the topic from its beginning. Then it follows the
partition (`Following`): it folds every marker into the head state, keeps the markers in a
`MarkerLog`, and each subscription's `SubscriptionTracker` folds them up to its mark-delete
position, polled by the shell. A subscription's watermark is published once folded to its
mark-delete position (a new owner that has not read that far would publish a lower value).

Snapshots (watermark_core/snapshot.py): periodically the head state at the read position (then the
cursor moves there), and the state at the start of every ledger the reading enters, so that the state
at any position still in the topic can be rebuilt exactly (broker_ext/engine/recovery.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

from broker_ext.engine.marker_log import BeforeBase, MarkerLog, SubscriptionTracker
from broker_ext.engine.recovery import (
    BEFORE_EVERYTHING,
    ReadSnapshotAt,
    SnapshotCatalog,
    ledger_start,
    normalized_cursor,
    position_before,
    read_lag,
    rebuilt_is_consistent,
    refusal,
)
from broker_ext.engine.vocabulary import (
    AcknowledgeUpTo,
    BrokenAssertion,
    ClaimIncarnation,
    Command,
    CursorsPolled,
    EngineConfig,
    EntryRead,
    Event,
    HeadWatermark,
    IncarnationClaimed,
    IncarnationRead,
    MarkerFetched,
    MarkerFolded,
    MarkerMalformed,
    OwnershipLost,
    PollCursors,
    PublishTable,
    RangeRead,
    RawMarker,
    ReadIncarnation,
    ReadLag,
    ReadMarkerAt,
    ReadRange,
    RebuildRefused,
    Reported,
    Restart,
    SnapshotFailed,
    SnapshotWritten,
    SubscriptionRemoved,
    Tick,
    UnusableSnapshot,
    WriteSnapshot,
)
from pulsar_access.topics import base_topic_and_partition
from watermark_core.protocol import (
    INCARNATION_PROPERTY,
    MARKER_PROPERTY,
    SNAPSHOT_PRODUCER_PREFIX,
    MalformedMarker,
    Marker,
    MarkerKind,
    Position,
    WatermarkEvent,
    decode_marker,
    entry_end,
)
from watermark_core.snapshot import Snapshot, decode_snapshot, is_generator_snapshot
from watermark_core.state import WatermarkState, is_broken_assertion

log = logging.getLogger(__name__)

MAX_UNTOLD = 1_000
_claim_refusals: list[str] = []
"""The first refusal to set the incarnation property (logged once, not once per partition)."""


# -- markers as the shells hand them ----------------------------------------------------------------


def decode_raw(raw: RawMarker) -> Marker:
    """The one place markers are decoded; raises `MalformedMarker`."""
    marker = decode_marker({MARKER_PROPERTY: raw.kind}, raw.payload, raw.producer, raw.position, raw.publish_time)
    if marker is None:  # not reached: the property is there
        raise MalformedMarker("bad-kind", "no marker kind")
    return marker


def _quietly(raw: RawMarker) -> Marker | None:
    try:
        return decode_raw(raw)
    except MalformedMarker:
        return None  # counted when the head read it


def _decoded_entry(entry: EntryRead, out: list[Command]) -> EntryRead:
    """`entry` with the raw marker a shell handed decoded; a malformed one is told to the shell and followed as data
    of its producer."""
    raw = entry.raw
    if raw is None:
        return entry
    try:  # built, not `dataclasses.replace`d: once per marker read
        return EntryRead(entry.position, decode_raw(raw), entry.producer, entry.event_time, entry.stretch)
    except MalformedMarker as exc:
        out.append(MarkerMalformed(exc, raw.producer, raw.position))
        return EntryRead(entry.position, None, raw.producer, entry.event_time, entry.stretch)


def _decoded(event: Event, out: list[Command]) -> Event:
    """`event` with the raw markers a shell handed decoded; a malformed one the head read is told to the shell."""
    if isinstance(event, EntryRead):
        return _decoded_entry(event, out)
    if isinstance(event, RangeRead) and event.raw:
        decoded = tuple(m for m in map(_quietly, event.raw) if m is not None)
        return replace(event, markers=event.markers + decoded, raw=())
    if isinstance(event, MarkerFetched) and event.raw is not None:
        return replace(event, marker=_quietly(event.raw), raw=None)
    return event


# -- phases -----------------------------------------------------------------------------------------


@dataclass
class Unowned:
    """Nothing was delivered to us (another instance owns the partition, or nobody wrote yet): no state."""


@dataclass
class AwaitingCursor:
    """Pulsar started delivering to us, so we own the partition; the generator cursor's position and the topic's
    incarnation property are asked for."""

    entries: list[EntryRead]
    polled: CursorsPolled | None = None
    token: str | None = None
    token_read: bool = False


@dataclass
class TakingOver:
    """Looking, in what is delivered after the generator's `cursor`, for a snapshot stating a position at or after it.

    The search ends with such a snapshot (restored at once), or at the partition's `tail` (its last
    entry when the take-over began), or once delivery pauses: then the state before the first entry
    delivered is rebuilt from the nearest snapshot known (`seen` ones included) or the partition's
    start. `not_before` delays the next attempt after a refused rebuild.
    """

    cursor: tuple[int, int]
    tail: tuple[int, int]
    entries: list[EntryRead]
    seen: list[Snapshot]
    last_entry_at: float
    not_before: float = 0.0


@dataclass
class Following:
    """We own the partition and follow it: the head state, the marker log, one tracker per subscription."""

    log: MarkerLog
    head: WatermarkState
    last_snapshot_at: float
    trackers: dict[str, SubscriptionTracker] = field(default_factory=dict)
    snapshots_due: list[tuple[WatermarkState, bool]] = field(default_factory=list)
    """Snapshots to write, in order: (state, periodic). Ledger-start ones are not periodic."""
    messages_since_snapshot: int = 0
    read_to_tail: bool = False
    """At the latest cursor poll, the head was the partition's last entry."""
    rebuilds_due: list[str] = field(default_factory=list)
    """Subscriptions whose state must be rebuilt from the log, in order."""
    evaluate_at: tuple[int, int] | None = None
    """The head reaching this (ledger, entry) lets some tracker reach its mark-delete position."""


Phase = Unowned | AwaitingCursor | TakingOver | Following


@dataclass
class Rebuild:
    """Finding the state at `target`: the nearest snapshot before it, then the markers up to `stop` read from
    the partition, then those up to `target` from the marker log. For a subscription, or (None) the take-over.
    """

    request: int
    subscription: str | None
    target: Position
    stop: Position
    found: list[Snapshot] = field(default_factory=list)
    visited: set[Position] = field(default_factory=set)
    start: tuple[WatermarkState, Position] | None = None
    """The state to fold from and its position, once the chain walk found it."""


# -- the engine -------------------------------------------------------------------------------------


class PartitionEngine:
    """One partition's watermark logic. `handle(event, now)` returns the commands to carry out."""

    def __init__(self, topic: str, config: EngineConfig | None = None) -> None:
        self.topic = topic
        self.base_topic, self.partition = base_topic_and_partition(topic)
        self.config = config or EngineConfig()
        self.phase: Phase = Unowned()
        self.catalog = SnapshotCatalog()
        self.earliest_read: Position | None = None
        self.first_ledger: int | None = None
        """The partition's oldest ledger in the latest cursor answer that listed its ledgers."""
        """The earliest entry ever delivered to us; entries before it may be deleted since."""
        self._rebuild: Rebuild | None = None
        self._requests = 0
        self._retry_delay = self.config.retry_initial_s
        self._retry_at = 0.0
        self._writing: tuple[WatermarkState, bool] | None = None
        self._write_retry_at = 0.0
        self._seq = 0
        self._told: int | None = None
        self._untold: list[tuple[Position, int | None]] = []
        """Head watermarks held back while a claim is open, told once it is answered."""
        self.created = 0
        """The topic's creation time as the broker plugin last said it (0: never): another one is a re-created topic.
        Kept while answers without one come (the admin API's), so a later report of another one still tells."""
        self._created_in_last_answer = False
        """Whether the latest cursors carried a creation time: only then does it stand in for the periodic read of
        the topic property (an answer through the admin API says nothing of a re-creation)."""
        self.incarnation: str | None = None
        """The token of the topic's incarnation our state belongs to, as the topic property names it (None: the
        property is not set, or not ours to set): on every table, head event and snapshot we write."""
        self._claiming: str | None = None
        """A token we asked the shell to set as the topic property: nothing is published until it answers."""
        self._malformed_logged: set[str] = set()
        self._broken_logged: set[str] = set()

    # -- views --------------------------------------------------------------------------------------

    @property
    def owner(self) -> bool:
        return not isinstance(self.phase, Unowned)

    @property
    def head(self) -> WatermarkState | None:
        return self.phase.head if isinstance(self.phase, Following) else None

    @property
    def head_position(self) -> Position | None:
        return self.phase.log.head_position if isinstance(self.phase, Following) else None

    @property
    def trackers(self) -> dict[str, SubscriptionTracker]:
        return self.phase.trackers if isinstance(self.phase, Following) else {}

    @property
    def wants_cursors(self) -> bool:
        """Whether fresh cursors could change something now: a take-over needs them, or a marker waits.

        A marker waits while some subscription has not acknowledged past it; the shell then polls
        fast (and backs off while nothing moves).
        """
        phase = self.phase
        if isinstance(phase, AwaitingCursor):
            return True
        if not isinstance(phase, Following):
            return False
        last = phase.log.last_marker_position
        return last is not None and any(t.applied_to < last for t in phase.trackers.values())

    @property
    def wakeup_at(self) -> float | None:
        """When the engine wants a `Tick`, if ever (it never needs one while nothing is delivered)."""
        phase = self.phase
        times: list[float] = []
        if isinstance(phase, TakingOver) and not self._rebuilding_takeover:
            times.append(max(phase.last_entry_at + self.config.takeover_idle_s, phase.not_before))
        elif isinstance(phase, Following):
            if phase.messages_since_snapshot:
                times.append(phase.last_snapshot_at + self.config.snapshot_interval_s)
            if phase.snapshots_due and self._writing is None and self._claiming is None:  # see `_next_write`
                times.append(self._write_retry_at)
            if phase.rebuilds_due and self._rebuild is None:
                times.append(self._retry_at)
        return min(times, default=None)

    @property
    def _rebuilding_takeover(self) -> bool:
        return self._rebuild is not None and self._rebuild.subscription is None

    # -- events -------------------------------------------------------------------------------------

    def handle(self, event: Event, now: float) -> list[Command]:
        """Take in one event at time `now` (seconds, wall clock: table `seq`s derive from it)."""
        out: list[Command] = []
        if isinstance(event, Reported):
            for entry in event.entries:
                self._entry(_decoded_entry(entry, out), now, out)
            if self.owner:
                self._cursors(event.cursors, now, out)
            return self._after_event(now, out)
        event = _decoded(event, out)
        if isinstance(event, EntryRead):
            self._entry(event, now, out)
        elif isinstance(event, CursorsPolled):
            self._cursors(event, now, out)
        elif isinstance(event, OwnershipLost):
            self._lose(event)
        elif isinstance(event, SnapshotWritten):
            self._written(event, out)
        elif isinstance(event, SnapshotFailed):
            self._write_failed(event, now)
        elif isinstance(event, MarkerFetched):
            self._marker_fetched(event, now, out)
        elif isinstance(event, RangeRead):
            self._range_read(event, now, out)
        elif isinstance(event, Tick):
            self._tick(now, out)
        elif isinstance(event, IncarnationRead):
            self._incarnation_read(event, now, out)
        elif isinstance(event, IncarnationClaimed):
            self._claimed(event, now, out)
        return self._after_event(now, out)

    def _after_event(self, now: float, out: list[Command]) -> list[Command]:
        """What every event may make due: a snapshot, the next write, the next rebuild."""
        if isinstance(self.phase, Following):
            self._snapshot_if_due(self.phase, now)
            self._next_write(self.phase, now, out)
            self._next_rebuild(self.phase, now, out)
        return out

    def _entry(self, entry: EntryRead, now: float, out: list[Command]) -> None:
        phase = self.phase
        if isinstance(phase, Following):
            self._follow(phase, entry, now, out)
        elif isinstance(phase, Unowned):
            self.earliest_read = min(entry.position, self.earliest_read or entry.position)
            self.phase = AwaitingCursor([entry])
            log.debug("%s: owner now; delivery starts at %s, reading the generator's cursor",
                      self.topic, entry.position[:2])  # fmt: skip
            out.append(PollCursors())
            out.append(ReadIncarnation())
        elif isinstance(phase, AwaitingCursor):
            if entry.position > phase.entries[-1].position:  # not a redelivery
                phase.entries.append(entry)
        else:
            self._search(phase, entry, now, out)

    def _cursors(self, polled: CursorsPolled, now: float, out: list[Command]) -> None:
        phase = self.phase
        if polled.created and self.created and polled.created != self.created and isinstance(phase, Following):
            # another creation time: the topic was deleted and created again, whether or not a token says so
            reason = f"it was created again at {polled.created} (ms), after {self.created}"
            log.warning("%s: %s; following it anew", self.topic, reason)
            self._lose(OwnershipLost(""))
            out.append(Restart(reason))
            return
        self.created = polled.created or self.created
        if polled.ledgers:
            self.first_ledger = min(ledger for ledger, _ in polled.ledgers)
        self._created_in_last_answer = bool(polled.created)
        if isinstance(phase, AwaitingCursor):
            phase.polled = polled
            self._take_over(phase, now, out)
        elif isinstance(phase, Following):
            self._follow_cursors(phase, polled, now, out)

    def _take_over(self, phase: AwaitingCursor, now: float, out: list[Command]) -> None:
        """Once the cursor and the topic's incarnation are known: look for the snapshot to start from."""
        polled = phase.polled
        if polled is None or not phase.token_read:
            return
        self.incarnation = phase.token  # only snapshots of this incarnation are restored from
        cursor = normalized_cursor(polled.generator_cursor, polled.ledgers)
        taking = TakingOver(cursor, polled.last_confirmed, [], [], now)
        self.phase = taking
        log.debug("%s: looking for a snapshot after the generator's cursor %s (tail %s, incarnation %s)",
                  self.topic, cursor, polled.last_confirmed, phase.token)  # fmt: skip
        for entry in phase.entries:
            if self.phase is not taking:
                self._entry(entry, now, out)  # restored already: the rest is followed
            else:
                self._search(taking, entry, now, out)

    def _incarnation_read(self, read: IncarnationRead, now: float, out: list[Command]) -> None:
        """The topic property: at a take-over, which snapshots are ours; later, whether the topic is still ours."""
        phase = self.phase
        if isinstance(phase, AwaitingCursor):
            phase.token, phase.token_read = read.token, True
            self._take_over(phase, now, out)
        elif (
            isinstance(phase, Following) and self._claiming is None and self.incarnation is not None
            and read.token != self.incarnation
        ):  # fmt: skip
            reason = (
                f"its property {INCARNATION_PROPERTY} is {read.token!r}, not our {self.incarnation!r}: the topic "
                "was deleted and created again (or another generator started it anew)"
            )
            log.warning("%s: %s; following it anew", self.topic, reason)
            self._lose(OwnershipLost(""))
            out.append(Restart(reason))

    def _claimed(self, claimed: IncarnationClaimed, now: float, out: list[Command]) -> None:
        """The property is set (or may not be): publish what was held back meanwhile, under that token."""
        f = self.phase
        if claimed.token != self._claiming or not isinstance(f, Following):
            return
        self._claiming = None
        if claimed.ok:
            self.incarnation = claimed.token
            log.info("%s: incarnation %s (topic property %s)", self.topic, claimed.token, INCARNATION_PROPERTY)
        else:
            self.incarnation = None
            if not _claim_refusals:  # once per process: every partition of a cluster is refused alike
                _claim_refusals.append(claimed.reason)
                log.warning(
                    "%s: cannot set the topic property %s (%s); watermarks go out without an incarnation token, so "
                    "if this topic is deleted and created again, readers may see its old watermark until the new "
                    "one is published. Grant the generator's role tenant admin on the data tenant to avoid it "
                    "(docs/SECURITY.md)", self.topic, INCARNATION_PROPERTY, claimed.reason,
                )  # fmt: skip
        untold, self._untold = self._untold, []
        out.extend(HeadWatermark(position, watermark, self.incarnation) for position, watermark in untold)
        self._publish(f, now, out)

    def _lose(self, lost: OwnershipLost) -> None:
        if isinstance(self.phase, Unowned):
            return
        if lost.owner:
            log.info("%s: now owned by generator %s; dropping our state", self.topic, lost.owner)
        self.phase = Unowned()
        self._rebuild = None
        self._told = None
        self._claiming = None

    def _tick(self, now: float, out: list[Command]) -> None:
        phase = self.phase
        if (
            isinstance(phase, TakingOver)
            and not self._rebuilding_takeover
            and now >= max(phase.last_entry_at + self.config.takeover_idle_s, phase.not_before)
        ):
            self._end_search(phase, now, out)

    # -- taking over --------------------------------------------------------------------------------

    def _search(self, phase: TakingOver, entry: EntryRead, now: float, out: list[Command]) -> None:
        """One more entry delivered while looking for the snapshot to start from."""
        if phase.entries and entry.position <= phase.entries[-1].position:
            return  # a redelivery (the consumer reconnected): buffered already, never twice
        phase.entries.append(entry)
        phase.last_entry_at = now
        snapshot = self._trusted(entry.marker, []) if entry.marker is not None else None  # reported once followed
        if snapshot is not None:
            phase.seen.append(snapshot)
            self.catalog.add(snapshot)
            if snapshot.at[:2] >= phase.cursor and snapshot.at[:2] >= position_before(phase.entries[0].position)[:2]:
                # it states all before the first entry delivered (a delivery that starts later than the cursor
                # leaves a gap no snapshot before it covers: rebuilt from the log at the search's end instead)
                self._rebuild = None  # a fold still under way is not needed any more
                log.info("%s: restored from the snapshot at %s stating %s",
                         self.topic, entry.position[:2], snapshot.at[:2])  # fmt: skip
                self._begin_following(snapshot.state, snapshot.at, phase.entries, now, out, restored=True)
                return
        if entry.position[:2] >= phase.tail and now >= phase.not_before and not self._rebuilding_takeover:
            self._end_search(phase, now, out)

    def _end_search(self, phase: TakingOver, now: float, out: list[Command]) -> None:
        """No delivered snapshot states a position at or after the cursor: rebuild the state before the first entry."""
        before_first = position_before(phase.entries[0].position)
        if phase.seen:
            log.warning("%s: no snapshot matches the cursor %s; starting from the nearest one known",
                        self.topic, phase.cursor)  # fmt: skip
        elif phase.cursor[1] != -1:
            log.warning("%s: no usable snapshot after the cursor %s; rebuilding the state up to %s",
                        self.topic, phase.cursor, before_first[:2])  # fmt: skip
        else:
            log.debug("%s: no snapshot after the generator's cursor; rebuilding the state before %s",
                      self.topic, phase.entries[0].position[:2])  # fmt: skip
        self._start_rebuild(None, before_first, before_first, out, now)

    def _begin_following(
        self, state: WatermarkState, at: Position, entries: list[EntryRead], now: float, out: list[Command],
        *, restored: bool,
    ) -> None:  # fmt: skip
        """Start following from `state` at `at`; replay what was delivered after `at`.

        `restored`: from a snapshot of the topic's incarnation (`self.incarnation`, its token; tokens never
        differ, `_trusted`). Otherwise folded from a snapshot of it or from the partition's very start: a state
        without a token (folded from the start, or from an older generator's snapshots) gets a new one, set as
        the topic property before anything carrying it is published (`ClaimIncarnation`).
        """
        following = Following(MarkerLog(state, at), state, last_snapshot_at=now)
        self.phase = following
        self._retry_delay = self.config.retry_initial_s
        if not restored and at == ledger_start(at[0]):  # delivery starts at a ledger's first entry: its start state
            following.snapshots_due.append((state.advanced_to(at), False))
        self._claiming, self._untold = None, []
        if self.incarnation is None:
            self._claiming = self.config.new_incarnation()
            out.append(ClaimIncarnation(self._claiming))
        if state.watermark is not None:
            self._tell_head(at, state.watermark, out)
        for entry in entries:
            self._follow(following, entry, now, out)
        out.append(PollCursors())

    # -- following ----------------------------------------------------------------------------------

    def _follow(self, f: Following, entry: EntryRead, now: float, out: list[Command]) -> None:
        """Fold one entry into the head (a redelivered one is ignored)."""
        position = entry.position
        head_position = f.log.head_position
        if position <= head_position:
            return
        marker = entry.marker
        if marker is None:
            f.messages_since_snapshot += entry.messages
        elif not marker.producer.startswith(SNAPSHOT_PRODUCER_PREFIX):
            f.messages_since_snapshot += 1  # our own snapshots do not call for another one
        if position[0] > head_position[0]:
            self._note_ledger_start(f, position[0])
        if marker is None:
            f.log.advance_head(position)
            if not entry.stretch:
                self._judge(f, entry.producer, entry.event_time, position, out)
            for producer, _, lowest in entry.stretch:
                self._judge(f, producer, lowest, position, out)
        else:
            f.log.append(marker)
            f.head = f.head.apply(marker)
            out.append(MarkerFolded(position))
            if marker.kind is MarkerKind.W_SNAPSHOT:
                snapshot = self._trusted(marker, out)
                if snapshot is not None:
                    self.catalog.add(snapshot)
            if f.head.watermark != self._told:
                self._tell_head(position, f.head.watermark, out)
        if f.evaluate_at is not None and position[:2] >= f.evaluate_at:
            self._evaluate(f, now, out)

    def _judge(self, f: Following, producer: str, event_time: int, position: Position, out: list[Command]) -> None:
        """Data of `producer` at `event_time` (0: none): below its own latest W_SET, it broke its promise."""
        if event_time and is_broken_assertion(f.head, producer, event_time):
            out.append(BrokenAssertion(producer, event_time, position))
            if producer not in self._broken_logged:
                self._broken_logged.add(producer)
                log.warning("%s: producer %r sent event time %d below its own watermark at %s (a late message)",
                            self.topic, producer, event_time, position)  # fmt: skip

    def _tell_head(self, position: Position, watermark: int | None, out: list[Command]) -> None:
        """The head's watermark changed at `position`; held back (and told once claimed) while a claim is open."""
        self._told = watermark
        if self._claiming is None:
            out.append(HeadWatermark(position, watermark, self.incarnation))
        else:
            self._untold.append((position, watermark))
            del self._untold[:-MAX_UNTOLD]  # each is a lower bound of the ones after: the earliest can go

    def _note_ledger_start(self, f: Following, ledger: int) -> None:
        """Reading enters a new ledger: keep the state before its first entry, to write as a snapshot.

        Pulsar deletes whole ledgers, and a snapshot stating `(ledger, -1)` lands in that ledger or a
        later one and lives as long as it does, so the state at any position still in the topic can
        be rebuilt exactly from its ledger's start, reading only that ledger.
        """
        start = ledger_start(ledger)
        f.snapshots_due.append((f.head.advanced_to(start), False))

    def _follow_cursors(self, f: Following, polled: CursorsPolled, now: float, out: list[Command]) -> None:
        """Every subscription's mark-delete position: move its tracker, recompute it if it moved back."""
        lag = read_lag(f.log.head_position, polled.last_confirmed, polled.ledgers)
        if lag or not f.read_to_tail:  # at the tail again tells nothing new; a lag is told each time (stall watch)
            out.append(ReadLag(lag))
        f.read_to_tail = lag == 0
        for name in [n for n in f.trackers if n not in polled.subscriptions]:
            log.info("%s: subscription %r removed", self.topic, name)
            del f.trackers[name]
            out.append(SubscriptionRemoved(name))
        for name, (ledger, entry) in sorted(polled.subscriptions.items()):
            mark_delete = entry_end(ledger, entry)
            tracker = f.trackers.get(name)
            if tracker is None:
                tracker = SubscriptionTracker(name, f.head, mark_delete, mark_delete)
                f.trackers[name] = tracker
                log.debug("%s: following subscription %r from %s", self.topic, name, (ledger, entry))
                self._place(f, tracker)
            elif mark_delete < tracker.mark_delete:
                log.info("%s: subscription %r moved back from %s to %s; recomputing its watermark",
                         self.topic, name, tracker.mark_delete[:2], (ledger, entry))  # fmt: skip
                tracker.mark_delete = mark_delete
                tracker.announced = False  # publish the recomputed value, even an unchanged one
                if not tracker.rebuilding:
                    self._place(f, tracker)
            else:
                tracker.mark_delete = mark_delete
        self._evaluate(f, now, out)

    def _place(self, f: Following, tracker: SubscriptionTracker) -> None:
        """Give `tracker` the state at its position: from the marker log, else rebuilt from the partition."""
        target = min(tracker.mark_delete, f.log.head_position)
        if target >= f.log.base_position:
            tracker.state, tracker.applied_to, tracker.rebuilding = f.log.state_at(target, f.head), target, False
        else:
            self._rebuild_later(f, tracker)

    def _rebuild_later(self, f: Following, tracker: SubscriptionTracker) -> None:
        tracker.rebuilding = True
        if tracker.name not in f.rebuilds_due:
            f.rebuilds_due.append(tracker.name)

    def _evaluate(self, f: Following, now: float, out: list[Command]) -> None:
        """Move every tracker toward its mark-delete position; publish the table if a watermark changed."""
        head_position = f.log.head_position
        waiting: list[tuple[int, int]] = []
        for tracker in f.trackers.values():
            if tracker.rebuilding:
                continue
            if min(tracker.mark_delete, head_position) < tracker.applied_to:
                self._place(f, tracker)  # moved back again while it was being rebuilt
                if tracker.rebuilding:
                    continue
            try:
                tracker.advance(f.log, f.head)
            except BeforeBase:
                self._rebuild_later(f, tracker)
                continue
            if tracker.applied_to[:2] < tracker.mark_delete[:2]:
                waiting.append(tracker.mark_delete[:2])
        f.evaluate_at = min(waiting, default=None)
        self._publish(f, now, out)

    def _publish(self, f: Following, now: float, out: list[Command]) -> None:
        """Publish the table if a ready subscription's watermark, or who holds it, is not the one last published.

        Ready: folded to its mark-delete position (or the head is the partition's last entry). A
        subscription without a watermark is published too (event_time None) where the partition has
        had one: after a seek back before every W_SET, or for a subscription re-created under an old
        name, the latest table may still hold a watermark for it that is premature now. Every table
        names every subscription published before: one not ready (acknowledged ahead of our head, or
        being rebuilt) with its last event, still true at the position it names; compaction keeps only
        the latest table, and a consumer attaching must find its subscription there.
        """
        if self._claiming is not None:
            return  # published once the topic property names the token they carry
        had_watermark = f.head.watermark is not None
        ready = [
            t for t in f.trackers.values()
            if not t.rebuilding
            and (t.applied_to[:2] >= t.mark_delete[:2] or f.read_to_tail)
            and (t.state.watermark is not None or had_watermark)
        ]  # fmt: skip
        changed = tuple(t.name for t in ready if t.unpublished())
        if not changed:
            return
        self._seq = max(self._seq + 1, int(now * 1_000_000))
        for t in ready:
            t.mark_published()
            t.last_event = WatermarkEvent(
                topic=self.base_topic,
                partition=self.partition,
                subscription=t.name,
                event_time=t.state.watermark,
                position=(t.mark_delete[0], t.mark_delete[1]),
                seq=self._seq,
                active=t.state.active_producers(),
                idle=tuple(t.state.idle_producers()),
                pending=len(t.state.pending_txns),
                incarnation=self.incarnation,
            )
            if log.isEnabledFor(logging.DEBUG):
                log.debug("%s: publishing %r: watermark %s folded to %s, mark-delete %s, active %s, idle %s",
                          self.topic, t.name, t.state.watermark, t.applied_to[:2], t.mark_delete[:2],
                          t.state.active_producers(), t.state.idle_producers())  # fmt: skip
        events = tuple(
            t.last_event if t.last_event.seq == self._seq else replace(t.last_event, seq=self._seq)
            for t in f.trackers.values()
            if t.last_event is not None
        )
        out.append(PublishTable(events, changed))

    # -- snapshots ----------------------------------------------------------------------------------

    def _trusted(self, marker: Marker, out: list[Command]) -> Snapshot | None:
        """A generator's snapshot of the topic's incarnation, or without a token (an older generator's, or one that
        may not set the property); others' W_SNAPSHOT records are never trusted, nor those of a deleted incarnation
        (a generator whose consumer followed the topic's new incarnation writes them there). None for anything else."""
        if not is_generator_snapshot(marker):
            return None
        try:
            snapshot = decode_snapshot(marker, self.config.watermark, keys=self.config.snapshot_keys, topic=self.topic)
            if snapshot.incarnation is not None and snapshot.incarnation != self.incarnation:
                log.debug("%s: the snapshot at %s is of incarnation %s, not %s: not ours",
                          self.topic, marker.position[:2], snapshot.incarnation, self.incarnation)  # fmt: skip
                return None
            if snapshot.created and self.created and snapshot.created != self.created:
                # computed under another creation of the topic: an engine that followed the old topic into the new
                # one's first ledger before it heard of the re-creation wrote it there (no token tells them apart)
                log.info("%s: the snapshot at %s was computed for the topic created at %d, not at %d: not ours",
                         self.topic, marker.position[:2], snapshot.created, self.created)  # fmt: skip
                return None
            return snapshot
        except MalformedMarker as exc:  # e.g. written by an incompatible version: never fatal, just not used
            out.append(UnusableSnapshot(marker.position, exc.reason))
            if exc.reason not in self._malformed_logged:
                self._malformed_logged.add(exc.reason)
                log.warning("%s: skipping unusable snapshot at %s: %s", self.topic, marker.position[:2], exc)
            return None

    def _snapshot_if_due(self, f: Following, now: float) -> None:
        """Every `snapshot_interval_messages` messages, or `snapshot_interval_s` after one: the head's state."""
        if not f.messages_since_snapshot or (
            f.messages_since_snapshot < self.config.snapshot_interval_messages
            and now - f.last_snapshot_at < self.config.snapshot_interval_s
        ):
            return
        at = f.log.head_position
        for tracker in f.trackers.values():  # let the trackers catch up with the head, so the log trims further
            if not tracker.rebuilding:
                try:
                    tracker.advance(f.log, f.head)
                except BeforeBase:
                    self._rebuild_later(f, tracker)
        f.snapshots_due.append((f.head.advanced_to(at), True))
        f.messages_since_snapshot = 0
        f.last_snapshot_at = now
        # A subscription far behind (one that never acknowledges) must not pin the markers in memory: past
        # `marker_log_limit` markers it is left before the log's base, and rebuilt from snapshots once it moves.
        floor = f.log.keeping(self.config.marker_log_limit)
        keep = [at] + [max(t.applied_to, floor) for t in f.trackers.values()]
        if self._rebuild is not None:
            keep.append(self._rebuild.stop)  # its fold goes on from the marker log there
        up_to = min(keep)
        # the state there when the head or a subscription has it already: the trim folds nothing
        standing_there = (t.state for t in f.trackers.values() if not t.rebuilding and t.applied_to == up_to)
        known = f.head if up_to == at else next(standing_there, None)
        f.log.trim(up_to, known)

    def _next_write(self, f: Following, now: float, out: list[Command]) -> None:
        """Ask for the next snapshot to be written: one at a time, so each names the one before it."""
        if self._writing is not None or not f.snapshots_due or now < self._write_retry_at or self._claiming is not None:
            return
        self._writing = f.snapshots_due[0]
        state, periodic = self._writing
        out.append(WriteSnapshot(state, self.catalog.previous_for_next(), periodic, self.incarnation, self.created))
        if periodic and self.incarnation is not None and not self._created_in_last_answer:
            # now and then: is the topic still the one we follow? (a creation time, when the plugin gives one,
            # tells that at every poll without an admin call per topic)
            out.append(ReadIncarnation())

    def _written(self, written: SnapshotWritten, out: list[Command]) -> None:
        if self._writing is None:
            return
        self.catalog.last_written = written.message
        state, periodic = item = self._writing
        self._writing = None
        f = self.phase
        if not isinstance(f, Following) or not f.snapshots_due or f.snapshots_due[0] is not item:
            return  # ownership changed meanwhile: the new state writes its own
        f.snapshots_due.pop(0)
        if periodic and state.position is not None:
            out.append(AcknowledgeUpTo(state.position))
        elif state.position is not None:
            log.debug("%s: wrote the snapshot of ledger %d's start (watermark %s)",
                      self.topic, state.position[0], state.watermark)  # fmt: skip

    def _write_failed(self, failed: SnapshotFailed, now: float) -> None:
        self._writing = None
        self._write_retry_at = now + self.config.retry_initial_s
        log.warning("%s: writing a snapshot failed (%s); retrying in %.1f s",
                    self.topic, failed.reason, self.config.retry_initial_s)  # fmt: skip

    # -- rebuilding ---------------------------------------------------------------------------------

    def _next_rebuild(self, f: Following, now: float, out: list[Command]) -> None:
        """Start the next subscription's rebuild: one at a time, after the back-off of a refused one."""
        while self._rebuild is None and f.rebuilds_due and now >= self._retry_at:
            tracker = f.trackers.get(f.rebuilds_due.pop(0))
            if tracker is None or not tracker.rebuilding:
                continue
            target = min(tracker.mark_delete, f.log.head_position)
            if target >= f.log.base_position:  # the marker log reaches back there now
                self._place(f, tracker)
                self._evaluate(f, now, out)
                continue
            self._start_rebuild(tracker.name, target, min(target, f.log.base_position), out, now)

    def _start_rebuild(
        self, subscription: str | None, target: Position, stop: Position, out: list[Command], now: float
    ) -> None:
        self._requests += 1
        self._rebuild = Rebuild(self._requests, subscription, target, stop)
        self._walk(self._rebuild, out, now)

    def _walk(self, rebuild: Rebuild, out: list[Command], now: float) -> None:
        """Walk the snapshot chain back to the nearest snapshot at or before the target, then read on from it."""
        while rebuild.start is None:
            step = self.catalog.nearest(rebuild.target, rebuild.found, rebuild.visited)
            if isinstance(step, ReadSnapshotAt):
                rebuild.visited.add(step.position)
                out.append(ReadMarkerAt(rebuild.request, step.position))
                return
            if step is None:
                rebuild.start = (WatermarkState.initial(self.config.watermark), BEFORE_EVERYTHING)
            else:
                rebuild.start = (step.state, step.at)
            self.catalog.remember(rebuild.found)
        state, at = rebuild.start
        if at >= rebuild.stop:
            self._finish(rebuild, state, at, out, now)
        elif at == BEFORE_EVERYTHING and self._nothing_before(rebuild.stop):
            self._finish(rebuild, state, rebuild.stop, out, now)  # what a read would have found: no entry
        else:
            out.append(ReadRange(rebuild.request, at, rebuild.stop))

    def _nothing_before(self, stop: Position) -> bool:
        """Whether the partition has no entry at or before `stop`, as the latest ledger list says (a fresh topic's
        take-over: its first entry delivered is its oldest ledger's first), and none was ever read there."""
        return (
            self.first_ledger is not None and stop <= ledger_start(self.first_ledger)
            and (self.earliest_read is None or self.earliest_read > stop)
        )  # fmt: skip

    def _marker_fetched(self, fetched: MarkerFetched, now: float, out: list[Command]) -> None:
        rebuild = self._rebuild
        if rebuild is None or fetched.request != rebuild.request:
            return
        if fetched.error is not None:
            self._retry(rebuild, f"reading the snapshot at {fetched.position[:2]} failed: {fetched.error}", now, out)
            return
        snapshot = self._trusted(fetched.marker, out) if fetched.marker is not None else None
        if snapshot is None:  # the chain ends here (deleted, or not a snapshot of ours): from the start
            rebuild.start = (WatermarkState.initial(self.config.watermark), BEFORE_EVERYTHING)
        else:
            rebuild.found.append(snapshot)
            self.catalog.add(snapshot)
        self._walk(rebuild, out, now)

    def _range_read(self, read: RangeRead, now: float, out: list[Command]) -> None:
        rebuild = self._rebuild
        if rebuild is None or read.request != rebuild.request or rebuild.start is None:
            return
        if read.error is not None:
            self._retry(rebuild, f"reading the partition failed: {read.error}", now, out)
            return
        state, at = rebuild.start
        if at == BEFORE_EVERYTHING:
            # a snapshot read on the way states the fold of all before it, deleted ledgers included: the fold
            # goes on from the latest one (the partition's first entry left may follow ledgers deleted unread)
            found = [s for m in read.markers if (s := self._trusted(m, [])) is not None and s.at <= rebuild.stop]
            if found:
                latest = max(found, key=lambda snapshot: snapshot.at)
                state, at = latest.state, latest.at
        reason = refusal(at, read.first, read.ledgers, self.earliest_read)
        if reason is not None:
            if at != BEFORE_EVERYTHING:
                self.catalog.forget_walked_through(at[0])
            self._refuse(rebuild, reason, now, out)
            return
        folded = 0
        for marker in read.markers:
            if at < marker.position <= rebuild.stop and (state.position is None or marker.position > state.position):
                state = state.apply(marker)
                folded += 1
        log.debug("%s: folded %d markers in (%s, %s]: first entry read %s, watermark %s",
                  self.topic, folded, at[:2], rebuild.stop[:2], read.first and read.first[:2],
                  state.watermark)  # fmt: skip
        self._finish(rebuild, state, max(at, rebuild.stop), out, now)

    def _finish(self, rebuild: Rebuild, state: WatermarkState, at: Position, out: list[Command], now: float) -> None:
        """The state at `at` is known; complete it up to the target and use it."""
        self._rebuild = None
        phase = self.phase
        if rebuild.subscription is None:
            if isinstance(phase, TakingOver):
                log.info("%s: rebuilt the state at %s (watermark %s); following from there",
                         self.topic, rebuild.target[:2], state.watermark)  # fmt: skip
                self._begin_following(state, rebuild.target, phase.entries, now, out, restored=False)
            return
        if not isinstance(phase, Following):
            return
        tracker = phase.trackers.get(rebuild.subscription)
        if tracker is None or not tracker.rebuilding:
            return
        if min(tracker.mark_delete, phase.log.head_position) < rebuild.target:
            self._rebuild_later(phase, tracker)  # it moved back further meanwhile
            return
        if rebuild.target > at:
            try:
                state = phase.log.fold(state, at, rebuild.target)
            except BeforeBase:
                self._rebuild_later(phase, tracker)
                return
        if not rebuilt_is_consistent(state, phase.head):
            self._refuse(rebuild, (
                f"its watermark {state.watermark} is above the watermark {phase.head.watermark} at our head "
                f"{phase.log.head_position[:2]}"
            ), now, out)  # fmt: skip
            return
        tracker.state, tracker.applied_to, tracker.rebuilding = state, rebuild.target, False
        self._retry_delay = self.config.retry_initial_s
        self._evaluate(phase, now, out)

    def _refuse(self, rebuild: Rebuild, reason: str, now: float, out: list[Command]) -> None:
        """A rebuilt state that could be premature is not used: the watermark waits, the rebuild is retried."""
        start = rebuild.start[1] if rebuild.start is not None else BEFORE_EVERYTHING
        log.warning("%s: the state rebuilt at %s from %s: %s; not using it, retrying in %.1f s",
                    self.topic, rebuild.target[:2], start[:2], reason, self._retry_delay)  # fmt: skip
        out.append(RebuildRefused(rebuild.target, reason))
        self._retry(rebuild, None, now, out)

    def _retry(self, rebuild: Rebuild, failure: str | None, now: float, out: list[Command]) -> None:
        if failure is not None:
            log.warning("%s: rebuilding the state at %s: %s; retrying in %.1f s",
                        self.topic, rebuild.target[:2], failure, self._retry_delay)  # fmt: skip
        self._rebuild = None
        self._retry_at = now + self._retry_delay
        self._retry_delay = min(self._retry_delay * 2, self.config.retry_max_s)
        phase = self.phase
        if rebuild.subscription is None and isinstance(phase, TakingOver):
            phase.not_before = self._retry_at
        elif rebuild.subscription is not None and isinstance(phase, Following):
            tracker = phase.trackers.get(rebuild.subscription)
            if tracker is not None and tracker.rebuilding:
                phase.rebuilds_due.insert(0, tracker.name)
