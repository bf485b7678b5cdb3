"""The consumer's trust rule: which watermark may stand over which message (pure: no I/O, no clock).

Every SendWatermark event names the mark-delete position (ledger, entry) it was computed at. Its
watermark holds for every message *after* that position and says nothing about a message at or
before it: that message was acknowledged when the event was computed, so if it arrives again the
subscription moved back (a seek, an admin reset-cursor) and the watermark must be recomputed.
Positions are compared per entry: a mark-delete position covers whole entries, every batch index
of an entry at or before it included.

Per partition, `WatermarkTrust` keeps the event the partition's watermark comes from (`held`) and,
while it distrusts that event, the earliest entry it must protect (`floor`):

- **distrust**: a message at or before the held event's position, or an event at or after a message
  received and not yet acknowledged, starts distrust; the floor is that message's entry, and later
  messages can only lower it;
- **trust again**: while distrusting, only an event computed before the floor (and before every
  message still unacknowledged) is accepted, and that ends the distrust; the latest event is
  reconsidered whenever the floor or the unacknowledged messages move, so an event that came
  before the message it had to precede is not lost; `drain_regained` tells the caller;
- **queued copies**: a message received and waiting to be handed to a listener (`queued=True`)
  holds back an event computed at or after it (`Outcome.DEFERRED`) until it has been handed over
  (`on_handed_over`), and then the event is taken. Counted per copy: after a move back the same
  position can be delivered again while its first copy is still with the application, and the
  acknowledgement of that first copy (by message id, the same for both) must not free the second
  to be handed over under a watermark computed after it (chaos seed 122113);
- **held acknowledgements**: while distrusting, the caller holds back acknowledgements at or before
  the floor, so the subscription's mark-delete position stays before it and the generator is sure
  to see the backward move and to publish a watermark computed before the floor;
- **seeks**: `on_seek` distrusts at once, with the seek's target as a provisional floor that the
  first message after it replaces (a seek into a deleted ledger lands later than its target; a
  seek by publish time has no known target and takes the position of the latest event read, held or
  not: one computed before it follows a move back); a seek forward
  of the held event's position, known from its target or from that first message, keeps the held
  watermark: computed before it, it holds for everything after it (but a later event computed at or
  after the target was read before the seek, and the entries between come again: it is taken only once
  they came again, as a guarded partition takes one; and a
  later event the first message contradicts distrusts from that message, as in `on_event`). A seek to
  the start (`BEFORE_ALL`) needs no wait: the fold there is no watermark, a fact. A seek by publish
  time after which nothing comes here (another consumer of the subscription is the active one) learns
  where it landed from the generator instead: from an event without watermark at once (it claims
  nothing), from any other once the reader has read everything published until a while after the seek
  (`on_caught_up`), unless it restates the event read before it;
- **moves back seen from what comes again**: a message that comes again after this consumer
  acknowledged it (it is neither outstanding nor negatively acknowledged, and comes at or before the
  latest position received) shows a move back the consumer did not make (an operator's reset-cursor),
  even when it is after the held event's position and was acknowledged at once (a marker): the held
  watermark still holds, but an event read from now on may have been computed before the move back,
  so the partition is guarded from that message on, as after a seek (issue 25's property test found
  a reset back to a marker that let such an event stand). What this consumer acknowledged since the
  held event is remembered for that (the last `ACKNOWLEDGED_KEPT`), and everything before a seek's
  known target (the seek acknowledged it); a message another consumer of a Shared subscription gave back
  was never acknowledged here, so it does not count;
- **negative acknowledgements**: a nacked message is not outstanding any more (it may go to another
  consumer, or to a dead-letter topic); if it comes back it is received again. Until then (or until an
  event computed after it says it was acknowledged elsewhere) no fact at or after it is fallen back
  on or taken while guarded;
- **facts**: every event read, and every head event (`on_fact`: the watermark at a position of the
  log, which the generator publishes as it reads), says what the fold of the log is at its
  position; that stays true whatever the subscription does later (contract section 1: a pure
  function of the log), so such a fact holds for every message after its position. The partition
  remembers the last `FACTS_KEPT` of them;
- **giving up**: `give_up` (the caller's time limits; `fallback` says what it would hold) stops
  waiting for the generator and falls back on the best remembered fact (the held event counts as
  one): the one at the latest position that is before every message the partition protects, at or
  before the `frontier` (the latest entry delivered since the move back: everything after it may
  still come) and not after the latest event (a fact beyond what the subscription was last seen at
  would only distrust the messages still to come). Without one, the partition's watermark is
  withdrawn. Then (`guarded`, as after every seek) it takes an event only at or before the frontier
  and not before the fact it holds, as soon as nothing contradicts it: an event read now may have
  been computed before the move back, and one beyond what came since would stand over entries still
  to come (issue 25, case 1). `on_caught_up` (the reader has read everything published since) ends
  it; the latest event read while guarded is still taken only at or before the frontier (`stale`): it
  may have been computed before the move back, and what it covers may not have come again (issue 34,
  fault 1: a reset back to entry 5 while E(20) was in flight took E(20) a second later); or once the
  reader caught up again a while later with nothing newer (`take_stale`: the caller's clock), since what
  it covers may never come *here* (an inactive Failover consumer, a Shared one). Giving up
  is what ends the wait in a Shared subscription where another consumer acknowledged its copy of a
  message this one holds: the generator never computes a watermark before that message again (chaos
  seed 214393).
  Callers log it.

Partitioned topics: a consumer's watermark is the minimum over partitions. `watermark()` is the
strict view (None while any partition has none or is distrusted); `listener_watermark()` is what a
listener may hold: a distrusted partition keeps its old value there because its messages are not
handed over until it is trusted again, and a partition without any event yet holds the listener's
watermark where it is rather than taking it away. A partition added to a live topic (`add_partition`,
`live`) holds both views where they were when it came, until its own watermark reaches that: the
subscription did not move back, so its watermark does not go back; the new partition's older messages
are late, as a late producer's.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from watermark_core.protocol import Position, Watermark

Entry = tuple[int, int]
"""(ledger_id, entry_id) inside one partition: the granularity of a mark-delete position."""

BEFORE_ALL: Entry = (-1, -1)
"""Before every entry of a partition: the provisional floor of a seek whose target is unknown."""


@dataclass(frozen=True, slots=True)
class Computed:
    """A SendWatermark event as the trust rule sees it: where it was computed, and its watermark."""

    position: Entry
    event_time: int | None
    """None: the subscription's state at `position` has no watermark (e.g. before any W_SET)."""


