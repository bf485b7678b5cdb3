"""`make demo`: start the local cluster and show messages flowing (placeholder until the Spark demo)."""

from __future__ import annotations

import sys
import time
import uuid

from broker_ext.local_cluster import ClusterError, LocalCluster
from broker_ext.settings import PulsarSettings


def main() -> int:
    cluster = LocalCluster.from_env()
    try:
        cluster.up()
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    settings = PulsarSettings(cluster.service_url, cluster.admin_url)
    client = settings.client()
    topic = f"demo-{uuid.uuid4().hex[:8]}"
    consumer = client.subscribe(topic, "demo")
    producer = client.create_producer(topic, producer_name="demo-producer")
    now = int(time.time() * 1000)
    for i in range(5):
        producer.send(f"event {i}".encode(), event_timestamp=now + i)
    print(f"[demo] sent 5 messages to {topic}")
    for _ in range(5):
        message = consumer.receive(timeout_millis=10_000)
        consumer.acknowledge(message)
        print(f"[demo] received {message.data().decode()!r} event_time={message.event_timestamp()}")
    client.close()
    print("[demo] done; stop the cluster with 'make cluster-down'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
