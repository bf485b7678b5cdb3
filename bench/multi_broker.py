"""Issue 24: the generator on a real three-broker cluster (`make cluster-up BROKERS=3`).

- topic moves: a topic with a producer asserting every 100 ms and an acknowledging `WatermarkConsumer`
  is moved to another broker 20 times (an unload with a destination broker); for each, the time from
  the unload to the next watermark at the consumer (p50 and max);
- ownership: 300 non-partitioned topics spread over 3 brokers, 3 generator instances each pointed at
  its own broker first: the largest share of the topics one instance owns.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from pathlib import Path

from bench.common import say
from bench.generator_scale import ownership_share
from consumer import Watermark, WatermarkConsumer, WatermarkListener
from devtools.broker_cluster import BrokerPorts, MultiBrokerCluster
from devtools.local_cluster import free_listen_port
from producer import WatermarkProducer
from pulsar_access.admin import PulsarAdmin
from pulsar_access.settings import PulsarSettings

MOVES = 20
STEADY_S = 2.0
ASSERT_EVERY_S = 0.1


class _Arrivals(WatermarkListener):
    """When each watermark reached the listener; acknowledges every message."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def received(self, consumer: WatermarkConsumer, message: object) -> None:
        consumer.acknowledge(message)

    def received_watermark(self, consumer: WatermarkConsumer, watermark: Watermark) -> None:
        self.times.append(time.monotonic())


def topic_move_gaps(cluster: MultiBrokerCluster, admin: PulsarAdmin, moves: int = MOVES) -> list[float]:
    """Seconds from each unload to the next watermark at the consumer."""
    client = cluster.settings().client(operation_timeout_seconds=60)
    topic = f"persistent://public/default/move-{time.monotonic_ns()}"
    admin.create_topic(topic)
    arrivals = _Arrivals()
    consumer = WatermarkConsumer(client, topic, "mover", listener=arrivals)
    producer = WatermarkProducer(client, topic, producer_name="mover")
    stop = threading.Event()

    def assert_steadily() -> None:
        event_time = 1_000
        while not stop.is_set():
            producer.send(b"x", event_timestamp=event_time)
            producer.new_watermark().event_time(event_time).send()
            event_time += 100
            time.sleep(ASSERT_EVERY_S)

    thread = threading.Thread(target=assert_steadily, daemon=True)
    thread.start()
    gaps = []
    try:
        for move in range(moves):
            time.sleep(STEADY_S)
            owner = cluster.owner_index(admin, topic)
            moved_at = time.monotonic()
            cluster.move_topic(admin, topic, (owner + 1) % len(cluster.ports))
            deadline = moved_at + 60
            while not any(t > moved_at for t in arrivals.times) and time.monotonic() < deadline:
                time.sleep(0.01)
            after = [t for t in arrivals.times if t > moved_at]
            gaps.append(after[0] - moved_at if after else 60.0)
            say(f"  move {move + 1}/{moves}: next watermark after {gaps[-1] * 1000:.0f} ms")
    finally:
        stop.set()
        thread.join(timeout=10)
        consumer.close()
        producer.close()
        client.close()
    return gaps


def run(_settings: PulsarSettings) -> dict[str, float | int | str]:
    """Starts a cluster of its own (the standalone the other groups use is not a cluster)."""
    with tempfile.TemporaryDirectory(prefix="wm-bench-multi-") as state:
        cluster = MultiBrokerCluster(
            state_dir=Path(state),
            ports=[BrokerPorts(free_listen_port(), free_listen_port()) for _ in range(3)],
            bookie_ports=[free_listen_port()], zookeeper_port=free_listen_port(),
            generator_env={"WM_METRICS_PORT": "0"},
        )  # fmt: skip
        started = time.monotonic()
        cluster.up()
        up_s = time.monotonic() - started
        admin = PulsarAdmin(cluster.settings())
        client = cluster.settings().client()
        try:
            say(f"topic moved between brokers {MOVES} times")
            gaps = topic_move_gaps(cluster, admin)
            say("ownership over 3 generator instances, 300 topics, 3 brokers")
            rotated = [cluster.ports[i:] + cluster.ports[:i] for i in range(3)]
            instance_settings = [
                PulsarSettings("pulsar://" + ",".join(f"127.0.0.1:{p.service}" for p in order),
                               "http://" + ",".join(f"127.0.0.1:{p.web}" for p in order))
                for order in rotated
            ]  # fmt: skip
            with tempfile.TemporaryDirectory(prefix="wm-bench-multi-logs-") as logs:
                share, owners = ownership_share(cluster.settings(), client, admin, Path(logs),
                                                instance_settings=instance_settings)  # fmt: skip
        finally:
            client.close()
            admin.close()
            cluster.down()
    return {
        "multi_broker_cluster_up_s": round(up_s, 1),
        "multi_broker_cluster_up_s_how": "make cluster-up BROKERS=3 on this machine, jars cached: ZooKeeper, metadata "
        "set-up, a bookie, 3 brokers serving lookups and 3 generators started",
        "watermark_gap_on_topic_move_p50_ms": round(statistics.median(gaps) * 1000),
        "watermark_gap_on_topic_move_max_ms": round(max(gaps) * 1000),
        "watermark_gap_on_topic_move_p50_ms_how": f"3 brokers; one topic, a W_SET every {ASSERT_EVERY_S * 1000:.0f} ms "
        f"and an acknowledging WatermarkConsumer; {MOVES} unloads with a destination broker, each after "
        f"{STEADY_S:.0f} s steady: from the unload call to the next watermark at the consumer",
        "generator_ownership_max_share_3_instances_3_brokers": round(share, 3),
        "generator_ownership_max_share_3_instances_3_brokers_how": "300 non-partitioned topics on 3 brokers, 3 "
        f"generator instances each pointed at its own broker first: the largest share one instance owns ({owners})",
    }