WITHDRAWN = Computed(BEFORE_ALL, None)
"""What a partition holds after `give_up` without a fact to fall back on: no watermark, contradicted by no message."""

FACTS_KEPT = 256

SEEK_BATCH_END = 2**31
"""A batch index after every message of an entry: a seek acknowledges whole entries before its target."""

ACKNOWLEDGED_KEPT = 10_000
"""Acknowledgements remembered per partition since the held event, to tell a move back from what comes again."""
"""Facts (events and head events) remembered per partition for `give_up`: at one W_SET a second, minutes of them."""


class Outcome(Enum):
    """What `on_event` did with an event."""

    DEFERRED = "deferred"
    """Not taken yet: a copy of a message at or before its position waits to be handed to the listener;
    it is taken once that copy has been handed over (`on_handed_over`)."""
    IGNORED = "ignored"
    """Distrusting, and the event was computed at or after the floor: it may be stale."""
    ACCEPTED = "accepted"
    """The partition's watermark now comes from this event."""
    REGAINED = "regained"
    """Accepted, and it ended a distrust: the caller releases the acknowledgements it held."""
    DISTRUSTED = "distrusted"
    """Not accepted: it was computed at or after a message still unacknowledged, so it is stale."""


NOWHERE: Position = (-(2**63), 0, 0)
"""Before every position: a lane's `after` before anything was received."""


def position_of(key: Any) -> Position:
    """The position a lane's key stands for: a position itself, or a message id of the client's binding (its
    ledger, entry and batch index: three calls, made only where the rule needs a position, see `Lane`)."""
    if type(key) is tuple:
        return key
    return (key.ledger_id(), key.entry_id(), key.batch_index())


def _same(position: Position) -> Any:
    return position


@dataclass(slots=True)
class Lane:
    """One partition's hot path: a message or an acknowledgement that changes nothing but what is outstanding and
    acknowledged is written here by the caller, without the rule, and the rule takes it in (`catch_up`) before it
    decides anything about the partition. The rule sets the flags and `after` again after every decision
    (`open_lanes`), so a lane is open only while the rule would decide nothing else.

    - **a message**, under the caller's exclusion of the rule's decisions (the consumer's shell: the feed's
      `lane_token`, which every decision holds too): while `receiving`, a data message after `after` (`after < key`)
      is such a one: its key becomes `after` and is appended to `arrived` (`ConsumerEngine.received_quietly`);
    - **a marker**, under the same exclusion: while `receiving` and `acknowledging`, a marker after `after` is received
      and acknowledged at once with nothing to decide (what the engine does with one): its key becomes `after` and
      is appended to `skipped` (`ConsumerEngine.skipped_quietly`), apart from the data, so that the data's
      acknowledgements stay in the order received;
    - **an acknowledgement**, without a lock: append its key to `acked` first, then, if `acknowledging` and
      `acked` is still the list appended to, it is such a one (send it); else it is the rule's to decide
      (`ConsumerEngine.acknowledged_quietly`). The rule closes every lane before it takes `acked` in, and takes it
      by swapping the list: an acknowledgement appended before the close is taken in before the decision, and
      one appended later sees the closed lane or the swapped list. (Each step is one bytecode-atomic operation
      under the GIL: a list append, an attribute read.)

    **Keys.** What the caller writes is a key: a position (a plain tuple), or whatever `key(position)` makes, as
    long as it orders as positions do with `<` and `position_of` turns it back into one. The consumer's shell uses
    the client binding's own message id (issue 48): one comparison in C where a position costs three calls, and the
    rule turns keys into positions only where it needs one: the last of a batch, what stays outstanding, and the
    first and last of a run acknowledged in the order received (`Acknowledgements`), never the rest.
    """

    partition: int
    receiving: bool = False
    acknowledging: bool = False
    after: Any = NOWHERE
    """The key of the position after which a data message is in order and after the held event: nothing to
    decide."""
    after_at: Position = NOWHERE
    """The position `after` stands for (the rule makes a new key only when it moves elsewhere)."""
    arrived: list[Any] = field(default_factory=list)
    acked: list[Any] = field(default_factory=list)
    skipped: list[Any] = field(default_factory=list)
    key: Callable[[Position], Any] = _same
    """The caller's key of a position (`after` when the rule moves it): the position itself by default."""

    def __post_init__(self) -> None:
        self.after = self.key(self.after_at)


@dataclass(slots=True)
class _Run:
    """Lane keys acknowledged in the order received (increasing), and the positions of the first and the last."""

    keys: list[Any]
    first: Position
    last: Position

    def positions(self) -> dict[Position, None]:
        return dict.fromkeys(map(position_of, self.keys))

    def kept(self, keep: Callable[[Position], bool], *, tail: bool) -> _Run | None:
        """The part of the run whose positions `keep` holds for: its tail (`keep` false, then true along the run) or
        its head (true, then false); None if nothing. Where it is cut is found by a binary search, which asks about
        2 log2(n) keys for their positions (issue 48: a new held event cuts the latest run nearly every time)."""
        keys = self.keys
        if keep(self.first) and keep(self.last):
            return self
        if not keep(self.last if tail else self.first):
            return None
        cut = bisect_left(keys, True, key=lambda k: keep(position_of(k)) is tail)  # the first key on the other side
        if tail:
            return _Run(keys[cut:], position_of(keys[cut]), self.last)
        return _Run(keys[:cut], self.first, position_of(keys[cut - 1]))


