"""When the producer's background ticker sends a marker: pure functions of times, no threads, no I/O.

Times are seconds of the producer's monotonic clock. The ticker thread of `WatermarkProducer` asks
`TickerSchedule.plan` what to do at each wake-up and when to wake up next; keeping that decision
here lets the tests check the schedule over arbitrary send times.

**The bound** (docs/DECISIONS.md, "Keepalive"): a keepalive is due `K` (`keepalive_s`) after the
last marker the producer handed to Pulsar, whoever sent it, and the ticker never sleeps past a due
keepalive. So between two markers of a producer that asserts a W_SET pass at most `K` plus the
slack: the ticker's wake-up delay and a synchronous marker send in progress at the due time (the
ticker waits for it, since the log must have them in order). The generator's producer timeout
must exceed `K + slack + the largest clock skew between producers`; `check_intervals` refuses a
configuration that leaves no margin at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

KEEPALIVE_SLACK_MS = 5_000
"""The slack budgeted for a marker that is due to reach the log: the ticker's wake-up delay (ms
normally), a synchronous marker send in progress (one round trip normally), the client's batching
delay and the broker's write (ms). 5 s leaves room for a loaded host and a slow broker."""


class Tick(Enum):
    """What the ticker does at a wake-up."""

    NOTHING = "nothing"
    INGESTION = "ingestion"
    """Send the wall clock as W_SET (ingestion-time watermarks)."""
    KEEPALIVE = "keepalive"
    """Re-send the producer's latest assertion, so the generator's producer timeout does not drop it."""


def keepalive_due(last_marker_at: float, keepalive_s: float) -> float:
    """When the next keepalive is due: `keepalive_s` after the last marker was handed to Pulsar.

    `last_marker_at` is taken before the marker is handed over, so it is never after its publish
    time: the real gap is never longer than the scheduled one.
    """
    return last_marker_at + keepalive_s


@dataclass(frozen=True)
class TickerSchedule:
    """`keepalive_s` and `ingestion_s` are the producer's intervals in seconds (None: off)."""

    keepalive_s: float | None
    ingestion_s: float | None

    def __post_init__(self) -> None:
        if self.keepalive_s is None and self.ingestion_s is None:
            raise ValueError("a ticker schedule needs a keepalive or an ingestion interval")

    @property
    def shortest_s(self) -> float:
        """The shorter of the two intervals."""
        return min(s for s in (self.keepalive_s, self.ingestion_s) if s)

    def plan(
        self, now: float, last_marker_at: float, last_ingestion_at: float, event_time: int | None, idle: bool
    ) -> tuple[Tick, float]:
        """What to do at `now`, and when to wake up next (`now` after an action: plan again then).

        `last_marker_at` is when the producer last handed any marker to Pulsar, `last_ingestion_at`
        when the ticker last sent an ingestion-time W_SET; `event_time` and `idle` are what the
        producer's markers so far leave in the log: its latest W_SET (None before the first) and
        whether a W_IDLE came after it (transactional ones once committed).

        A keepalive re-sends the latest W_SET of a producer that asserts one; an idle producer gets
        none, nor ingestion-time W_SETs, until its next W_SET (docs/DECISIONS.md, issue #17, 4).
        With ingestion-time watermarks a due keepalive is a fresh ingestion W_SET. When nothing is
        due the ticker still wakes up within the shorter interval: a marker sent meanwhile makes
        the next keepalive due no earlier than K after it, so that wake-up is never late.
        """
        asserting = event_time is not None and not idle
        ingestion_due = last_ingestion_at + self.ingestion_s if self.ingestion_s and not idle else math.inf
        keepalive = keepalive_due(last_marker_at, self.keepalive_s) if self.keepalive_s and asserting else math.inf
        if now >= ingestion_due or (ingestion_due < math.inf and now >= keepalive):
            return Tick.INGESTION, now
        if now >= keepalive:
            return Tick.KEEPALIVE, now
        return Tick.NOTHING, min(ingestion_due, keepalive, now + self.shortest_s)


def check_intervals(keepalive_ms: int | None, ingestion_ms: int | None, producer_timeout_ms: int) -> None:
    """Refuse intervals that leave a live producer no margin against the generator's producer timeout.

    The longest gap between two markers of a live producer is the shorter interval plus the slack;
    what is left of the timeout is the clock skew between producers that it tolerates. Without any
    interval the producer keeps no watermark alive: that is allowed (the caller's choice).
    """
    intervals = [ms for ms in (keepalive_ms, ingestion_ms) if ms is not None]
    if not intervals:
        return
    margin = producer_timeout_ms - min(intervals) - KEEPALIVE_SLACK_MS
    if margin <= 0:
        raise ValueError(
            f"keepalive_interval_ms={keepalive_ms} and ingestion_time_interval_ms={ingestion_ms} leave no margin "
            f"against the producer timeout of {producer_timeout_ms} ms: the shorter interval plus "
            f"{KEEPALIVE_SLACK_MS} ms of slack must stay below it (the margin left is the clock skew between "
            "producers that is tolerated); use a shorter interval, or pass the generator's producer_timeout_ms"
        )
