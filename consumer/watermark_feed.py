"""Follows the `SendWatermark` events of one subscription on the topic's companion topic.

The generator publishes one event per (partition, subscription) change to the topic's companion
topic; `CompanionReader` (pulsar_access/companion.py, shared with the Spark source) reads it from its
start, so the current watermark is known at once and every change after it follows, through the client's
one reader of that companion topic (shared by the feeds of the topics whose events go there). An event
that names another topic or subscription is ignored.

Each event names the mark-delete position it was computed at, and holds only for messages after
it. Which event may stand over which message, which acknowledgement waits, how long a partition that
moved back waits for the generator: all that is decided by the consumer's engine (consumer/engine.py).
The feed owns the engine and its lock, and nobody else touches either: it reads the companion topic into
it on the reader's thread, ticks it, looks for partitions added to the topic, and passes on what the
consumer reports. The consumer's hot path goes through the engine's lanes (`lanes`, holding `lane_token` for a
message; consumer/trust.py `Lane`) and, for everything a lane does not let through, two calls: `received` (a message the
client delivered) and `report` (any other event); and three reads: `current`, `pending`, `follows_new_partitions`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pulsar

from consumer.engine import (
    FALLBACK_WAIT_S,
    RECOMPUTE_WAIT_S,
    Attached,
    CaughtUp,
    Command,
    ConsumerEngine,
    Deliver,
    Event,
    GaveUp,
    HeadRead,
    Limits,
    PartitionsChanged,
    Received,
    SendAcknowledgement,
    Tick,
    WatermarkRead,
)
from consumer.trust import position_of
from pulsar_access.companion import CompanionReader
from pulsar_access.incarnations import Incarnations
from pulsar_access.topics import base_topic_and_partition
from watermark_core.protocol import HeadWatermark, Position, Watermark, WatermarkEvent

log = logging.getLogger(__name__)

TICK_S = 0.1
"""How often, at most, the feed's reader ticks the engine (its time limits are seconds): not at every event read,
which on a busy topic comes every few hundred messages and would tick as often (issue 48)."""
PARTITION_REFRESH_S = 10.0
"""How often the feed of a partitioned topic looks for partitions added to it."""
LANE_WAIT_S = 0.0001
"""How long a thread that waits for the lanes' token sleeps (letting go of the GIL) before it looks again: a pull holds
it for a few lines (`WatermarkFeed.lane_token`)."""

Perform = Callable[[list[Command]], None]


def take_lane_token(token: list[bool]) -> None:
    """Take the lanes' token (`WatermarkFeed.lane_token`), waiting while another thread holds it."""
    while True:
        try:
            token.pop()
            return
        except IndexError:
            time.sleep(LANE_WAIT_S)


class _Deciding:
    """`with feed.deciding:` the feed's lock, then the lanes' token: what every call into the engine holds."""

    __slots__ = ("_lock", "_token")

    def __init__(self, lock: threading.Lock, token: list[bool]) -> None:
        self._lock, self._token = lock, token

    def __enter__(self) -> None:
        self._lock.acquire()
        try:
            take_lane_token(self._token)
        except BaseException:
            self._lock.release()
            raise

    def __exit__(self, *_exc: object) -> None:
        self._token.append(True)
        self._lock.release()


def partition_indexes(client: pulsar.Client, topic: str) -> list[int]:
    """The partitions a consumer of `topic` reads: [-1] for a non-partitioned topic."""
    names = client.get_topic_partitions(topic)
    base, _ = base_topic_and_partition(topic)
    if names == [base]:
        return [-1]
    return sorted(base_topic_and_partition(name)[1] for name in names)


