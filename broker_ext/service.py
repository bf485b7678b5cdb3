"""`broker-ext serve`: discovers topics and runs one partition worker for each partition."""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import pulsar

from broker_ext.config import GeneratorConfig, warn_about_snapshot_key
from broker_ext.dispatch import WatermarkDispatcher
from broker_ext.metrics import GeneratorMetrics
from broker_ext.partition_worker import Context, PartitionWorker
from pulsar_access.admin import AdminError, PulsarAdmin, TopicNotFound
from pulsar_access.settings import PulsarSettings
from pulsar_access.topics import TopicName, full_name, is_watermark_topic, partition_names

log = logging.getLogger(__name__)

FAILURE_REPEAT_S = 60.0
"""While the broker stays away, repeat its warning this often (not at every retry)."""


def is_followable(topic: str, watermark_namespace: str | None = None) -> bool:
    """Data topics only: not our companion topics, not Pulsar's system topics."""
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
        self.dispatcher = WatermarkDispatcher(self.client, self.admin, config.instance_id, config.watermark_namespace)
        self.ctx = Context(self.client, self.admin, config, self.dispatcher, self.metrics)
        self.workers: dict[str, PartitionWorker] = {}
        self._stop = threading.Event()
        self._metrics_started = False
        self._missing_topics: set[str] = set()
        self._failing_since: float | None = None
        self._last_failure_log = 0.0

    def partition_topics(self) -> set[str]:
        """Every partition (or non-partitioned topic) the configuration names, as it is now."""
        found: set[str] = set()
        for namespace in self.config.namespaces:
            found.update(self.admin.list_topics(namespace))
        for topic in self.config.topics:
            name = full_name(topic)
            try:
                partitions = self.admin.partitions(name)
            except TopicNotFound:
                # not created yet: followed once it is; the other topics are not held up
                if name not in self._missing_topics:
                    self._missing_topics.add(name)
                    log.warning("topic %s (from --topic / WM_TOPICS) does not exist at %s; it is followed once "
                                "created (check the name if it never is)", name, self.settings.admin_url)  # fmt: skip
                continue
            self._missing_topics.discard(name)
            found.update(partition_names(name, partitions))
        return {t for t in found if is_followable(t, self.config.watermark_namespace)}

    def sync_workers(self) -> None:
        """Start workers for new partitions, stop those of deleted ones."""
        wanted = self.partition_topics()
        for topic in sorted(wanted - self.workers.keys()):
            log.info("following %s", topic)
            worker = PartitionWorker(topic, self.ctx)
            self.workers[topic] = worker
            worker.start()
        for topic in sorted(self.workers.keys() - wanted):
            log.info("%s is gone; no longer following it", topic)
            self.workers.pop(topic).stop()
        for topic, worker in list(self.workers.items()):
            if not worker.alive:
                self.workers.pop(topic)

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
        while not self._stop.is_set():
            try:
                self.dispatcher.ensure_namespace()  # once it succeeds: consumers may read the tables' topics
                self.sync_workers()
            except AdminError as exc:
                self._discovery_failed(exc)
            else:
                self._discovery_succeeded()
            self._stop.wait(self.config.discovery_interval_s)
        self.close()

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
                     self.settings.admin_url, time.monotonic() - self._failing_since, len(self.workers))  # fmt: skip
            self._failing_since = None

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        for worker in self.workers.values():
            worker._stop.set()
        for worker in self.workers.values():
            worker.stop()
        self.workers.clear()
        self.dispatcher.close()
        with contextlib.suppress(pulsar.PulsarException):
            self.client.close()
        self.admin.close()
