"""Partition routing of the watermark producer: markers where they are sent, data only where markers are."""

from __future__ import annotations

from typing import Any

from producer.routing import TARGET_PARTITION_PROPERTY, MarkerAwareRouter, PartitionCount


class FakeMessage:
    """What the router reads of a `pulsar.Message`: its properties and its key (a value, not a broker)."""

    def __init__(self, properties: dict[str, str] | None = None, key: str = "") -> None:
        self._properties = properties or {}
        self._key = key

    def properties(self) -> dict[str, str]:
        return self._properties

    def partition_key(self) -> str:
        return self._key


def route(router: MarkerAwareRouter, message: FakeMessage, num_partitions: int) -> int:
    message_: Any = message
    return router(message_, num_partitions)


def test_data_stays_on_covered_partitions_until_the_producer_covers_the_new_ones() -> None:
    """Issue #17, counterexample 6: partitions added to a live topic."""
    count = PartitionCount(2)
    router = MarkerAwareRouter(partitions=count)
    assert {route(router, FakeMessage(), 3) for _ in range(30)} == {0, 1}, "no data before the markers"
    assert count.uncovered() == range(2, 3)
    assert route(router, FakeMessage({TARGET_PARTITION_PROPERTY: "2"}), 3) == 2, "markers go where they are sent"
    count.cover(3)
    assert count.uncovered() == range(3, 3)
    assert {route(router, FakeMessage(), 3) for _ in range(30)} == {0, 1, 2}


def test_keys_are_hashed_over_the_covered_partitions_and_a_users_router_sees_that_count() -> None:
    count = PartitionCount(2)
    seen: list[int] = []

    def user_router(_message: Any, num_partitions: int) -> int:
        seen.append(num_partitions)
        return num_partitions - 1

    assert route(MarkerAwareRouter(partitions=count), FakeMessage(key="k"), 5) in (0, 1)
    assert route(MarkerAwareRouter(user_router, count), FakeMessage(), 5) == 1
    assert seen == [2]


def test_the_count_only_grows() -> None:
    count = PartitionCount(4)
    count.seen(3)
    count.cover(2)
    assert count.covered == 4 and count.uncovered() == range(4, 4)
