"""When the producer's background ticker sends a marker: pure functions of times, no threads, no I/O.

Times are seconds of the producer's monotonic clock. The ticker thread of `WatermarkProducer` asks
`TickerSchedule.plan` what to do at each wake-up and when to wake up next; keeping that decision
here lets the tests check the schedule over arbitrary send times.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Tick(Enum):
    """What the ticker does at a wake-up."""

    NOTHING = "nothing"
    INGESTION = "ingestion"
    """Send the wall clock as W_SET (ingestion-time watermarks)."""
    KEEPALIVE = "keepalive"
    """Re-send the producer's latest assertion, so the generator's producer timeout does not drop it."""


@dataclass(frozen=True)
class TickerSchedule:
    """`keepalive_s` and `ingestion_s` are the producer's intervals in seconds (None: off)."""

    keepalive_s: float | None
    ingestion_s: float | None

    def __post_init__(self) -> None:
        if self.keepalive_s is None and self.ingestion_s is None:
            raise ValueError("a ticker schedule needs a keepalive or an ingestion interval")

    def plan(self, now: float, last_marker_at: float, last_ingestion_at: float, asserting: bool) -> tuple[Tick, float]:
        """What to do at `now`, and when to wake up next.

        `last_marker_at` is when the producer last handed any marker to Pulsar, `last_ingestion_at`
        when the ticker last sent an ingestion-time W_SET; `asserting` is whether the producer's
        latest marker leaves it asserting a W_SET (not idle, not before its first W_SET).
        """
        period = min(s for s in (self.keepalive_s, self.ingestion_s) if s)
        if self.ingestion_s:
            return Tick.INGESTION, now + period
        if self.keepalive_s and now - last_marker_at >= self.keepalive_s:
            return Tick.KEEPALIVE, now + period
        return Tick.NOTHING, now + period
