"""Follows the `SendWatermark` events of one subscription on the topic's companion topic.

The generator publishes one event per (partition, subscription) change to the topic's companion
topic (`watermark_topic_for`: in the watermark namespace, where only the generator may produce);
compaction keeps the latest per key, so reading the compacted topic from its start gives the
current watermark at once, and reading on gives every change after it. Events come from there
only, and an event that names another topic or subscription is ignored.

Each event names the mark-delete position it was computed at, and holds only for messages after
it. Which event may stand over which message is the trust rule of `watermark_core.trust`; the feed
is its I/O shell: it feeds the rule the events it reads and the messages and acknowledgements the
consumer reports, holds back the acknowledgements the rule asks it to hold, gives up waiting for a
recomputed watermark after `fallback_wait_s` when it can fall back on an event or head event it
read (the watermark at a position of the log), else after `recompute_wait_s`, and follows
partitions added to the topic later.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable

import pulsar

from pulsar_access.errors import explained, service_url_of
from pulsar_access.topics import base_topic_and_partition, watermark_topic_for
from watermark_core.protocol import (
    EVENT_PROPERTY,
    HEAD_WATERMARK,
    MalformedMarker,
    Position,
    Watermark,
    WatermarkEvent,
    decode_head,
    decode_table,
)
from watermark_core.trust import Entry, WatermarkTrust

log = logging.getLogger(__name__)

CATCH_UP_LIMIT_S = 10.0
RECOMPUTE_WAIT_S = 30.0
"""How long a partition that moved back waits for a watermark computed before its messages, at most."""
FALLBACK_WAIT_S = 5.0
"""How long it waits when it remembers a fact of the log to fall back on (`WatermarkTrust.fallback`):
the generator recomputes within about a second of a move back (`make bench`, seek), so a longer wait
means it will not (a Shared copy acknowledged elsewhere) or cannot now (it is restarting)."""
PARTITION_REFRESH_S = 10.0
"""How often the feed of a partitioned topic looks for partitions added to it."""

Send = Callable[[], None]


def partition_indexes(client: pulsar.Client, topic: str) -> list[int]:
    """The partitions a consumer of `topic` reads: [-1] for a non-partitioned topic."""
    names = client.get_topic_partitions(topic)
    base, _ = base_topic_and_partition(topic)
    if names == [base]:
        return [-1]
    return sorted(base_topic_and_partition(name)[1] for name in names)


class WatermarkFeed:
    """The subscription's watermark: the minimum over the partitions it reads, as far as it can be trusted.

    `on_change(current)` runs on the feed's thread whenever what a listener may hold can have
    changed; `current` is the strict watermark (None while a partition has none or is distrusted).
    `partitions` fixes the partitions; by default they are the topic's, and for a partitioned topic
    partitions added later join (without a watermark, they hold the minimum back until they have one).
    """

    def __init__(
        self,
        client: pulsar.Client,
        topic: str,
        subscription: str,
        on_change: Callable[[Watermark | None], None],
        partitions: list[int] | None = None,
        *,
        recompute_wait_s: float = RECOMPUTE_WAIT_S,
        fallback_wait_s: float = FALLBACK_WAIT_S,
        partition_refresh_s: float = PARTITION_REFRESH_S,
    ) -> None:
        self.topic, own_partition = base_topic_and_partition(topic)
        self.subscription = subscription
        self.recompute_wait_s = recompute_wait_s
        self.fallback_wait_s = min(fallback_wait_s, recompute_wait_s)
        self._client = client
        self._topic_name = topic
        self._on_change = on_change
        indexes = partitions if partitions is not None else partition_indexes(client, topic)
        self._follow_new_partitions = partitions is None and own_partition == -1 and indexes != [-1]
        self._partition_refresh_s = partition_refresh_s
        self._trust = WatermarkTrust(indexes)
        self._cond = threading.Condition()
        self._held: dict[int, list[Send]] = {}
        self._distrusted_since: dict[int, float] = {}
        self._current: Watermark | None = None
        self.malformed_events = 0
        self.gave_up = 0
        """How often a partition stopped waiting for a recomputed watermark (see `recompute_wait_s`)."""
        companion = watermark_topic_for(topic)
        with explained(service_url=service_url_of(client), topic=companion, doing="read the watermarks from"):
            self._reader = client.create_reader(companion, pulsar.MessageId.earliest, is_read_compacted=True)
        self._stop = threading.Event()
        self._caught_up = False
        self._catch_up()
        self._caught_up = True
        self._thread = threading.Thread(target=self._run, name=f"wm-feed-{subscription}", daemon=True)
        self._thread.start()

    # -- what the consumer reads -------------------------------------------------------------------

    @property
    def current(self) -> Watermark | None:
        """The strict watermark: None while any partition has none or is distrusted."""
        return self._current  # one attribute read: atomic, no lock on the message path

    @property
    def partitions(self) -> list[int]:
        with self._cond:
            return self._trust.partitions

    def partition_of(self, index: int) -> int:
        """Our name of a message id's partition index (-1 from a consumer of one partition topic)."""
        with self._cond:
            known = self._trust.partitions
        if index < 0 and len(known) == 1:
            return known[0]
        return index

    def listener_watermark(self, delivered: Watermark | None) -> Watermark | None:
        """What a listener that holds `delivered` may hold now (see `WatermarkTrust.listener_watermark`)."""
        with self._cond:
            return self._trust.listener_watermark(delivered)

    def wait_to_hand_over(self, partition: int, stop: Callable[[], bool]) -> bool:
        """Block until a message of `partition` may be handed over; False if `stop()` became true first."""
        with self._cond:
            while not self._trust.may_hand_over(partition):
                if stop() or self._stop.is_set():
                    return False
                self._cond.wait(0.5)
        return True

    # -- what the consumer reports -----------------------------------------------------------------

    def observe(self, partition: int, position: Position, *, queued: bool = False) -> None:
        """A message (data or marker) arrived at `position`, before anyone sees it; `queued`: it waits for
        the listener (then `handed_over`)."""
        with self._cond:
            if partition not in self._trust.partitions:
                self._trust.add_partition(partition)
            self._trust.on_message(partition, position, queued=queued)
            released, changed = self._settle()
        self._after(released, changed)

    def handed_over(self, partition: int, position: Position) -> None:
        """A queued message is being handed to the listener (see `WatermarkTrust.on_handed_over`)."""
        with self._cond:
            if partition not in self._trust.partitions:
                return
            self._trust.on_handed_over(partition, position)
            released, changed = self._settle()
        self._after(released, changed)

    def acknowledge(self, partition: int, position: Position, send: Send, *, cumulative: bool = False) -> None:
        """Acknowledge with `send()` now, or later if the trust rule holds it back (it covers the floor)."""
        with self._cond:
            if partition not in self._trust.partitions:
                hold = False
            elif cumulative:
                hold = self._trust.on_acknowledged_through(partition, position)
            else:
                hold = self._trust.on_acknowledged(partition, position)
            if hold:
                self._held.setdefault(partition, []).append(send)
            released, changed = self._settle()
        if not hold:
            send()
        self._after(released, changed)

    def send_held(self, partitions: Iterable[int] | None) -> None:
        """Send the acknowledgements held for these partitions (None: all) now: before a seek, as the
        Pulsar client sends what the application acknowledged before it seeks."""
        with self._cond:
            chosen = list(self._held) if partitions is None else [p for p in partitions if p in self._held]
            released = [send for p in chosen for send in self._held.pop(p)]
        self._after(released, changed=False)

    def seek(self, partitions: Iterable[int] | None, target: Entry | None) -> None:
        """The consumer sought these partitions (None: all) to `target` (None: unknown, by publish time)."""
        with self._cond:
            chosen = self._trust.partitions if partitions is None else list(partitions)
            self._trust.on_seek([p for p in chosen if p in self._trust.partitions], target)
            released, changed = self._settle(changed=True)
        self._after(released, changed)

    # -- the trust rule's consequences -------------------------------------------------------------

    def _settle(self, changed: bool = False) -> tuple[list[Send], bool]:
        """After any input (under the lock): collect acknowledgements to release, note distrust times."""
        released: list[Send] = []
        for partition in self._trust.drain_regained():
            released += self._held.pop(partition, [])
            changed = True
        now = time.monotonic()
        for partition in self._trust.partitions:
            if self._trust.distrusting(partition):
                self._distrusted_since.setdefault(partition, now)
            else:
                self._distrusted_since.pop(partition, None)
        current = self._trust.watermark()
        if current != self._current or (current is None) != (self._current is None):
            changed = True
        self._current = current
        if changed:
            self._cond.notify_all()
        return released, changed

    def _after(self, released: list[Send], changed: bool) -> None:
        """Outside the lock: send released acknowledgements, tell the consumer."""
        for send in released:
            try:
                send()
            except Exception:  # a closed consumer: the broker redelivers; nothing to hold any more
                log.debug("a held acknowledgement on %s could not be sent", self.topic, exc_info=True)
        if changed and self._caught_up:
            self._on_change(self._current)

    def _check_time_limits(self) -> None:
        """A partition distrusted for longer than `fallback_wait_s` with a fact to fall back on, or than
        `recompute_wait_s` without, gives up waiting (and says so)."""
        now = time.monotonic()
        with self._cond:
            late = [
                p for p, since in self._distrusted_since.items()
                if now - since >= self.recompute_wait_s
                or (now - since >= self.fallback_wait_s and self._trust.fallback(p) is not None)
            ]  # fmt: skip
            waited = {p: now - self._distrusted_since[p] for p in late}
            floors = {p: self._trust.state(p).floor for p in late}
            released: list[Send] = []
            for partition in late:
                self._trust.give_up(partition)
                released += self._held.pop(partition, [])
                self.gave_up += 1
            fallbacks = {p: self._trust.state(p).held for p in late}
            more, changed = self._settle(changed=bool(late))
        for partition in late:
            fallback = fallbacks[partition]
            going_on = (
                "going on without a watermark until the generator publishes one"
                if fallback is None or fallback.event_time is None
                else f"going on with the watermark {fallback.event_time} the log had at {fallback.position}"
            )
            log.log(
                logging.INFO if fallback is not None and fallback.event_time is not None else logging.WARNING,
                "subscription %r of %s, partition %d moved back to %s, and no watermark computed before it "
                "arrived within %.1f s; %s (is 'broker-ext serve' running? In a Shared subscription, another "
                "consumer may have acknowledged its copy of a message this one holds)",
                self.subscription, self.topic, partition, floors[partition], waited[partition], going_on,
            )  # fmt: skip
        self._after(released + more, changed)

    def _refresh_partitions(self) -> None:
        """Partitions added to the topic join the minimum, without a watermark until they have one."""
        try:
            indexes = partition_indexes(self._client, self._topic_name)
        except Exception:
            log.debug("looking up the partitions of %s failed; trying again later", self.topic, exc_info=True)
            return
        with self._cond:
            added = [p for p in indexes if p >= 0 and self._trust.add_partition(p)]
            released, changed = self._settle(changed=bool(added))
        if added:
            log.info("%s: partitions %s added; following them for subscription %r", self.topic, added,
                     self.subscription)  # fmt: skip
        self._after(released, changed)

    # -- reading the companion topic ---------------------------------------------------------------

    def _catch_up(self) -> None:
        """Read what is already there, so the latest watermark is known when the consumer attaches.

        Silent: the history before the latest event (older watermarks, or higher ones from before a
        seek) is not the subscription's watermark now and is never handed on; the caller takes
        `current` once this returns.
        """
        deadline = time.monotonic() + CATCH_UP_LIMIT_S
        while time.monotonic() < deadline and self._reader.has_message_available():
            try:
                self._handle(self._reader.read_next(timeout_millis=1000))
            except pulsar.Timeout:
                break

    def _run(self) -> None:
        next_refresh = time.monotonic() + self._partition_refresh_s
        while not self._stop.is_set():
            self._check_time_limits()
            if self._follow_new_partitions and time.monotonic() >= next_refresh:
                self._refresh_partitions()
                next_refresh = time.monotonic() + self._partition_refresh_s
            try:
                message = self._reader.read_next(timeout_millis=200)
            except pulsar.Timeout:
                continue
            except pulsar.AlreadyClosed:
                return
            except Exception:  # the reader reconnects by itself; keep following
                if self._stop.is_set():
                    return
                log.warning("reading watermarks of %s failed; retrying", self.topic, exc_info=True)
                time.sleep(1)
                continue
            self._handle(message)

    def _handle(self, message: pulsar.Message) -> None:
        if message.properties().get(EVENT_PROPERTY) == HEAD_WATERMARK:
            self._note_head(message)
            return
        try:
            events = decode_table(message.data())
        except MalformedMarker as exc:
            self.malformed_events += 1
            if self.malformed_events == 1:
                log.warning(
                    "skipping malformed watermark event at %s on %s: %s",
                    message.message_id(),
                    message.topic_name(),
                    exc,
                )
            return
        for event in events:
            self._apply(event)

    def _note_head(self, message: pulsar.Message) -> None:
        """The watermark at a position of a partition's log: not a subscription's, but a fact the trust rule
        falls back on when it gives up waiting (`WatermarkTrust.give_up`)."""
        try:
            head = decode_head(message.data())
        except MalformedMarker as exc:
            log.debug("skipping malformed head event at %s: %s", message.message_id(), exc)
            return
        with self._cond:
            if head.topic == self.topic and head.partition in self._trust.partitions:
                self._trust.on_fact(head.partition, head.position, head.event_time)

    def _apply(self, event: WatermarkEvent) -> None:
        if event.subscription != self.subscription or event.topic != self.topic:
            return
        with self._cond:
            if event.partition not in self._trust.partitions:
                if not (self._follow_new_partitions and event.partition >= 0):
                    return
                self._trust.add_partition(event.partition)
            self._trust.on_event(event.partition, event.position, event.event_time)
            released, changed = self._settle(changed=True)
        self._after(released, changed)

    def close(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        self._thread.join(timeout=2)
        with contextlib.suppress(pulsar.PulsarException):
            self._reader.close()
