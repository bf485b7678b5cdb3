"""One thread that runs everything the generator decides: callables posted from any thread, and timers.

The Pulsar client's listener thread posts each message delivered (`post_message`, which blocks
while too many wait: back-pressure to the broker through the consumers' flow permits); the worker
threads post the outcome of what they did (`post`). Engines and the state around them are only
touched on this thread, so they need no locks. Timers (`call_at`) are keyed: setting a key again
moves its timer, so each partition has at most one of each kind however often it is rescheduled.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Hashable

log = logging.getLogger(__name__)

MAX_WAITING_MESSAGES = 20_000
"""Messages delivered but not handled yet, across all partitions; the listener waits beyond that."""
BATCH = 1_000
"""Posted callables run between two looks at the timers."""


class EventLoop:
    """A queue of callables and a heap of timers, served by one thread."""

    def __init__(self, name: str = "wm-loop", max_waiting: int = MAX_WAITING_MESSAGES) -> None:
        self._queue: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._slots: queue.SimpleQueue[None] = queue.SimpleQueue()
        """One token per message that may wait: a queue in C, where `threading.Semaphore` is Python code run twice
        for every message."""
        for _ in range(max_waiting):
            self._slots.put(None)
        self._timers: list[tuple[float, int, Hashable]] = []
        self._due: dict[Hashable, tuple[float, int, Callable[[], None]]] = {}
        self._order = itertools.count()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.iterations = 0

    # -- from any thread ------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stopping.set()
        self._queue.put(lambda: None)
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def post(self, work: Callable[[], None]) -> None:
        """Run `work` on the loop thread, after what was posted before it. Never blocks."""
        self._queue.put(work)

    def post_message(self, work: Callable[[], None]) -> None:
        """Like `post`, for a delivered message: waits while `max_waiting` messages are not handled yet."""
        while True:
            try:
                self._slots.get(timeout=1.0)
                break
            except queue.Empty:
                if self._stopping.is_set():
                    return

        def handled() -> None:
            try:
                work()
            finally:
                self._slots.put(None)

        self._queue.put(handled)

    # -- on the loop thread -------------------------------------------------------------------------

    def call_at(self, when: float, key: Hashable, work: Callable[[], None]) -> None:
        """Run `work` at `when` (time.time()); a timer with the same key is replaced."""
        order = next(self._order)
        self._due[key] = (when, order, work)
        heapq.heappush(self._timers, (when, order, key))

    def cancel(self, key: Hashable) -> None:
        self._due.pop(key, None)

    def scheduled(self, key: Hashable) -> float | None:
        entry = self._due.get(key)
        return entry[0] if entry is not None else None

    def _run(self) -> None:
        while not self._stopping.is_set():
            self.iterations += 1
            timeout = self._next_timeout()
            try:
                work: Callable[[], None] | None = self._queue.get(timeout=timeout)
            except queue.Empty:
                work = None
            for _ in range(BATCH):
                if work is not None:
                    self._call(work)
                try:
                    work = self._queue.get_nowait()
                except queue.Empty:
                    break
            else:
                if work is not None:
                    self._call(work)
            self._run_timers()

    def _next_timeout(self) -> float:
        while self._timers:
            when, order, key = self._timers[0]
            entry = self._due.get(key)
            if entry is None or entry[1] != order:
                heapq.heappop(self._timers)  # moved or cancelled
                continue
            return max(0.0, min(when - time.time(), 5.0))
        return 5.0

    def _run_timers(self) -> None:
        now = time.time()
        while self._timers and self._timers[0][0] <= now:
            _, order, key = heapq.heappop(self._timers)
            entry = self._due.get(key)
            if entry is None or entry[1] != order:
                continue
            del self._due[key]
            self._call(entry[2])

    @staticmethod
    def _call(work: Callable[[], None]) -> None:
        try:
            work()
        except Exception:
            log.exception("unexpected error in the generator's event loop; carrying on")
