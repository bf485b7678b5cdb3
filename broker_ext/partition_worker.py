"""The generator's work on one topic partition: read it once, follow every subscription on it.

Ownership: every generator instance subscribes to the partition with the same Failover
subscription (`__wm_generator`); Pulsar delivers to exactly one active consumer, and that
instance owns the partition. When it dies, Pulsar makes another consumer active and redelivers
from the subscription's mark-delete position, which the owner only moves to the stated position of
a snapshot it has written. So a new owner finds, in what it is delivered, a snapshot of the state
at (or after) where its reading starts, and never reads the topic from its beginning.

Each subscription has a secondary cursor (`SubscriptionTracker`) that folds the markers up to its
mark-delete position, read from the admin API only while a marker waits for it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import pulsar

from broker_ext.config import GeneratorConfig
from broker_ext.dispatch import WatermarkDispatcher
from broker_ext.marker_log import BeforeBase, MarkerLog, SubscriptionTracker
from broker_ext.metrics import GeneratorMetrics
from pulsar_access.admin import (
    AdminError,
    PulsarAdmin,
    TopicNotFound,
    durable_subscriptions,
    last_confirmed_entry,
    mark_delete_of,
)
from pulsar_access.errors import explain, service_url_of
from pulsar_access.topics import base_topic_and_partition
from watermark_core.protocol import (
    GENERATOR_SUBSCRIPTION,
    LAST_BATCH_INDEX,
    MARKER_PROPERTY,
    SNAPSHOT_PRODUCER_PREFIX,
    HeadWatermark,
    MalformedMarker,
    Marker,
    MarkerKind,
    Position,
    WatermarkEvent,
    decode_marker,
    entry_end,
    position_of,
)
from watermark_core.snapshot import Snapshot, decode_snapshot, encode_snapshot, is_generator_snapshot
from watermark_core.state import WatermarkState, is_broken_assertion

log = logging.getLogger(__name__)

BEFORE_EVERYTHING: Position = (-1, -1, -1)
MAX_BACKOFF_S = 10.0
FOLD_READ_LIMIT_S = 60.0
"""How long rebuilding a state from the log may keep waiting for entries the broker says exist."""


class InconsistentFold(RuntimeError):
    """A state rebuilt from the log disagrees with what the generator read itself; it is not used."""


@dataclass(frozen=True)
class DataSeen:
    """A data message, as far as the generator cares: for counting broken assertions."""

    position: Position
    producer: str
    event_time: int


@dataclass
class Context:
    """What every worker of one generator shares."""

    client: pulsar.Client
    admin: PulsarAdmin
    config: GeneratorConfig
    dispatcher: WatermarkDispatcher
    metrics: GeneratorMetrics


def normalized_mark_delete(stats: dict[str, object], subscription: str) -> tuple[int, int]:
    """A cursor's mark-delete position, with Pulsar's "(next ledger, -1)" written as the last entry before it."""
    cursors = stats.get("cursors", {})
    ledger, entry = mark_delete_of(cursors.get(subscription, {}) if isinstance(cursors, dict) else {})
    if entry != -1:
        return ledger, entry
    ledgers = stats.get("ledgers", [])
    earlier = [
        (int(info["ledgerId"]), int(info.get("entries", 0)))
        for info in (ledgers if isinstance(ledgers, list) else [])
        if int(info["ledgerId"]) < ledger and int(info.get("entries", 0)) > 0
    ]
    if not earlier:
        return ledger, entry
    previous, entries = max(earlier)
    return previous, entries - 1


def rebuilt_is_consistent(rebuilt: WatermarkState, head: WatermarkState) -> bool:
    """Whether a state rebuilt for a position at or before `head`'s can be right: its watermark is not above."""
    if rebuilt.watermark is None:
        return True
    return head.watermark is not None and rebuilt.watermark <= head.watermark


def history_deleted(start: Position, first_read: Position, earliest_read: Position) -> bool:
    """Whether a fold from the partition's start began after an entry we read before: its ledger is gone."""
    return start == BEFORE_EVERYTHING and first_read > earliest_read


