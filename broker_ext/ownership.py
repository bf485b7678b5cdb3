"""Which generator instance owns a partition: decided by Pulsar, spread over the instances by name.

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

SEPARATOR = "."


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
