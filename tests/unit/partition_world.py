"""A simulated partition for the engine's unit tests: entries in ledgers, cursors, and the shell's duties.

Pure, no Pulsar: `World` carries out an engine's commands against its own log the way the shell
does against the broker. Snapshots are appended as W_SNAPSHOT entries, acknowledgements move the
generator's cursor, range reads skip deleted ledgers like a Pulsar reader, and cursor polls answer
with the subscriptions' positions. Answers are queued and handled in order, like the shell's loop;
`hold` keeps the answers of some commands back, to test what arrives meanwhile.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from broker_ext.engine import EngineConfig, PartitionEngine
from broker_ext.engine.vocabulary import (
    AcknowledgeUpTo,
    ClaimIncarnation,
    Command,
    CursorsPolled,
    EntryRead,
    Event,
    HeadWatermark,
    IncarnationClaimed,
    IncarnationRead,
    MarkerFetched,
    OwnershipLost,
    PollCursors,
    PublishTable,
    RangeRead,
    ReadIncarnation,
    ReadMarkerAt,
    ReadRange,
    RebuildRefused,
    Reported,
    Restart,
    SnapshotWritten,
    Tick,
    WriteSnapshot,
)
from watermark_core.protocol import (
    MARKER_PROPERTY,
    MarkerKind,
    Position,
    WatermarkEvent,
    decode_marker,
    encode_idle,
    encode_set,
    entry_end,
)
from watermark_core.snapshot import encode_snapshot
from watermark_core.state import WatermarkState, apply_all

TOPIC = "persistent://public/default/world"


@dataclass
class Delivery:
    """What the owner's consumer of `__wm_generator` has been delivered so far."""

    engine: PartitionEngine
    after: Position


