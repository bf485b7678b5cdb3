"""The contract's checks over what each consumer's listener saw in one scenario (pure).

A consumer *instance* is one `WatermarkConsumer` from subscribe to close (a crash ends it, the
restart is a new instance). Instances never live across a seek: the scenario closes a
subscription's consumers, seeks, waits until the generator has recomputed the watermark at the
new position and only then opens new ones. So within an instance the watermark must never go back,
and across instances of one subscription it goes back only when a seek lies between them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Delivery:
    """A data message handed to a listener."""

    payload: str
    producer: str
    event_time: int
    at: float


@dataclass(frozen=True, slots=True)
class WatermarkSeen:
    """A watermark handed to a listener."""

    event_time: int
    at: float


@dataclass
class InstanceLog:
    """What one consumer instance's listener saw, in the order it saw it."""

    subscription: str
    name: str
    started: float
    epoch: int
    """How many seeks of its subscription happened before it started."""
    events: list[Delivery | WatermarkSeen] = field(default_factory=list)
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


def check_premature(log: InstanceLog, honest: set[str]) -> list[Violation]:
    """No message of an honest producer is handed over after a watermark above its event time."""
    found: list[Violation] = []
    current: int | None = None
    for event in log.events:
        if isinstance(event, WatermarkSeen):
            current = event.event_time if current is None else max(current, event.event_time)
        elif current is not None and event.producer in honest and event.event_time < current:
            found.append(Violation(
                "premature-watermark", log.subscription,
                f"{log.name} got {event.payload} (event time {event.event_time}) after watermark {current}",
            ))  # fmt: skip
    return found


def check_monotonic(log: InstanceLog) -> list[Violation]:
    """Within one instance the watermark never goes back."""
    found: list[Violation] = []
    values = [w.event_time for w in log.watermarks()]
    for before, after in itertools.pairwise(values):
        if after < before:
            found.append(Violation("watermark-went-back", log.subscription, f"{log.name}: {before} -> {after}"))
    return found


def check_across_instances(logs: Iterable[InstanceLog]) -> list[Violation]:
    """A later instance of a subscription, with no seek in between, never starts below what an earlier one saw."""
    found: list[Violation] = []
    ordered = sorted(logs, key=lambda log: log.started)
    for later in ordered:
        first = later.watermarks()[:1]
        if not first:
            continue
        for earlier in ordered:
            if earlier is later or earlier.epoch != later.epoch:
                continue
            seen_before = [w.event_time for w in earlier.watermarks() if w.at < later.started]
            if seen_before and first[0].event_time < max(seen_before):
                found.append(Violation(
                    "watermark-went-back", later.subscription,
                    f"{later.name} started at {first[0].event_time} after {earlier.name} had seen {max(seen_before)}",
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
        found += check_monotonic(log)
    return found
