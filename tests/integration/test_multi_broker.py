"""The contract on a real three-broker cluster (`make cluster-up BROKERS=3`), and what a cluster adds:
topics that move between brokers, and a broker killed while the others serve.

Every client here is pointed at one broker only (the producers and consumers at broker 1, admin calls
at broker 2), so most topics are owned by another broker: lookups and admin redirects must be
followed. Three generators run, one pointed at each broker first, sharing the partitions.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest

from consumer import WatermarkConsumer
from devtools.broker_cluster import CLUSTER_NAME, MultiBrokerCluster
from producer import WatermarkProducer
from pulsar_access.admin import PulsarAdmin
from pulsar_access.settings import PulsarSettings
from tests.integration import test_generator, test_seek
from tests.integration.generator_process import FAST
from tests.integration.helpers import wait_until, watermarks
from tests.oracle import assert_oracle_agrees, keep_history, keep_watermark_history

BROKERS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiBrokerCluster]:
    running = MultiBrokerCluster.on_free_ports(
        tmp_path_factory.mktemp("multi-broker"), BROKERS, generator_env={**FAST, "WM_NAMESPACES": "public/default"}
    )
    try:
        running.up()
        yield running
    finally:
        running.down()


@pytest.fixture(scope="module")
def settings(cluster: MultiBrokerCluster) -> PulsarSettings:
    """One broker's service URL and another's admin URL: neither owns most topics."""
    return PulsarSettings(cluster.ports[1].service_url, cluster.ports[2].admin_url)


@pytest.fixture(scope="module")
def client(settings: PulsarSettings) -> Iterator[pulsar.Client]:
    made = settings.client(operation_timeout_seconds=60)
    yield made
    made.close()


@pytest.fixture(scope="module")
def multi_admin(settings: PulsarSettings) -> Iterator[PulsarAdmin]:
    made = PulsarAdmin(settings)
    yield made
    made.close()


def owned_elsewhere(cluster: MultiBrokerCluster, admin: PulsarAdmin, topic: str, avoid: set[int]) -> int:
    """Move `topic`'s bundle to a broker whose index is not in `avoid`; its index."""
    return cluster.move_elsewhere(admin, topic, avoid)


# -- the contract's scenarios, on three brokers -------------------------------------------------------


def test_every_broker_serves_and_topics_spread_over_them(
    cluster: MultiBrokerCluster, multi_admin: PulsarAdmin, client: pulsar.Client
) -> None:
    assert len(multi_admin.brokers(CLUSTER_NAME)) == BROKERS
    owners = set()
    for i in range(24):
        topic = f"persistent://public/default/spread-{i}-{time.monotonic_ns()}"
        multi_admin.create_topic(topic)
        owners.add(multi_admin.owner(topic))
    assert len(owners) >= 2, f"24 topics all on {owners}: one broker, not a cluster"


def test_min_over_producers_and_idle(client: pulsar.Client, multi_admin: PulsarAdmin, topic: str) -> None:
    test_generator.test_watermark_is_the_minimum_over_active_producers_at_each_subscriptions_position(
        client, multi_admin, topic
    )


def test_minimum_over_partitions_owned_by_different_brokers(
    client: pulsar.Client, multi_admin: PulsarAdmin, topic: str
) -> None:
    test_generator.test_a_consumer_of_a_partitioned_topic_sees_the_minimum_over_partitions(client, multi_admin, topic)


def test_transactions(
    settings: PulsarSettings, client: pulsar.Client, multi_admin: PulsarAdmin, tmp_path: Path
) -> None:
    namespace = f"public/ns-multi-{time.monotonic_ns() % 10**9}"
    multi_admin.create_namespace(namespace)
    multi_admin.set_namespace_retention(namespace)
    keep_watermark_history(multi_admin)
    test_generator.test_watermark_transactions_commit_abort_and_timeout(
        settings, client, multi_admin, namespace, tmp_path
    )


def test_seek_with_a_consumer_attached(cluster: MultiBrokerCluster, client: pulsar.Client, topic: str) -> None:
    test_seek.test_seek_back_by_message_id_with_the_consumer_attached(client, topic)


