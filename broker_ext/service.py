"""`broker-ext serve`: discovers topics and runs one partition worker for each partition."""

from __future__ import annotations

import contextlib
import logging
import threading

import pulsar

from broker_ext.admin import AdminError, PulsarAdmin, TopicName
from broker_ext.config import GeneratorConfig
from broker_ext.dispatch import WatermarkDispatcher
from broker_ext.metrics import GeneratorMetrics
from broker_ext.partition_worker import Context, PartitionWorker
from broker_ext.settings import PulsarSettings
from watermark_core.protocol import is_watermark_topic

log = logging.getLogger(__name__)


def is_followable(topic: str) -> bool:
    """Data topics only: not our companion topics, not Pulsar's system topics."""
    local = TopicName.parse(topic).local
    return topic.startswith("persistent://") and not is_watermark_topic(topic) and not local.startswith("__")


class GeneratorService:
    """The watermark generator: follows the configured topics until stopped."""

    def __init__(self, config: GeneratorConfig, settings: PulsarSettings | None = None) -> None:
        self.config = config
        self.settings = settings or PulsarSettings.from_env()
        self.client = self.settings.client(operation_timeout_seconds=10)
        self.admin = PulsarAdmin(self.settings)
        self.metrics = GeneratorMetrics()
        self.dispatcher = WatermarkDispatcher(self.client, self.admin, config.instance_id)
        self.ctx = Context(self.client, self.admin, config, self.dispatcher, self.metrics)
        self.workers: dict[str, PartitionWorker] = {}
        self._stop = threading.Event()

    def partition_topics(self) -> set[str]:
        """Every partition (or non-partitioned topic) the configuration names, as it is now."""
        found: set[str] = set()
        for namespace in self.config.namespaces:
            found.update(self.admin.list_topics(namespace))
        for topic in self.config.topics:
            name = TopicName.parse(topic).full
            partitions = self.admin.partitions(name)
            found.update(f"{name}-partition-{i}" for i in range(partitions)) if partitions else found.add(name)
        return {t for t in found if is_followable(t)}

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

    def run(self) -> None:
        """Discover topics every few seconds until `stop()`; errors are logged and retried."""
        self.metrics.serve(self.config.metrics_port)
        log.info("watermark generator %s following namespaces %s and topics %s on %s",
                 self.config.instance_id, list(self.config.namespaces), list(self.config.topics),
                 self.settings.service_url)  # fmt: skip
        while not self._stop.is_set():
            try:
                self.sync_workers()
            except AdminError as exc:
                log.warning("topic discovery failed: %s", exc)
            self._stop.wait(self.config.discovery_interval_s)
        self.close()

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
