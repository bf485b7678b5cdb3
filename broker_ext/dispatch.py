"""Publishes `SendWatermark` tables and `HeadWatermark` events on each topic's companion topic.

Companion topics live in the watermark namespace (`pulsar_access.topics.watermark_topic_for`),
where only the generator's role may produce. Consumers read them with a compacted reader; the
generator triggers compaction now and then so that a consumer that attaches finds the latest table
of its partition (key `<topic>:<partition>`) and the latest head event (key `head:<topic>:<partition>`)
at once without reading the whole history. A companion topic may carry the events of several data
topics: what is kept per partition is kept per (topic, partition).

Runs on the event loop's thread and never blocks it: a companion topic's producer is created on the
worker pool (tables and head events wait for it, in order), both are sent asynchronously in the
order the engines publish them on that one producer, and one whose send failed is sent again unless
a later one of its kind and partition was sent since.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Literal

import _pulsar
import pulsar

from broker_ext.engine.vocabulary import PublishTable
from broker_ext.loop import EventLoop
from broker_ext.metrics import GeneratorMetrics
from pulsar_access.admin import AdminError, PulsarAdmin
from pulsar_access.topics import base_topic_and_partition, watermark_namespace, watermark_topic_for
from watermark_core.protocol import (
    EVENT_PROPERTY,
    HEAD_WATERMARK,
    SEND_WATERMARK,
    HeadWatermark,
    encode_head,
    encode_table,
    head_key,
    table_key,
)

log = logging.getLogger(__name__)

COMPACT_EVERY_EVENTS = 1_000
COMPACT_EVERY_S = 600.0
"""A companion topic is compacted after this many events or this long after the last compaction: a consumer that
attaches reads at most that much history, and the broker (which rewrites the topic each time) is not made to
compact thousands of topics every minute."""
RETRY_S = 1.0
BATCH_DELAY_MS = 5
"""A companion topic's producer batches what is sent within this long: the tables of a group's topics, sent together
when their markers are acknowledged together (a burst), go to the broker as one entry (issue 47)."""
COMPACT_EVERY_EVENTS_CAP = 20_000
"""A companion topic shared by N followed topics is compacted after N * `COMPACT_EVERY_EVENTS` events, at most this
many."""


def compaction_due(events_since: int, compacted_at: float, now: float, first_of_run: bool, topics: int = 1) -> bool:
    """Whether to compact a companion topic that `topics` followed topics share, after its latest event (monotonic
    seconds): each topic's history read by one that attaches stays about as long as with a companion of its own."""
    every = min(COMPACT_EVERY_EVENTS * max(topics, 1), max(COMPACT_EVERY_EVENTS_CAP, COMPACT_EVERY_EVENTS))
    return first_of_run or events_since >= every or now - compacted_at >= COMPACT_EVERY_S


PartitionKey = tuple[str, int]
"""A partition on a companion topic: its base topic and index (-1: not partitioned)."""


@dataclass
class LatestSent:
    """Per partition, the latest table and head event sent: a failed send goes out again only while it is
    still the latest of its kind (a reader needs only the newest: compaction keeps one per key anyway)."""

    tables: dict[PartitionKey, int] = field(default_factory=dict)
    """Per partition, the seq of the latest table sent."""
    heads: dict[PartitionKey, HeadWatermark] = field(default_factory=dict)
    """Per partition, the latest head event sent."""

    def sending_table(self, table: PublishTable) -> None:
        first = table.events[0]
        self.tables[first.topic, first.partition] = first.seq

    def sending_head(self, head: HeadWatermark) -> None:
        self.heads[head.topic, head.partition] = head

    def resend_table(self, table: PublishTable) -> bool:
        """Whether a table whose send failed is to be sent again: no later one of its partition was sent."""
        first = table.events[0]
        return self.tables.get((first.topic, first.partition)) == first.seq

    def resend_head(self, head: HeadWatermark) -> bool:
        """Whether a head event whose send failed is to be sent again: no later one of its partition was sent."""
        return self.heads.get((head.topic, head.partition)) is head

    def forget(self, topic: str) -> None:
        """The topic is no longer followed: nothing of it is sent again."""
        self.tables = {key: seq for key, seq in self.tables.items() if key[0] != topic}
        self.heads = {key: head for key, head in self.heads.items() if key[0] != topic}