@dataclass
class World:
    """One partition, its cursors, and the engines that follow it (one owner at a time)."""

    config: EngineConfig = field(default_factory=lambda: EngineConfig(snapshot_interval_messages=4))
    now: float = 1_000.0
    ledgers: dict[int, list[EntryRead]] = field(default_factory=lambda: {10: []})
    history: list[EntryRead] = field(default_factory=list)
    """Every entry ever written, deleted ledgers included: the truth the watermarks are checked against."""
    subscriptions: dict[str, tuple[int, int]] = field(default_factory=dict)
    generator_cursor: tuple[int, int] = (-1, -1)
    delivery: Delivery | None = None
    tables: list[tuple[float, WatermarkEvent]] = field(default_factory=list)
    last_table: tuple[WatermarkEvent, ...] = ()
    head_watermarks: list[HeadWatermark] = field(default_factory=list)
    refused: list[RebuildRefused] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)
    hold: set[type] = field(default_factory=set)
    held: list[Command] = field(default_factory=list)
    publish_time: int = 0
    incarnation: str | None = None
    """The topic property `wm.incarnation` (deleted with the topic, `recreate`)."""
    may_claim: bool = True
    """False: the broker refuses to set topic properties (the generator's role is no tenant admin)."""
    created: int = 0
    """When the topic was created, as the broker plugin reports it (0: unknown, as through the admin API)."""
    list_ledgers: bool = True
    """False: cursor answers list no ledgers."""
    restarts: list[Restart] = field(default_factory=list)
    _queue: deque[tuple[PartitionEngine, Event]] = field(default_factory=deque)

    # -- writing ------------------------------------------------------------------------------------

    @property
    def ledger(self) -> int:
        return max(self.ledgers)

    def _append(self, entry_of: type | None = None, **kwargs: object) -> Position:
        ledger = self.ledger
        position: Position = (ledger, len(self.ledgers[ledger]), -1)
        marker = kwargs.pop("marker", None)
        if not (isinstance(marker, tuple) and marker[0] is MarkerKind.W_SNAPSHOT):
            self.publish_time += 10  # the producers' clocks: the same whatever snapshots lie between
        if isinstance(marker, tuple):
            kind, producer, payload = marker
            properties = {MARKER_PROPERTY: kind.value}
            marker = decode_marker(properties, payload, producer, position, self.publish_time)
        entry = EntryRead(position, marker, str(kwargs.get("producer", "")), int(kwargs.get("event_time", 0)))
        self.ledgers[ledger].append(entry)
        self.history.append(entry)
        return position

    def w_set(self, producer: str, event_time: int, txn: str | None = None) -> Position:
        return self._append(marker=(MarkerKind.W_SET, producer, encode_set(event_time, txn)))

    def w_idle(self, producer: str) -> Position:
        return self._append(marker=(MarkerKind.W_IDLE, producer, encode_idle()))

    def data(self, producer: str, event_time: int = 0) -> Position:
        return self._append(producer=producer, event_time=event_time)

    def snapshot_record(
        self,
        state: WatermarkState,
        previous: Position | None,
        producer: str,
        incarnation: str | None = None,
        created: int = 0,
    ) -> Position:
        payload = encode_snapshot(
            state, previous, keys=self.config.snapshot_keys, topic=TOPIC, incarnation=incarnation, created=created
        )
        return self._append(marker=(MarkerKind.W_SNAPSHOT, producer, payload))

    def recreate(self) -> None:
        """The topic is deleted and created again under its name: a new log in ledgers of higher ids, no cursors,
        no property, a later creation time. The owner's consumer goes on delivering (the client reconnected), as it
        may on Pulsar."""
        self.created = self.created + 1_000 if self.created else 0
        first = self.ledger + 10
        self.ledgers = {first: []}
        self.subscriptions = {}
        self.generator_cursor = (-1, -1)
        self.incarnation = None

    def roll(self) -> int:
        """A new ledger (Pulsar rolls them over by size, time, or a broker restart)."""
        ledger = self.ledger + 1 + len(self.ledgers) % 3  # ids have gaps, like Pulsar's
        self.ledgers[ledger] = []
        return ledger

    def delete_ledger(self, ledger: int) -> None:
        """Pulsar deletes a ledger that every cursor has passed (no retention)."""
        del self.ledgers[ledger]

    def entries(self) -> Iterator[EntryRead]:
        for ledger in sorted(self.ledgers):
            yield from self.ledgers[ledger]

    def last_confirmed(self) -> tuple[int, int]:
        for ledger in sorted(self.ledgers, reverse=True):
            if self.ledgers[ledger]:
                return (ledger, len(self.ledgers[ledger]) - 1)
        return (-1, -1)

    # -- truth --------------------------------------------------------------------------------------

    def truth(self, at: Position) -> WatermarkState:
        """The fold of every marker ever written at or before `at` (deleted ledgers included)."""
        return apply_all(
            WatermarkState.initial(self.config.watermark),
            [e.marker for e in self.history if e.marker is not None and e.position <= at],
        )

    def watermark_at(self, mark_delete: tuple[int, int]) -> int | None:
        return self.truth(entry_end(*mark_delete)).watermark

    def latest(self, subscription: str) -> WatermarkEvent | None:
        """The subscription's event in the latest table (what a consumer attaching now gets)."""
        for _, event in reversed(self.tables):
            if event.subscription == subscription:
                return event
        return None

    def latest_table_holds(self, subscription: str) -> WatermarkEvent | None:
        """The subscription's event in the very latest table, None if that table does not hold it."""
        # the last table published, not the events with the last `seq`: two owners (a take-over) at the
        # world's same instant give their tables the same seq (it derives from the clock)
        return next((e for e in self.last_table if e.subscription == subscription), None)

    # -- driving engines ----------------------------------------------------------------------------

    def polled(self) -> CursorsPolled:
        ledgers = tuple((ledger, len(entries)) for ledger, entries in sorted(self.ledgers.items()))
        if not self.list_ledgers:
            ledgers = ()
        return CursorsPolled(
            dict(self.subscriptions), self.generator_cursor, self.last_confirmed(), ledgers, created=self.created
        )

    def send(self, engine: PartitionEngine, event: Event) -> None:
        """Hand `event` to `engine` and everything that follows from it, in order."""
        self._queue.append((engine, event))
        while self._queue:
            target, next_event = self._queue.popleft()
            for command in target.handle(next_event, self.now):
                self.commands.append(command)
                if type(command) in self.hold:
                    self.held.append(command)
                else:
                    self._carry_out(target, command)

    def release(self, engine: PartitionEngine, kind: type | None = None) -> None:
        """Carry out the held commands (of one kind)."""
        keep = [c for c in self.held if kind is not None and not isinstance(c, kind)]
        ready = [c for c in self.held if c not in keep]
        self.held = keep
        for command in ready:
            self._carry_out(engine, command)
        if self._queue:
            self.send(*self._queue.popleft())

    def _carry_out(self, engine: PartitionEngine, command: Command) -> None:
        answer: Event | None = None
        if isinstance(command, PollCursors):
            answer = self.polled()
        elif isinstance(command, WriteSnapshot):
            answer = SnapshotWritten(
                self.snapshot_record(
                    command.state, command.previous, "__wm_generator-world", command.incarnation, command.created
                )
            )
        elif isinstance(command, AcknowledgeUpTo):
            self.generator_cursor = command.position[:2]
        elif isinstance(command, PublishTable):
            self.tables.extend((self.now, event) for event in command.events)
            self.last_table = command.events
        elif isinstance(command, HeadWatermark):
            self.head_watermarks.append(command)
        elif isinstance(command, RebuildRefused):
            self.refused.append(command)
        elif isinstance(command, ReadIncarnation):
            answer = IncarnationRead(self.incarnation)
        elif isinstance(command, ClaimIncarnation):
            if self.may_claim:
                self.incarnation = command.token
            answer = IncarnationClaimed(command.token, self.may_claim, "" if self.may_claim else "HTTP 401")
        elif isinstance(command, Restart):
            self.restarts.append(command)
            self.delivery = None  # the shell closes the partition's consumer; discovery follows it anew
        elif isinstance(command, ReadRange):
            answer = self.read_range(command)
        elif isinstance(command, ReadMarkerAt):
            found = next((e for e in self.entries() if e.position == command.position), None)
            answer = MarkerFetched(command.request, command.position, found.marker if found else None)
        if answer is not None:
            self._queue.append((engine, answer))

    def read_range(self, command: ReadRange) -> RangeRead:
        """A reader opened after `start`: it silently begins at the first entry left after it."""
        after = [e for e in self.entries() if e.position > command.start]
        markers = tuple(e.marker for e in after if e.marker is not None and e.position <= command.stop)
        first = after[0].position if after else None
        return RangeRead(command.request, first, markers, frozenset(self.ledgers))

    def own(self, engine: PartitionEngine) -> None:
        """Pulsar makes `engine` the active consumer: the previous one loses it, delivery restarts after the cursor."""
        if self.delivery is not None and self.delivery.engine is not engine:
            self.send(self.delivery.engine, OwnershipLost("another"))
        self.delivery = Delivery(engine, entry_end(*self.generator_cursor))

    def deliver(self, count: int | None = None) -> int:
        """Deliver the next `count` entries (all) to the owner, if there is one; returns how many."""
        delivered = 0
        while (count is None or delivered < count) and self.delivery is not None:
            entry = next((e for e in self.entries() if e.position > self.delivery.after), None)
            if entry is None:
                break
            self.delivery.after = entry.position
            self.send(self.delivery.engine, entry)
            delivered += 1
        return delivered

    def deliver_listed(self, count: int) -> int:
        """Deliver, one by one, the next `count` entries as they stand now (not those the engine's own requests
        write meanwhile, such as its snapshot records): what one answer of the plugin lists; returns how many."""
        if self.delivery is None:
            return 0
        listed = [e for e in self.entries() if e.position > self.delivery.after][:count]
        for entry in listed:
            if self.delivery is None or entry.position <= self.delivery.after:
                break
            self.delivery.after = entry.position
            self.send(self.delivery.engine, entry)
        return len(listed)

    def report(self, count: int) -> int:
        """As a broker plugin's answer: the next `count` entries and the cursors, to the owner as one `Reported`
        event (an engine not owning the partition yet becomes its owner with the first entry); returns how many."""
        if self.delivery is None:
            return 0
        entries = [e for e in self.entries() if e.position > self.delivery.after][:count]
        if entries:
            self.delivery.after = entries[-1].position
        self.send(self.delivery.engine, Reported(tuple(entries), self.polled()))
        return len(entries)

    def redeliver(self, entries: int) -> None:
        """The consumer reconnected: the last `entries` are delivered again."""
        assert self.delivery is not None
        seen = [e.position for e in self.entries() if e.position <= self.delivery.after]
        if len(seen) > entries:
            self.delivery.after = seen[-entries - 1]
        else:
            self.delivery.after = (-1, -1, -1)

    def poll(self) -> None:
        if self.delivery is not None:
            self.send(self.delivery.engine, self.polled())

    def tick(self, seconds: float) -> None:
        """Time passes; the owner gets a Tick if it asked for one."""
        self.now += seconds
        if self.delivery is not None:
            wakeup = self.delivery.engine.wakeup_at
            if wakeup is not None and wakeup <= self.now:
                self.send(self.delivery.engine, Tick())

    def settle(self) -> None:
        """Deliver everything, let take-overs finish and polls happen, until nothing changes."""
        for _ in range(50):
            before = (len(self.commands), self.delivery.after if self.delivery else None)
            self.deliver()
            self.tick(1.0)
            self.poll()
            self.tick(11.0)
            if (len(self.commands), self.delivery.after if self.delivery else None) == before:
                return

    def engine(self) -> PartitionEngine:
        return PartitionEngine(TOPIC, self.config)


def ack(world: World, subscription: str, position: Position) -> None:
    """The subscription acknowledges everything up to `position`."""
    world.subscriptions[subscription] = position[:2]


def ack_all(world: World, subscription: str) -> None:
    world.subscriptions[subscription] = world.last_confirmed()


def before_entry(position: Position) -> tuple[int, int]:
    """The mark-delete of a subscription that acknowledged everything before `position`."""
    return (position[0], position[1] - 1)


__all__ = ["TOPIC", "World", "ack", "ack_all", "before_entry"]