class WatermarkFeed:
    """The subscription's watermark: the minimum over the partitions it reads, as far as it can be trusted.

    `on_change(current)` runs on the feed's thread whenever the engine's `current` changed after
    something the feed read; without `listener` it is the strict watermark (None while a partition has
    none or is distrusted). `partitions` fixes the partitions; by default they are the topic's, and for a
    partitioned topic partitions added later join. `perform(commands)` carries out what the engine asks
    after an event the feed read (by default: send the acknowledgements it releases); it runs under
    the feed's lock, so commands of all threads keep the engine's order; the acknowledgements are sent
    after it, by calling their token (or `acknowledge(token)` for a message the engine skipped). `idle()`: with
    `perform`, whether everything performed was carried out (the listener's inbox is empty); only then may a
    message the engine lets go at once be handed over by the caller (`received`).
    `admin_url`: where the topic property naming the topic's incarnation is read (`Incarnations.for_consumer`).
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
        listener: bool = False,
        perform: Perform | None = None,
        idle: Callable[[], bool] | None = None,
        acknowledge: Callable[[object], None] | None = None,
        admin_url: str | None = None,
        key: Callable[[Position], Any] | None = None,
    ) -> None:
        self.topic, own_partition = base_topic_and_partition(topic)
        self.subscription = subscription
        self._client = client
        self._topic_name = topic
        self._on_change = on_change
        self._perform = perform
        self._idle = idle
        self._acknowledge = acknowledge
        indexes = partitions if partitions is not None else partition_indexes(client, topic)
        self._follow_new_partitions = partitions is None and own_partition == -1 and indexes != [-1]
        self._partition_refresh_s = partition_refresh_s
        limits = Limits(min(fallback_wait_s, recompute_wait_s), recompute_wait_s)
        self._engine = ConsumerEngine(
            indexes, listener=listener, limits=limits, follow_new=self._follow_new_partitions, key=key
        )
        self.current: Watermark | None = None
        """The engine's watermark (strict without a listener), copied after each event it handled (all under the lock,
        here): the hot path reads it per message without a call."""
        self.lock = threading.Lock()
        """Held while the engine handles an event and its commands are queued or carried out (with `lane_token`), and
        over a `batch_receive`'s batch; nothing else takes it."""
        self.lane_token: list[bool] = [True]
        """The right to write the lanes (`lanes`; what the engine decides reads them): the list holds one token while
        nobody has it. `pop()` takes it (IndexError: somebody has it), `append(True)` gives it back; each is one call
        the GIL makes atomic (and a free-threaded Python's list makes atomic too). A lock by another name, cheaper than
        a `threading.Lock`'s pair by about 600 instructions (its `acquire` parses its arguments every call; issue 48):
        the consumer's `receive` takes it without waiting, and goes the slow way (`received`) when somebody has it;
        every call into the engine holds `lock` and then the token (`deciding`), waiting the few lines a pull holds
        it."""
        self.deciding = _Deciding(self.lock, self.lane_token)
        """`with deciding:` what a call into the engine holds (`lock`, then `lane_token`)."""
        self.lanes = self._engine.lanes
        """Each partition's hot path (consumer/trust.py `Lane`): the consumer's `receive`, `batch_receive` and
        `acknowledge` let a quiet message through with `lane_token`, and a quiet acknowledgement without it, by the
        lane's protocol; everything else is an event for the engine (`received`, `report`)."""
        self._incarnations = Incarnations.for_consumer(admin_url, reader=f"subscription {subscription!r} of {topic}")
        self._companion = CompanionReader(
            client, topic, self._incarnations, on_table=self._on_table, on_head=self._on_head,
            each_turn=self._each_turn, on_caught_up=self._on_caught_up, wants_caught_up=self._wants_caught_up,
            subscription=subscription, shared=True,
        )  # fmt: skip
        # Silent: the history before the latest event (older watermarks, or higher ones from before a
        # seek) is not the subscription's watermark now and is never handed on. Then the engine hands a
        # listener what it holds, under the lock and before the reader's thread starts: once, and before
        # anything read later (issue 34, fault 3).
        self._attached = threading.Event()
        self._companion.catch_up()
        with self.deciding:
            commands = self._engine.handle(Attached(), time.monotonic())
            self.current = self._engine.current
            if commands and self._perform is not None:
                self._perform(commands)
        self._attached.set()
        self._next_refresh = time.monotonic() + self._partition_refresh_s
        self._next_tick = 0.0
        self._companion.start()

    # -- what the consumer reads -------------------------------------------------------------------

    @property
    def partitions(self) -> list[int]:
        return self._engine.partitions

    @property
    def follows_new_partitions(self) -> bool:
        """Partitions added to the topic later join (a partitioned topic, all of its partitions read)."""
        return self._follow_new_partitions

    @property
    def pending(self) -> int:
        """Listener: messages received that wait to be handed over (one attribute read, no lock)."""
        return self._engine.pending

    @property
    def malformed_events(self) -> int:
        """Events on the companion topic skipped as malformed."""
        count: int = self._companion.malformed_events
        return count

    @property
    def gave_up(self) -> int:
        """How often a partition stopped waiting for a recomputed watermark (see `recompute_wait_s`)."""
        return self._engine.gave_up

    def partition_of(self, index: int) -> int:
        """Our name of a message id's partition index (-1 from a consumer of one partition topic)."""
        if index < 0:
            known = self._engine.partitions
            if len(known) == 1:
                return known[0]
        return index

    # -- events ----------------------------------------------------------------------------------------

    def report(self, event: Event) -> list[Command]:
        """An event the consumer reports: `perform` under the lock, acknowledgements sent; the commands."""
        with self.deciding:
            commands = self._engine.handle(event, time.monotonic())
            self.current = self._engine.current
            if commands and self._perform is not None:
                self._perform(commands)
        if commands:
            self._send_acknowledgements(commands)
        return commands

    def received(self, partition: int, key: Any, message: object, marker: bool = False) -> bool:
        """The client delivered `message` (`key`: its key in the lanes, consumer/trust.py `Lane`; a position by
        default): whether the caller hands it to the application now. A data message the partition's lane lets
        through (with `perform`, only while `idle()`: nothing commanded before it is still to be carried out) costs
        one lock, and the caller hands it over; so does a marker the lane lets through both ways (received and
        acknowledged at once: it is acknowledged here, with `acknowledge`). Any other is `report`ed (a marker is
        skipped and acknowledged; with `perform` the engine's `Deliver` reaches the application through it, and the
        caller hands nothing). The one home of the lanes' protocol for a message off the pull path (markers, the
        listener's thread, the pull path's messages its own inline copy did not let through)."""
        idle, skipped = self._idle, False
        with self.lock:  # `deciding`, written out: the listener's thread comes here for every message
            token = self.lane_token
            try:
                token.pop()
            except IndexError:
                take_lane_token(token)
            try:
                if marker:
                    skipped = self._engine.skipped_quietly(partition, key)
                elif (idle is None or idle()) and self._engine.received_quietly(partition, key):
                    return True
            finally:
                token.append(True)
        if skipped:
            if self._acknowledge is not None:
                self._acknowledge(message)
            return False
        commands = self.report(Received(partition, position_of(key), message, marker))
        return self._perform is None and any(type(command) is Deliver for command in commands)

    def acknowledged_quietly(self, partition: int, position: Any) -> bool:
        """An acknowledgement through the partition's lane (no lock, see `Lane`): True, the caller sends it; False,
        `report(Acknowledged(...))` instead."""
        return self._engine.acknowledged_quietly(partition, position)

    def _feed(self, event: Event) -> None:
        """An event the feed itself read or timed: its commands carried out, the change told."""
        with self.deciding:
            before = self._engine.current
            commands = self._engine.handle(event, time.monotonic())
            self.current = after = self._engine.current
            attached = self._attached.is_set()  # before: catching up, history
            if commands and attached and self._perform is not None:
                self._perform(commands)
        if commands:
            self._send_acknowledgements(commands)
            for command in commands:
                if isinstance(command, GaveUp):
                    self._log_gave_up(command)
        if attached and (after != before or (after is None) != (before is None)):
            self._on_change(after)

    def _send_acknowledgements(self, commands: list[Command]) -> None:
        for command in commands:
            if isinstance(command, SendAcknowledgement):
                try:
                    if callable(command.token):
                        command.token()
                    elif self._acknowledge is not None:
                        self._acknowledge(command.token)
                except Exception:  # a closed consumer: the broker redelivers; nothing to hold any more
                    log.debug("an acknowledgement on %s could not be sent", self.topic, exc_info=True)

    def _log_gave_up(self, gave_up: GaveUp) -> None:
        fallback = gave_up.fallback
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
            self.subscription, self.topic, gave_up.partition, gave_up.floor, gave_up.waited, going_on,
        )  # fmt: skip

    def _refresh_partitions(self) -> None:
        """Partitions added to the topic join (see `WatermarkTrust.add_partition`)."""
        try:
            indexes = partition_indexes(self._client, self._topic_name)
        except Exception:
            log.debug("looking up the partitions of %s failed; trying again later", self.topic, exc_info=True)
            return
        with self.lock:
            added = [p for p in indexes if p >= 0 and p not in self._engine.trust]
        if added:
            log.info("%s: partitions %s added; following them for subscription %r", self.topic, added,
                     self.subscription)  # fmt: skip
            self._feed(PartitionsChanged(tuple(indexes)))

    # -- reading the companion topic (pulsar_access/companion.py, on its thread) ---------------------

    def _each_turn(self) -> None:
        now = time.monotonic()
        if now >= self._next_tick:
            self._next_tick = now + TICK_S
            self._feed(Tick())
        if self._follow_new_partitions and time.monotonic() >= self._next_refresh:
            self._refresh_partitions()
            self._next_refresh = time.monotonic() + self._partition_refresh_s

    def _on_caught_up(self, as_of: float) -> None:
        self._feed(CaughtUp(as_of))  # everything published before `as_of` is read: events from before a seek too

    def _wants_caught_up(self) -> bool:
        with self.lock:
            return self._engine.waits_for_caught_up

    def _on_head(self, head: HeadWatermark) -> None:
        """The watermark at a position of a partition's log: not a subscription's, but a fact the trust rule
        falls back on when it gives up waiting (`WatermarkTrust.give_up`)."""
        self._feed(HeadRead(head.partition, head.position, head.event_time))

    def _on_table(self, events: list[WatermarkEvent]) -> None:
        for event in events:
            if event.subscription != self.subscription:
                continue
            if event.partition >= 0 or not self._follow_new_partitions:
                self._feed(WatermarkRead(event.partition, event.position, event.event_time))

    def close(self) -> None:
        self._companion.close()
        self._incarnations.close()
