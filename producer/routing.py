"""Partition routing for a producer that must also reach every partition with its markers.

Pulsar's Python client only lets a producer choose a partition through a custom router, so the
watermark producer installs one: markers carry a private property naming their partition, data
messages go where Pulsar's Java client would put them (Java string hash of the key, round robin
without one) or where the user's own router says.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

import pulsar

TARGET_PARTITION_PROPERTY = "wm.partition"
"""Set on markers only, to route one copy of the marker to each partition."""

MessageRouter = Callable[[pulsar.Message, int], int]


def java_string_hash(text: str) -> int:
    """`String.hashCode()` of the Java client, so keyed messages land where a Java producer puts them."""
    value = 0
    for unit in text.encode("utf-16-be").hex(" ", 2).split():
        value = (31 * value + int(unit, 16)) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


class MarkerAwareRouter:
    """Routes markers to their named partition and data by the user's router or the default one.

    With `partitions`, data goes only to partitions that carry this producer's markers (see
    `PartitionCount`); the count Pulsar passes in is reported to it.
    """

    def __init__(self, user_router: MessageRouter | None = None, partitions: PartitionCount | None = None) -> None:
        self._user_router = user_router
        self._partitions = partitions
        self._round_robin = itertools.count()

    def __call__(self, message: pulsar.Message, num_partitions: int) -> int:
        target = message.properties().get(TARGET_PARTITION_PROPERTY)
        if self._partitions is not None:
            self._partitions.seen(num_partitions)
            num_partitions = max(1, min(num_partitions, self._partitions.covered))
        if target is not None:
            return int(target)
        if self._user_router is not None:
            return int(self._user_router(message, num_partitions))
        key = message.partition_key()
        if key:
            return (java_string_hash(key) & 0x7FFFFFFF) % num_partitions
        return next(self._round_robin) % num_partitions


class PartitionCount:
    """How many partitions carry this producer's markers, and how many Pulsar says the topic has.

    A topic's partitions can be added while it is in use (`pulsar-admin topics update-partitioned-topic`);
    the Pulsar producer notices within its metadata refresh (60 s in the C++ client) and then hands
    the router the larger count. Data routed to a new partition before this producer's markers
    would be covered by none of its assertions there, so the router sends data only to `covered`
    partitions, and the producer, before its next send, sends its current assertion to the new
    ones (`WatermarkProducer._cover_new_partitions`) and then covers them.
    """

    def __init__(self, count: int) -> None:
        self._covered = count
        self._seen = count
        self._lock = threading.Lock()

    @property
    def covered(self) -> int:
        return self._covered

    def seen(self, count: int) -> None:
        """The count Pulsar gave the router."""
        if count > self._seen:
            with self._lock:
                self._seen = max(self._seen, count)

    def uncovered(self) -> range:
        """Partitions Pulsar knows that have no marker of this producer yet."""
        return range(self._covered, self._seen)

    def cover(self, count: int) -> None:
        """Partitions below `count` now carry this producer's current assertion."""
        with self._lock:
            self._covered = max(self._covered, count)