class Acknowledgements:
    """What a partition acknowledged (or skipped) since its held event, in that order (an ordered set of positions).

    Runs of lane keys acknowledged in the order received are kept as they came (`_Run`): membership, forgetting what
    is at or before an entry and keeping what is before a position look at a run's ends, and turn its keys into
    positions only when the answer lies inside it (a move back, rare). So an in-order acknowledgement costs the rule
    no position of its own (issue 48)."""

    __slots__ = ("_chunks", "_size")

    def __init__(self) -> None:
        self._chunks: list[dict[Position, None] | _Run] = []
        """Oldest first: positions (a dict: an ordered set), or a run."""
        self._size = 0

    def add(self, position: Position) -> None:
        chunks = self._chunks
        last = chunks[-1] if chunks else None
        if not isinstance(last, dict):
            last = {}
            chunks.append(last)
        if position not in last:
            self._size += 1
        last[position] = None

    def add_run(self, keys: list[Any], first: Position, last: Position) -> None:
        """Keys in increasing order, whose first and last stand for `first` and `last`."""
        if keys:
            self._chunks.append(_Run(keys, first, last))
            self._size += len(keys)

    def __len__(self) -> int:
        """How many were added and kept (one acknowledged twice, in two batches, may count twice)."""
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def __iter__(self) -> Iterator[Position]:
        """Each position once, where it was first acknowledged (as a dict's keys)."""
        every: dict[Position, None] = {}
        for chunk in self._chunks:
            every.update(chunk.positions() if isinstance(chunk, _Run) else chunk)
        return iter(every)

    def __contains__(self, position: object) -> bool:
        for i, chunk in enumerate(self._chunks):
            if isinstance(chunk, _Run):
                if not chunk.first <= position <= chunk.last:  # type: ignore[operator]
                    continue
                chunk = self._chunks[i] = chunk.positions()
            if position in chunk:
                return True
        return False

    def clear(self) -> None:
        self._chunks, self._size = [], 0

    def _keep(self, keep: Callable[[Position], bool], *, tail: bool) -> None:
        """Keep the positions `keep` says: along every run (increasing) false then true (`tail`), or true then false."""
        kept: list[dict[Position, None] | _Run] = []
        for chunk in self._chunks:
            if isinstance(chunk, _Run):
                run = chunk.kept(keep, tail=tail)
                if run is not None:
                    kept.append(run)
                continue
            left = {p: None for p in chunk if keep(p)}
            if left:
                kept.append(left)
        self._set(kept)

    def _set(self, chunks: list[dict[Position, None] | _Run]) -> None:
        self._chunks = chunks
        self._size = sum(len(c.keys) if isinstance(c, _Run) else len(c) for c in chunks)

    def keep_before(self, position: Position) -> None:
        """Forget every position at or after `position`."""
        self._keep(lambda p: p < position, tail=False)

    def forget_through(self, entry: tuple[int, int]) -> None:
        """Forget every position of an entry at or before `entry`."""
        self._keep(lambda p: p[:2] > entry, tail=True)

    def keep_newest(self, count: int) -> None:
        """Keep the `count` newest."""
        kept: list[dict[Position, None] | _Run] = []
        left = count
        for chunk in reversed(self._chunks):
            if left <= 0:
                break
            if isinstance(chunk, _Run):
                if len(chunk.keys) > left:
                    keys = chunk.keys[-left:]
                    chunk = _Run(keys, position_of(keys[0]), chunk.last)
                kept.append(chunk)
                left -= len(chunk.keys)
            else:
                positions = list(chunk)[-left:]
                kept.append(dict.fromkeys(positions))
                left -= len(positions)
        kept.reverse()
        self._set(kept)


