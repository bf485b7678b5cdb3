"""Which generator instance owns a partition: decided by Pulsar, spread over the instances by name.

By claim (`--ownership claim`, broker_ext/claims.py) the owner is the holder of the companion topic's exclusive
producer. By Failover (below):

Every instance subscribes to every partition with the Failover subscription `__wm_generator`;
Pulsar delivers each partition to one active consumer, and that instance owns it. How the broker
picks the active consumer (Pulsar 4.0, `AbstractDispatcherSingleActiveConsumer`): for a partition,
the consumers sorted by name, index `partition % consumers`; for a non-partitioned topic, a hash
ring over the consumers' names. With one name per instance, partition i of every topic would land on
the same instance, and with fewer partitions than instances some would own nothing.

So each instance's consumer name starts with a hash of the base topic and its own id: the sorted
order of the instances differs from topic to topic, the partitions of each topic go round the
instances in that order, and the ring of a non-partitioned topic differs per topic too. Nothing is
coordinated outside Pulsar; when an instance dies, Pulsar makes another consumer active within its
failover delay (1 s by default).
"""

from __future__ import annotations

import hashlib

from pulsar_access.admin import PulsarAdmin
from pulsar_access.topics import watermark_topic_for
from watermark_core.protocol import GENERATOR_SUBSCRIPTION

SEPARATOR = "."
CLAIM_PRODUCER_PREFIX = "__wm_dispatch-"
"""A claim's producer is named `__wm_dispatch-<instance id>-<n>` (broker_ext/claims.py)."""


def consumer_name(base_topic: str, instance_id: str) -> str:
    """This instance's consumer name on `base_topic`'s partitions: `<8 hex digits>.<instance id>`."""
    digest = hashlib.blake2b(f"{base_topic}\x00{instance_id}".encode(), digest_size=4).hexdigest()
    return f"{digest}{SEPARATOR}{instance_id}"


def instance_of(name: str) -> str:
    """The instance id in a consumer name (a name without our prefix is returned as it is)."""
    prefix, sep, rest = name.partition(SEPARATOR)
    if sep and len(prefix) == 8 and all(c in "0123456789abcdef" for c in prefix):
        return rest
    return name


def owner_of(admin: PulsarAdmin, topic: str, namespace: str | None = None) -> str:
    """The instance that owns a (non-partitioned, or partition) topic as Pulsar shows it now, "" for none: by claim,
    the holder of the companion topic's exclusive producer; else the active consumer of `__wm_generator`."""
    base = topic.split("-partition-")[0]
    for publisher in admin.topic_stats(watermark_topic_for(base, namespace)).get("publishers") or []:
        if publisher.get("accessMode") in ("WaitForExclusive", "Exclusive", "ExclusiveWithFencing"):
            return str(publisher.get("producerName", "")).removeprefix(CLAIM_PRODUCER_PREFIX).rsplit("-", 1)[0]
    stats = admin.topic_stats(topic).get("subscriptions", {}).get(GENERATOR_SUBSCRIPTION, {})
    return instance_of(str(stats.get("activeConsumerName") or ""))