def test_spark_windows_exact(
    spark: object, settings: PulsarSettings, client: pulsar.Client, multi_admin: PulsarAdmin, topic: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    """Two partitions (on different brokers, most likely), two producers: each window's count is exact, and the
    last window is closed by the watermark alone. The query is pointed at one broker by its options."""
    import random
    from collections import Counter

    from pyspark.sql import functions as F

    import spark_sink
    from tests.integration.test_spark import BASE, Windows, _produce

    multi_admin.create_topic(topic, partitions=2)
    producers = [WatermarkProducer(client, topic, producer_name=f"multi-spark-{i}") for i in range(2)]
    for producer in producers:
        producer.new_watermark().event_time(BASE).send()
    sink = Windows()
    counts = (
        spark_sink.read_stream(spark, topic=topic, subscription="spark", serviceUrl=settings.service_url,
                               adminUrl=settings.admin_url)
        .groupBy(F.window("event_time", "10 seconds"), "key").count()
    )  # fmt: skip
    query = (
        counts.writeStream.outputMode("append").foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(processingTime="500 milliseconds").start()
    )  # fmt: skip
    try:
        rng = random.Random(11)
        truth: Counter[tuple[int, str]] = Counter()
        truth += _produce(producers[0], ["a", "b"], 0, 22, rng)
        truth += _produce(producers[1], ["c"], 0, 22, rng)
        for producer in producers:  # no data after this: only the watermark closes the window [20 s, 30 s)
            producer.new_watermark().event_time(BASE + 31_000).send()
        wait_until(lambda: sink.counts().keys() >= truth.keys(), timeout_s=120, what="every window to close")
    finally:
        query.stop()
    assert sink.counts() == dict(truth)
    assert len(sink.emitted()) == len(set(sink.emitted())), "a window was emitted twice"
    for producer in producers:
        producer.close()


# -- what a cluster adds --------------------------------------------------------------------------


class Checker(test_generator.Checker):
    """Records when each watermark arrived, beside the premature-watermark check."""

    def __init__(self) -> None:
        super().__init__()
        self.arrivals: list[float] = []

    def received_watermark(self, consumer: WatermarkConsumer, watermark: object) -> None:
        self.arrivals.append(time.monotonic())
        super().received_watermark(consumer, watermark)  # type: ignore[arg-type]


def _stream_in_background(producer: WatermarkProducer, count: int) -> tuple[threading.Thread, threading.Event]:
    stop = threading.Event()
    thread = threading.Thread(target=test_generator._stream, args=(producer, count, stop, 0.01), daemon=True)
    thread.start()
    return thread, stop


def test_a_topic_moved_between_brokers_mid_stream_keeps_exact_watermarks(
    cluster: MultiBrokerCluster, client: pulsar.Client, multi_admin: PulsarAdmin, topic: str
) -> None:
    keep_history(multi_admin, topic)
    checker = Checker()
    consumer = WatermarkConsumer(client, topic, "sub", listener=checker)
    producer = WatermarkProducer(client, topic, producer_name="mover")
    count = 1_200
    thread, stop = _stream_in_background(producer, count)
    gaps = []
    try:
        wait_until(lambda: len(watermarks(checker)) >= 2, timeout_s=30, what="watermarks before the first move")
        for move in range(3):
            moved_at = time.monotonic()
            owned_elsewhere(cluster, multi_admin, topic, avoid=set())
            wait_until(lambda t=moved_at: any(a > t for a in checker.arrivals), timeout_s=30,
                       what=f"a watermark after move {move}")  # fmt: skip
            gaps.append(min(a for a in checker.arrivals if a > moved_at) - moved_at)
        multi_admin.split_bundle("public/default", multi_admin.bundle_of(topic))
        thread.join(timeout=120)
        wait_until(lambda: (watermarks(checker) or [0])[-1] == 1_000_000 + count, timeout_s=60,
                   what="the final watermark after the moves")  # fmt: skip
        assert_oracle_agrees(client, multi_admin, topic)
    finally:
        stop.set()
        thread.join(timeout=10)
    # a move closes the topic on its broker: acknowledgements still in the client's batch are lost and
    # Pulsar redelivers those messages (at least once); each copy is checked against the watermark held
    assert set(checker.messages()) == {f"m{i}".encode() for i in range(count)}
    assert checker.violations == []
    test_generator.assert_monotonic(watermarks(checker))
    print(f"watermark gap after each move: {[round(g * 1000) for g in gaps]} ms")
    consumer.close()
    producer.close()


def test_a_broker_killed_mid_stream_while_the_others_serve(
    cluster: MultiBrokerCluster, multi_admin: PulsarAdmin, topic: str
) -> None:
    """The broker that owns the topic dies with -9; the others take its bundles once its metadata session
    expires. Clients given every broker (as a deployment should) go on; nothing premature, nothing lost."""
    keep_history(multi_admin, topic)
    victim = owned_elsewhere(cluster, multi_admin, topic, avoid={2})  # not the admin calls' broker
    client = PulsarSettings(cluster.service_url).client(operation_timeout_seconds=60)
    checker = Checker()
    consumer = WatermarkConsumer(client, topic, "sub", listener=checker)
    producer = WatermarkProducer(client, topic, producer_name="survivor", send_timeout_millis=60_000)
    count = 800
    thread, stop = _stream_in_background(producer, count)
    try:
        wait_until(lambda: len(watermarks(checker)) >= 2, timeout_s=30, what="watermarks before the kill")
        cluster.kill_broker(victim)
        killed_at = time.monotonic()
        wait_until(lambda: cluster.owner(multi_admin, topic) not in (None, cluster.ports[victim].admin_url),
                   timeout_s=60, what="another broker to own the topic")  # fmt: skip
        thread.join(timeout=180)
        wait_until(lambda: (watermarks(checker) or [0])[-1] == 1_000_000 + count, timeout_s=90,
                   what="the final watermark after the kill")  # fmt: skip
        print(f"first watermark {min(a for a in checker.arrivals if a > killed_at) - killed_at:.1f} s after the kill")
        assert_oracle_agrees(client, multi_admin, topic)
    finally:
        stop.set()
        thread.join(timeout=10)
        cluster.start_broker(victim)
    assert set(checker.messages()) == {f"m{i}".encode() for i in range(count)}
    assert checker.violations == []
    # no monotonic check: a kill -9 loses the acknowledgements the broker had not persisted, the
    # subscription's mark-delete position goes back, and the watermark is recomputed there (a move back)
    consumer.close()
    producer.close()
    client.close()


def test_each_brokers_plugin_tells_only_what_it_serves_and_a_moved_topic_moves_between_them(
    cluster: MultiBrokerCluster, client: pulsar.Client, multi_admin: PulsarAdmin, topic: str
) -> None:
    """The broker plugin on a cluster: the topic is reported by its owner's plugin alone; after a move, the old
    owner says it is gone and the new one reports it, with the same positions."""
    from tests.integration.test_plugin import Changes

    checker = Checker()
    consumer = WatermarkConsumer(client, topic, "sub", listener=checker)
    producer = WatermarkProducer(client, topic, producer_name="mover")
    producer.new_watermark().event_time(1_000).send()
    admins = [PulsarAdmin(PulsarSettings(p.service_url, p.admin_url)) for p in cluster.ports]
    views = [Changes(a) for a in admins]
    try:
        owner = cluster.owner_index(multi_admin, topic, timeout_s=60)
        views[owner].until(lambda: topic in views[owner].topics, "the topic, by its owner (the generator follows it)")
        for i, view in enumerate(views):
            view.poll(0)
            assert (topic in view.topics) == (i == owner), i
        before = views[owner].topics[topic]["cursors"]["sub"]
        to = owned_elsewhere(cluster, multi_admin, topic, avoid=set())
        views[owner].until(lambda: topic not in views[owner].topics, "the moved topic gone from its old broker")
        views[to].until(lambda: topic in views[to].topics, "the moved topic at its new broker")
        assert views[to].topics[topic]["cursors"]["sub"] >= before
        producer.new_watermark().event_time(2_000).send()
        wait_until(lambda: 2_000 in watermarks(checker), timeout_s=30,
                   what="the watermark after the move, from the new broker's plugin")  # fmt: skip
    finally:
        for a in admins:
            a.close()
        consumer.close()
        producer.close()
