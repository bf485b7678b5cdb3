"""Ingestion-time stamps of data messages, and the W_SETs that pass them, in order (no I/O of its own).

`send_data(send)` stamps a data message with the wall clock and hands it over with `send(stamp)`;
`send_set(event_time, send)` hands a W_SET over with `send(t)`. Both take the function that talks
to Pulsar as an argument, so the ordering between them is tested with threads and a fake send
(tests/unit/test_producer.py), without a broker.

**The promise kept (issue #17, 5):** W_SET(t) is handed to Pulsar only once every data message
stamped below t has been handed over, and every stamp taken after it is >= t. The log then never
has a data message that this producer stamped below a W_SET before it. Before, `send()` stamped the
wall clock and the ticker could send a higher W_SET before that message was handed over.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import TypeVar

R = TypeVar("R")


def wall_clock_ms() -> int:
    """Milliseconds since the Unix epoch, Pulsar's `event_timestamp` unit."""
    return time.time_ns() // 1_000_000


class StampOrder:
    """Ingestion-time stamps and W_SETs, ordered.

    A stamp is "in flight" from the moment it is taken until `send` returns (for a synchronous
    send, once the broker acknowledged it; for `send_async`, once the client queued it). The
    ticker's W_SET asserts at most the lowest stamp in flight, so it never waits; a W_SET with a
    given value (the application's, a commit's) waits until no stamp below it is in flight. Stamps
    never go below the highest W_SET sent (`floor`), so the wall clock stepping back cannot break
    the promise either.
    """

    def __init__(self, wall_ms: Callable[[], int] = wall_clock_ms) -> None:
        self._wall_ms = wall_ms
        self._changed = threading.Condition()
        self._floor = 0
        self._in_flight: Counter[int] = Counter()

    def _now(self) -> int:
        return max(self._wall_ms(), self._floor)

    def send_data(self, send: Callable[[int], R]) -> R:
        """Stamp a data message and hand it to Pulsar with `send(stamp)`."""
        with self._changed:
            stamp = self._now()
            self._in_flight[stamp] += 1
        try:
            return send(stamp)
        finally:
            with self._changed:
                self._in_flight[stamp] -= 1
                if not self._in_flight[stamp]:
                    del self._in_flight[stamp]
                self._changed.notify_all()

    def send_set(self, event_time: int | None, send: Callable[[int], R]) -> R:
        """Hand W_SET(t) to Pulsar with `send(t)`, in order with the stamps.

        `event_time` None is the ticker's ingestion-time W_SET: t is the wall clock, or the lowest
        stamp in flight if that is lower. Otherwise t is `event_time`, and this waits until every
        message stamped below it has been handed over (at most one send's duration: a send that
        blocks, e.g. with `send_timeout_millis=0` while the broker is away, holds it that long).
        Callers send one W_SET at a time (the producer's marker lock).
        """
        with self._changed:
            t = min([self._now(), *self._in_flight]) if event_time is None else event_time
            self._floor = max(self._floor, t)  # first, so that no stamp below t is taken while waiting
            self._changed.wait_for(lambda: all(stamp >= t for stamp in self._in_flight))
        return send(t)
