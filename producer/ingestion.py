"""Ingestion-time stamps of data messages, and the W_SETs that assert them (no I/O of its own).

`send_data(send)` stamps a data message with the wall clock and hands it over with `send(stamp)`,
taking the function that talks to Pulsar as an argument, so it can be tested without a broker.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

R = TypeVar("R")


def wall_clock_ms() -> int:
    """Milliseconds since the Unix epoch, Pulsar's `event_timestamp` unit."""
    return time.time_ns() // 1_000_000


class StampOrder:
    """Ingestion-time stamps that never go below a W_SET this producer sent."""

    def __init__(self, wall_ms: Callable[[], int] = wall_clock_ms) -> None:
        self._wall_ms = wall_ms
        self._lock = threading.Lock()
        self._floor = 0

    def now(self) -> int:
        """The wall clock, never below the latest W_SET sent."""
        with self._lock:
            return max(self._wall_ms(), self._floor)

    def send_data(self, send: Callable[[int], R]) -> R:
        """Stamp a data message and hand it to Pulsar with `send(stamp)`."""
        return send(self.now())

    def asserted(self, event_time: int) -> None:
        """This producer sent W_SET(`event_time`): later stamps are not below it."""
        with self._lock:
            self._floor = event_time
