"""The contract's checks over what each consumer's listener saw in one scenario (pure).

A consumer *instance* is one `WatermarkConsumer` from subscribe to close (a crash ends it, the
restart is a new instance). A seek of a subscription whose consumers were closed first (`epoch`
counts those) lies between instances; a seek by an attached consumer or an operator's
reset-cursor happens while instances live. Either way the watermark may go back only to one
computed at an earlier position than the one it replaces (each watermark names the positions it
was computed at); every message is checked against the watermark its listener held when it got it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from consumer.engine import RECOMPUTE_WAIT_S

Positions = tuple[tuple[int, int, int], ...]
"""(partition, ledger, entry) of each partition a watermark comes from (`Watermark.computed_at`)."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """A data message handed to a listener."""

    payload: str
    producer: str
    event_time: int
    at: float
    position: tuple[int, int, int] | None = None
    """(partition, ledger, entry) of the message."""


@dataclass(frozen=True, slots=True)
class WatermarkSeen:
    """A watermark handed to a listener."""

    event_time: int
    at: float
    computed_at: Positions = ()


@dataclass(frozen=True, slots=True)
class WatermarkWithdrawn:
    """The consumer took the listener's watermark away (its subscription moved back to where it has none,
    or it gave up waiting for the recomputed one)."""

    at: float


@dataclass
class InstanceLog:
    """What one consumer instance's listener saw, in the order it saw it."""

    subscription: str
    name: str
    started: float
    epoch: int
    """How many seeks of its subscription happened before it started."""
    events: list[Delivery | WatermarkSeen | WatermarkWithdrawn] = field(default_factory=list)
    acknowledged: set[str] = field(default_factory=set)
    closed: float | None = None

    def watermarks(self) -> list[WatermarkSeen]:
        return [e for e in self.events if isinstance(e, WatermarkSeen)]


@dataclass(frozen=True, slots=True)
class Violation:
    check: str
    subscription: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.check}] {self.subscription}: {self.detail}"


def moved_back(before: WatermarkSeen, after: WatermarkSeen) -> bool:
    """Whether `after` was computed at an earlier position than `before` on some partition: a move back."""
    earlier = {p: (ledger, entry) for p, ledger, entry in before.computed_at}
    return any(p in earlier and (ledger, entry) < earlier[p] for p, ledger, entry in after.computed_at)


def check_premature(log: InstanceLog, honest: set[str]) -> list[Violation]:
    """No message of an honest producer is handed over below the watermark its listener held then."""
    found: list[Violation] = []
    current: int | None = None
    for event in log.events:
        if isinstance(event, WatermarkSeen):
            current = event.event_time
        elif isinstance(event, WatermarkWithdrawn):
            current = None
        elif current is not None and event.producer in honest and event.event_time < current:
            found.append(Violation(
                "premature-watermark", log.subscription,
                f"{log.name} got {event.payload} (event time {event.event_time}) after watermark {current}",
            ))  # fmt: skip
    return found


def check_stale(log: InstanceLog) -> list[Violation]:
    """No message is handed over under a watermark computed at or after its own position (the consumer's rule)."""
    found: list[Violation] = []
    held: dict[int, tuple[int, int]] = {}
    for event in log.events:
        if isinstance(event, WatermarkSeen):
            held = {p: (ledger, entry) for p, ledger, entry in event.computed_at}
        elif isinstance(event, WatermarkWithdrawn):
            held = {}
        elif event.position is not None and event.position[0] in held:
            partition, ledger, entry = event.position
            if (ledger, entry) <= held[partition]:
                found.append(Violation(
                    "stale-watermark", log.subscription,
                    f"{log.name} got {event.payload} at {(ledger, entry)} under a watermark computed at "
                    f"{held[partition]}",
                ))  # fmt: skip
    return found


def check_monotonic(log: InstanceLog) -> list[Violation]:
    """Within one instance the watermark goes back only to one computed at an earlier position (a move back)."""
    found: list[Violation] = []
    for before, after in itertools.pairwise(log.watermarks()):
        if after.event_time < before.event_time and not moved_back(before, after):
            found.append(Violation(
                "watermark-went-back", log.subscription, f"{log.name}: {before.event_time} -> {after.event_time}"
            ))  # fmt: skip
    return found


