"""Partition routing for a producer that must also reach every partition with its markers.

Pulsar's Python client only lets a producer choose a partition through a custom router, so the
watermark producer installs one: markers carry a private property naming their partition, data
messages go where Pulsar's Java client would put them (Java string hash of the key, round robin
without one) or where the user's own router says.
"""

from __future__ import annotations

import itertools
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
    """Routes markers to their named partition and data by the user's router or the default one."""

    def __init__(self, user_router: MessageRouter | None = None) -> None:
        self._user_router = user_router
        self._round_robin = itertools.count()

    def __call__(self, message: pulsar.Message, num_partitions: int) -> int:
        target = message.properties().get(TARGET_PARTITION_PROPERTY)
        if target is not None:
            return int(target)
        if self._user_router is not None:
            return int(self._user_router(message, num_partitions))
        key = message.partition_key()
        if key:
            return (java_string_hash(key) & 0x7FFFFFFF) % num_partitions
        return next(self._round_robin) % num_partitions
