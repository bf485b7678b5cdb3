"""A batch Spark runs again is cut into the same tasks as when it was planned, whatever the driver that runs it
again (no broker: the driver's admin API, client and companion follower are fakes; the planning is the real one).

The exactly-once sink names a task's producer after its Spark partition, so a replayed batch must give each
task the very same rows: a 2-CPU driver that cut into 2 tasks what a 4-CPU driver had cut into 4 lost half the
rows of the replayed tasks and wrote the other half twice (issue 35).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

pytest.importorskip("pyspark")
from pyspark.sql.streaming.datasource import ReadAllAvailable
from pyspark.sql.types import StructType

import spark_sink.driver
from pulsar_access.settings import PulsarSettings
from spark_sink.offsets import SourceOffset
from spark_sink.source import PulsarStreamReader

pytestmark = pytest.mark.unit

T = "persistent://public/default/t"
PARTITIONS = 4


class FakeAdmin:
    """A topic of `PARTITIONS` partitions; `ledgers[p]` is partition p's (ledger id, entries), the last one open."""

    ledgers: ClassVar[dict[int, list[tuple[int, int]]]] = {}

    def __init__(self, *_: Any, **__: Any) -> None:
        pass

    def partitions(self, topic: str) -> int:
        return PARTITIONS

    def fast_internal_stats(self, name: str) -> dict[str, Any]:
        ledgers = FakeAdmin.ledgers[int(name.rsplit("-", 1)[1])]
        (*closed, (open_ledger, entries)) = ledgers
        return {
            "ledgers": [{"ledgerId": ledger, "entries": n} for ledger, n in closed] + [{"ledgerId": open_ledger}],
            "lastConfirmedEntry": f"{open_ledger}:{entries - 1}",
            "cursors": {},
        }

    def close(self) -> None:
        pass


def write(entries: int) -> None:
    """`entries` more entries on every partition, in a new ledger."""
    for partition in range(PARTITIONS):
        ledgers = FakeAdmin.ledgers.setdefault(partition, [])
        ledgers.append((ledgers[-1][0] + 1 if ledgers else 100 + 10 * partition, entries))


class FakeConsumer:
    def acknowledge_cumulative(self, message_id: Any) -> None:
        pass

    def close(self) -> None:
        pass


class FakeClient:
    def subscribe(self, *_: Any, **__: Any) -> FakeConsumer:
        return FakeConsumer()

    def close(self) -> None:
        pass


class FakeFollower:
    def __init__(self, *_: Any, **__: Any) -> None:
        pass

    def follow(self, topics: Any) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture(autouse=True)
def _no_broker(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(spark_sink.driver, "PulsarAdmin", FakeAdmin)
    monkeypatch.setattr(spark_sink.driver, "CompanionFollower", FakeFollower)
    monkeypatch.setattr(PulsarSettings, "client", lambda self, **options: FakeClient())
    FakeAdmin.ledgers = {}
    yield


def driver(monkeypatch: pytest.MonkeyPatch, cpus: int, **options: str) -> PulsarStreamReader:
    """A fresh driver-side reader (a driver process started anew) on a machine with `cpus` CPUs."""
    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    given = {"topic": T, "subscription": "s", "serviceUrl": "pulsar://localhost:6650",
             "adminUrl": "http://localhost:8080", **options}  # fmt: skip
    return PulsarStreamReader(StructType(), given)


def as_stored(offset: dict[str, Any]) -> dict[str, Any]:
    """An offset as Spark hands it back from its checkpoint (JSON text)."""
    return dict(json.loads(json.dumps(offset)))


def next_batch(
    reader: PulsarStreamReader, start: dict[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The next batch's start and end as Spark keeps them in its checkpoint (the first batch's without `start`)."""
    begin = as_stored(start if start is not None else reader.initialOffset())
    return begin, as_stored(reader.latestOffset(begin, ReadAllAvailable()))


def tasks(reader: PulsarStreamReader, start: dict[str, Any], end: dict[str, Any]) -> list[list[tuple[Any, ...]]]:
    """What each Spark task of the batch reads: its ranges (partition, after, up to), in order."""
    return [[(r.key, r.start, r.end) for r in task.ranges] for task in reader.partitions(start, end)]  # type: ignore[attr-defined]


def test_a_batch_replayed_on_a_driver_with_fewer_cpus_gives_each_task_the_same_ranges(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    write(1500)
    write(1500)  # 3000 entries per partition, across two ledgers
    first = driver(monkeypatch, cpus=4)
    start, end = next_batch(first)
    original = tasks(first, start, end)
    assert len(original) == 4, "the batch is large enough for the first driver's 4 tasks"
    replay = driver(monkeypatch, cpus=2)  # the query restarted from its checkpoint on another machine
    assert tasks(replay, start, end) == original


def test_a_batch_replayed_with_another_min_partitions_gives_each_task_the_same_ranges(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    write(3000)
    first = driver(monkeypatch, cpus=2, minPartitions="4")
    start, end = next_batch(first)
    original = tasks(first, start, end)
    assert len(original) == 4
    for other in ("1", "3", "16"):
        assert tasks(driver(monkeypatch, cpus=8, minPartitions=other), start, end) == original


def test_the_next_batch_follows_the_new_option_and_a_quiet_topic_starts_no_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    write(3000)
    _, end = next_batch(driver(monkeypatch, cpus=2, minPartitions="4"))
    restarted = driver(monkeypatch, cpus=2, minPartitions="1")
    assert next_batch(restarted, end)[1] == end, "nothing new: the same end, so Spark starts no empty batch"
    write(3000)
    begin, later = next_batch(restarted, end)
    assert tasks(restarted, begin, later) == [[((T, p), (100 + 10 * p, 2999), (101 + 10 * p, 2999)) for p in range(4)]]
    _, again = next_batch(restarted, later)
    assert again == later, "an end with nothing new is the same JSON: Spark starts no batch for it"


def test_ledgers_deleted_before_the_batchs_start_change_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retention may delete the ledgers the query acknowledged before the batch runs again: a range's entries
    are counted from its start, so the cuts stay where they were."""
    write(1000)
    first = driver(monkeypatch, cpus=8)
    _, end = next_batch(first)
    write(8000)
    start, end = next_batch(first, end)
    original = tasks(first, start, end)
    assert len(original) == 8 and len(original[0]) == 1, "each partition's range cut in two"
    for partition in range(PARTITIONS):
        del FakeAdmin.ledgers[partition][0]
    assert tasks(driver(monkeypatch, cpus=8), start, end) == original
    assert SourceOffset.from_json(end).partitions[(T, 0)] == (101, 7999)