def read_lag(stats: dict[str, Any], head: Position) -> int:
    """Entries between our read position and the partition's last entry, from its internal stats."""
    tail_ledger, tail_entry = last_confirmed_entry(stats)
    if tail_ledger == head[0]:
        return max(0, tail_entry - head[1])
    ledgers = {int(info["ledgerId"]): int(info.get("entries", 0)) for info in stats.get("ledgers", [])}
    lag = max(0, ledgers.get(head[0], 0) - head[1] - 1)
    lag += sum(entries for ledger, entries in ledgers.items() if head[0] < ledger < tail_ledger)
    return lag + tail_entry + 1


def message_position(message: pulsar.Message) -> Position:
    msg_id = message.message_id()
    return position_of(msg_id.ledger_id(), msg_id.entry_id(), msg_id.batch_index())


class PartitionWorker:
    """Follows one partition topic in a thread of its own."""

    def __init__(self, partition_topic: str, ctx: Context) -> None:
        self.topic = partition_topic
        self.base_topic, self.partition = base_topic_and_partition(partition_topic)
        self.ctx = ctx
        self.config = ctx.config
        self.log: MarkerLog | None = None
        self.head: WatermarkState = WatermarkState.initial(ctx.config.watermark_config)
        self.trackers: dict[str, SubscriptionTracker] = {}
        self.durable_subscriptions: set[str] = set()
        self.snapshots: list[Snapshot] = []
        self.owner = False
        self.deleted = False
        self._pending: list[Marker | DataSeen] | None = None  # read while looking for the start snapshot
        self._init_tail: tuple[int, int] | None = None
        self._init_start: tuple[int, int] | None = None
        self._init_first: Position | None = None
        self._earliest_read: Position | None = None
        """The earliest entry this worker ever read from the partition; entries before it may be deleted since."""
        self._ledger_starts: list[tuple[Position, WatermarkState]] = []
        """Ledger-start states (see `_note_ledger_start`) not written as snapshots yet."""
        self._last_written: Position | None = None
        """Where our latest snapshot landed: the next one names it as `previous`."""
        self._init_snapshots: list[Snapshot] = []
        self._last_message: pulsar.Message | None = None
        self._messages_since_snapshot = 0
        self._last_snapshot_at = time.monotonic()
        self._next_poll = 0.0
        self._next_discovery = 0.0
        self._read_to_tail_at_poll = False
        self._malformed_logged: set[str] = set()
        self._broken_logged: set[str] = set()
        self._consumer: pulsar.Consumer | None = None
        self._snapshot_producer: pulsar.Producer | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"wm-{partition_topic.rsplit('/', 1)[-1]}", daemon=True)

    # -- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        backoff = 0.5
        failing = False
        while not self._stop.is_set() and not self.deleted:
            try:
                self._step()
                backoff = 0.5
                if failing:
                    failing = False
                    log.info("%s: reading again", self.topic)
            except TopicNotFound:
                log.info("%s: topic deleted; dropping it", self.topic)
                self.deleted = True
            except InconsistentFold as exc:
                log.warning("%s: %s; retrying in %.1f s", self.topic, exc, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
            except (AdminError, pulsar.PulsarException) as exc:
                # A broker that went away: say once what is wrong and how to fix it, then retry quietly
                # (the Pulsar client reconnects by itself; the state is kept and resumes where it was).
                url = service_url_of(self.ctx.client)
                reason = explain(exc, service_url=url, topic=self.topic, doing="read") or exc
                if not failing:
                    log.warning("%s: %s; retrying with a back-off up to %.0f s", self.topic, reason, MAX_BACKOFF_S)
                else:
                    log.debug("%s: %s; retrying in %.1f s", self.topic, reason, backoff)
                failing = True
                self._stop.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
            except Exception:
                log.exception("%s: unexpected error at read position %s; retrying", self.topic, self._head_position)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
        self._close_pulsar()

    def _close_pulsar(self) -> None:
        for closable in (self._consumer, self._snapshot_producer):
            if closable is not None:
                with contextlib.suppress(pulsar.PulsarException):
                    closable.close()
        self._consumer = None
        self._snapshot_producer = None

    @property
    def _head_position(self) -> Position | None:
        return self.log.head_position if self.log is not None else None

    # -- the loop ------------------------------------------------------------------------------------

    def _step(self) -> None:
        if self._consumer is None:
            self._consumer = self.ctx.client.subscribe(
                self.topic, GENERATOR_SUBSCRIPTION,
                consumer_type=pulsar.ConsumerType.Failover,
                consumer_name=self.config.instance_id,
                initial_position=pulsar.InitialPosition.Earliest,
                receiver_queue_size=1000,
            )  # fmt: skip
        self._read_available()
        now = time.monotonic()
        if now >= self._next_discovery:
            self._discover()
            self._next_discovery = now + self.config.discovery_interval_s
        if self.log is not None and now >= self._next_poll:
            self._poll_positions()
            self._next_poll = now + (
                self.config.poll_interval_s if self._markers_waiting() else self.config.idle_poll_interval_s
            )
        if self.log is not None:
            self._advance_trackers()
            self._maybe_snapshot()

    def _read_available(self) -> None:
        """Read what the broker has for us: wait briefly for the first message, then drain."""
        assert self._consumer is not None
        timeout_ms = max(1, int(self.config.poll_interval_s * 1000))
        for _ in range(10_000):
            try:
                message = self._consumer.receive(timeout_millis=timeout_ms)
            except pulsar.Timeout:
                if self._pending is not None:
                    self._finish_init_at_tail()
                return
            timeout_ms = 1
            self.owner = True
            self._handle(message)
            if self._stop.is_set():
                return

    # -- reading the partition -----------------------------------------------------------------------

    def _handle(self, message: pulsar.Message) -> None:
        position = message_position(message)
        if self.log is None and self._pending is None:
            self._begin_init(position)
        if self.log is not None and position <= self.log.head_position:
            return  # redelivered after a reconnect: already folded
        self._last_message = message
        marker = self._decode(message, position)
        if marker is None or not marker.producer.startswith(SNAPSHOT_PRODUCER_PREFIX):
            self._messages_since_snapshot += 1  # our own snapshots do not call for another one
        if self._pending is not None:
            self._handle_during_init(marker or DataSeen(position, message.producer_name(), message.event_timestamp()))
            return
        assert self.log is not None
        self._note_ledger_start(position)
        if marker is None:
            self.log.advance_head(position)
            self._check_data(DataSeen(position, message.producer_name(), message.event_timestamp()))
            return
        self._fold_head(marker)

    def _decode(self, message: pulsar.Message, position: Position) -> Marker | None:
        properties = message.properties()
        if MARKER_PROPERTY not in properties:
            return None
        try:
            return decode_marker(
                properties, message.data(), message.producer_name(), position, message.publish_timestamp()
            )
        except MalformedMarker as exc:
            self.ctx.metrics.malformed_markers.labels(self.base_topic, str(self.partition), exc.reason).inc()
            if exc.reason not in self._malformed_logged:
                self._malformed_logged.add(exc.reason)
                log.warning("%s: skipping malformed marker (%s) from %r at %s: %s",
                            self.topic, exc.reason, message.producer_name(), position, exc)  # fmt: skip
            return None

    def _fold_head(self, marker: Marker) -> None:
        assert self.log is not None
        self.log.append(marker)
        before = self.head.watermark
        self.head = self.head.apply(marker)
        self.ctx.metrics.markers_applied.labels(self.base_topic, str(self.partition)).inc()
        if marker.kind is MarkerKind.W_SNAPSHOT:
            self._index_snapshot(marker)
        if self.owner and self.head.watermark is not None and self.head.watermark != before:
            # The watermark at this marker's entry, for readers that need it before any subscription
            # has acknowledged there (the Spark source); the tables below are published as before.
            self.ctx.dispatcher.publish_head(
                HeadWatermark(self.base_topic, self.partition, marker.position[:2], self.head.watermark)
            )

    def _check_data(self, data: DataSeen) -> None:
        """Count messages below their own producer's last W_SET (the producer broke its assertion)."""
        if data.event_time and is_broken_assertion(self.head, data.producer, data.event_time):
            self.ctx.metrics.broken_assertions.labels(self.base_topic, str(self.partition), data.producer).inc()
            if data.producer not in self._broken_logged:
                self._broken_logged.add(data.producer)
                log.warning("%s: producer %r sent event time %d below its own watermark at %s (a late message)",
                            self.topic, data.producer, data.event_time, data.position)  # fmt: skip

    # -- starting from a snapshot --------------------------------------------------------------------

    def _begin_init(self, first: Position) -> None:
        """We were just made the owner: find the state at where our delivery starts."""
        stats = self.ctx.admin.internal_stats(self.topic)
        self._init_tail = last_confirmed_entry(stats)
        self._init_start = normalized_mark_delete(stats, GENERATOR_SUBSCRIPTION)
        self._init_first = first
        self._earliest_read = min(first, self._earliest_read or first)
        self._pending = []
        self._init_snapshots = []
        log.info("%s: owner now (instance %s); delivery starts at %s after cursor %s, looking for a snapshot",
                 self.topic, self.config.instance_id, first[:2], self._init_start)  # fmt: skip
        log.debug("%s: ledgers %s, cursors %s", self.topic, stats.get("ledgers"),
                  {name: c.get("markDeletePosition") for name, c in stats.get("cursors", {}).items()})  # fmt: skip

    def _handle_during_init(self, item: Marker | DataSeen) -> None:
        assert self._pending is not None and self._init_start is not None
        if isinstance(item, Marker):
            snapshot = self._trusted_snapshot(item)
            if snapshot is not None:
                self._init_snapshots.append(snapshot)
                if snapshot.at[:2] >= self._init_start:
                    self._restore(snapshot, item)
                    return
        self._pending.append(item)
        if self._init_tail is not None and item.position[:2] >= self._init_tail:
            self._finish_init_at_tail()

    def _replay_pending(self, after: Position) -> None:
        """Fold the markers, and check the data, read during the search after position `after`."""
        assert self._pending is not None and self.log is not None
        pending, self._pending = self._pending, None
        for item in pending:
            if item.position <= after:
                continue
            self._note_ledger_start(item.position)
            if isinstance(item, Marker):
                self._fold_head(item)
            else:
                self.log.advance_head(item.position)
                self._check_data(item)

    def _restore(self, snapshot: Snapshot, marker: Marker) -> None:
        """Start from `snapshot`; fold what was read after its stated position."""
        self._start_from(snapshot.state, snapshot.at)
        self._pending = [item for item in self._pending or [] if item.position != marker.position]
        self._pending.append(marker)
        self._pending.sort(key=lambda item: item.position)
        self._replay_pending(snapshot.at)
        log.info("%s: restored from the snapshot at %s stating %s", self.topic, marker.position[:2], snapshot.at[:2])

    def _finish_init_at_tail(self) -> None:
        """Reached the tail without a snapshot after our cursor."""
        assert self._pending is not None
        if self._init_snapshots:
            # The cursor's position could not be matched (e.g. its ledger was trimmed): the newest
            # snapshot we were delivered is the best state there is.
            newest = max(self._init_snapshots, key=lambda s: s.at)
            marker = next(m for m in self._pending if isinstance(m, Marker) and m.position == newest.message)
            log.warning("%s: no snapshot matches the cursor %s; using the newest one", self.topic, self._init_start)
            self._restore(newest, marker)
        elif self._init_start is not None and self._init_start[1] != -1:
            # Our cursor has moved but no usable snapshot follows it (e.g. an incompatible one):
            # rebuild the state at the cursor from the start of the log, once.
            cursor = entry_end(*self._init_start)
            log.warning("%s: no usable snapshot after the cursor %s; folding the log up to it", self.topic, cursor[:2])
            state = self._fold_range(WatermarkState.initial(self.config.watermark_config), BEFORE_EVERYTHING, cursor)
            self._start_from(state, cursor)
            self._replay_pending(cursor)
        else:
            # The cursor names no entry. Usually nothing was consumed yet and our delivery starts at
            # the log's first entry; but after a broker restart the cursor has been seen at
            # "(next ledger, -1)" past entries we were never delivered. Fold whatever lies before
            # our first delivery (nothing, in the usual case) so no marker is missed.
            assert self._init_first is not None
            before_first: Position = (self._init_first[0], self._init_first[1] - 1, LAST_BATCH_INDEX)
            log.info("%s: no snapshot after the generator's cursor; folding the log before %s",
                     self.topic, self._init_first[:2])  # fmt: skip
            state = self._fold_range(
                WatermarkState.initial(self.config.watermark_config), BEFORE_EVERYTHING, before_first
            )
            self._start_from(state, before_first)
            if before_first[1] == -1:  # delivery starts at a ledger's first entry: that is a ledger start
                self._ledger_starts.append((before_first, state.advanced_to(before_first)))
            self._replay_pending(before_first)
        if self._last_message is not None and self.log is not None:
            self.log.advance_head(message_position(self._last_message))

    def _start_from(self, state: WatermarkState, at: Position) -> None:
        self.head = state
        self.log = MarkerLog(state, at)
        self._ledger_starts = []
        self.trackers.clear()
        self._next_poll = 0.0
        self._next_discovery = 0.0

    # -- snapshots -----------------------------------------------------------------------------------

    def _trusted_snapshot(self, marker: Marker) -> Snapshot | None:
        """A generator's snapshot (others' W_SNAPSHOT records are never trusted)."""
        if not is_generator_snapshot(marker):
            return None
        try:
            return decode_snapshot(marker, self.config.watermark_config)
        except MalformedMarker as exc:  # e.g. written by an incompatible version: never fatal, just not used
            self.ctx.metrics.malformed_markers.labels(self.base_topic, str(self.partition), exc.reason).inc()
            if exc.reason not in self._malformed_logged:
                self._malformed_logged.add(exc.reason)
                log.warning("%s: skipping unusable snapshot at %s: %s", self.topic, marker.position, exc)
            return None

    def _index_snapshot(self, marker: Marker) -> None:
        ref = self._trusted_snapshot(marker)
        if ref is not None and all(s.message != ref.message for s in self.snapshots):
            self.snapshots.append(ref)
            self.snapshots.sort(key=lambda s: s.at)
            del self.snapshots[:-100]

    def _note_ledger_start(self, position: Position) -> None:
        """Reading enters a new ledger: keep the state before its first entry, to write as a snapshot.

        Pulsar deletes whole ledgers (those every subscription has acknowledged, without retention),
        and a reader then silently starts at the first ledger left. A snapshot stating `(ledger, -1)`
        lands in that ledger or a later one and lives as long as it does, so the state at any
        position still in the topic can be rebuilt exactly: from its ledger's start, reading only
        that ledger. Folding from the topic's start instead would miss the deleted ledgers' markers.
        """
        assert self.log is not None
        if position[0] > self.log.head_position[0]:
            start: Position = (position[0], -1, LAST_BATCH_INDEX)
            self._ledger_starts.append((start, self.head.advanced_to(start)))

    def _write_ledger_starts(self) -> None:
        """Write the pending ledger-start snapshots (no acknowledgement: they state earlier positions)."""
        while self._ledger_starts:
            at, state = self._ledger_starts[0]
            self._send_snapshot(state)
            self._ledger_starts.pop(0)
            log.debug("%s: wrote the snapshot of ledger %d's start (watermark %s)", self.topic, at[0], state.watermark)

    def _send_snapshot(self, state: WatermarkState) -> None:
        """Write `state` as a W_SNAPSHOT naming the snapshot written before it, so the chain misses none."""
        previous = max([s.message for s in self.snapshots] + ([self._last_written] if self._last_written else []),
                       default=None)  # fmt: skip
        message_id = self._snapshot_producer_for().send(
            encode_snapshot(state, previous), properties={MARKER_PROPERTY: MarkerKind.W_SNAPSHOT.value}
        )
        self._last_written = position_of(message_id.ledger_id(), message_id.entry_id(), message_id.batch_index())
        self.ctx.metrics.snapshots_written.labels(self.base_topic, str(self.partition)).inc()

    def _snapshot_producer_for(self) -> pulsar.Producer:
        if self._snapshot_producer is None:
            self._snapshot_producer = self.ctx.client.create_producer(
                self.topic,
                producer_name=f"{SNAPSHOT_PRODUCER_PREFIX}{self.config.instance_id}",
                batching_enabled=False,
            )
        return self._snapshot_producer

    def _maybe_snapshot(self) -> None:
        if self.owner and self.log is not None:
            self._write_ledger_starts()
        if not self.owner or self.log is None or self._last_message is None or self._messages_since_snapshot == 0:
            return
        due = (
            self._messages_since_snapshot >= self.config.snapshot_interval_messages
            or time.monotonic() - self._last_snapshot_at >= self.config.snapshot_interval_s
        )
        if due:
            self.write_snapshot()

    def write_snapshot(self) -> None:
        """Write the head state at the last read position, then let our cursor move up to it."""
        assert self.log is not None and self._last_message is not None and self._consumer is not None
        at = self.log.head_position
        self._send_snapshot(self.head.advanced_to(at))
        self._consumer.acknowledge_cumulative(self._last_message)
        self._messages_since_snapshot = 0
        self._last_snapshot_at = time.monotonic()
        self.ctx.metrics.last_snapshot.labels(self.base_topic, str(self.partition)).set(time.time())
        self.log.trim(min([t.applied_to for t in self.trackers.values()] + [at]))

    def _state_at(self, target: Position) -> WatermarkState:
        """The state at any position: from the marker log, else from the nearest snapshot before it."""
        assert self.log is not None
        if target >= self.log.base_position:
            return self.log.state_at(target)
        snapshot = self._snapshot_before(target)
        if snapshot is None:
            state, start = WatermarkState.initial(self.config.watermark_config), BEFORE_EVERYTHING
        else:
            state, start = snapshot.state, snapshot.at
        state = self._replay(state, start, target)
        self._check_not_above_head(state, start, target)
        return state

    def _check_not_above_head(self, state: WatermarkState, start: Position, target: Position) -> None:
        """A state rebuilt for a position at or before our head can never have a higher watermark.

        The fold only moves the watermark up along the log, so such a state means the rebuild read
        the log differently from our own reading, e.g. without the markers of a ledger Pulsar has
        deleted since (docs/RELIABILITY.md); publishing it could be premature, so it is refused and retried.
        """
        head = self.head.watermark
        if not rebuilt_is_consistent(state, self.head):
            raise InconsistentFold(
                f"the state rebuilt at {target[:2]} from {start[:2]} has watermark {state.watermark}, above the "
                f"watermark {head} at our head {self._head_position}; not using it"
            )

    def _snapshot_before(self, target: Position) -> Snapshot | None:
        """The nearest snapshot stating a position at or before `target`, walking the chain back.

        Each snapshot names the one written before it (`previous`); the walk goes back from the
        earliest written one we know until a snapshot states a position at or before `target`, or
        the chain ends (the first snapshot, or one whose ledger was deleted).
        """
        known = list(self.snapshots)
        visited: set[Position] = set()
        while True:
            candidates = [s for s in known if s.at <= target]
            if candidates:
                return max(candidates, key=lambda s: s.at)
            earliest = min(known, key=lambda s: s.message, default=None)
            if earliest is None or earliest.previous is None or earliest.previous in visited:
                return None
            visited.add(earliest.previous)
            marker = self._read_marker_at(earliest.previous)
            ref = self._trusted_snapshot(marker) if marker is not None else None
            if marker is None or ref is None:
                return None
            known.append(ref)
            self._index_snapshot(marker)

    def _open_reader(self, start: Position | None, inclusive: bool) -> pulsar.Reader:
        start_id = (
            pulsar.MessageId.earliest if start is None or start == BEFORE_EVERYTHING
            else pulsar.MessageId(-1, start[0], start[1], start[2])
        )  # fmt: skip
        return self.ctx.client.create_reader(self.topic, start_id, start_message_id_inclusive=inclusive)

    def _read_marker_at(self, position: Position) -> Marker | None:
        reader = self._open_reader(position, inclusive=True)
        try:
            message = reader.read_next(timeout_millis=10_000)
            if message_position(message) != position:
                return None
            return self._decode(message, position)
        except pulsar.Timeout:
            return None
        finally:
            reader.close()

    def _replay(self, state: WatermarkState, start: Position, target: Position) -> WatermarkState:
        """The state at `target`: markers in (start, target] from the log, then from the marker log."""
        assert self.log is not None
        state = self._fold_range(state, start, min(target, self.log.base_position))
        if target > self.log.base_position:
            state = self.log.fold(state, self.log.base_position, target)
        return state

    def _fold_range(self, state: WatermarkState, start: Position, stop_at: Position) -> WatermarkState:
        """Fold the markers in (start, stop_at] read from the partition with a reader of our own.

        The fold ends at the first entry past `stop_at`, or where the broker says the partition
        ends. A read that merely times out (a broker restarting) is not an end: a fold that stopped
        there would miss markers, and a state without a producer's latest `W_SET` (say, after its
        `W_IDLE`) gives a premature watermark. Reads that keep failing raise, and the step is retried.
        """
        reader = self._open_reader(start, inclusive=False)
        deadline = time.monotonic() + FOLD_READ_LIMIT_S
        first: Position | None = None
        last: Position | None = None
        folded = 0
        try:
            while True:
                try:
                    message = reader.read_next(timeout_millis=5_000)
                except pulsar.Timeout:
                    if not reader.has_message_available():
                        break  # the partition ends before `stop_at`
                    if time.monotonic() > deadline:
                        raise pulsar.Timeout(
                            f"reading {self.topic} from {start[:2]} to {stop_at[:2]} kept timing out for "
                            f"{FOLD_READ_LIMIT_S:.0f} s although the broker has more"
                        ) from None
                    continue
                position = message_position(message)
                if first is None:
                    first = position
                    self._check_start_kept(start, first)
                if position <= start:
                    continue
                if position > stop_at:
                    break
                last = position
                marker = self._decode(message, position)
                if marker is not None:
                    state = state.apply(marker)
                    folded += 1
        finally:
            reader.close()
        log.debug("%s: folded %d markers in (%s, %s]: first entry read %s, last folded %s, watermark %s",
                  self.topic, folded, start[:2], stop_at[:2], first and first[:2], last and last[:2],
                  state.watermark)  # fmt: skip
        return state

    def _check_start_kept(self, start: Position, first: Position) -> None:
        """A fold is exact only if nothing between `start` and the first entry it read was deleted.

        Without retention Pulsar deletes ledgers that every subscription has acknowledged, and a
        reader then silently begins after them: a state folded without their markers can be
        premature (found by the chaos suite's restart stress, seed 7007). From the partition's start,
        the fold must begin at or before the earliest entry we ever read; from a snapshot, a fold
        that leaves the snapshot's ledger at once is exact only if that ledger still exists (then it
        simply ended there).
        """
        if start == BEFORE_EVERYTHING:
            if self._earliest_read is not None and history_deleted(start, first, self._earliest_read):
                raise InconsistentFold(
                    f"the partition now starts at {first[:2]}, after {self._earliest_read[:2]} which we read "
                    "earlier: the ledgers before it were deleted (no retention), so the state there cannot be "
                    "rebuilt; not using it (set a retention policy on the namespace to keep that history)"
                )
        elif first[0] != start[0]:
            ledgers = {int(info["ledgerId"]) for info in self.ctx.admin.internal_stats(self.topic).get("ledgers", [])}
            if start[0] not in ledgers:
                raise InconsistentFold(
                    f"rebuilding from the snapshot stating {start[:2]}: ledger {start[0]} was deleted, entries "
                    "after that position may be gone with it; not using it"
                )

    # -- subscriptions -------------------------------------------------------------------------------

    def _discover(self) -> None:
        """Durable subscriptions of the partition, and whether we still own it."""
        stats = self.ctx.admin.topic_stats(self.topic)
        subscriptions = stats.get("subscriptions", {})
        ours = subscriptions.get(GENERATOR_SUBSCRIPTION, {})
        active = ours.get("activeConsumerName")
        if active and active != self.config.instance_id and self.owner:
            log.info("%s: now owned by generator %s; dropping our state", self.topic, active)
            self.owner = False
            self.log = None
            self._ledger_starts = []
            self._pending = None
            self.trackers.clear()
        self.durable_subscriptions = durable_subscriptions(stats)
        for name in list(self.trackers):
            if name not in self.durable_subscriptions:
                log.info("%s: subscription %r removed", self.topic, name)
                del self.trackers[name]
                self.ctx.metrics.forget_subscription(self.base_topic, self.partition, name)

    def _markers_waiting(self) -> bool:
        if self.log is None:
            return False
        last = self.log.last_marker_position
        if any(name not in self.trackers for name in self.durable_subscriptions):
            return True
        return last is not None and any(t.applied_to < last for t in self.trackers.values())

    def _poll_positions(self) -> None:
        """Read every subscription's mark-delete position and move its secondary cursor."""
        assert self.log is not None
        stats = self.ctx.admin.internal_stats(self.topic)
        lag = read_lag(stats, self.log.head_position)
        self.ctx.metrics.read_lag.labels(self.base_topic, str(self.partition)).set(lag)
        self._read_to_tail_at_poll = lag == 0
        cursors = stats.get("cursors", {})
        for name in self.durable_subscriptions:
            cursor = cursors.get(name)
            if cursor is None:
                continue
            mark_delete = entry_end(*mark_delete_of(cursor))
            tracker = self.trackers.get(name)
            if tracker is None:
                at = min(mark_delete, self.log.head_position)
                self.trackers[name] = SubscriptionTracker(name, self._state_at(at), at, mark_delete)
                log.info("%s: following subscription %r from %s", self.topic, name, mark_delete[:2])
            elif mark_delete < tracker.mark_delete:
                at = min(mark_delete, self.log.head_position)
                log.info("%s: subscription %r moved back from %s to %s; recomputing its watermark",
                         self.topic, name, tracker.mark_delete[:2], mark_delete[:2])  # fmt: skip
                tracker.state = self._state_at(at)
                tracker.applied_to = at
                tracker.mark_delete = mark_delete
                tracker.published = None
            else:
                tracker.mark_delete = mark_delete

    def _reached_mark_delete(self, tracker: SubscriptionTracker) -> bool:
        """Whether the tracker's state is the one at its mark-delete position, not short of it.

        A generator that just took a partition over may not have read up to a subscription's
        position yet; the watermark folded so far is lower than the one the previous owner
        published, and publishing it would make the subscription's watermark go back.
        """
        return tracker.applied_to[:2] >= tracker.mark_delete[:2] or self._read_to_tail_at_poll

    def _advance_trackers(self) -> None:
        """Move every secondary cursor; if any watermark changed, publish the partition's table."""
        assert self.log is not None
        for tracker in self.trackers.values():
            try:
                tracker.advance(self.log)
            except BeforeBase:  # a subscription far behind: rebuild from the nearest snapshot
                target = min(tracker.mark_delete, self.log.head_position)
                tracker.state, tracker.applied_to = self._state_at(target), target
        ready = [t for t in self.trackers.values() if t.state.watermark is not None and self._reached_mark_delete(t)]
        if not self.owner or all(t.state.watermark == t.published for t in ready):
            return
        seq = time.time_ns() // 1000
        table = [
            WatermarkEvent(
                topic=self.base_topic,
                partition=self.partition,
                subscription=tracker.name,
                event_time=tracker.state.watermark,
                position=tracker.mark_delete[:2],
                seq=seq,
                active=tracker.state.active_producers(),
                idle=tuple(tracker.state.idle_producers()),
                pending=len(tracker.state.pending_txns),
            )
            for tracker in ready
        ]
        if log.isEnabledFor(logging.DEBUG):
            for tracker in ready:
                log.debug("%s: publishing %r: watermark %s folded to %s, mark-delete %s, active %s, idle %s",
                          self.topic, tracker.name, tracker.state.watermark, tracker.applied_to[:2],
                          tracker.mark_delete[:2], tracker.state.active_producers(),
                          sorted(tracker.state.idle_producers()))  # fmt: skip
        self.ctx.dispatcher.publish(table)
        for tracker in ready:
            if tracker.state.watermark is not None and tracker.state.watermark != tracker.published:
                tracker.published = tracker.state.watermark
                self.ctx.metrics.record_watermark(
                    self.base_topic, self.partition, tracker.name, tracker.state.watermark
                )
