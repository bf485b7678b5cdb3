"""`broker-ext serve`: discovers topics and follows every partition on a few threads.

Threads, whatever the number of partitions: this service's discovery loop; the event loop that
feeds every partition's engine and carries out its commands (broker_ext/loop.py); a pool for
blocking Pulsar calls (subscribing, creating producers, a rebuild's reads) and one for admin calls
(broker_ext/intake/admin_polling.py); the Pulsar client's own I/O and listener threads; the metrics server.
Messages reach the loop through each consumer's message listener.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pulsar

from broker_ext.claims import WAIT_S, Claims, Follows
from broker_ext.config import GeneratorConfig, warn_about_snapshot_key
from broker_ext.dispatch import WatermarkDispatcher
from broker_ext.intake.admin_polling import CursorPoller
from broker_ext.intake.plugin_cursors import PluginCursors
from broker_ext.intake.source import CursorSource
from broker_ext.loop import EventLoop
from broker_ext.metrics import GeneratorMetrics
from broker_ext.partition_io import Context, PartitionIO
from pulsar_access.admin import AdminError, PulsarAdmin, TopicNotFound
from pulsar_access.settings import PulsarSettings
from pulsar_access.topics import TopicName, full_name, is_watermark_topic, partition_names
from watermark_core.protocol import Position

log = logging.getLogger(__name__)

FAILURE_REPEAT_S = 60.0
"""While the broker stays away, repeat its warning this often (not at every retry)."""
MIN_DISCOVERY_GAP_S = 0.2
"""Looks at the topic list that new topics ask for are at least this far apart."""
IO_THREADS = 4
ADMIN_THREADS = 3


@functools.lru_cache(maxsize=1 << 16)
def is_followable(topic: str, watermark_namespace: str | None = None) -> bool:
    """Data topics only: not our companion topics, not Pulsar's system topics.

    Cached: discovery asks it of every partition of every followed topic every few seconds.
    """
    local = TopicName.parse(topic).local
    return (
        topic.startswith("persistent://")
        and not is_watermark_topic(topic, watermark_namespace)
        and not local.startswith("__")
    )


class GeneratorService:
    """The watermark generator: follows the configured topics until stopped."""

    def __init__(self, config: GeneratorConfig, settings: PulsarSettings | None = None) -> None:
        self.config = config
        self.settings = settings or PulsarSettings.from_env()
        self.client = self.settings.client(operation_timeout_seconds=10)
        self.admin = PulsarAdmin(self.settings)
        self.metrics = GeneratorMetrics()
        self.loop = EventLoop()
        self.pool = ThreadPoolExecutor(IO_THREADS, thread_name_prefix="wm-io")
        self.admin_pool = ThreadPoolExecutor(ADMIN_THREADS, thread_name_prefix="wm-admin")
        self.dispatcher = WatermarkDispatcher(
            self.client,
            self.admin,
            config.instance_id,
            self.metrics,
            self.loop,
            self.pool,
            config.watermark_namespace,
            by_claim=config.ownership == "claim",
            fenced=lambda companion: self.claims.fenced(companion) if self.claims is not None else None,
        )
        self.follows = Follows(frozenset(config.namespaces), frozenset(full_name(t) for t in config.topics))
        self.claims: Claims | None = None
        """By claim (`--ownership claim`): which topics this instance owns (broker_ext/claims.py), on a client of its
        own whose operation timeout is how long a request waits in Pulsar's queue."""
        if config.ownership == "claim":
            self.claims = Claims(
                self.settings.client(operation_timeout_seconds=WAIT_S), self.loop, config.instance_id,
                config.watermark_namespace, gained=self._claim_gained, lost=self._claim_lost, admin=self.admin,
                pool=self.admin_pool, members_client=self.client, follows=self.follows,
            )  # fmt: skip
        self.poller = CursorPoller(
            self.loop, self.admin, self.admin_pool, poll_interval_s=config.poll_interval_s,
            idle_poll_interval_s=config.idle_poll_interval_s, stats_rate=config.stats_rate,
            count=lambda call: self.metrics.admin_calls.labels(call).inc(), first_poll_s=config.first_poll_s,
            ack_watch_interval_s=config.ack_watch_interval_s,
        )  # fmt: skip
        self.cursors: CursorSource = self.poller
        if config.cursor_source == "auto":
            self.cursors = PluginCursors(self.loop, self.admin, self.poller, self.admin_pool,
                                         count=lambda call: self.metrics.admin_calls.labels(call).inc(),
                                         fresh=self._fresh_topics, namespaces=self._namespaces(),
                                         intake=config.intake == "plugin")  # fmt: skip
        else:
            log.info("reading cursor positions through the admin API (--cursor-source admin): one internal-stats "
                     "call per topic and acknowledgement (docs/OPERATIONS.md)")  # fmt: skip
        self.ctx = Context(self.client, self.admin, config, self.dispatcher, self.metrics, self.loop, self.pool,
                           self.cursors, by_claim=self.claims is not None)  # fmt: skip
        self.partitions: dict[str, PartitionIO] = {}
        """Every partition followed, by topic name; touched only on the loop's thread."""
        self._of_base: dict[str, dict[str, PartitionIO]] = {}
        """The same partitions by base topic (a claim names base topics: no scan of every partition per claim)."""
        self._followed_at: dict[str, float] = {}
        """When each partition was followed (monotonic; loop thread): a list asked for before it does not drop it."""
        self._stop = threading.Event()
        self._discover_now = threading.Event()
        """Set to look at the topic list before the next discovery interval (a new topic, stopping)."""
        self._metrics_started = False
        self._missing_topics: set[str] = set()
        self._failing_since: float | None = None
        self._last_failure_log = 0.0

    def partition_topics(self) -> set[str]:
        """Every partition (or non-partitioned topic) the configuration names, as it is now, and by claim those
        followed for other generators (the topics of our claims' groups that they follow, broker_ext/claims.py)."""
        found = self._listed(self.follows, warn=True)
        if self.claims is not None and (adopted := self.claims.adoptions()) != Follows():
            claims = self.claims
            found |= {t for t in self._listed(adopted, warn=False) if claims.adopts(t.split("-partition-")[0])}
        return {t for t in found if is_followable(t, self.config.watermark_namespace)}

    def _listed(self, follows: Follows, *, warn: bool) -> set[str]:
        """The partitions of the namespaces and topics; a topic not created yet is warned about (`warn`) and followed
        once it is, the other topics are not held up."""
        found: set[str] = set()
        for namespace in sorted(follows.namespaces):
            found.update(self.admin.list_topics(namespace))
        for name in sorted(follows.topics):
            try:
                partitions = self.admin.partitions(name)
            except TopicNotFound:
                if warn and name not in self._missing_topics:
                    self._missing_topics.add(name)
                    log.warning("topic %s (from --topic / WM_TOPICS) does not exist at %s; it is followed once "
                                "created (check the name if it never is)", name, self.settings.admin_url)  # fmt: skip
                continue
            self._missing_topics.discard(name)
            found.update(partition_names(name, partitions))
        return found

    def sync_partitions(self) -> None:
        """Follow new partitions, drop those of deleted topics (on the loop), subscribe where that failed."""
        listed_at = time.monotonic()
        wanted = self.partition_topics()
        self.loop.post(lambda: self._sync(wanted, listed_at))

    def _sync(self, wanted: set[str], listed_at: float) -> None:
        for topic in [t for t, p in self.partitions.items() if p.closed]:  # restarted (a re-created topic)
            self._unfollow(topic)
        self._follow(wanted)
        # a topic followed since the list was asked for (a plugin announced it) is not in it yet, not gone
        for topic in sorted(t for t in self.partitions.keys() - wanted if self._followed_at.get(t, 0.0) < listed_at):
            gone = self._unfollow(topic)
            if gone.base_topic in self.follows:
                log.info("%s is gone; no longer following it", topic)
            else:  # followed for another generator while we held its group's claim
                log.info("%s: another generator holds its group's claim now; no longer following it", topic)
            gone.close()
            if gone.base_topic not in self._of_base:
                self.dispatcher.forget(gone.base_topic)
                if self.claims is not None:
                    self.claims.drop(gone.base_topic)
        for partition in self.partitions.values():
            partition.subscribe()  # again, where it failed (a broker away)

    def _follow(self, topics: set[str], *, fresh: bool = False) -> None:
        """Follow the partitions not followed yet (on the loop); `fresh`: they appeared while we run."""
        for topic in sorted(topics - self.partitions.keys()):
            log.info("following %s", topic)
            partition = PartitionIO(topic, self.ctx, fresh=fresh)
            self.partitions[topic] = partition
            self._of_base.setdefault(partition.base_topic, {})[topic] = partition
            self._followed_at[topic] = time.monotonic()
            self.cursors.add(partition)
            if self.claims is not None:
                if self.claims.held(partition.base_topic) is not None:
                    partition.claim(True)
                else:
                    self.claims.want(partition.base_topic, home=self._served_here(partition))
            partition.subscribe()

    def _unfollow(self, topic: str) -> PartitionIO:
        partition = self.partitions.pop(topic)
        self._followed_at.pop(topic, None)
        siblings = self._of_base[partition.base_topic]
        del siblings[topic]
        if not siblings:
            del self._of_base[partition.base_topic]
        return partition

    def _served_here(self, partition: PartitionIO) -> bool:
        """Whether this instance's own broker (the first of several admin URLs) serves the partition, as its plugin
        reports."""
        bases = self.admin.admin_bases
        return len(bases) > 1 and self.cursors.served_by(partition) == bases[0]

    def _claim_gained(self, companion: str, topics: frozenset[str], producer: pulsar.Producer) -> None:
        if self.claims is not None and self.claims.adoptions() != Follows():
            self._discover_now.set()  # the group's topics other generators follow are ours to publish now
        self.dispatcher.claimed(companion, producer)
        for base_topic in topics:
            for partition in list(self._of_base.get(base_topic, {}).values()):
                partition.claim(True)

    def _claim_lost(self, companion: str, topics: frozenset[str]) -> None:
        self.dispatcher.unclaimed(companion)
        for base_topic in topics:
            for partition in list(self._of_base.get(base_topic, {}).values()):
                partition.claim(False)

    def head_position(self, topic: str) -> Position | None:
        """How far the engine of `topic` has read (for benchmarks; a racy read from another thread)."""
        partition = self.partitions.get(topic)
        return partition.engine.head_position if partition is not None else None

    def start_metrics(self) -> None:
        """Serve /metrics; a port in use is a ValueError that names the flag to change."""
        if self._metrics_started:
            return
        try:
            self.metrics.serve(self.config.metrics_port)
        except OSError as exc:
            raise ValueError(
                f"cannot serve metrics on 127.0.0.1:{self.config.metrics_port} ({exc.strerror or exc}); choose "
                "another port with --metrics-port or WM_METRICS_PORT (0 turns metrics off)"
            ) from None
        self._metrics_started = True

    def run(self) -> None:
        """Discover topics every few seconds until `stop()`; errors are logged and retried.

        While the admin API does not answer (broker down, wrong PULSAR_ADMIN_URL) the generator keeps
        trying: the first failure is logged as a warning that names the fix, then once a minute, and
        the recovery is logged when the broker answers again.
        """
        self.start_metrics()
        log.info("watermark generator %s following namespaces %s and topics %s on %s (admin %s), publishing "
                 "watermarks in namespace %s, snapshots signed with %s", self.config.instance_id,
                 list(self.config.namespaces), list(self.config.topics), self.settings.service_url,
                 self.settings.admin_url, self.config.watermark_namespace, self.config.snapshot_keys)  # fmt: skip
        warn_about_snapshot_key(self.config)
        self.loop.start()
        self.cursors.start()
        if self.claims is not None:
            self.claims.start()
        while not self._stop.is_set():
            try:
                self.dispatcher.ensure_namespace()  # once it succeeds: consumers may read the tables' topics
                self.sync_partitions()
            except AdminError as exc:
                self._discovery_failed(exc)
            else:
                self._discovery_succeeded()
            if self._discover_now.wait(self.config.discovery_interval_s):
                self._stop.wait(MIN_DISCOVERY_GAP_S)  # new topics come in bursts: one look serves them all
            self._discover_now.clear()
        self.close()

    def _namespaces(self) -> list[str]:
        """Every namespace with something we follow: the plugins tell us of their topics only."""
        of_topics = {TopicName.parse(full_name(t)).tenant_namespace for t in self.config.topics}
        return sorted(set(self.config.namespaces) | of_topics)

    def _fresh_topics(self, topics: list[str]) -> None:
        """A broker's plugin saw a producer or consumer on topics no generator follows (on the loop): follow those that
        are ours (in a namespace or of a topic we follow, or that we follow for another generator) at once,
        so a new topic's first watermark waits for no look at the topic list; the next look, soon after,
        confirms them."""
        claims = self.claims
        ours = {
            t for t in topics
            if ((base := t.split("-partition-")[0]) in self.follows or (claims is not None and claims.adopts(base)))
            and is_followable(t, self.config.watermark_namespace)
        }  # fmt: skip
        if ours:
            self._follow(ours, fresh=True)
            self._discover_now.set()

    def _discovery_failed(self, exc: AdminError) -> None:
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
            self._last_failure_log = now
            log.warning("topic discovery failed: %s; retrying every %.0f s", exc, self.config.discovery_interval_s)
        elif now - self._last_failure_log >= FAILURE_REPEAT_S:
            self._last_failure_log = now
            log.warning("topic discovery still failing after %.0f s: %s", now - self._failing_since, exc)
        else:
            log.debug("topic discovery failed: %s", exc)

    def _discovery_succeeded(self) -> None:
        if self._failing_since is not None:
            log.info("the admin API at %s answers again after %.0f s; following %d partitions",
                     self.settings.admin_url, time.monotonic() - self._failing_since, len(self.partitions))  # fmt: skip
            self._failing_since = None

    def stop(self) -> None:
        self._stop.set()
        self._discover_now.set()

    def close(self) -> None:
        closed = threading.Event()

        def close_partitions() -> None:
            for partition in self.partitions.values():
                partition.close()
            self.partitions.clear()
            self._of_base.clear()
            closed.set()

        if self.loop.alive:
            self.loop.post(close_partitions)
            closed.wait(10)
        else:  # never ran (a test's or a bench's service, driven on its own thread)
            close_partitions()
        self.cursors.close()
        self.loop.stop()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.admin_pool.shutdown(wait=False, cancel_futures=True)
        self.dispatcher.close()
        if self.claims is not None:
            self.claims.close()
        with contextlib.suppress(pulsar.PulsarException):
            self.client.close()
        self.admin.close()
