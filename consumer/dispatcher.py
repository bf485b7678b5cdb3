"""The listener's one thread: it receives from the client itself and calls the listener in the engine's order.

A message takes one way through the shell: the thread asks `receive` (the consumer's intake: one message from the
client, told to the engine through the feed, at most `LISTENER_POLL_MS`); the engine's deliveries and watermarks
come into the inbox (`put`, the feed's `perform`, called under the feed's lock, so the inbox keeps the engine's
order whichever thread the commands came from: this one, the feed's reader, the application's acknowledgements);
and the thread hands them to the listener itself (`received`, `received_watermark`, `watermark_withdrawn`),
judging each message's lateness under the watermark the listener holds (`handed`). When the inbox is empty it
receives, unless paused (`pause`, `receiving` while a seek runs) or the application has `full()` messages waiting
(the client keeps the rest). A message the engine lets go at once (the hot path: nothing queued, `idle()` under
the feed's lock) comes back from `receive` and is delivered next, without the inbox; a seek drops it as it drops
the inbox's.

The client's `message_listener` is not used: it costs a thread hop per message. Everything shared between
threads is a lock, a condition or an event; no plain flag.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pulsar

from consumer.engine import Command, Deliver, HandWatermark
from consumer.lateness import Lateness
from consumer.listener import Listener
from watermark_core.protocol import Watermark

log = logging.getLogger(__name__)

LISTENER_POLL_MS = 50
"""How long the thread waits in `receive` before it hands over what the feed queued meanwhile."""
PAUSED_WAIT_S = 0.5
"""How long the thread waits for the inbox while it may not receive, before it looks again."""


class Dispatcher:
    """The inbox and the thread (see the module docstring). `consumer` is what the listener's methods are given."""

    def __init__(
        self,
        name: str,
        *,
        listener: Listener,
        consumer: object,
        receive: Callable[[int], pulsar.Message | None],
        full: Callable[[], bool],
        lateness: Lateness,
    ) -> None:
        self._listener, self._consumer, self._lateness = listener, consumer, lateness
        self._receive, self._full = receive, full
        self.handed: Watermark | None = None
        """The watermark handed to the listener last (None: none yet, or withdrawn); written on the thread only."""
        self._inbox: deque[Deliver | HandWatermark] = deque()
        self._direct: pulsar.Message | None = None
        """The message `receive` returned to be delivered next, without the inbox (None: none)."""
        self._changed = threading.Condition()
        """Guards `_inbox`, `_direct` and `_waiting`; notified when something was put while the thread waits."""
        self._waiting = False
        """The thread waits on `_changed` (read and written under it)."""
        self._paused = threading.Event()
        self._stopped = threading.Event()
        self._receiving = threading.Lock()
        """Held while the thread receives a message and tells the engine (`receiving` takes it)."""
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    # -- the inbox ---------------------------------------------------------------------------------------

    def put(self, commands: list[Command]) -> None:
        """The engine's deliveries and watermarks, in its order (the feed's `perform`, under its lock)."""
        items = [c for c in commands if type(c) is Deliver or type(c) is HandWatermark]
        if items:
            with self._changed:
                self._inbox.extend(items)
                if self._waiting:
                    self._changed.notify_all()

    def idle(self) -> bool:
        """Nothing waits in the inbox (asked under the feed's lock, where everything is `put`)."""
        return not self._inbox

    def drop(self, dropped: Callable[[object], bool]) -> None:
        """Forget the deliveries whose token is `dropped` (a seek: delivery starts again from its target)."""
        with self._changed:
            kept = [item for item in self._inbox if type(item) is not Deliver or not dropped(item.token)]
            self._inbox.clear()
            self._inbox.extend(kept)
            if self._direct is not None and dropped(self._direct):
                self._direct = None

    # -- receiving ---------------------------------------------------------------------------------------

    @contextmanager
    def receiving_stopped(self) -> Iterator[None]:
        """Nothing is received meanwhile, and what was received before is in the engine (a seek)."""
        paused = self._paused.is_set()
        self._paused.set()
        with self._receiving:
            try:
                yield
            finally:
                if not paused:
                    self._paused.clear()

    def pause(self) -> None:
        with self._receiving:
            self._paused.set()

    def resume(self) -> None:
        self._paused.clear()
        with self._changed:
            self._changed.notify_all()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopped.set()
        with self._changed:
            self._changed.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=timeout)

    # -- the thread --------------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopped.is_set():
            while True:
                with self._changed:  # one at a time: a seek from the listener drops what came before it
                    if not self._inbox:
                        break
                    item = self._inbox.popleft()
                if self._stopped.is_set():
                    return
                try:
                    if type(item) is Deliver:
                        self._deliver(item.token)
                    else:
                        self._hand(item)  # type: ignore[arg-type]
                except Exception:
                    log.exception("the listener raised; continuing")
            if self._paused.is_set() or self._full():
                self._wait(PAUSED_WAIT_S)
                continue
            with self._receiving:
                if self._paused.is_set() or self._stopped.is_set():
                    continue
                token = self._receive(LISTENER_POLL_MS)
                if token is None:
                    continue
                with self._changed:
                    self._direct = token
            with self._changed:  # outside `_receiving`: the listener may seek
                token, self._direct = self._direct, None
            if token is None or self._stopped.is_set():
                continue
            try:
                self._deliver(token)
            except Exception:
                log.exception("the listener raised; continuing")

    def _deliver(self, message: pulsar.Message) -> None:
        """Hand a data message to the listener, under the watermark it holds."""
        self._lateness.judge(message, self.handed)
        self._listener.received(self._consumer, message)

    def _hand(self, item: HandWatermark) -> None:
        """Hand the listener a watermark (a restated one is held without calling it)."""
        self.handed = None if item.withdrawn else item.watermark
        if item.restated:
            return
        if item.withdrawn:
            self._listener.watermark_withdrawn(self._consumer)
        else:
            self._listener.received_watermark(self._consumer, item.watermark)

    def _wait(self, timeout: float) -> None:
        with self._changed:
            if self._inbox or self._stopped.is_set():
                return
            self._waiting = True
            try:
                self._changed.wait(timeout)
            finally:
                self._waiting = False
