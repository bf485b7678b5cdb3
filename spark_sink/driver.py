"""The Spark source's driver side: which partitions are read, each batch's end and watermark, the subscription.

`DriverState` lives as long as the query in Spark's driver-side Python worker: the admin API (partitions,
their ends and ledgers, data loss), the companion follower (the broker watermark at a batch's end,
`spark_sink.watermarks`) and one consumer per partition that only acknowledges the query's subscription.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pulsar

from pulsar_access.admin import PulsarAdmin, TopicNotFound, last_confirmed_entry, mark_delete_of
from pulsar_access.errors import explained
from pulsar_access.incarnations import Incarnations
from pulsar_access.topics import TopicName, base_topic_and_partition, is_watermark_topic, partition_name
from spark_sink.offsets import NO_WATERMARK, Entry, Ledgers, PartitionKey, SourceOffset, share_limit
from spark_sink.options import SourceOptions
from spark_sink.watermarks import CompanionFollower, KnownWatermarks

log = logging.getLogger(__name__)

ADMIN_CALLS = 8
"""Admin API calls the driver makes at once (each partition's end, every batch)."""
DISCOVERY_INTERVAL_S = 10.0
"""How often new partitions, and topics matching `topicsPattern`, are looked for."""


class DriverState:
    """Long-lived on Spark's driver-side Python worker: admin, watermark events, acknowledging consumers."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.settings = options.settings()
        self.admin = PulsarAdmin(self.settings)
        self.client = self.settings.client(**options.client_options)
        self.known = KnownWatermarks()
        incarnations = Incarnations(self.admin, lambda topic, partition: self.known.reset((topic, partition)),
                                    reader="the Spark source")  # fmt: skip
        self.follower = CompanionFollower(self.client, self.known, incarnations)
        self.last_end: SourceOffset | None = None
        self.available_now: dict[PartitionKey, Entry | None] | None = None
        self.ledgers: dict[PartitionKey, Ledgers] = {}
        self._stats: dict[PartitionKey, dict[str, Any]] = {}
        self._partitions: list[PartitionKey] = []
        self._next_discovery = 0.0
        self._starts: dict[PartitionKey, Entry | None] | None = None
        self._consumers: dict[PartitionKey, Any] = {}
        self._loss_reported: set[PartitionKey] = set()
        self._held: list[PartitionKey] = []
        self._pool = ThreadPoolExecutor(ADMIN_CALLS, thread_name_prefix="pulsar-watermark-admin")
        self.partitions()

    # -- what is read --------------------------------------------------------------------------------

    def partitions(self) -> list[PartitionKey]:
        """Every partition of every topic read; new topics and partitions are found every few seconds."""
        if time.monotonic() < self._next_discovery:
            return self._partitions
        topics = list(self.options.topics)
        if self.options.pattern is not None:
            topics += self._matching_topics()
        keys: list[PartitionKey] = []
        for topic in topics:
            try:
                count = self.admin.partitions(topic)
                if count == 0:
                    self.admin.internal_stats(topic)  # TopicNotFound if it does not exist
            except TopicNotFound:
                if self.options.pattern is not None or self._partitions:
                    continue  # deleted since: what was read stays in the offsets
                raise ValueError(f"topic {topic} does not exist; create it first or check option 'topic'") from None
            keys += [(topic, index) for index in range(count)] if count else [(topic, -1)]
        new = [key for key in keys if key not in self._partitions]
        if new:
            topics_new = sorted({topic for topic, _ in new})
            with explained(service_url=self.options.service_url, topic=topics_new[0], doing="read watermark events of"):
                self.follower.follow(topics_new)
            if self._partitions:
                log.info("reading new partitions %s from their start", new)
        self._partitions = sorted(set(self._partitions) | set(keys))
        self._next_discovery = time.monotonic() + DISCOVERY_INTERVAL_S
        return self._partitions

    def _matching_topics(self) -> list[str]:
        assert self.options.pattern is not None
        found = set()
        for name in self.admin.list_topics(self.options.pattern_namespace):
            base, _ = base_topic_and_partition(name)
            local = TopicName.parse(base).local
            if not is_watermark_topic(base) and not local.startswith("__") and self.options.pattern.fullmatch(base):
                found.add(base)
        return sorted(found)

    def starting_positions(self) -> dict[PartitionKey, Entry | None]:
        """Where a new query starts (`startingOffsets`); the subscription is created there too."""
        if self._starts is not None:
            return self._starts
        keys = self.partitions()
        for key in keys:
            self._subscription_consumer(key)
        wanted = self.options.starting_offsets
        latest = self.ends(keys)
        starts: dict[PartitionKey, Entry | None] = {}
        for key in keys:
            start = wanted if isinstance(wanted, str) else wanted.get(key, "earliest")
            if start == "earliest":
                starts[key] = None
            elif start == "latest":
                starts[key] = latest.get(key)
            else:
                assert not isinstance(start, str)
                starts[key] = start
        self.acknowledge(SourceOffset(starts))
        self._starts = starts
        return starts

    # -- ends, limits and the watermark ----------------------------------------------------------------

    def ends(self, keys: Sequence[PartitionKey]) -> dict[PartitionKey, Entry | None]:
        """Each partition's last entry (admin API, keep-alive connections, the partitions' calls side by side:
        a batch waits for about one round trip, not one per partition); ledgers are kept for limits and splits."""

        def stats_of(key: PartitionKey) -> dict[str, Any] | None:
            try:
                return self.admin.fast_internal_stats(partition_name(*key))
            except TopicNotFound:
                return None

        ends: dict[PartitionKey, Entry | None] = {}
        for key, stats in zip(keys, self._pool.map(stats_of, keys), strict=True):
            if stats is None:
                self._lost(key, "its topic was deleted")
                continue
            ledger, entry = last_confirmed_entry(stats)
            ends[key] = (ledger, entry) if entry >= 0 else None
            self.ledgers[key] = Ledgers.from_stats(stats)
            self._stats[key] = stats
        return ends

    def next_end(self, begin: SourceOffset, max_entries: int | None) -> SourceOffset:
        """The next batch's end after `begin`: every partition's last entry within the limits, and the
        broker watermark there (never below `begin`'s: it only goes up along the log)."""
        keys = self.partitions()
        ends = self.ends(keys)
        for key in keys:
            self._check_data_loss(key, begin.partitions.get(key))
        if self.available_now is not None:
            ends = {key: _min_entry(end, self.available_now.get(key)) for key, end in ends.items()}
        for key, start in begin.partitions.items():  # never back; partitions gone keep their place
            if start is not None and (ends.get(key) is None or ends[key] < start):  # type: ignore[operator]
                ends[key] = start
        starts = {key: begin.partitions.get(key) for key in ends}
        if max_entries is not None:
            ends = share_limit(starts, ends, self.ledgers, max_entries)
        found = self.known.watermark(ends)
        watermark = max(begin.watermark, NO_WATERMARK if found is None else found)
        held = self.known.held_back_by(ends)
        self._say_held_back(held, watermark)
        joined = [key for key, end in ends.items() if end is not None and begin.partitions.get(key) is None]
        if joined and begin.watermark != NO_WATERMARK:
            log.warning("%s got its first messages after the query's watermark reached %d: those below it are late "
                        "(a topic that joins late is a late joiner, like a producer)",
                        ", ".join(f"{t}" + (f" partition {p}" if p >= 0 else "") for t, p in joined[:20]),
                        begin.watermark)  # fmt: skip
        self.known.forget_before(starts)
        # How many tasks the batch is cut into, kept in its end offset for any replay; an end with nothing new to
        # read keeps the one before, so that a restart with another `minPartitions` starts no empty batch.
        tasks = self.options.min_partitions
        if begin.tasks is not None and not SourceOffset(ends).ranges_after(begin):
            tasks = begin.tasks
        return SourceOffset(ends, watermark, tuple(held), tasks)

    def _say_held_back(self, held: list[PartitionKey], watermark: int) -> None:
        """Log when the partitions holding the watermark back change: a query never stalls silently."""
        if held == self._held:
            return
        if held:
            log.warning(
                "the query's watermark is held at %s by %d partition(s) with messages but no broker watermark: %s. "
                "A topic takes part once a WatermarkProducer sends a W_SET there (plain producers never do) and "
                "the generator (`broker-ext serve`) follows it; or leave the topic out of 'topics'/'topicsPattern'",
                "none" if watermark == NO_WATERMARK else watermark, len(held),
                ", ".join(f"{t}" + (f" partition {p}" if p >= 0 else "") for t, p in held[:20]),
            )  # fmt: skip
        else:
            log.info("no partition holds the query's watermark back any more (now %s)", watermark)
        self._held = held

    def ledgers_of(self, key: PartitionKey) -> Ledgers:
        """A partition's ledgers (entry counts), as last read; read now for a batch replayed after a restart."""
        if key not in self.ledgers:
            self.ends([key])
        return self.ledgers.get(key) or Ledgers([])

    def _check_data_loss(self, key: PartitionKey, start: Entry | None) -> None:
        """Entries after `start` that Pulsar deleted before the query read them: fail (`failOnDataLoss`,
        the default) or say so once.

        Pulsar deletes whole ledgers, from the oldest, once every subscription has acknowledged them;
        the query acknowledges only what Spark has finished. So entries after `start` can be gone only
        if `start`'s ledger is gone and something else (TTL, a backlog quota, another consumer) moved
        the subscription past the start of the first ledger left. (Our own acknowledgement of a
        ledger's last entry shows as "(next ledger, -1)" once that ledger is deleted: not a loss.)
        """
        cursor = (self._stats.get(key, {}).get("cursors") or {}).get(self.options.subscription)
        first = self.ledgers[key].first if key in self.ledgers else None
        if start is None or not cursor or first is None or start[0] >= first:
            return
        acknowledged = mark_delete_of(cursor)
        if acknowledged > (first, -1):
            self._lost(key, f"ledger {start[0]} with entries after {start} was deleted (the subscription is at "
                            f"{acknowledged}: retention, a TTL or a backlog quota moved it)")  # fmt: skip

    def _lost(self, key: PartitionKey, why: str) -> None:
        message = (
            f"{partition_name(*key)}: data may have been lost: {why}. Set option failOnDataLoss to false to "
            "go on from what is left, or keep more with a retention policy on the namespace"
        )
        if self.options.fail_on_data_loss:
            raise RuntimeError(message)
        if key not in self._loss_reported:
            self._loss_reported.add(key)
            log.warning("%s", message)

    # -- the subscription ------------------------------------------------------------------------------

    def _subscription_consumer(self, key: PartitionKey) -> Any:
        """A consumer per partition that only acknowledges (and so creates the subscription)."""
        if key not in self._consumers:
            initial = (
                pulsar.InitialPosition.Latest if self.options.starting_position == "latest"
                else pulsar.InitialPosition.Earliest
            )  # fmt: skip
            name = partition_name(*key)
            with explained(service_url=self.options.service_url, topic=name, doing="subscribe to"):
                self._consumers[key] = self.client.subscribe(
                    name, self.options.subscription,
                    consumer_type=pulsar.ConsumerType.Failover, receiver_queue_size=1, initial_position=initial,
                )  # fmt: skip
        return self._consumers[key]

    def acknowledge(self, offset: SourceOffset) -> None:
        """The subscription acknowledged up to `offset`, a batch Spark has finished (cumulatively, per partition)."""
        for key, position in offset.partitions.items():
            if position is not None and position[1] >= 0:
                self._subscription_consumer(key).acknowledge_cumulative(
                    pulsar.MessageId(max(key[1], 0), position[0], position[1], -1)
                )

    def close(self) -> None:
        self.follower.close()
        for consumer in self._consumers.values():
            consumer.close()
        self.client.close()
        self._pool.shutdown()
        self.admin.close()


def _min_entry(a: Entry | None, b: Entry | None) -> Entry | None:
    return None if a is None or b is None else min(a, b)