HEAD_WAIT_S = 0.25
"""How long a head event waits for a table of its partition to ride on (one message instead of two when a
subscription acknowledges the marker soon after it was folded, the common case)."""


@dataclass
class HeadPairing:
    """Per partition, whether head events wait up to `HEAD_WAIT_S` for the next table to ride on it.

    Where nobody acknowledges that soon (a topic read by the Spark source alone), heads that waited in vain go
    alone and the next ones go at once, so a reader of heads is not held back; a table that follows a head sent at
    once within `HEAD_WAIT_S` makes the next heads wait again. Every head goes out, in order: a reader whose batch
    ends between two of them needs the earlier one. Times are monotonic seconds, passed in.
    """

    waiting: dict[PartitionKey, list[HeadWatermark]] = field(default_factory=dict)
    at_once: set[PartitionKey] = field(default_factory=set)
    alone_at: dict[PartitionKey, float] = field(default_factory=dict)
    """When a head of the partition last went out alone."""

    def on_head(self, head: HeadWatermark, now: float) -> Literal["send", "wait", "added"]:
        """What to do with a new head: "send" it now; "wait" (held: call `due` after `HEAD_WAIT_S`); "added"
        (held after others whose wait goes on)."""
        partition = (head.topic, head.partition)
        if partition in self.at_once:
            self.alone_at[partition] = now
            return "send"
        waiting = self.waiting.setdefault(partition, [])
        waiting.append(head)
        return "wait" if len(waiting) == 1 else "added"

    def on_table(self, partition: PartitionKey, now: float) -> list[HeadWatermark]:
        """A table of the partition goes out now: the heads to ride on it, in order."""
        heads = self.waiting.pop(partition, [])
        if not heads and now - self.alone_at.get(partition, -HEAD_WAIT_S) < HEAD_WAIT_S:
            self.at_once.discard(partition)
        return heads

    def due(self, partition: PartitionKey, now: float) -> list[HeadWatermark]:
        """The wait is over: the heads still waiting go alone, and the partition's next ones at once."""
        heads = self.waiting.pop(partition, [])
        if heads:
            self.at_once.add(partition)
            self.alone_at[partition] = now
        return heads

    def forget(self, topic: str) -> list[PartitionKey]:
        """The topic is no longer followed: its partitions whose heads were waiting (their timers to cancel)."""
        waited = [key for key in self.waiting if key[0] == topic]
        for key in waited:
            del self.waiting[key]
        self.at_once = {key for key in self.at_once if key[0] != topic}
        self.alone_at = {key: at for key, at in self.alone_at.items() if key[0] != topic}
        return waited


@dataclass
class Companion:
    """One companion topic: its producer once created, what waits for it, compaction bookkeeping."""

    topic: str
    followed: dict[str, set[str]] = field(default_factory=dict)
    """The base topics whose events go here, each with its partitions' names (with none left, it is let go)."""
    producer: pulsar.Producer | None = None
    creating: bool = False
    waiting: list[PublishTable | HeadWatermark] = field(default_factory=list)
    sent: LatestSent = field(default_factory=LatestSent)
    heads: HeadPairing = field(default_factory=HeadPairing)
    since_compaction: int = 0
    compacted_at: float = field(default_factory=time.monotonic)


