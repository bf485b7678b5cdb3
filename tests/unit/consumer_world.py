"""A simulated subscription around the consumer engine: logs, a broker cursor, a generator, other consumers.

Pure, no Pulsar: `ConsumerWorld` carries out the engine's commands the way the shell does against the
client (deliveries go to the application, acknowledgements to the broker's cursor), and plays what the
engine sits between: the broker dispatching entries of each partition's log to this consumer or to
another consumer of a Shared subscription, redelivering what is negatively acknowledged, seeks and an
operator's reset-cursor moving the subscription back or forward; the generator polling the mark-delete
position and publishing the fold of the log there, and head events as it reads the log, into a channel
the engine reads late (and nothing while the generator is down); partitions added to the topic.

The log of a partition: honest producers, each starting with a W_SET, each data message at or above its
producer's latest W_SET, W_SETs never going down; its fold at entry e (the minimum over producers of
their latest W_SET at or before e) never decreases along the log. Entry e is at position (L, e).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from consumer.engine import (
    Acknowledged,
    CaughtUp,
    ConsumerEngine,
    Deliver,
    Event,
    HandWatermark,
    HeadRead,
    NegativelyAcknowledged,
    PartitionsChanged,
    Received,
    SendAcknowledgement,
    Skip,
    Sought,
    Tick,
    WatermarkRead,
)
from watermark_core.protocol import Position, Watermark

L = 7


def at(entry: int) -> Position:
    return (L, entry, -1)


class Key:
    """A lane's key as the consumer's shell writes it (consumer/trust.py `Lane`): the client binding's message id,
    which orders as positions do with `<` alone (its `==` also compares the partition), has no hash, and gives its
    position through three getters."""

    __slots__ = ("_at",)
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, ledger: int, entry: int, batch: int) -> None:
        self._at = (ledger, entry, batch)

    def __lt__(self, other: Key) -> bool:
        return self._at < other._at

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Key) and self._at == other._at

    def ledger_id(self) -> int:
        return self._at[0]

    def entry_id(self) -> int:
        return self._at[1]

    def batch_index(self) -> int:
        return self._at[2]


def key_of(position: Position) -> Key:
    return Key(*position)


@dataclass(frozen=True)
class Entry:
    producer: str
    event_time: int
    marker: bool


@dataclass
class Partition:
    """A partition's log and the subscription's cursor on it, at the broker."""

    log: list[Entry]
    acked: set[int] = field(default_factory=set)
    read: int = 0
    """The next entry the broker dispatches (after the redeliveries)."""
    redeliver: set[int] = field(default_factory=set)
    ours: set[int] = field(default_factory=set)
    """Dispatched to this consumer and not acknowledged, redelivered or dropped by a seek."""
    others: set[int] = field(default_factory=set)
    """Dispatched to another consumer of the Shared subscription and not acknowledged."""

    def mark_delete(self) -> int:
        entry = -1
        while entry + 1 in self.acked:
            entry += 1
        return entry

    def fold(self, entry: int) -> int | None:
        latest: dict[str, int] = {}
        for item in self.log[: entry + 1]:
            if item.marker:
                latest[item.producer] = item.event_time
        return min(latest.values()) if latest else None

    def next_to_dispatch(self) -> int | None:
        self.redeliver -= self.acked
        if self.redeliver:
            entry = min(self.redeliver)
            self.redeliver.discard(entry)
            return entry
        while self.read < len(self.log) and self.read in self.acked:
            self.read += 1
        if self.read >= len(self.log):
            return None
        self.read += 1
        return self.read - 1

    def move(self, target: int) -> None:
        """A seek or reset-cursor: everything from `target` on is unacknowledged and delivered again."""
        self.acked = {e for e in self.acked if e < target} | set(range(target))
        self.read, self.redeliver, self.ours, self.others = target, set(), set(), set()


class ConsumerWorld:
    def __init__(
        self, logs: list[list[Entry]], *, listener: bool, partitioned: bool, publishes_none: bool = True
    ) -> None:
        self.publishes_none = publishes_none
        """False: as the generator today, nothing is published for a state without a watermark."""
        self.partitions: dict[int, Partition] = {
            (i if partitioned else -1): Partition(list(log)) for i, log in enumerate(logs)
        }
        self.listener = listener
        self.engine = ConsumerEngine(list(self.partitions), listener=listener, follow_new=partitioned, key=key_of)
        self.keys: dict[tuple[int, int], Key] = {}
        """The key each message's last delivery rode on (the shell's message id), for the lanes."""
        self.now = 0.0
        self.channel: deque[Event] = deque()
        self._generator_up = True
        self.moved: set[int] = set()
        """Partitions moved back (a seek, a reset) at least once: see `still_to_come`."""
        self.elsewhere: dict[int, set[int]] = {}
        """Entries dispatched to another consumer of the Shared subscription after a move back: see `still_to_come`."""
        self.received_here: dict[int, set[int]] = {}
        """Entries ever dispatched to this consumer: only one of them coming again shows it a reset."""
        self.unrecomputed: set[int] = set()
        """Partitions moved back (a seek, a reset) that the generator has not polled since."""
        self.missed: dict[int, WatermarkRead | None] = {}
        """Partitions moved back while the generator was down, or that it went down before it polled them after a
        move back; with the event it published for them once up again (None: not yet), until the consumer reads
        it. The engine assumes a live generator: a stale event still the latest a while after its reader caught up
        is taken (consumer/trust.py `take_stale`), which is premature only for such a move; the checks leave
        these partitions out, as the documented gap (docs/DECISIONS.md, issue 34)."""
        self.published: dict[int, int | None] = {}
        """The mark-delete position the generator published last, per partition."""
        self.head_read: dict[int, int] = {}
        self.handed: list[tuple[int, int]] = []
        """The application's messages: handed over, not acknowledged yet."""
        self.watermark: Watermark | None = None
        """What the application holds: the listener's last hand-over, or `get_last_watermark()`."""
        self.moved_back = False
        self.since_move: dict[int, set[int]] = {}
        """Per partition moved back, the positions the generator published events at since the move: only a
        watermark from those says the consumer holds the fold where the subscription moved to (an event read
        late, from before the move, can have the same value and say nothing of it)."""
        self.unseen_reset: set[int] = set()
        """Partitions an operator's reset-cursor moved, with no message of theirs received since: the consumer
        learns of a reset only from what comes again, so until then what it holds may be above their messages."""
        self.added: set[int] = set()
        self.events = 0

    # -- the engine's shell ------------------------------------------------------------------------------

    def send(self, event: Event) -> None:
        for command in self.engine.handle(event, self.now):
            if isinstance(command, Deliver):
                partition, entry = command.token  # type: ignore[misc]
                self.check_hand_over(partition, entry)
                self.handed.append((partition, entry))
            elif isinstance(command, HandWatermark):
                self.observe(None if command.withdrawn else command.watermark)
            elif isinstance(command, SendAcknowledgement):
                token = command.token  # a message (a skipped one) or an acknowledgement
                assert isinstance(token, tuple)
                self.broker_ack(token[0], token[1], len(token) == 3 and token[2])
            elif isinstance(command, Skip):
                pass
        if not self.listener:
            self.observe(self.engine.current)
        self.check_still_to_come()

    def broker_ack(self, partition: int, entry: int, cumulative: bool) -> None:
        state = self.partitions[partition]
        if cumulative:
            state.acked |= set(range(entry + 1))
            state.ours = {e for e in state.ours if e > entry}
        else:
            state.acked.add(entry)
            state.ours.discard(entry)

    # -- what happens -------------------------------------------------------------------------------------

    def deliver(self, partition: int, to_other: bool = False) -> None:
        state = self.partitions[partition]
        entry = state.next_to_dispatch()
        if entry is None:
            return
        if to_other:
            state.others.add(entry)
            if partition in self.moved:
                self.elsewhere.setdefault(partition, set()).add(entry)
            return
        state.ours.add(entry)
        seen = self.received_here.setdefault(partition, set())
        if entry in seen:  # what comes again shows the reset; an entry never received here does not
            self.unseen_reset.discard(partition)
        seen.add(entry)
        key = self.keys[(partition, entry)] = Key(*at(entry))
        if state.log[entry].marker and self.engine.skipped_quietly(partition, key):  # the shell's hot path
            self.broker_ack(partition, entry, False)
            self.observe(self.engine.current)
            self.check_still_to_come()
            return
        if not state.log[entry].marker and self.engine.received_quietly(partition, key):
            self.check_hand_over(partition, entry)  # the shell's hot path: delivered, nothing else
            self.handed.append((partition, entry))
            self.observe(self.engine.current)
            self.check_still_to_come()
            return
        self.send(Received(partition, at(entry), (partition, entry), marker=state.log[entry].marker))

    def ack(self, index: int, cumulative: bool = False) -> None:
        if not self.handed:
            return
        partition, entry = self.handed.pop(index % len(self.handed))
        if cumulative:
            self.handed = [(p, e) for p, e in self.handed if p != partition or e > entry]
        elif self.engine.acknowledged_quietly(partition, self.keys.get((partition, entry)) or key_of(at(entry))):
            self.broker_ack(partition, entry, False)
            self.observe(self.engine.current)
            self.check_still_to_come()
            return
        self.send(Acknowledged(partition, at(entry), (partition, entry, cumulative), cumulative=cumulative))

    def nack(self, index: int) -> None:
        if not self.handed:
            return
        partition, entry = self.handed.pop(index % len(self.handed))
        self.send(NegativelyAcknowledged(partition, at(entry)))
        state = self.partitions[partition]
        if entry in state.ours:
            state.ours.discard(entry)
            state.redeliver.add(entry)

    def ack_timeout(self, index: int) -> None:
        """The broker redelivers a message the application holds (its acknowledgement timed out): a second
        copy, to this consumer or to another one of a Shared subscription that may acknowledge it."""
        if not self.handed:
            return
        partition, entry = self.handed[index % len(self.handed)]
        state = self.partitions[partition]
        if entry in state.ours and entry not in state.acked:
            state.redeliver.add(entry)

    def copy_acknowledged_elsewhere(self, index: int) -> None:
        """A message the application holds was redelivered to another consumer (its acknowledgement timed
        out), which acknowledged it: the subscription moves on past a message this consumer still holds."""
        if not self.handed:
            return
        partition, entry = self.handed[index % len(self.handed)]
        self.partitions[partition].acked.add(entry)

    def other(self, partition: int, index: int, acknowledge: bool) -> None:
        state = self.partitions[partition]
        if not state.others:
            return
        entry = sorted(state.others)[index % len(state.others)]
        state.others.discard(entry)
        if acknowledge:
            state.acked.add(entry)
        else:
            state.redeliver.add(entry)

    def seek(self, partition: int, target: int, how: str) -> None:
        """`how`: "id" (resumes after the target, which the engine acknowledges), "inclusive", "time",
        "earliest", or "reset" (an operator's reset-cursor: the engine is not told)."""
        state = self.partitions[partition]
        target = 0 if how == "earliest" else min(target, len(state.log))
        if how == "id" and target >= len(state.log):
            target = len(state.log) - 1
        if how == "id" and target < 0:
            return
        state.move(target)
        self.moved_back = True
        self.since_move[partition] = set()
        self.moved.add(partition)
        self.unrecomputed.add(partition)
        if not self.generator_up:
            self.missed[partition] = None
        if how == "reset":
            self.unseen_reset.add(partition)
            return
        self.unseen_reset.discard(partition)
        self.handed = [(p, e) for p, e in self.handed if p != partition]
        engine_target = {"id": (L, target), "inclusive": (L, target), "time": None, "earliest": (-1, -1)}[how]
        self.send(Sought((partition,), engine_target, skips_target=how == "id"))

    @property
    def generator_up(self) -> bool:
        return self._generator_up

    @generator_up.setter
    def generator_up(self, up: bool) -> None:
        if not up:
            for partition in self.unrecomputed:
                self.missed.setdefault(partition, None)
        self._generator_up = up

    def generator_poll(self) -> None:
        if not self.generator_up:
            return
        for partition, state in self.partitions.items():
            mark_delete = state.mark_delete()
            fold = state.fold(mark_delete)
            self.unrecomputed.discard(partition)
            if self.published.get(partition, -2) != mark_delete and (fold is not None or self.publishes_none):
                self.published[partition] = mark_delete
                if partition in self.since_move:
                    self.since_move[partition].add(mark_delete)
                event = WatermarkRead(partition, (L, mark_delete), fold)
                self.channel.append(event)
                if partition in self.missed and self.missed[partition] is None:
                    self.missed[partition] = event
            elif self.missed.get(partition, 0) is None and self.published.get(partition) == mark_delete:
                del self.missed[partition]  # back where it published last: that event is true again
            head = self.head_read.get(partition, -1)
            for entry in range(head + 1, len(state.log)):
                if state.log[entry].marker:
                    fold = state.fold(entry)
                    assert fold is not None
                    self.channel.append(HeadRead(partition, (L, entry), fold))
            self.head_read[partition] = len(state.log) - 1

    def read_events(self, count: int) -> None:
        for _ in range(min(count, len(self.channel))):
            event = self.channel.popleft()
            if isinstance(event, WatermarkRead) and self.missed.get(event.partition) is event:
                del self.missed[event.partition]  # read: from now on the checks hold for it again
            self.send(event)

    def caught_up(self) -> None:
        """The engine's reader has read everything published (only true when the channel is empty)."""
        if not self.channel:
            self.send(CaughtUp(self.now))

    def restate(self) -> None:
        """The companion topic is busy (issue 34, fault 2): a table published for another subscription names this
        one's last event again, on every partition the generator published for."""
        for partition, entry in self.published.items():
            if entry is not None:
                self.channel.append(WatermarkRead(partition, (L, entry), self.partitions[partition].fold(entry)))

    def read_to_end(self) -> None:
        """The reader reads what is there and finds nothing more available: caught up, never quiet for long."""
        self.read_events(len(self.channel))
        self.caught_up()

    def reset_while_in_flight(self, partition: int, back: int, count: int) -> None:
        """Issue 34, fault 1: the generator publishes an event the consumer has not read yet; an operator resets the
        cursor `back` entries before the mark-delete position; `count` entries come again and are acknowledged; the
        event is read, and a second later the reader has caught up."""
        self.generator_poll()
        self.seek(partition, max(0, self.partitions[partition].mark_delete() + 1 - back), "reset")
        for _ in range(count):
            self.deliver(partition)
        while self.handed:
            self.ack(0)
        self.read_events(len(self.channel))
        self.tick(1.0, poll=False)  # the generator has not published its recomputed event yet
        self.caught_up()

    def tick(self, seconds: float, *, poll: bool = True) -> None:
        """Time passes; a generator that is up polls meanwhile (it publishes what it recomputes within about a
        second: the engine's waits count on it, see `missed`), unless `poll` is False (a slow one)."""
        if poll:
            self.generator_poll()
        self.now += seconds
        self.send(Tick())

    def add_partition(self, log: list[Entry]) -> None:
        index = max(self.partitions) + 1
        self.partitions[index] = Partition(list(log))
        self.added.add(index)
        self.send(PartitionsChanged(tuple(self.partitions)))

    def append(self, partition: int, entry: Entry) -> None:
        self.partitions[partition].log.append(entry)

    # -- the checks ---------------------------------------------------------------------------------------

    def joining(self, partition: int) -> bool:
        return partition not in self.engine.trust or self.engine.trust.state(partition).joining is not None

    def still_to_come(self) -> int | None:
        """The lowest event time of a data message the subscription has not acknowledged (partitions that
        joined the minimum only, and not moved by a reset-cursor the consumer has not seen yet, nor `missed`).

        After a move back, a message another consumer of the Shared subscription holds is unknown here: what came
        again here is all the trust rule can go by (the known gap, docs/DECISIONS.md, issue 34;
        `test_after_a_reset_in_a_shared_subscription_a_message_another_consumer_holds_is_unknown`)."""
        times = [
            item.event_time for partition, state in self.partitions.items()
            if not self.joining(partition) and partition not in self.unseen_reset and partition not in self.missed
            for entry, item in enumerate(state.log) if not item.marker and entry not in state.acked
            and entry not in self.elsewhere.get(partition, ())
        ]  # fmt: skip
        return min(times, default=None)

    def check_still_to_come(self) -> None:
        """Pull: `get_last_watermark()` is never above a message still to come."""
        if self.listener or self.watermark is None:
            return
        lowest = self.still_to_come()
        assert lowest is None or self.watermark.event_time <= lowest, (self.watermark, lowest)

    def check_hand_over(self, partition: int, entry: int) -> None:
        """A message handed to a listener is never older than the watermark it comes under."""
        if not self.listener or self.watermark is None or self.joining(partition) or partition in self.missed:
            return
        item = self.partitions[partition].log[entry]
        assert self.watermark.event_time <= item.event_time, (self.watermark, partition, entry, item)

    def observe(self, watermark: Watermark | None) -> None:
        """The application sees `watermark`: it goes back only after a move back (which an operator's
        reset-cursor is until the consumer holds the fold of the log where it moved to: it learns of it
        only from what comes again)."""
        previous = self.watermark
        self.watermark = watermark
        if watermark is None:
            return
        if previous is not None and watermark.event_time < previous.event_time:
            assert self.moved_back or self.unseen_reset, (previous, watermark)  # a reset it could not see: later
        if watermark.event_time == self.fold_now() and all(
            entry in self.since_move[partition]
            for partition, _, entry in watermark.computed_at
            if partition in self.since_move
        ):
            self.moved_back = False  # the consumer has seen the move back: it holds the fold there now
            self.since_move.clear()

    def settle(self, *, elsewhere: bool = False, marker: bool = True) -> None:
        """The generator live, the application acknowledging everything, time passing: until nothing changes.

        `elsewhere`: another consumer of the subscription gets every message from now on and acknowledges it (this
        one is an inactive Failover consumer, or a Shared one that gets nothing more); else the other consumers are
        gone and this one gets everything. `marker`: the topic goes on with a W_SET (a new event to read at the
        end); without, the last event the generator published may be the last one there is."""
        self.generator_up = True
        for partition, state in self.partitions.items():
            if not elsewhere:
                state.redeliver |= state.others
                state.others = set()
            if marker:
                self.append(partition, Entry("settle", 10**9, True))
        for _ in range(len(self.partitions) * 200):
            for partition, state in self.partitions.items():
                if elsewhere:
                    state.acked |= state.others
                    state.others = set()
                    while (entry := state.next_to_dispatch()) is not None:
                        state.acked.add(entry)
                else:
                    self.deliver(partition)
            while self.handed:
                self.ack(0)
            self.generator_poll()
            self.read_events(len(self.channel))
            self.tick(31)
            self.caught_up()
        assert all(s.read >= len(s.log) and not s.redeliver and not s.ours for s in self.partitions.values())

    def fold_now(self) -> int | None:
        folds = [s.fold(s.mark_delete()) for s in self.partitions.values()]
        return None if any(f is None for f in folds) else min(f for f in folds if f is not None)
