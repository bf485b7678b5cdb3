"""One partition's Pulsar side: the consumer that makes it ours, its snapshots' way into the topic, and its engine.

A snapshot goes through the broker's plugin where one reports the partition (`CursorSource.write_snapshot`),
else through a producer of the partition's own. Everything here runs on the event loop's thread
(broker_ext/loop.py), except what is handed to the worker pool and comes back as an event: subscribing,
creating the snapshot producer, the reads of a rebuild. A partition costs nothing while nothing happens on
it: no thread, no timer, no admin call beyond the sweep of its topic (broker_ext/intake/admin_polling.py).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import pulsar

from broker_ext.config import GeneratorConfig
from broker_ext.dispatch import WatermarkDispatcher
from broker_ext.engine import EngineConfig, PartitionEngine
from broker_ext.engine.recovery import BEFORE_EVERYTHING
from broker_ext.engine.vocabulary import (
    AcknowledgeUpTo,
    BrokenAssertion,
    ClaimIncarnation,
    Command,
    CursorsPolled,
    EntryRead,
    Event,
    HeadWatermark,
    IncarnationClaimed,
    IncarnationRead,
    MarkerFolded,
    MarkerMalformed,
    OwnershipLost,
    PollCursors,
    PublishTable,
    RangeRead,
    RawMarker,
    ReadIncarnation,
    ReadLag,
    ReadMarkerAt,
    ReadRange,
    RebuildRefused,
    Reported,
    Restart,
    SnapshotFailed,
    SnapshotWritten,
    SubscriptionRemoved,
    Tick,
    UnusableSnapshot,
    WriteSnapshot,
)
from broker_ext.intake.plugin_stream import IntakeReport
from broker_ext.intake.source import CursorSource
from broker_ext.loop import EventLoop
from broker_ext.metrics import GeneratorMetrics
from broker_ext.ownership import consumer_name, instance_of
from broker_ext.reads import message_position, read_marker_at, read_range
from pulsar_access.admin import AdminError, PulsarAdmin, TopicNotFound
from pulsar_access.topics import base_topic_and_partition
from watermark_core.protocol import (
    GENERATOR_SUBSCRIPTION,
    INCARNATION_PROPERTY,
    LAST_BATCH_INDEX,
    MARKER_PROPERTY,
    SNAPSHOT_PRODUCER_PREFIX,
    MalformedMarker,
    MarkerKind,
    Position,
    entry_end,
    position_of,
)
from watermark_core.protocol import HeadWatermark as HeadEvent
from watermark_core.snapshot import encode_snapshot

log = logging.getLogger(__name__)

RECEIVER_QUEUE = 1_000
INCARNATION_RETRY_S = 1.0
INTAKE_STALL_S = 10.0
"""With the plugin's intake, entries the engine has not read for this long (the plugin's reading stalled): the
consumer receives them instead (logged)."""


@dataclass
class Context:
    """What every partition of one generator shares."""

    client: pulsar.Client
    admin: PulsarAdmin
    config: GeneratorConfig
    dispatcher: WatermarkDispatcher
    metrics: GeneratorMetrics
    loop: EventLoop
    pool: Executor
    """Blocking Pulsar calls: subscribing, creating producers, a rebuild's reads."""
    poller: CursorSource
    """Where each cursor is: the broker plugin or the admin API (broker_ext/intake/source.py `CursorSource`)."""
    by_claim: bool = False
    """Ownership by claim (`--ownership claim`, broker_ext/claims.py): the service tells each partition whether
    this instance holds its topic's claim; no consumer per partition but where the plugin hands nothing over."""


def engine_config(config: GeneratorConfig) -> EngineConfig:
    return EngineConfig(
        watermark=config.watermark_config,
        snapshot_keys=config.snapshot_keys,
        snapshot_interval_messages=config.snapshot_interval_messages,
        snapshot_interval_s=config.snapshot_interval_s,
    )