@dataclass(slots=True)
class PartitionTrust:
    """One partition's trust state (see the module docstring)."""

    held: Computed | None = None
    """The event the partition's watermark comes from; None before the first one."""
    latest: Computed | None = None
    """The latest event read, accepted or not: reconsidered when what it must be before moves."""
    floor: Entry | None = None
    """While distrusting, the earliest entry to protect; None while trusting."""
    provisional: bool = False
    """The floor is a seek's target: the first message after the seek replaces it."""
    by_time: bool = False
    """The provisional floor is a seek by publish time's, whose target is unknown (see `on_seek`)."""
    nacked: set[Entry] = field(default_factory=set)
    """Entries negatively acknowledged and not received again: no fact at or after one stands for it while
    guarded or falling back (a generator's event at or after one says another consumer acknowledged it)."""
    outstanding: set[Position] = field(default_factory=set)
    """Messages received and not acknowledged: no accepted event may be computed at or after them."""
    queued: dict[Position, int] = field(default_factory=dict)
    """Copies of messages received and not handed to the listener yet, per position: no event computed at
    or after one of them is taken before it has been handed over."""
    facts: deque[Computed] = field(default_factory=lambda: deque(maxlen=FACTS_KEPT))
    """The last events and head events read: what the log's fold is at their positions (see `give_up`)."""
    frontier: Entry | None = None
    """The latest entry delivered since the last move back (just before a seek's known target before the
    first one): everything after it may still come, so no fact beyond it may stand (see `give_up`)."""
    guarded: bool = False
    """After a seek or `give_up`: events read may have been computed before the move back (the companion
    topic's reader lags), so one is taken only at or before the frontier, until `on_caught_up`."""
    stale: Computed | None = None
    """The latest event when the reader caught up (`on_caught_up`), read while guarded and refused for being beyond
    the frontier: it may have been computed before the move back, so it is taken only as a guarded partition takes
    one, once what it covers came again (issue 34, fault 1). Events read after it are taken as usual."""
    last: Position | None = None
    """The latest position received: a message at or before it comes out of order (see `on_message`)."""
    acknowledged: Acknowledgements = field(default_factory=Acknowledgements)
    """What this consumer acknowledged (or skipped) after the held event's position, in that order (an ordered
    set): one of them received again shows a move back (see the module docstring)."""
    acknowledged_through: Position | None = None
    """The latest cumulative acknowledgement after the held event's position."""
    joining: Computed | None = None
    """Added to a live topic: counts in the minimum with this (the minimum when it was added) until its own
    watermark reaches it, so the watermark neither goes back nor passes it (see `add_partition`)."""
    lane: Lane = field(default_factory=lambda: Lane(0))
    """The hot path's (see `Lane`): what it wrote is taken in by `catch_up` before anything else reads this state."""

    @property
    def distrusting(self) -> bool:
        return self.floor is not None

    def lowest_outstanding(self) -> Entry | None:
        return min((position[:2] for position in self.outstanding), default=None)

    def lowest_queued(self) -> Entry | None:
        return min((position[:2] for position in self.queued), default=None)

    def accepts(self, position: Entry, guarded: bool | None = None) -> bool:
        """Whether an event computed at `position` is before everything this partition protects (`guarded`: with
        the guarded rule or not; by default as the partition is)."""
        if self.floor is not None:
            if position >= self.floor:
                return False
        elif (self.guarded if guarded is None else guarded) and (
            self.frontier is None
            or position > self.frontier
            or (self.held is not None and position < self.held.position)
            or (self.nacked and position >= min(self.nacked))
        ):
            return False  # beyond what came since the move back, or older than the fact held: read late
        low, queued = self.lowest_outstanding(), self.lowest_queued()
        return (low is None or position < low) and (queued is None or position < queued)


