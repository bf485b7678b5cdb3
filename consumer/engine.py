"""The consumer's decisions, as a pure engine: events in, commands out, `now` passed in, no I/O.

The shell (consumer/watermark_consumer.py, consumer/watermark_feed.py) turns what the Pulsar client
delivers, what the application calls and what the companion topic holds into events, and carries out
the commands in the order given. Everything that decides lives here: the trust rule
(consumer/trust.py: which watermark may stand over which message), the acknowledgements held
back while a partition waits for a recomputed watermark, the time limits on that wait, the seek
target Pulsar would deliver again, which message a listener gets next and under which watermark,
and partitions added to a live topic.

Messages and acknowledgements carry a `token`: whatever the shell needs to act on them later (the
`pulsar.Message`, an acknowledgement to send). The engine stores tokens and hands them back in
commands; it never looks inside.

Positions are `(ledger, entry, batch_index)` of ONE partition; partitions are named by index (-1
for a non-partitioned topic).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from consumer.trust import BEFORE_ALL, Computed, Entry, Lane, PartitionTrust, WatermarkTrust
from watermark_core.protocol import Position, Watermark

RECOMPUTE_WAIT_S = 30.0
"""How long a partition that moved back waits for a watermark computed before its messages, at most."""
STALE_WINDOW_S = 1.0
"""How long after a seek (or giving up) the generator may still publish an event it computed before it:
a partition takes events only at or before what came since until its reader caught up after this."""
FALLBACK_WAIT_S = 5.0
"""How long it waits when it remembers a fact of the log to fall back on (`WatermarkTrust.fallback`):
the generator recomputes within about a second of a move back (`make bench`, seek), so a longer wait
means it will not (a Shared copy acknowledged elsewhere) or cannot now (it is restarting)."""

NO_WATERMARK = Watermark(0)
"""What a listener is handed when the subscription moved back to where no watermark holds (before any
W_SET): every event time is at or above it, so it is true, and a listener that only keeps the latest
value it received (the README's example) drops the one that no longer holds."""


# -- events -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Received:
    """The Pulsar client delivered a message (data, or a marker when `marker`) at `position`."""

    partition: int
    position: Position
    token: object = None
    marker: bool = False


@dataclass(frozen=True, slots=True)
class Acknowledged:
    """The application acknowledges a message (`cumulative`: everything up to it); `token` sends it."""

    partition: int
    position: Position
    token: object = None
    cumulative: bool = False


@dataclass(frozen=True, slots=True)
class NegativelyAcknowledged:
    """The application negatively acknowledged a message: the broker will deliver it again (maybe to
    another consumer of a Shared subscription, maybe never: a dead-letter policy)."""

    partition: int
    position: Position


@dataclass(frozen=True, slots=True)
class Sought:
    """The application seeks `partitions` (None: all) to `target` (None: unknown, by publish time).

    `skips_target`: Pulsar resumes after the target without acknowledging it (a seek by a real,
    unbatched message id without `start_message_id_inclusive`): the engine acknowledges it when it
    comes first (`Skip`), so the subscription does not stay before it for good.
    """

    partitions: tuple[int, ...] | None
    target: Entry | None
    skips_target: bool = False


@dataclass(frozen=True, slots=True)
class WatermarkRead:
    """A SendWatermark event of this subscription, computed at mark-delete `position`."""

    partition: int
    position: Entry
    event_time: int | None


@dataclass(frozen=True, slots=True)
class HeadRead:
    """A head event: the watermark at a position of the partition's log (a fact to fall back on)."""

    partition: int
    position: Entry
    event_time: int


@dataclass(frozen=True, slots=True)
class PartitionsChanged:
    """The topic's partitions now (partitions added to a live topic join)."""

    partitions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CaughtUp:
    """The feed's reader has read everything published on the companion topic before monotonic time `as_of`
    (None: `handle`'s `now`): it found nothing more available then, however busy the topic is."""

    as_of: float | None = None


@dataclass(frozen=True, slots=True)
class Attached:
    """The consumer attached: the feed has read what the companion topic held (history, handed to nobody);
    a listener is handed the watermark it holds from now on, once, before anything the feed reads later."""


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed (the engine asked for it with `WakeAt`); the time is `handle`'s `now`."""


Event = (
    Received | Acknowledged | NegativelyAcknowledged | Sought | WatermarkRead | HeadRead | PartitionsChanged
    | CaughtUp | Attached | Tick
)  # fmt: skip


# -- commands ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Deliver:
    """Hand the data message `token` to the application (after every command before it)."""

    token: object


@dataclass(frozen=True, slots=True)
class Skip:
    """Drop the message `token` (a marker, or a seek's target): never handed over; its acknowledgement
    follows as a `SendAcknowledgement`."""

    token: object


@dataclass(frozen=True, slots=True)
class HandWatermark:
    """Hand the listener this watermark (`NO_WATERMARK` when it is withdrawn)."""

    watermark: Watermark
    withdrawn: bool = False
    restated: bool = False
    """The value the listener holds, recomputed at other positions (after a move back): the shell holds this
    one (`get_last_watermark().computed_at`) without calling the listener, which gets each value once."""


@dataclass(frozen=True, slots=True)
class SendAcknowledgement:
    """Send the acknowledgement `token` (the application's, held back until now, or a skipped message's)."""

    token: object


@dataclass(frozen=True, slots=True)
class WakeAt:
    """Send a `Tick` at monotonic time `at` (or soon after)."""

    at: float


@dataclass(frozen=True, slots=True)
class GaveUp:
    """A report: `partition`, distrusted since `floor` for `waited` seconds, goes on with `fallback`."""

    partition: int
    floor: Entry | None
    waited: float
    fallback: Computed | None


Command = Deliver | Skip | HandWatermark | SendAcknowledgement | WakeAt | GaveUp


@dataclass(frozen=True, slots=True)
class Limits:
    """How long a distrusted partition waits for the generator (see the constants)."""

    fallback_wait_s: float = FALLBACK_WAIT_S
    recompute_wait_s: float = RECOMPUTE_WAIT_S


class ConsumerEngine:
    """One consumer's decisions (see the module docstring).

    `listener`: messages are handed over by the engine (`Deliver`), each after the watermark it comes
    under (`HandWatermark`), and none of a partition that waits for a recomputed watermark. Without,
    every message is delivered at once (a `receive()` returns it) and `watermark` is the strict view.
    `follow_new`: partitions met later (events, messages, `PartitionsChanged`) join.
    """

    def __init__(
        self,
        partitions: Iterable[int],
        *,
        listener: bool = False,
        limits: Limits = Limits(),
        follow_new: bool = True,
        key: Callable[[Position], Any] | None = None,
    ) -> None:
        self.listener = listener
        self.limits = limits
        self.follow_new = follow_new
        self.trust = WatermarkTrust(partitions) if key is None else WatermarkTrust(partitions, key=key)
        """`key`: the lanes' keys (consumer/trust.py `Lane`; by default positions)."""
        self.gave_up = 0
        self._pending: deque[tuple[int, Position, object]] = deque()
        """Listener: data messages received and not handed over yet, in the order received."""
        self._held: dict[int, list[object]] = {}
        self._distrusted_since: dict[int, float] = {}
        self._seek_targets: dict[int, Entry] = {}
        self._guarded_since: dict[int, float] = {}
        """Partitions that take only events at or before what came since a seek or giving up, since when."""
        self._stale_since: dict[int, float] = {}
        """Partitions whose latest event the caught-up rule left `stale` (consumer/trust.py), since when."""
        self._joining: set[int] = set()
        """Partitions added to a live topic: out of the minimum until their watermark reaches it."""
        self._delivered: Watermark | None = None
        """Listener: the watermark handed over last (None: none yet, or withdrawn)."""
        self.current: Watermark | None = None
        """What `get_last_watermark()` returns: the listener's watermark, or the strict one."""
        self._stale = False
        """Listener: what it may hold can have changed since it was handed a watermark last."""
        self.lanes: dict[int, Lane] = self.trust.lanes
        """Each partition's hot path (consumer/trust.py `Lane`): the shell writes quiet messages and acknowledgements
        there itself, as `received_quietly` and `acknowledged_quietly` do; every `handle` takes them in first."""
        self._open_lanes()

    # -- views --------------------------------------------------------------------------------------

    @property
    def partitions(self) -> list[int]:
        return self.trust.partitions

    @property
    def waits_for_caught_up(self) -> bool:
        """Whether a partition takes events only at or before what came since a move back until the reader has
        caught up (`CaughtUp`): the shell asks the companion topic's reader only then."""
        return bool(self._guarded_since or self._stale_since)

    @property
    def pending(self) -> int:
        """Messages received that wait for the listener."""
        return len(self._pending)

    # -- the one entry point --------------------------------------------------------------------------

    def handle(self, event: Event, now: float) -> list[Command]:
        self.trust.close_lanes()  # what the lanes let through first (see `Lane`)
        try:
            return self._handle(event, now)
        finally:
            self._open_lanes()

    def _open_lanes(self) -> None:
        """Open the lanes as far as the engine's own state allows: no message while a partition waits for a
        recomputed watermark or a seek's target, nor (a listener) while messages wait to be handed over or the
        listener may hold something new; no acknowledgement while a partition waits or messages wait."""
        waits = bool(self._distrusted_since)
        self.trust.open_lanes(
            receiving=not waits and not self._seek_targets and not (self.listener and (self._pending or self._stale)),
            acknowledging=not waits and not self._pending,
        )

    def _handle(self, event: Event, now: float) -> list[Command]:
        kind = type(event)
        if (kind is Received or kind is Acknowledged) and not self._distrusted_since and not self._seek_targets:
            state = self.trust.get(event.partition)  # type: ignore[union-attr]
            if state is not None:
                return self._quiet(event, state, now)  # type: ignore[arg-type]
        out: list[Command] = []
        if isinstance(event, Received):
            self._know(event.partition)
            self._received(event, out)
        elif isinstance(event, Acknowledged):
            if event.partition in self.trust:
                self._acknowledge(event.partition, event.position, event.token, event.cumulative, out)
            else:
                out.append(SendAcknowledgement(event.token))
        elif isinstance(event, NegativelyAcknowledged):
            if event.partition in self.trust:
                self.trust.on_negatively_acknowledged(event.partition, event.position)
        elif isinstance(event, Sought):
            self._seek(event, now, out)
        elif isinstance(event, WatermarkRead):
            if self._know(event.partition):
                self.trust.on_event(event.partition, event.position, event.event_time)
        elif isinstance(event, HeadRead):
            if event.partition in self.trust:
                self.trust.on_fact(event.partition, event.position, event.event_time)
        elif isinstance(event, PartitionsChanged):
            for partition in event.partitions:
                self._know(partition)
        elif isinstance(event, CaughtUp):
            as_of = now if event.as_of is None else event.as_of
            for partition, since in list(self._stale_since.items()):
                # Still the latest a while after the reader caught up: the generator published nothing newer.
                if as_of - since >= self.limits.fallback_wait_s and self.trust.take_stale(partition):
                    del self._stale_since[partition]
            for partition, since in list(self._guarded_since.items()):
                if as_of - since >= STALE_WINDOW_S:
                    del self._guarded_since[partition]
                    self.trust.on_caught_up(partition)
                    if self.trust.stale(partition):
                        self._stale_since[partition] = as_of
        elif isinstance(event, Attached):
            if self.listener and self._delivered is not None:  # the catch-up's hand-overs went to nobody
                out.append(HandWatermark(self._delivered))
            return out
        else:  # Tick
            self._check_time_limits(now, out)
        self._settle(now, out, True)  # off the hot path: look at everything again
        return out

    def _quiet(self, event: Received | Acknowledged, state: PartitionTrust, now: float) -> list[Command]:
        """A message or an acknowledgement while every partition trusts its watermark (the hot path):
        the full `_settle` only if it changed what the partition holds or started a distrust."""
        out: list[Command] = []
        held, joining = state.held, state.joining
        if type(event) is Received:
            self._received(event, out)
        else:
            self._acknowledge(event.partition, event.position, event.token, event.cumulative, out)  # type: ignore[union-attr]
        trust = self.trust
        moved = state.floor is not None or state.held is not held or state.joining is not joining
        if moved or trust.regained or trust.moved_back:
            self._settle(now, out, changed=True)
        elif self._pending:
            self._hand_over(out)
        return out

    def received_quietly(self, partition: int, position: Any) -> bool:
        """`handle(Received(partition, position, token))` for a data message, when its only command would be
        `Deliver` and nothing else would change: True, deliver it now (a listener: before anything the engine
        commands later). False, nothing changed: call `handle`. The shell does the same itself, under the lock
        its `handle` calls are made under (see `Lane`): a message after the lane's `after` while it is `receiving`.
        `position` is the message's key in the lanes (a position, or what the engine's `key` makes of one)."""
        lane = self.lanes.get(partition)
        if lane is None or not lane.receiving or not lane.after < position:
            return False
        lane.after = position
        lane.arrived.append(position)
        return True

    def skipped_quietly(self, partition: int, position: Any) -> bool:
        """`handle(Received(partition, position, token, marker=True))` when it would only skip the marker and send its
        acknowledgement: True, send it. False, nothing changed: call `handle`. The shell does the same itself, under
        the lock its `handle` calls are made under (see `Lane`)."""
        lane = self.lanes.get(partition)
        if lane is None or not lane.receiving or not lane.acknowledging or not lane.after < position:
            return False
        lane.after = position
        lane.skipped.append(position)
        return True

    def acknowledged_quietly(self, partition: int, position: Any) -> bool:
        """`handle(Acknowledged(partition, position, token))` when its only command would be sending it: True, send
        it. False: call `handle` (what the lane took is taken in again there, to the same effect). The shell does the
        same itself, without a lock (see `Lane`)."""
        lane = self.lanes.get(partition)
        if lane is None:
            return False
        acked = lane.acked
        acked.append(position)
        return lane.acknowledging and lane.acked is acked

    # -- inputs ---------------------------------------------------------------------------------------

    def _know(self, partition: int) -> bool:
        """Follow `partition` if it is new and partitions are followed; whether it is followed now."""
        if partition in self.trust:
            return True
        if not self.follow_new:
            return False
        self.trust.add_partition(partition, live=True)
        return True

    def _received(self, event: Received, out: list[Command]) -> None:
        partition, position = event.partition, event.position
        target = self._seek_targets.pop(partition, None) if self._seek_targets else None
        skip = event.marker or (target is not None and position[:2] == target)
        queued = self.listener and not skip
        self.trust.on_message(partition, position, queued=queued)
        if skip:
            out.append(Skip(event.token))
            self._acknowledge(partition, position, event.token, False, out)
        elif queued:
            self._pending.append((partition, position, event.token))
        else:
            out.append(Deliver(event.token))

    def _acknowledge(
        self, partition: int, position: Position, token: object, cumulative: bool, out: list[Command]
    ) -> None:
        if cumulative:
            hold = self.trust.on_acknowledged_through(partition, position)
        else:
            hold = self.trust.on_acknowledged(partition, position)
        if hold:
            self._held.setdefault(partition, []).append(token)
        else:
            out.append(SendAcknowledgement(token))

    def _seek(self, event: Sought, now: float, out: list[Command]) -> None:
        known = self.trust.partitions
        chosen = known if event.partitions is None else [p for p in event.partitions if p in known]
        for partition in chosen:  # as the Pulsar client sends what was acknowledged before it seeks
            out.extend(SendAcknowledgement(token) for token in self._held.pop(partition, []))
            self._seek_targets.pop(partition, None)
        if self._pending:  # not handed over yet: delivery starts again from the target
            self._pending = deque(item for item in self._pending if item[0] not in chosen)
        self.trust.on_seek(chosen, event.target)
        for partition in chosen:
            self._guarded_since[partition] = now
        if event.skips_target and event.target is not None and len(chosen) == 1:
            self._seek_targets[chosen[0]] = event.target

    def _check_time_limits(self, now: float, out: list[Command]) -> bool:
        """A partition distrusted for longer than the fallback wait with a fact to fall back on, or than
        the recompute wait without, gives up waiting (reported with `GaveUp`)."""
        late = [
            p for p, since in self._distrusted_since.items()
            if now - since >= self.limits.recompute_wait_s
            or (now - since >= self.limits.fallback_wait_s and self.trust.fallback(p) is not None)
        ]  # fmt: skip
        for partition in late:
            floor = self.trust.state(partition).floor
            self.trust.give_up(partition)
            self._guarded_since[partition] = now
            self.gave_up += 1
            out.extend(SendAcknowledgement(token) for token in self._held.pop(partition, []))
            waited = now - self._distrusted_since.pop(partition)
            out.append(GaveUp(partition, floor, waited, self.trust.state(partition).held))
        return bool(late)

    # -- consequences ---------------------------------------------------------------------------------

    def _settle(self, now: float, out: list[Command], changed: bool) -> None:
        """After every event: release held acknowledgements, start the clocks, hand over what may go."""
        for partition in self.trust.drain_moved_back():
            self._guarded_since[partition] = now  # taken only at or before what comes again, until caught up
        for partition in self.trust.drain_regained():
            out.extend(SendAcknowledgement(token) for token in self._held.pop(partition, []))
            changed = True
        for partition in self.trust.distrusting_partitions():
            if partition not in self._distrusted_since:
                self._distrusted_since[partition] = now
                out.append(WakeAt(now + self.limits.fallback_wait_s))
                out.append(WakeAt(now + self.limits.recompute_wait_s))
        if self._distrusted_since:
            for partition in [p for p in self._distrusted_since if not self.trust.distrusting(p)]:
                del self._distrusted_since[partition]
        if self._stale_since:  # taken once what it covers came again, or a newer event read, or a seek
            for partition in [p for p in self._stale_since if not self.trust.stale(p)]:
                del self._stale_since[partition]
        if not self.listener:
            if changed:
                self.current = self.trust.watermark()
            return
        self._stale |= changed
        self._hand_over(out)
        if self._stale:
            self._hand_watermark(out)

    def _hand_over(self, out: list[Command]) -> None:
        """Listener: deliver what waits, in order, while its partition may be handed over, each after the
        watermark it comes under."""
        while self._pending and self.trust.may_hand_over(self._pending[0][0]):
            partition, position, token = self._pending.popleft()
            if self._stale:
                self._hand_watermark(out)
            state = self.trust.state(partition)
            held, joining = state.held, state.joining
            self.trust.on_handed_over(partition, position)
            if state.held is not held or state.joining is not joining or state.floor is not None:
                self._stale = True
            out.append(Deliver(token))

    def _hand_watermark(self, out: list[Command]) -> None:
        """Hand the listener what it may hold now: a new value, or none; the same value silently."""
        self._stale = False
        new = self.trust.listener_watermark(self._delivered)
        previous, self._delivered = self._delivered, new
        self.current = new
        if new == previous:
            if new is not None and previous is not None and new.computed_at != previous.computed_at:
                out.append(HandWatermark(new, restated=True))
            return
        out.append(HandWatermark(NO_WATERMARK, withdrawn=True) if new is None else HandWatermark(new))


__all__ = [
    "BEFORE_ALL",
    "NO_WATERMARK",
    "Acknowledged",
    "Attached",
    "CaughtUp",
    "Command",
    "ConsumerEngine",
    "Deliver",
    "Event",
    "GaveUp",
    "HandWatermark",
    "HeadRead",
    "Limits",
    "NegativelyAcknowledged",
    "PartitionsChanged",
    "Received",
    "SendAcknowledgement",
    "Skip",
    "Sought",
    "Tick",
    "WakeAt",
    "WatermarkRead",
]