class PartitionIO:
    """Feeds one partition's engine with what Pulsar delivers and answers, and carries out its commands."""

    def __init__(self, topic: str, ctx: Context, *, fresh: bool = False) -> None:
        self.topic = topic
        self.base_topic, self.partition = base_topic_and_partition(topic)
        self.ctx = ctx
        self.engine = PartitionEngine(topic, engine_config(ctx.config))
        self.consumer_name = consumer_name(self.base_topic, ctx.config.instance_id)
        self.closed = False
        self.consumer: pulsar.Consumer | None = None
        self.subscribing = False
        self.head: HeadWatermark | None = None
        """The head state's latest watermark and where it took effect (published as a head event)."""
        self._heads: list[HeadEvent] = []
        """Head events told in this turn (`handle`), not yet handed to the dispatcher."""
        self._producer: pulsar.Producer | None = None
        self._creating_producer = False
        self._waiting_write: WriteSnapshot | None = None
        self._last_position: Position = BEFORE_EVERYTHING
        self._last_message: pulsar.Message | None = None
        self._anchor: tuple[Position, pulsar.Message | None] | None = None
        """The message a periodic snapshot states (None: handed over by the plugin), acknowledged once the snapshot
        is durable."""
        self._was_owner = False
        self._fresh = fresh
        """The topic appeared while this generator runs (a broker's plugin saw it): it may read ahead once."""
        self._reading_ahead = False
        self._ahead: Any = None
        """The reader of `named_owner`, while it reads ahead of our consumer's first delivery."""
        self._delivered = False
        """Our consumer has delivered an entry (the read-ahead is over)."""
        self._malformed_logged: set[str] = set()
        self._intake = False
        """A plugin hands this partition's markers over (`--intake plugin`): our consumer's listener is paused, so
        the broker dispatches it nothing; it only holds the partition (its Failover subscription)."""
        self._overflow_logged = False
        self._intake_stalled = False
        """The plugin's reading of this partition stalled once: its consumer receives from then on."""
        self.claimed = False
        """By claim: this instance holds the topic's claim, so the partition is ours to follow."""
        self._subscription_made = False
        """By claim: `__wm_generator` exists (made by a plugin or the admin API where none reported the partition)."""
        self._plugin_follows = False
        """By claim: a broker's plugin made (or is making) `__wm_generator`, so it reports the partition and, with its
        intake, hands the markers over: no consumer of ours is needed (`_awaiting_intake`)."""
        self._claimed_at = 0.0
        """When the claim was granted (monotonic)."""
        self._lagging_since: float | None = None
        """Since when the engine's head has been behind the partition's last entry (`ReadLag`)."""
        self._labels = labels = (self.base_topic, str(self.partition))
        self._markers_applied = ctx.metrics.markers_applied.labels(*labels)
        self._read_lag = ctx.metrics.read_lag.labels(*labels)
        ctx.metrics.partitions.labels("false").inc()

    # -- what the poller asks ---------------------------------------------------------------------------

    @property
    def owner(self) -> bool:
        return self.engine.owner

    @property
    def wants_cursors(self) -> bool:
        return self.engine.wants_cursors

    def cursors(self, polled: CursorsPolled) -> None:
        self.handle(polled, polled=True)

    def lost(self, owner: str) -> None:
        self._stop_reading_ahead()
        self.handle(OwnershipLost(instance_of(owner)))

    def ours(self, owner: str | None) -> bool:
        """Whether what a broker's plugin tells of this partition is ours to take: by claim, while we hold the
        topic's claim; else while the broker's active consumer of `__wm_generator` (`owner`) is ours."""
        if self.ctx.by_claim:
            return self.claimed
        return owner == self.consumer_name or (owner is None and self.owner)

    def claim(self, held: bool) -> None:
        """By claim: this instance holds the topic's claim now, or lost it (the service tells every partition)."""
        if held == self.claimed or self.closed:
            return
        self.claimed = held
        if held:
            self._claimed_at = time.monotonic()
            if self.ctx.poller.claimed(self):  # a plugin reports the partition and hands its markers over
                self._plugin_follows = True
            else:
                self._intake = False
                self.subscribe()  # our consumer receives them, unless a plugin follows it (`_awaiting_intake`)
            return
        self.lost("")
        self._intake = self._intake_stalled = False
        consumer, self.consumer = self.consumer, None
        if consumer is not None:
            self.ctx.pool.submit(_close, consumer)

    def named_owner(self, polled: CursorsPolled) -> None:
        """The broker's plugin says the broker chose our consumer to deliver to. Pulsar starts delivering to a
        Failover subscription's chosen consumer only `activeConsumerFailoverDelayTimeMillis` (1 s by default) later,
        the first time too, so a topic that appeared while we run reads the same entries (those after the generator's
        cursor) with a reader meanwhile: its first watermark does not wait for that delay. The engine takes entries
        in order from either and ignores those it has (docs/DECISIONS.md, "A new topic reading ahead")."""
        ledger, entry = polled.generator_cursor
        if self._intake:
            return  # the plugin hands over every entry after the generator's cursor already
        if not self._fresh or self._reading_ahead or self._delivered or self.consumer is None or self.closed:
            return
        if ledger < 0:
            return  # the broker has not made our subscription yet
        self._fresh = False  # once: if the broker chooses another consumer meanwhile, we wait for delivery
        self._reading_ahead = True
        start = pulsar.MessageId(self.partition, ledger, entry, -1)  # exclusive: what comes after the cursor
        self.ctx.pool.submit(self._open_reader, start)

    def _open_reader(self, start: pulsar.MessageId) -> None:
        try:
            reader = self.ctx.client.create_reader(
                self.topic, start, reader_listener=self._ahead_listener, receiver_queue_size=RECEIVER_QUEUE
            )
        except Exception as exc:  # the consumer's delivery comes anyway
            log.debug("%s: reading ahead of our consumer's first delivery failed: %s", self.topic, exc)
            return
        self.ctx.loop.post(lambda: self._reader_opened(reader))

    def _reader_opened(self, reader: Any) -> None:
        if not self._reading_ahead or self._delivered or self.closed:
            self.ctx.pool.submit(_close, reader)
            return
        self._ahead = reader
        log.info("%s: reading ahead until Pulsar delivers to our consumer (its failover delay)", self.topic)

    def _ahead_listener(self, _reader: Any, message: pulsar.Message) -> None:
        """On the client's listener thread, as `_listener`."""
        self.ctx.loop.post_message(lambda: self.on_message(message, ahead=True))

    def _stop_reading_ahead(self) -> None:
        self._reading_ahead = False
        reader, self._ahead = self._ahead, None
        if reader is not None:
            self.ctx.pool.submit(_close, reader)

    # -- subscribing ------------------------------------------------------------------------------------

    def subscribe(self) -> None:
        """Subscribe `__wm_generator` (on the pool); delivery then makes this instance the owner. By claim, only
        while we hold the claim and no plugin hands the markers over; else make sure the subscription exists, which
        is what makes a broker's plugin report the partition (and retention keep what no snapshot covers yet)."""
        if self.consumer is not None or self.subscribing or self.closed:
            return
        if self.ctx.by_claim and not (self.claimed and not self._intake):
            if not self._subscription_made and not self.ctx.poller.reports(self):
                self.subscribing = True
                self._plugin_follows = self.ctx.poller.follow(self, self.engine.config.new_incarnation())
                if not self._plugin_follows:
                    self.ctx.pool.submit(self._make_subscription)
            return
        if self.ctx.by_claim and self._awaiting_intake():
            return
        self.subscribing = True
        self.ctx.pool.submit(self._subscribe)

    def _awaiting_intake(self) -> bool:
        """Claimed, and a plugin follows the partition with its intake: its findings come next (a large take-over
        is granted claims before the plugin's first report of their topics), so no consumer meanwhile, unless they
        have not come `INTAKE_STALL_S` after the claim."""
        return (
            self._plugin_follows
            and self.ctx.config.intake == "plugin"
            and time.monotonic() - self._claimed_at < INTAKE_STALL_S
        )

    def _make_subscription(self) -> None:
        try:
            self.ctx.admin.create_subscription(self.topic, GENERATOR_SUBSCRIPTION)
        except AdminError as exc:  # the broker away: the next discovery asks again
            log.debug("%s: making the subscription %s failed: %s", self.topic, GENERATOR_SUBSCRIPTION, exc)
            self.ctx.loop.post(lambda: setattr(self, "subscribing", False))
            return
        self.ctx.loop.post(self._subscription_exists)

    def _subscription_exists(self) -> None:
        self.subscribing = False
        self._subscription_made = True

    def followed(self, incarnation: str | None) -> None:
        """A broker's plugin made `__wm_generator` (`incarnation`: the topic property in place), or none could
        (None): the admin API makes it."""
        if self.closed:
            return
        if incarnation is None:
            self._plugin_follows = False
            self.ctx.pool.submit(self._make_subscription)
            return
        self._plugin_follows = True
        self._subscription_exists()  # the token in place comes again in the plugin's reports of the topic

    def _subscribe(self) -> None:
        try:
            consumer = self.ctx.client.subscribe(
                self.topic, GENERATOR_SUBSCRIPTION,
                consumer_type=pulsar.ConsumerType.Failover,
                consumer_name=self.consumer_name,
                initial_position=pulsar.InitialPosition.Earliest,
                receiver_queue_size=RECEIVER_QUEUE,
                message_listener=self._listener,
            )  # fmt: skip
        except Exception as exc:  # the broker away: discovery subscribes again
            failure = exc
            self.ctx.loop.post(lambda: self._subscribed(None, failure))
            return
        self.ctx.loop.post(lambda: self._subscribed(consumer, None))

    def _subscribed(self, consumer: pulsar.Consumer | None, failure: Exception | None) -> None:
        self.subscribing = False
        if consumer is None:
            log.debug("%s: subscribing failed (%s); trying again at the next discovery", self.topic, failure)
            return
        if self.closed:
            self.ctx.pool.submit(_close, consumer)
            return
        if self.ctx.by_claim and (not self.claimed or self._intake):
            self.ctx.pool.submit(_close, consumer)  # the claim was lost, or the plugin hands over, meanwhile
            return
        self.consumer = consumer
        if self._intake:
            consumer.pause_message_listener()

    # -- the plugin's intake (`--intake plugin`) ---------------------------------------------------------

    def intake(self, report: IntakeReport | None, cursors: CursorsPolled | None = None) -> bool:
        """What the broker plugin found on this partition, in log order; None once no plugin reports it. With the
        `cursors` of the same answer, both go to the engine as one event (`Reported`); True when they did, else the
        caller hands the cursors as ever."""
        if self.closed or self.ctx.config.intake != "plugin" or self._intake_stalled:
            return False
        if report is None or report.overflowed:
            if report is not None and not self._overflow_logged:
                self._overflow_logged = True
                log.warning("%s: the broker plugin keeps no more of this partition's markers (the generator is far "
                            "behind): receiving them through the consumer", self.topic)  # fmt: skip
            self._receive_through_consumer()
            return False
        if not self._intake and report.scanned_to[1] < 0 and not report.entries:
            return False  # the plugin has not read the partition yet: its consumer goes on receiving meanwhile
        if not self._intake:
            self._intake = True
            self._stop_reading_ahead()
            if self.consumer is not None and self.ctx.by_claim:  # what it kept meanwhile, the engine has or skips
                consumer, self.consumer = self.consumer, None
                self.ctx.pool.submit(_close, consumer)
            elif self.consumer is not None:
                self.consumer.pause_message_listener()
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s: the plugin found %d markers and stretches up to %s", self.topic, len(report.entries),
                      report.scanned_to)  # fmt: skip
        entries = report.entries
        scanned = entry_end(*report.scanned_to)
        if report.scanned_to[1] >= 0 and (not entries or scanned > entries[-1].position):
            # entries it read and found nothing in (encrypted, malformed): the head passes them all the same
            entries = (*entries, EntryRead(scanned, stretch=(("", 0, 0),)))
        if entries and entries[-1].position > self._last_position:
            self._last_position, self._last_message = entries[-1].position, None
        if cursors is not None:
            self.handle(Reported(entries, cursors), marker_read=any(map(_marker_read, entries)))
            return True
        for entry in entries:
            self.handle(entry, marker_read=_marker_read(entry))
        return False

    def _watch_intake(self, lag: int) -> None:
        """The plugin hands entries over within milliseconds of their write: a head behind for long means its
        reading stalled, and the consumer takes over (what it delivers again, the engine skips)."""
        if not lag:
            self._lagging_since = None
            return
        now = time.monotonic()
        if self._lagging_since is None:
            self._lagging_since = now
        elif self._intake and now - self._lagging_since > INTAKE_STALL_S:
            log.warning("%s: the broker plugin handed over nothing new for %.0f s while %d entries wait: receiving "
                        "them through the consumer", self.topic, now - self._lagging_since, lag)  # fmt: skip
            self._intake_stalled = True
            self._receive_through_consumer()

    def _receive_through_consumer(self) -> None:
        handing, self._intake = self._intake, False
        self._plugin_follows = False  # no plugin hands the markers over now
        if self.consumer is not None:
            if handing:
                self.consumer.resume_message_listener()  # what it kept meanwhile is older: the engine skips it
        elif self.ctx.by_claim:
            self.subscribe()  # by claim, the consumer is made only now

    def _listener(self, _consumer: pulsar.Consumer, message: pulsar.Message) -> None:
        """On the client's listener thread: hand the message to the loop (waits while the loop is far behind)."""
        self.ctx.loop.post_message(lambda: self.on_message(message))

    # -- events -----------------------------------------------------------------------------------------

    def on_message(self, message: pulsar.Message, *, ahead: bool = False) -> None:
        """An entry our consumer delivered, or (`ahead`) the read-ahead's reader read."""
        if self.closed:
            return
        position = message_position(message)
        if ahead:
            if not self._reading_ahead:
                return  # the consumer delivers from the generator's cursor on now
        elif not self._delivered:
            self._delivered = True
            self._stop_reading_ahead()
        if not ahead and position > self._last_position:  # a snapshot's anchor is acknowledged on our consumer
            self._last_position, self._last_message = position, message
        kind = message.properties().get(MARKER_PROPERTY)
        if kind is not None:
            raw = RawMarker(kind, message.data(), message.producer_name(), position, message.publish_timestamp())
            self.handle(EntryRead(position, raw=raw), marker_read=kind != MarkerKind.W_SNAPSHOT.value)
            return
        self.handle(EntryRead(position, None, message.producer_name(), message.event_timestamp()))

    def handle(self, event: Event, *, marker_read: bool = False, polled: bool = False) -> None:
        """Feed the engine one event and carry out what it asks."""
        if self.closed:
            return
        for command in self.engine.handle(event, time.time()):
            self._carry_out(command)
        if self._heads:  # no table of this turn took them: they wait for the next one (`HeadPairing`)
            heads, self._heads = self._heads, []
            for head in heads:
                self.ctx.dispatcher.publish_head(head)
        wakeup = self.engine.wakeup_at
        key = (self.topic, "tick")
        if wakeup is None:
            self.ctx.loop.cancel(key)
        elif self.ctx.loop.scheduled(key) != wakeup:
            self.ctx.loop.call_at(wakeup, key, lambda: self.handle(Tick()))
        owner = self.engine.owner
        if owner != self._was_owner:
            self._was_owner = owner
            self.ctx.metrics.partitions.labels("true").inc(1 if owner else -1)
            self.ctx.metrics.partitions.labels("false").inc(-1 if owner else 1)
            if owner:
                self.ctx.poller.owned(self)
        if not polled:
            self.ctx.poller.after(self, marker_read)

    def _malformed(self, exc: MalformedMarker, producer: str, position: Position) -> None:
        self.ctx.metrics.malformed_markers.labels(self.base_topic, str(self.partition), exc.reason).inc()
        if exc.reason not in self._malformed_logged:
            self._malformed_logged.add(exc.reason)
            log.warning("%s: skipping malformed marker (%s) from %r at %s: %s",
                        self.topic, exc.reason, producer, position[:2], exc)  # fmt: skip

    # -- commands ---------------------------------------------------------------------------------------

    def _carry_out(self, command: Command) -> None:
        # The commands of every marker and cursor poll first: each `isinstance` below costs a marker's time.
        if isinstance(command, MarkerFolded):
            self._markers_applied.inc()
        elif isinstance(command, HeadWatermark):
            self.head = command
            if command.watermark is not None:
                # The watermark at this position of the log, for readers that need it before any
                # subscription has acknowledged there (the Spark source); tables go out as before. Held
                # to the end of the turn: a table of the same turn takes it along (`handle`).
                self._heads.append(HeadEvent(
                    self.base_topic, self.partition, command.position[:2], command.watermark, command.incarnation
                ))  # fmt: skip
        elif isinstance(command, PublishTable):
            heads, self._heads = self._heads, []
            self.ctx.dispatcher.publish(command, heads)
        elif isinstance(command, ReadLag):
            self._read_lag.set(command.entries)
            self._watch_intake(command.entries)
        elif isinstance(command, PollCursors):
            self.ctx.poller.request(self)
        elif isinstance(command, WriteSnapshot):
            self._write(command)
        elif isinstance(command, AcknowledgeUpTo):
            self._acknowledge(command.position)
        elif isinstance(command, ReadRange):
            self._read(lambda: read_range(self.ctx.client, self.ctx.admin, self.topic, command))
        elif isinstance(command, ReadMarkerAt):
            self._read(lambda: read_marker_at(self.ctx.client, self.topic, command))
        elif isinstance(command, ReadIncarnation):
            self._answer_incarnation()
        elif isinstance(command, ClaimIncarnation):
            log.debug("%s: setting the topic property %s to %s", self.topic, INCARNATION_PROPERTY, command.token)
            self.ctx.pool.submit(self._claim_incarnation, command.token)
        elif isinstance(command, Restart):
            self.close()  # discovery follows the topic anew, with a consumer and an engine of their own
        elif isinstance(command, BrokenAssertion):
            self.ctx.metrics.broken_assertions.labels(*self._labels, command.producer).inc()
        elif isinstance(command, MarkerMalformed):
            self._malformed(command.error, command.producer, command.position)
        elif isinstance(command, UnusableSnapshot):
            self.ctx.metrics.malformed_markers.labels(*self._labels, command.reason).inc()
        elif isinstance(command, SubscriptionRemoved):
            self.ctx.metrics.forget_subscription(self.base_topic, self.partition, command.name)
        elif isinstance(command, RebuildRefused):
            pass  # the engine logged it; the chaos suite keeps evidence of it

    def _answer_incarnation(self) -> None:
        """From the plugin's latest report of the topic (a take-over, a standby's after a kill too: no admin call);
        where none reports it, or it says unset, read through the admin API (only that read can say "unset" for
        sure: the report may not show a token set a moment ago)."""
        reported = self.ctx.poller.incarnation(self)
        if reported is not None:
            self.ctx.loop.post(lambda: self.handle(IncarnationRead(reported)))
        else:
            self.ctx.pool.submit(self._read_incarnation)

    def _read_incarnation(self) -> None:
        """The topic property naming the incarnation (on the pool); read again later while the broker is away."""
        self.ctx.metrics.admin_calls.labels("properties").inc()
        try:
            token: str | None = self.ctx.admin.topic_properties(self.topic).get(INCARNATION_PROPERTY)
        except TopicNotFound:
            token = None  # deleted: discovery drops the partition
        except AdminError as exc:
            if exc.status not in (401, 403):  # the broker away: asked again
                log.debug("%s: reading the topic's properties failed: %s", self.topic, exc)
                self._later(self._read_incarnation)
                return
            log.debug("%s: reading the topic's properties refused (%s): taken as unset", self.topic, exc)
            token = None  # then no property can be ours to set either: nothing carries a token
        self.ctx.loop.post(lambda: self.handle(IncarnationRead(token)))

    def _claim_incarnation(self, token: str) -> None:
        """Set the property (on the pool): a broker that says no is final, one that does not answer is asked again."""
        try:
            self.ctx.admin.set_topic_properties(self.topic, {INCARNATION_PROPERTY: token})
        except AdminError as exc:
            if exc.status is None:
                log.debug("%s: setting the topic's properties failed: %s", self.topic, exc)
                self._later(lambda: self._claim_incarnation(token))
                return
            failure = str(exc)
            self.ctx.loop.post(lambda: self.handle(IncarnationClaimed(token, False, failure)))
            return
        self.ctx.loop.post(lambda: self.handle(IncarnationClaimed(token, True)))

    def _later(self, work: Callable[[], None]) -> None:
        """Run `work` on the pool in a while (called from any thread), unless the partition is closed by then."""

        def due() -> None:
            if not self.closed:
                self.ctx.pool.submit(work)

        when = time.time() + INCARNATION_RETRY_S
        self.ctx.loop.post(lambda: self.ctx.loop.call_at(when, (self.topic, "incarnation"), due))

    def _read(self, read: Callable[[], Event]) -> None:
        def work() -> None:
            result = read()
            labels = self._labels
            if isinstance(result, RangeRead):
                self.ctx.metrics.rebuild_reads.labels(*labels, "range").inc()
                self.ctx.metrics.rebuild_entries_read.labels(*labels).inc(result.entries)
            else:
                self.ctx.metrics.rebuild_reads.labels(*labels, "snapshot").inc()
            self.ctx.loop.post(lambda: self.handle(result))

        self.ctx.pool.submit(work)

    def _acknowledge(self, position: Position) -> None:
        """Move our cursor to a durable snapshot's stated position: acknowledge the message there (the plugin's
        intake hands no message: up to its entry when the position is a whole entry, else up to the one before,
        since more markers of that batch may follow; the plugin moves the cursor inside its broker then)."""
        anchor, self._anchor = self._anchor, None
        target = None if anchor is None or anchor[0] != position else anchor[1] or _up_to(self.partition, position)
        if (
            target is not None
            and self._intake
            and self.ctx.poller.acknowledge(self, (target.ledger_id(), target.entry_id()))
        ):
            return  # inside the broker, by the plugin that hands the entries over
        if target is None or self.consumer is None:
            log.debug("%s: not acknowledging up to %s (the message there is not at hand)", self.topic, position[:2])
            return
        try:
            self.consumer.acknowledge_cumulative(target)
        except pulsar.PulsarException as exc:  # the next snapshot acknowledges further
            log.debug("%s: acknowledging up to %s failed: %s", self.topic, position[:2], exc)

    def _write(self, command: WriteSnapshot) -> None:
        if command.periodic:
            at_hand = self._last_position == command.state.position
            self._anchor = (self._last_position, self._last_message) if at_hand else None
        if self._producer is None and self.ctx.poller.write_snapshot(
            self, self._snapshot_producer_name, self._encoded(command), self._plugin_wrote
        ):
            return  # written inside the broker by its plugin: no producer of ours on the partition
        if self._producer is None:
            self._waiting_write = command
            if not self._creating_producer:
                self._creating_producer = True
                self.ctx.pool.submit(self._create_producer)
            return
        self._send(self._producer, command)

    def _plugin_wrote(self, where: Position | None, failure: str | None) -> None:
        if self.closed:
            return
        if where is None:
            self.handle(SnapshotFailed(f"the broker's plugin did not write the snapshot: {failure}"))
        else:
            self._written(where)

    @property
    def _snapshot_producer_name(self) -> str:
        return f"{SNAPSHOT_PRODUCER_PREFIX}{self.ctx.config.instance_id}"

    def _encoded(self, command: WriteSnapshot) -> bytes:
        return encode_snapshot(
            command.state, command.previous, keys=self.ctx.config.snapshot_keys, topic=self.topic,
            incarnation=command.incarnation, created=command.created,
        )  # fmt: skip

    def _create_producer(self) -> None:
        try:
            producer = self.ctx.client.create_producer(
                self.topic, producer_name=self._snapshot_producer_name, batching_enabled=False
            )
        except Exception as exc:
            failure = exc
            self.ctx.loop.post(lambda: self._producer_ready(None, failure))
            return
        self.ctx.loop.post(lambda: self._producer_ready(producer, None))

    def _producer_ready(self, producer: pulsar.Producer | None, failure: Exception | None) -> None:
        self._creating_producer = False
        waiting, self._waiting_write = self._waiting_write, None
        if self.closed:
            if producer is not None:
                self.ctx.pool.submit(_close, producer)
            return
        if producer is None:
            self.handle(SnapshotFailed(f"creating the snapshot producer failed: {failure}"))
            return
        self._producer = producer
        if waiting is not None:
            self._send(producer, waiting)

    def _send(self, producer: pulsar.Producer, command: WriteSnapshot) -> None:
        loop = self.ctx.loop

        def sent(result: pulsar.Result, msg_id: pulsar.MessageId) -> None:  # on a client thread
            if result == pulsar.Result.Ok:
                where = position_of(msg_id.ledger_id(), msg_id.entry_id(), msg_id.batch_index())
                loop.post(lambda: self._written(where))
            else:
                loop.post(lambda: self.handle(SnapshotFailed(str(result))))

        try:
            producer.send_async(self._encoded(command), sent, properties={MARKER_PROPERTY: MarkerKind.W_SNAPSHOT.value})
        except pulsar.PulsarException as exc:
            failure = exc
            loop.post(lambda: self.handle(SnapshotFailed(str(failure))))

    def _written(self, where: Position) -> None:
        self.ctx.metrics.snapshots_written.labels(*self._labels).inc()
        self.ctx.metrics.last_snapshot.labels(*self._labels).set(time.time())
        self.handle(SnapshotWritten(where))

    # -- closing ----------------------------------------------------------------------------------------

    def close(self) -> None:
        """The partition is gone (or the generator stops): release its consumer and producer."""
        if self.closed:
            return
        self.closed = True
        self._stop_reading_ahead()
        self.ctx.loop.cancel((self.topic, "tick"))
        self.ctx.loop.cancel((self.topic, "incarnation"))
        self.ctx.poller.remove(self)
        if self._was_owner:
            self.ctx.metrics.partitions.labels("true").dec()
        else:
            self.ctx.metrics.partitions.labels("false").dec()
        for closable in (self.consumer, self._producer):
            if closable is not None:
                self.ctx.pool.submit(_close, closable)
        self.consumer = self._producer = None


def _up_to(partition: int, position: Position) -> pulsar.MessageId | None:
    """What a cumulative acknowledgement may name to cover `position` and nothing after it in the log."""
    ledger, entry, batch = position
    if batch < 0 or batch == LAST_BATCH_INDEX:  # a message alone, or all the entry was read
        return pulsar.MessageId(partition, ledger, entry, -1)
    return pulsar.MessageId(partition, ledger, entry - 1, -1) if entry > 0 else None


def _marker_read(entry: EntryRead) -> bool:
    """Whether the entry is a marker other than our snapshots (it arms the admin path's fast poll)."""
    return entry.raw is not None and entry.raw.kind != MarkerKind.W_SNAPSHOT.value


def _close(closable: pulsar.Consumer | pulsar.Producer) -> None:
    with contextlib.suppress(Exception):
        closable.close()