def _catch_up(state: PartitionTrust) -> None:
    """Take in what the partition's lane wrote: the messages it let through (outstanding, in order: the last is
    `last`, and the frontier), then the acknowledgements (no longer outstanding, remembered as acknowledged).

    Keys become positions only where the rule needs one (see `Lane`): the last one let through, what stays
    outstanding, what was acknowledged out of the order received, and the ends of a run acknowledged in order."""
    lane = state.lane
    arrived, skipped = lane.arrived, lane.skipped
    acked: list[Any] = []
    if lane.acked:
        acked, lane.acked = lane.acked, []  # swapped, not cleared: see `Lane`
    outstanding = state.outstanding
    acknowledged = state.acknowledged
    if arrived or skipped:
        last = position_of(arrived[-1]) if arrived else None
        if skipped:  # markers: received and acknowledged at once
            lane.skipped = []
            markers = list(map(position_of, skipped))
            for position in markers:
                acknowledged.add(position)
            if last is None or markers[-1] > last:
                last = markers[-1]
        assert last is not None
        state.last = lane.after_at = last  # `after` is the last key let through (written under the same lock)
        entry = last[:2]
        if state.frontier is None or entry > state.frontier:
            state.frontier = entry
    if arrived:
        lane.arrived = []
        # Usually every message let through was acknowledged in the order received, but the latest few: what stays
        # outstanding is then the end of `arrived` (compared by identity: the same keys), without hashing the rest.
        done = 0
        while done < len(acked):  # the tail of the batch before
            position = position_of(acked[done])
            if position not in outstanding:
                break
            outstanding.discard(position)
            acknowledged.add(position)
            done += 1
        rest = acked[done:] if done else acked
        count = len(rest)
        try:
            in_order = arrived[:count] == rest
        except TypeError:  # keys of two kinds (a binding's `==` takes its own only): compared by identity below
            in_order = False
        if in_order:
            run, left, others = arrived[:count], arrived[count:], []
        else:  # acknowledged in another order (a batch's markers before its data): matched by identity, in C
            ids = set(map(id, rest))  # the keys are alive in both lists meanwhile: their ids are theirs
            run = [key for key in arrived if id(key) in ids]  # in the order received: increasing
            left = [key for key in arrived if id(key) not in ids]
            received = set(map(id, arrived))
            others = [key for key in rest if id(key) not in received]
        outstanding.update(map(position_of, left))
        if run:
            end = position_of(run[-1])
            acknowledged.add_run(run, position_of(run[0]), end)
        if others:
            positions = list(map(position_of, others))
            outstanding.difference_update(positions)
            for position in positions:
                acknowledged.add(position)
    elif acked:
        positions = list(map(position_of, acked))
        outstanding.difference_update(positions)
        for position in positions:
            acknowledged.add(position)
    if acked and len(acknowledged) > ACKNOWLEDGED_KEPT:
        acknowledged.keep_newest(ACKNOWLEDGED_KEPT // 2)


class WatermarkTrust:
    """The trust rule over the partitions one consumer reads (see the module docstring).

    Partitions are named by index (-1 for a non-partitioned topic); events and messages of a
    partition it does not know are the caller's to add first (`add_partition`).
    """

    def __init__(self, partitions: Iterable[int] = (), *, key: Callable[[Position], Any] = _same) -> None:
        self._key = key
        """The lanes' keys (see `Lane`)."""
        self._partitions: dict[int, PartitionTrust] = {p: PartitionTrust(lane=Lane(p, key=key)) for p in partitions}
        self.lanes: dict[int, Lane] = {p: state.lane for p, state in self._partitions.items()}
        """Each partition's `Lane` (the hot path's), closed until `open_lanes`."""
        self._regained: set[int] = set()
        self._moved_back: set[int] = set()

    # -- partitions ---------------------------------------------------------------------------------

    @property
    def partitions(self) -> list[int]:
        return sorted(self._partitions)

    def add_partition(self, partition: int, *, live: bool = False) -> bool:
        """Follow one more partition; True if it is new.

        `live`: added to a live topic. Its messages may be older than the watermark the others hold
        (they are late, as a late producer's), and the subscription did not move back: it holds the
        watermark where it is until its own reaches it, and then joins the minimum.
        """
        if partition in self._partitions:
            return False
        now = self.listener_watermark(None) if live else None
        state = PartitionTrust(
            joining=None if now is None else Computed(BEFORE_ALL, now.event_time), lane=Lane(partition, key=self._key)
        )
        self._partitions[partition] = state
        self.lanes[partition] = state.lane
        return True

    def __contains__(self, partition: int) -> bool:
        return partition in self._partitions

    def get(self, partition: int) -> PartitionTrust | None:
        return self._partitions.get(partition)

    @property
    def regained(self) -> bool:
        """Whether a partition was trusted again since `drain_regained` was called last."""
        return bool(self._regained)

    def state(self, partition: int) -> PartitionTrust:
        """The partition's state, to read (tests and logs); KeyError for one not followed."""
        state = self._partitions[partition]
        _catch_up(state)
        return state

    # -- the lanes (the hot path, see `Lane`) ---------------------------------------------------------

    def close_lanes(self) -> None:
        """Close every lane and take in what they wrote: call before any other call (see `Lane`)."""
        for state in self._partitions.values():
            lane = state.lane
            lane.receiving = lane.acknowledging = False
            if lane.arrived or lane.acked or lane.skipped:
                _catch_up(state)

    def open_lanes(self, *, receiving: bool = True, acknowledging: bool = True) -> None:
        """Open each lane as far as the partition's state allows (and the caller's: `receiving`, `acknowledging`
        False keep those closed everywhere): messages while it trusts, is not guarded and nothing waits as stale
        or negatively acknowledged, after the latest position received, the latest acknowledged by a seek or
        cumulatively, and the held event's entry; acknowledgements while it trusts and no event waits to be taken.
        Exactly what `on_message` and `on_acknowledged` would decide nothing about."""
        for state in self._partitions.values():
            lane = state.lane
            if lane.arrived or lane.acked or lane.skipped:
                _catch_up(state)
            trusting = state.floor is None
            lane.acknowledging = acknowledging and trusting and state.latest is state.held
            lane.receiving = (
                receiving and trusting and not state.guarded and not state.nacked and state.stale is None
            )  # fmt: skip
            after = NOWHERE if state.last is None else state.last
            through = state.acknowledged_through
            if through is not None and through > after:
                after = through
            held = state.held
            if held is not None and (held.position[0], held.position[1], SEEK_BATCH_END) > after:
                after = (held.position[0], held.position[1], SEEK_BATCH_END)  # the held event's whole entry
            if after != lane.after_at:  # a new key only when it moved elsewhere than the last key let through
                lane.after, lane.after_at = lane.key(after), after

    # -- inputs -------------------------------------------------------------------------------------

    def on_event(self, partition: int, position: Entry, event_time: int | None) -> Outcome:
        """A SendWatermark event for the partition, computed at mark-delete `position`."""
        state = self._partitions[partition]
        event = Computed((int(position[0]), int(position[1])), event_time)
        before, state.latest = state.latest, event
        state.facts.append(event)
        if state.stale is not None:
            if event == state.stale:  # restated (a table for another subscription): as stale as it was
                state.stale = event
                return Outcome.ACCEPTED if self._take_latest(partition) else Outcome.IGNORED
            state.stale = None  # read after the reader caught up: computed after the move back
        if state.by_time and state.provisional and self._landed(state, event, before):
            self._take_latest(partition, anywhere=True)
            return Outcome.REGAINED
        if state.floor is not None:
            return Outcome.REGAINED if self._reconsider(partition) else Outcome.IGNORED
        if state.guarded:
            return Outcome.ACCEPTED if self._take_latest(partition) else Outcome.IGNORED
        low = state.lowest_outstanding()
        if low is not None and event.position >= low:
            state.floor, state.provisional = low, False
            return Outcome.DISTRUSTED
        queued = state.lowest_queued()
        if queued is not None and event.position >= queued:
            return Outcome.DEFERRED  # `latest`: taken when the copies before it have been handed over
        state.held = event
        self._forget_acknowledged(state)
        if state.nacked:  # computed after them: acknowledged elsewhere (another consumer, a dead-letter topic)
            state.nacked = {e for e in state.nacked if e > event.position}
        self._join(partition)
        return Outcome.ACCEPTED

    def on_fact(self, partition: int, position: Entry, event_time: int) -> None:
        """The watermark at a position of the partition's log (a head event): remembered for `give_up`."""
        self._partitions[partition].facts.append(Computed((int(position[0]), int(position[1])), event_time))

    def on_message(self, partition: int, position: Position, *, queued: bool = False) -> None:
        """A message (data or marker) was received at `position`, before it is handed to anyone;
        `queued`: it waits to be handed to a listener (then `on_handed_over`)."""
        state = self._partitions[partition]
        last, through = state.last, state.acknowledged_through
        entry = position[:2]
        again = False  # delivered again after a move back: what came before it here comes again too
        if (last is None or position > last) and (through is None or position > through):  # in order: no move back
            state.last, moved_back = position, False
        else:
            held = state.held
            # At or before the held event's position, a first copy was acknowledged when that event was computed.
            again = (
                held is not None and entry <= held.position
                and position not in state.outstanding and entry not in state.nacked
            )  # fmt: skip
            moved_back = self._came_again(state, position)
            again = again or moved_back
        state.outstanding.add(position)
        if state.nacked:
            state.nacked.discard(entry)
        if queued:
            state.queued[position] = state.queued.get(position, 0) + 1
        if again or state.frontier is None or entry > state.frontier:
            state.frontier = entry
        if state.floor is not None and state.provisional:
            # The first message after a seek: where delivery really starts. After the held event's
            # position, the seek went forward of it and the held watermark holds again.
            state.floor, state.provisional, state.frontier, state.by_time = entry, False, entry, False
            if state.held is not None and entry > state.held.position:
                state.floor = None
                self._regained.add(partition)
                if not self._take_latest(partition) and state.latest is not None and state.latest is not state.held:
                    # The latest event was refused for this very message: it was computed at or after
                    # it, before the seek moved back over it. Distrust from here, as `on_event` does,
                    # so the acknowledgement is held and the generator sees the move back; otherwise
                    # nothing would ever reconsider that event, and the generator, which published
                    # it already, publishes nothing new: the held watermark would stay for good.
                    state.floor = entry
                    self._regained.discard(partition)
            else:
                self._reconsider(partition)  # an event that came before this message may be before it
        elif state.floor is not None:
            state.floor = min(state.floor, entry)
        elif state.held is not None and entry <= state.held.position:
            state.floor = state.frontier = entry  # a move back: what comes next starts here
            state.last = position
        elif moved_back:
            # A move back after the held event: it still holds, but an event read from now on may have been
            # computed before the move; take one only at or before what comes again (as after a seek).
            state.frontier, state.guarded = entry, True
            self._moved_back.add(partition)
        elif (state.guarded or state.stale is not None) and state.latest is not state.held:
            self._take_latest(partition)  # the frontier passed it

    @staticmethod
    def _came_again(state: PartitionTrust, position: Position) -> bool:
        """Whether a message received at or before `last` was acknowledged here before (then the subscription
        moved back, and `last` becomes its position)."""
        if position in state.outstanding or position[:2] in state.nacked:
            return False  # a second copy, or one given back: not acknowledged
        through = state.acknowledged_through
        if not ((through is not None and position <= through) or position in state.acknowledged):
            return False  # another consumer gave it back (Shared), or it was delivered here before and lost
        state.last = position  # what comes again from here is in order again
        state.acknowledged.keep_before(position)
        if through is not None and through >= position:
            # Moved back to this entry: what is before it stays acknowledged (a second reset back shows again).
            before = (position[0], position[1] - 1, SEEK_BATCH_END)
            state.acknowledged_through = before if position[1] > 0 else None
        return True

    @staticmethod
    def _landed(state: PartitionTrust, event: Computed, before: Computed | None) -> bool:
        """After a seek by publish time that delivered nothing yet: whether `event` says where it landed.

        Claiming no watermark, it is premature for nothing. Once the reader has read every event published
        until `STALE_WINDOW_S` after the seek (`on_caught_up` ended `guarded`), an event read was computed after
        the seek (the assumption `guarded` makes), unless it restates the one read before it (a table published
        for another subscription names this one's last event again until the generator sees the seek)."""
        if event.event_time is None:
            return True
        return not state.guarded and (before is None or before != event)

    def on_caught_up(self, partition: int) -> None:
        """Every event published before the partition's last seek or `give_up` has been read: events are
        taken wherever they were computed again (the latest one at once, if nothing contradicts it)."""
        state = self._partitions[partition]
        if state.guarded:
            state.guarded = False
            if state.floor is None and state.latest is not state.held:
                # The latest event was read while guarded: it may be from before the move back. Taken now only
                # if the guarded rule takes it, else once the frontier reaches it (`stale`).
                state.stale = state.latest
                self._take_latest(partition)

    def take_stale(self, partition: int) -> bool:
        """The reader caught up again `FALLBACK_WAIT_S` (consumer/engine.py) after `on_caught_up` left the latest
        event `stale`, and the generator published nothing newer for the subscription meanwhile: it recomputes
        within about a second of a move back it sees, so it saw none to recompute (the subscription is where the
        event says: another consumer got what it covers, an inactive Failover one or a Shared one; a seek went
        nowhere), or it cannot now (it is down). The event is taken as an unguarded partition takes one (chaos
        seeds 509827, 509833, 509854: waiting for what it covers to come here left such consumers without the
        final watermark for good). Whether it was taken."""
        state = self._partitions[partition]
        if state.stale is None or state.latest is not state.stale:
            return False
        # Not guarded again, unlike when the frontier reaches it: everything published until a while after it
        # was read, so what comes later is newer (the generator's recomputed event after it comes back too).
        state.stale = None
        if self._take_latest(partition, unguarded=True):
            return True
        state.stale = state.latest  # something outstanding or queued is before it: at the next catch-up
        return False

    def stale(self, partition: int) -> bool:
        """Whether the partition's latest event waits as `stale` (see `on_caught_up`, `take_stale`)."""
        state = self._partitions.get(partition)
        return state is not None and state.stale is not None

    def on_negatively_acknowledged(self, partition: int, position: Position) -> None:
        """The application negatively acknowledged a message: it is not this consumer's any more (the broker
        delivers it again, maybe to another consumer of a Shared subscription that acknowledges it, maybe to
        a dead-letter topic); if it comes here again, it is received again."""
        state = self._partitions[partition]
        state.outstanding.discard(position)
        state.nacked.add(position[:2])
        self._take_latest(partition)

    def on_handed_over(self, partition: int, position: Position) -> None:
        """A queued copy of the message at `position` has been handed to the listener: an event held back
        for it may be taken now."""
        state = self._partitions[partition]
        left = state.queued.get(position, 0) - 1
        if left > 0:
            state.queued[position] = left
        else:
            state.queued.pop(position, None)
        self._take_latest(partition)  # an event held back for it, or refused while distrusting

    def on_acknowledged(self, partition: int, position: Position) -> bool:
        """The application acknowledges one message; True: hold the acknowledgement back for now."""
        state = self._partitions[partition]
        state.outstanding.discard(position)
        state.acknowledged.add(position)
        if len(state.acknowledged) > ACKNOWLEDGED_KEPT:
            state.acknowledged.keep_newest(ACKNOWLEDGED_KEPT // 2)
        hold = state.floor is not None and position[:2] <= state.floor
        self._take_latest(partition)  # an event held back for it, or refused while distrusting
        return hold

    def on_acknowledged_through(self, partition: int, position: Position) -> bool:
        """A cumulative acknowledgement up to `position`; True: hold it back for now (it covers the floor)."""
        state = self._partitions[partition]
        state.outstanding = {p for p in state.outstanding if p > position}
        state.nacked = {e for e in state.nacked if e > position[:2]}
        if state.acknowledged_through is None or position > state.acknowledged_through:
            state.acknowledged_through = position
        hold = state.floor is not None and state.floor <= position[:2]
        self._take_latest(partition)  # an event held back for it, or refused while distrusting
        return hold

    def on_seek(self, partitions: Iterable[int], target: Entry | None) -> None:
        """The consumer seeks these partitions; `target` None when unknown (by publish time).

        An unknown target is taken as the held event's position: an event computed before it can
        only come from a move back, and the first message after the seek tells which way it went.
        While a move back before the seek is unsettled, it is taken as before every entry instead: the
        event computed for that move may still be read after the seek.

        What the partitions received before the seek is forgotten: delivery starts again from the
        target, and what comes again is received again.
        """
        for partition in partitions:
            state = self._partitions[partition]
            # A move back not settled yet (an event read may be from before it): see the by-time case below. A floor
            # not set by a message still outstanding is a move back whose event before it is still awaited.
            low = state.lowest_outstanding()
            awaited = state.floor is not None and (low is None or state.floor < low)
            unsettled = state.guarded or state.stale is not None or awaited
            state.outstanding, state.queued, state.nacked = set(), {}, set()
            state.last, state.acknowledged_through = None, None  # what comes again is expected now
            state.acknowledged.clear()
            if target is not None and target > BEFORE_ALL:
                # The broker acknowledges everything before the target: coming again later, it shows a move back.
                state.acknowledged_through = (target[0], target[1] - 1, SEEK_BATCH_END)
            # What comes next starts at the target (delivered again, even when skipped): before it.
            state.frontier = None if target is None else (target[0], target[1] - 1)
            state.joining, state.guarded, state.by_time, state.stale = None, True, False, None
            if target is not None and target <= BEFORE_ALL:
                # To the start: the fold there is no watermark, a fact. Events read from now on may
                # still be from before the seek: only one at or before what came again is taken.
                # The latest event read stays the latest: a fact of the log before the seek, taken as a guarded
                # partition takes one once what it covers came again (the generator may not see the move back
                # when the subscription is where it was before it polls, and then publishes nothing new).
                state.held = WITHDRAWN
                if state.latest is None:
                    state.latest = WITHDRAWN
                state.floor, state.provisional, state.guarded = None, False, True
                self._regained.add(partition)
                continue
            if target is None:
                # By publish time: back of the held event, or forward; the first message tells. An event
                # computed before the latest one read (taken or not) follows a move back: this one, at the
                # latest (what no event read says is an earlier one is "What the rule cannot see").
                read = [event.position for event in (state.held, state.latest) if event is not None]
                # Unless a move back before the seek is still unsettled: the event recomputed for it may be read
                # after the seek, before the latest one, and is not the seek's. Then no event is taken by where it
                # was computed until the first message says where the seek went (or `_landed`).
                floor = BEFORE_ALL if unsettled else max(read, default=BEFORE_ALL)
                state.floor, state.provisional, state.by_time = floor, True, True
                continue
            point = target
            if state.held is not None and point > state.held.position:
                # Forward: the held watermark was computed before everything from the target on,
                # and what came before the target is not delivered any more. An event computed at
                # or after the target may have been read before the seek: it is not taken now, only as a
                # guarded partition takes one, once what it covers came again (dropped, it left the consumer
                # on the held value for good when the generator had nothing new to publish).
                if state.floor is not None:
                    state.floor, state.provisional = None, False
                    self._regained.add(partition)
                self._take_latest(partition)
                continue
            state.floor, state.provisional = point, True

    def fallback(self, partition: int) -> Computed | None:
        """What `give_up` would hold now, if that is a watermark: the best remembered fact; None if giving
        up would withdraw it."""
        state = self._partitions[partition]
        fact = self._best_fact(state)
        return fact if fact is not None and fact.event_time is not None else None

    def give_up(self, partition: int) -> None:
        """Stop waiting for a watermark computed before the floor: the best remembered fact before
        everything the partition protects (none if there is no such fact), then the next event as it
        comes, and the latest one once nothing contradicts it.

        If nothing arrived since a seek, the frontier is the seek's target (none by publish time:
        then it withdraws until a message comes and an event at or before it is read).

        For when the generator does not publish one in time (it is down, or it missed the backward
        move, or another consumer acknowledged a redelivered copy of a message this one holds).
        Messages still unacknowledged keep protecting themselves: an event computed at or after one
        of them is still refused.
        """
        state = self._partitions[partition]
        state.held = self._best_fact(state) or WITHDRAWN
        state.floor, state.provisional, state.guarded, state.by_time = None, False, True, False
        state.stale = None
        self._take_latest(partition)

    @staticmethod
    def _best_fact(state: PartitionTrust) -> Computed | None:
        """The remembered fact at the latest position before every message `state` protects and not after
        its latest event (see `give_up`); None if there is none."""
        if state.frontier is None:
            return None  # nothing delivered since the move back: everything after it may come
        nacked = min(state.nacked) if state.nacked else None
        limits = [e for e in (state.lowest_outstanding(), state.lowest_queued(), nacked) if e is not None]
        known = [*state.facts, state.held] if state.held is not None else list(state.facts)
        candidates = [
            fact for fact in known
            if all(fact.position < limit for limit in limits)
            and fact.position <= state.frontier
            and (state.latest is None or fact.position <= state.latest.position)
        ]  # fmt: skip
        return max(candidates, key=lambda fact: fact.position, default=None)

    def _reconsider(self, partition: int) -> bool:
        """While distrusting: take the latest event if it is before everything the partition protects now."""
        return self._partitions[partition].floor is not None and self._take_latest(partition)

    def _take_latest(self, partition: int, *, anywhere: bool = False, unguarded: bool = False) -> bool:
        """Take the latest event if it is not the held one and nothing the partition protects contradicts it
        (`anywhere`: whatever it was computed at; nothing is outstanding or queued after a seek; `unguarded`:
        without the guarded rule, a `stale` event too).

        By identity: the generator republishes an unchanged value after a move back, and that event,
        equal to the held one, is the evidence a distrusted partition waits for.
        """
        state = self._partitions[partition]
        if state.latest is None or state.latest is state.held:
            return False
        stale = state.latest is state.stale
        if not anywhere and not state.accepts(state.latest.position, False if unguarded else state.guarded or stale):
            return False
        state.held, state.floor, state.provisional, state.by_time = state.latest, None, False, False
        if stale:
            # Taken late: older events computed before it (after the move back) may still be unread. Guarded
            # again (not older than it) until the reader catches up, so the watermark does not go back.
            state.stale, state.guarded = None, True
            self._moved_back.add(partition)
        self._forget_acknowledged(state)
        self._regained.add(partition)
        self._join(partition)
        return True

    @staticmethod
    def _forget_acknowledged(state: PartitionTrust) -> None:
        """Acknowledgements at or before the held event's position: one of them coming again is a move back
        the held event shows by itself."""
        assert state.held is not None
        held = state.held.position
        if state.acknowledged:
            state.acknowledged.forget_through(held)
        through = state.acknowledged_through
        if through is not None and through[:2] <= held:
            state.acknowledged_through = None

    def _join(self, partition: int) -> None:
        """A joining partition joins the minimum once its watermark reaches the one it holds."""
        state = self._partitions[partition]
        joining, held = state.joining, state.held
        if joining is not None and held is not None and held.event_time is not None:
            assert joining.event_time is not None
            if held.event_time >= joining.event_time:
                state.joining = None

    @staticmethod
    def _standing(state: PartitionTrust) -> Computed | None:
        """What a partition counts with in the minimum: its held event, or what it holds while joining."""
        return state.joining if state.joining is not None else state.held

    # -- outputs ------------------------------------------------------------------------------------

    def drain_moved_back(self) -> list[int]:
        """Partitions guarded since the last call because a message came again (see `on_message`), or because
        they took a `stale` event: until the reader catches up (`on_caught_up`)."""
        moved, self._moved_back = sorted(self._moved_back), set()
        return moved

    @property
    def moved_back(self) -> bool:
        return bool(self._moved_back)

    def drain_regained(self) -> list[int]:
        """Partitions trusted again since the last call: their held acknowledgements may go now."""
        regained, self._regained = sorted(self._regained), set()
        return regained

    # -- views --------------------------------------------------------------------------------------

    def distrusting(self, partition: int) -> bool:
        state = self._partitions.get(partition)
        return state is not None and state.distrusting

    def distrusting_partitions(self) -> list[int]:
        return sorted(p for p, state in self._partitions.items() if state.distrusting)

    def may_hand_over(self, partition: int) -> bool:
        """Whether a received message of the partition may be handed to the application now."""
        state = self._partitions.get(partition)
        return state is None or not state.distrusting

    def watermark(self) -> Watermark | None:
        """The consumer's watermark, strictly: None while any partition has none or is distrusted."""
        parts: list[tuple[int, int, Entry]] = []
        for partition, state in sorted(self._partitions.items()):
            standing = self._standing(state)
            if (state.floor is not None and state.joining is None) or standing is None or standing.event_time is None:
                return None
            parts.append((standing.event_time, partition, standing.position))
        return _combined(parts)

    def listener_watermark(self, delivered: Watermark | None) -> Watermark | None:
        """What a listener that holds `delivered` may hold from now on (`delivered` itself: no change).

        A distrusted partition counts with its old value (its messages wait); a partition whose
        state has no watermark takes the watermark away; a partition without any event yet keeps
        `delivered` where it is, or lower if another partition moved back below it.
        """
        parts: list[tuple[int, int, Entry]] = []
        unknown = False
        for partition, state in sorted(self._partitions.items()):
            standing = self._standing(state)
            if standing is None:
                unknown = True
            elif standing.event_time is None:
                return None
            else:
                parts.append((standing.event_time, partition, standing.position))
        combined = _combined(parts)
        if not unknown:
            return combined
        if delivered is None or combined is None or combined.event_time >= delivered.event_time:
            return delivered
        return combined


def _combined(parts: list[tuple[int, int, Entry]]) -> Watermark | None:
    """The minimum over partitions, naming where each partition's value was computed."""
    if not parts:
        return None
    return Watermark(
        min(value for value, _, _ in parts),
        computed_at=tuple((partition, position[0], position[1]) for _, partition, position in parts),
    )