def check_withdrawn(log: InstanceLog, logs: Iterable[InstanceLog] = ()) -> list[Violation]:
    """In these scenarios every position a subscription can move back to has a watermark (producers
    assert before they send), so a watermark taken away means the consumer gave up waiting for the
    generator's recomputed one.

    But for a broker that starts the subscription again before the topic's first entry, where no watermark
    holds: a `kill -9` within the second before it stored the subscription's position (seeds 15840, 1416).
    The generator then says "none" there, and taking the watermark away is right. That every message then
    comes again from the subscription's first one (to any of its instances, `logs`) tells it apart.

    But for an instance that received nothing for the whole wait (`RECOMPUTE_WAIT_S`) before it: the
    inactive consumer of a Failover subscription that sought by publish time gets no message that would
    tell it where its seek landed, so it cannot place the recomputed watermark, and withdrawing is what
    the consumer must do then (holding on would be premature for a consumer that the messages do reach).
    """
    withdrawals = []
    quiet_since = log.started
    for event in log.events:
        if isinstance(event, Delivery):
            quiet_since = event.at
        elif (
            isinstance(event, WatermarkWithdrawn) and event.at - quiet_since < RECOMPUTE_WAIT_S - 0.5
            and not _started_again(logs, event.at)
        ):  # fmt: skip
            withdrawals.append(event)
    if not withdrawals:
        return []
    detail = f"{log.name}: taken away {len(withdrawals)} times, first at {withdrawals[0].at:.1f}"
    return [Violation("watermark-withdrawn", log.subscription, detail)]


def _started_again(logs: Iterable[InstanceLog], at: float) -> bool:
    """Whether the subscription's first message (the earliest delivered before `at`) came again, to any
    instance, within the wait around `at`: the broker started the subscription again before it. The
    consumers may hear of it before the generator's recomputed "none" reaches them (seed 146734) or after."""
    deliveries = [e for log in logs for e in log.events if isinstance(e, Delivery) and e.position is not None]
    earlier = [e.position for e in deliveries if e.at < at and e.position is not None]
    if not earlier:
        return False
    first = min(earlier)
    again = sorted(e.at for e in deliveries if e.position == first)[1:]  # its first delivery is not a coming again
    return any(at - (RECOMPUTE_WAIT_S - 0.5) < t <= at + RECOMPUTE_WAIT_S for t in again)


def check_across_instances(logs: Iterable[InstanceLog]) -> list[Violation]:
    """A later instance of a subscription never starts below what an earlier one saw, unless a seek of
    closed consumers lies between them or its first watermark was computed at an earlier position."""
    found: list[Violation] = []
    ordered = sorted(logs, key=lambda log: log.started)
    for later in ordered:
        first = later.watermarks()[:1]
        if not first:
            continue
        for earlier in ordered:
            if earlier is later or earlier.epoch != later.epoch:
                continue
            above = [
                w for w in earlier.watermarks()
                if w.at < later.started and first[0].event_time < w.event_time and not moved_back(w, first[0])
            ]  # fmt: skip
            if above:
                highest = max(w.event_time for w in above)
                found.append(Violation(
                    "watermark-went-back", later.subscription,
                    f"{later.name} started at {first[0].event_time} after {earlier.name} had seen {highest}",
                ))  # fmt: skip
    return found


def check_nothing_lost(subscription: str, sent: Iterable[str], logs: Iterable[InstanceLog]) -> list[Violation]:
    """Every message the broker accepted was handed to and acknowledged by some instance."""
    acknowledged: set[str] = set()
    for log in logs:
        acknowledged |= log.acknowledged
    missing = sorted(set(sent) - acknowledged)
    if not missing:
        return []
    return [Violation("message-lost", subscription, f"{len(missing)} never acknowledged, e.g. {missing[:3]}")]


def check_final(subscription: str, final: int, reached: Mapping[str, float | None], bound_s: float) -> list[Violation]:
    """Each live instance reaches the final watermark within `bound_s` after the faults stop."""
    return [
        Violation("final-watermark-late", subscription,
                  f"{name} did not see {final} within {bound_s:.0f} s" if took is None
                  else f"{name} took {took:.1f} s > {bound_s:.0f} s")
        for name, took in sorted(reached.items())
        if took is None or took > bound_s
    ]  # fmt: skip


def check_subscription(
    subscription: str, logs: list[InstanceLog], sent: Iterable[str], honest: set[str]
) -> list[Violation]:
    """All per-subscription checks but the final watermark (which needs timing from the run)."""
    found = check_nothing_lost(subscription, sent, logs)
    found += check_across_instances(logs)
    for log in logs:
        found += check_premature(log, honest)
        found += check_stale(log)
        found += check_monotonic(log)
        found += check_withdrawn(log, logs)
    return found