class WatermarkDispatcher:
    """One producer per companion topic, shared by every partition of that topic.

    By claim (`--ownership claim`, broker_ext/claims.py) the producer is the claim's, handed over with
    `claimed` and taken back with `unclaimed`; a send refused as fenced is told to `fenced`. Otherwise the
    dispatcher creates a shared one itself.
    """

    def __init__(
        self, client: pulsar.Client, admin: PulsarAdmin, instance_id: str, metrics: GeneratorMetrics,
        loop: EventLoop, pool: Executor, namespace: str | None = None, *, by_claim: bool = False,
        fenced: Callable[[str], None] = lambda companion: None,
    ) -> None:  # fmt: skip
        self._by_claim = by_claim
        self._fenced = fenced
        self._client = client
        self._namespace = watermark_namespace(namespace)
        self._namespace_checked = False
        self._admin = admin
        self._instance_id = instance_id
        self._metrics = metrics
        self._loop = loop
        self._post = loop.post
        self._pool = pool
        self._retries = 0
        self._companions: dict[str, Companion] = {}
        self._of_topic: dict[str, Companion] = {}
        """Each data topic's companion, as `_companion` last found it."""
        self._created = 0
        self._compaction_refused = False
        self._compaction_tried = False
        """The run's first event triggers one compaction: whether this role may is known (and said) at once."""
        self._failures_logged = False

    def publish(self, table: PublishTable, riding: Sequence[HeadWatermark] = ()) -> None:
        """Send a partition's table (every subscription's watermark), with its head events waiting and then those of
        `riding` (the partition's heads of the same turn: they need not wait); on the loop thread."""
        companion = self._companion(table.events[0].topic)
        if companion.producer is None:
            for head in riding:
                self._wait_for_producer(companion, head)
            self._wait_for_producer(companion, table)
            return
        first = table.events[0]
        partition = (first.topic, first.partition)
        heads = companion.heads.on_table(partition, time.monotonic())
        if heads:
            self._loop.cancel(_head_timer(companion, partition))
        self._send(companion, table, [*heads, *riding] if riding else heads)

    def publish_head(self, head: HeadWatermark) -> None:
        """Send the watermark of a partition's head at a position (the fold of the log up to it); on the loop thread.

        A head event lets a reader (the Spark source) know the watermark at a position before any
        subscription has acknowledged there. It rides on the partition's next table if one comes
        within `HEAD_WAIT_S` (`HeadPairing`), else goes alone, on the same producer as the tables;
        one whose send failed is sent again unless a later one of its partition went out since (a
        reader never needs an older one: the watermark only grows along the log).
        """
        companion = self._companion(head.topic)
        action = companion.heads.on_head(head, time.monotonic())
        if action == "wait":
            due = time.time() + HEAD_WAIT_S
            partition = (head.topic, head.partition)
            self._loop.call_at(due, _head_timer(companion, partition), lambda: self._head_due(companion, partition))
        elif action == "send":
            self._head_alone(companion, head)

    def _head_due(self, companion: Companion, partition: PartitionKey) -> None:
        heads = companion.heads.due(partition, time.monotonic())
        if self._companions.get(companion.topic) is companion:
            for head in heads:
                self._head_alone(companion, head)

    def _head_alone(self, companion: Companion, head: HeadWatermark) -> None:
        if companion.producer is None:
            self._wait_for_producer(companion, head)
        else:
            self._send_head(companion, head)

    def _companion(self, topic: str) -> Companion:
        companion = self._of_topic.get(topic)  # naming the companion parses the topic: once per topic
        if companion is None or self._companions.get(companion.topic) is not companion:
            companion = self._of_topic[topic] = self._named(watermark_topic_for(topic, self._namespace))
            companion.followed.setdefault(base_topic_and_partition(topic)[0], set()).add(topic)
        return companion

    def _named(self, name: str) -> Companion:
        """The companion topic `name`'s, made when first asked for."""
        companion = self._companions.get(name)
        if companion is None:
            companion = self._companions[name] = Companion(name)
        return companion

    def claimed(self, companion_topic: str, producer: pulsar.Producer) -> None:
        """Our claim on the companion topic is granted: its tables and head events go out on the claim's producer."""
        self._ready(self._named(companion_topic), producer, None)

    def unclaimed(self, companion_topic: str) -> None:
        """Our claim on the companion topic is lost: nothing waiting goes out (the new owner publishes its own)."""
        companion = self._named(companion_topic)
        companion.producer = None
        companion.waiting.clear()
        for partition in list(companion.heads.waiting):
            self._loop.cancel(_head_timer(companion, partition))
        companion.heads = HeadPairing()

    def _wait_for_producer(self, companion: Companion, item: PublishTable | HeadWatermark) -> None:
        companion.waiting.append(item)
        if not companion.creating and not self._by_claim:
            companion.creating = True
            self._created += 1
            self._pool.submit(self._create, companion, f"__wm_dispatch-{self._instance_id}-{self._created}")

    def ensure_namespace(self) -> None:
        """Create the watermark namespace where the broker lets us (a cluster without authorization).

        With authorization only an admin may create it (`make cluster-up` does, and grants produce
        there to the generator's role alone; docs/SECURITY.md): then say once, with the fix, if it
        is missing or not ours to write. On the worker pool, before a companion's producer is created.
        """
        if self._namespace_checked:
            return
        try:
            self._admin.create_namespace(self._namespace)
        except AdminError as exc:
            if exc.status not in (401, 403):
                raise  # the broker is away: retried with the next producer
            try:
                self._admin.list_topics(self._namespace)
            except AdminError as missing:
                log.error(
                    "the watermark namespace %s is missing or not open to this generator's role (%s); as an admin, "
                    "create it and grant the generator produce,consume and the applications consume there "
                    "(docs/SECURITY.md), or set --watermark-namespace / WM_WATERMARK_NAMESPACE",
                    self._namespace,
                    missing,
                )
        self._namespace_checked = True

    def _create(self, companion: Companion, producer_name: str) -> None:
        try:
            self.ensure_namespace()
            producer = self._client.create_producer(
                companion.topic, producer_name=producer_name, batching_enabled=True,
                batching_max_publish_delay_ms=BATCH_DELAY_MS,
            )  # fmt: skip
        except Exception as exc:
            failure = exc
            self._post(lambda: self._ready(companion, None, failure))
            return
        self._post(lambda: self._ready(companion, producer, None))

    def _ready(self, companion: Companion, producer: pulsar.Producer | None, failure: Exception | None) -> None:
        companion.creating = False
        if self._companions.get(companion.topic) is not companion:  # forgotten meanwhile
            if producer is not None:
                self._pool.submit(_close, producer)
            return
        if producer is None:
            log.warning("cannot publish watermarks on %s yet: %s; retrying in %.0f s",
                        companion.topic, failure, RETRY_S)  # fmt: skip
            self._retry_later(lambda: self._retry_create(companion))
            return
        companion.producer = producer
        waiting, companion.waiting = companion.waiting, []
        for item in waiting:
            if isinstance(item, HeadWatermark):
                self._send_head(companion, item)
            else:
                self._send(companion, item)

    def _retry_create(self, companion: Companion) -> None:
        if self._by_claim or companion.producer is not None or companion.creating:
            return
        if self._companions.get(companion.topic) is companion:
            companion.creating = True
            self._created += 1
            self._pool.submit(self._create, companion, f"__wm_dispatch-{self._instance_id}-{self._created}")

    def _send(self, companion: Companion, table: PublishTable, heads: Sequence[HeadWatermark] = ()) -> None:
        companion.sent.sending_table(table)
        for head in heads:
            companion.sent.sending_head(head)
        first = table.events[0]
        self._send_async(
            companion, encode_table(table.events, heads), table_key(first.topic, first.partition), SEND_WATERMARK,
            lambda result: self._sent(companion, table, result, heads),
        )  # fmt: skip

    def _send_head(self, companion: Companion, head: HeadWatermark) -> None:
        companion.sent.sending_head(head)
        self._send_async(
            companion, encode_head(head), head_key(head.topic, head.partition), HEAD_WATERMARK,
            lambda result: self._head_sent(companion, head, result),
        )  # fmt: skip

    def _send_async(
        self, companion: Companion, payload: bytes, key: str, event: str, done: Callable[[object], None]
    ) -> None:
        """Send one event on the companion's producer; `done(result)` runs on the loop thread, also when the
        send could not even start."""
        assert companion.producer is not None
        post = self._post

        def sent(result: pulsar.Result, _msg_id: pulsar.MessageId) -> None:  # on a client thread
            post(lambda: done(result))

        # Built on the client's binding, as `pulsar.Producer.send_async` does, without its per-argument checks:
        # every acknowledged W_SET sends one (docs/DECISIONS.md, session 22).
        message = _pulsar.MessageBuilder().content(payload).partition_key(key).property(EVENT_PROPERTY, event).build()
        try:
            companion.producer._producer.send_async(message, sent)
        except pulsar.PulsarException as exc:
            failure = exc
            post(lambda: done(failure))

    def _head_sent(self, companion: Companion, head: HeadWatermark, result: object) -> None:
        if result == pulsar.Result.Ok:
            self._maybe_compact(companion)
            return
        if self._refused_as_fenced(companion, result):
            return
        log.debug("publishing a head event on %s failed (%s); sending again", companion.topic, result)
        self._retry_later(lambda: self._resend_head(companion, head))

    def _resend_head(self, companion: Companion, head: HeadWatermark) -> None:
        if self._companions.get(companion.topic) is not companion:
            return
        if not companion.sent.resend_head(head):
            return  # a later head event of that partition went out since
        if companion.producer is None:
            self._wait_for_producer(companion, head)
        else:
            self._send_head(companion, head)

    def _sent(self, companion: Companion, table: PublishTable, result: object, heads: Sequence[HeadWatermark]) -> None:
        first = table.events[0]
        if self._refused_as_fenced(companion, result):
            return
        if result != pulsar.Result.Ok:
            for head in heads:  # the heads that rode on it are sent again on their own, if still the latest
                self._head_sent(companion, head, result)
            if not self._failures_logged:
                self._failures_logged = True
                log.warning("publishing watermarks on %s failed (%s); sending again", companion.topic, result)
            else:
                log.debug("publishing watermarks on %s failed (%s); sending again", companion.topic, result)
            self._retry_later(lambda: self._resend(companion, table))
            return
        self._failures_logged = False
        changed = set(table.changed)
        for event in table.events:
            if event.subscription in changed:
                self._metrics.record_watermark(event.topic, event.partition, event.subscription, event.event_time)
        log.debug("%s: published the table of partition %d (seq %d)", first.topic, first.partition, first.seq)
        self._maybe_compact(companion)

    def _refused_as_fenced(self, companion: Companion, result: object) -> bool:
        """By claim, a send Pulsar refused because another instance holds the producer now: nothing is sent again
        (the claim is lost; its owner publishes)."""
        if not self._by_claim or result != pulsar.Result.ProducerFenced:
            return False
        self._fenced(companion.topic)
        return True

    def _resend(self, companion: Companion, table: PublishTable) -> None:
        if self._companions.get(companion.topic) is not companion:
            return
        if not companion.sent.resend_table(table):
            return  # a later table of that partition went out since
        if companion.producer is None:
            self._wait_for_producer(companion, table)
        else:
            self._send(companion, table)

    def _retry_later(self, work: Callable[[], None]) -> None:
        self._retries += 1
        self._loop.call_at(time.time() + RETRY_S, ("dispatch-retry", self._retries), work)

    def _maybe_compact(self, companion: Companion) -> None:
        companion.since_compaction += 1
        now = time.monotonic()
        due = compaction_due(companion.since_compaction, companion.compacted_at, now, not self._compaction_tried,
                             len(companion.followed))  # fmt: skip
        if not due or self._compaction_refused:
            return
        companion.since_compaction, companion.compacted_at = 0, now
        self._compaction_tried = True
        self._pool.submit(self._compact, companion.topic)

    def _compact(self, topic: str) -> None:
        try:
            self._admin.trigger_compaction(topic)
        except AdminError as exc:  # 409: one is running already; anything else is retried later
            if exc.status in (401, 403):  # not this role's right (tenant admin): say so once, then stop asking
                if not self._compaction_refused:
                    self._compaction_refused = True
                    log.warning(
                        "compaction of the __watermarks topics is not triggered: %s. Watermarks still flow; a "
                        "consumer that attaches reads the companion topic's whole history (see docs/SECURITY.md)",
                        exc,
                    )
            elif exc.status != 409:
                log.warning("compaction of %s not triggered: %s", topic, exc)

    def forget(self, topic: str) -> None:
        """The base topic is gone: nothing of it is sent again, and a companion left with no topic is let go (its
        producer closed, but a claim's: the claims close those); on the loop thread."""
        name = watermark_topic_for(topic, self._namespace)
        companion = self._companions.get(name)
        if companion is None:
            return
        for partition_topic in companion.followed.pop(topic, ()):
            self._of_topic.pop(partition_topic, None)
        companion.sent.forget(topic)
        for partition in companion.heads.forget(topic):
            self._loop.cancel(_head_timer(companion, partition))
        if companion.followed:
            return
        del self._companions[name]
        if companion.producer is not None and not self._by_claim:
            self._pool.submit(_close, companion.producer)

    def close(self) -> None:
        companions, self._companions = list(self._companions.values()), {}
        for companion in companions:
            if companion.producer is not None:
                for heads in companion.heads.waiting.values():  # no table came for them: they go alone
                    for head in heads:
                        self._send_head(companion, head)
                if not self._by_claim:  # a claim's producer is closed by the claims
                    _close(companion.producer)


def _head_timer(companion: Companion, partition: PartitionKey) -> tuple[str, str, PartitionKey]:
    """The loop's timer key of a partition's waiting head events."""
    return ("head", companion.topic, partition)


def _close(producer: pulsar.Producer) -> None:
    with contextlib.suppress(Exception):
        producer.close()
