"""Readers the Spark source's tasks leave open in a Python worker for the next batch (no broker: fake
readers; `spark_sink.clients` keeps whatever it is given)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("pulsar")
from pulsar_access.settings import PulsarSettings
from spark_sink import clients

pytestmark = pytest.mark.unit

SETTINGS = PulsarSettings("pulsar://localhost:6650", "http://localhost:8080")
T = "persistent://public/default/t-partition-0"


class FakeReader:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


@pytest.fixture(autouse=True)
def _no_kept_readers() -> Iterator[None]:
    clients._readers.clear()
    yield
    clients._readers.clear()


def test_a_reader_left_at_a_range_end_serves_the_next_range_once() -> None:
    reader = FakeReader()
    clients.keep_reader(SETTINGS, {}, T, reader, (5, 10), "pending")
    kept = clients.take_reader(SETTINGS, {}, T, (5, 10))
    assert kept is not None and kept.reader is reader and kept.pending == "pending"
    assert clients.take_reader(SETTINGS, {}, T, (5, 10)) is None  # taken out while in use


def test_a_reader_a_little_behind_reads_on_one_elsewhere_is_closed() -> None:
    behind = FakeReader()
    clients.keep_reader(SETTINGS, {}, T, behind, (5, 10))
    assert clients.take_reader(SETTINGS, {}, T, (5, 10 + clients.READER_SKIP_ENTRIES)) is not None
    for position in ((5, 9), (6, 10), (5, 11 + clients.READER_SKIP_ENTRIES), None):
        stale = FakeReader()
        clients.keep_reader(SETTINGS, {}, T, stale, (5, 10))
        assert clients.take_reader(SETTINGS, {}, T, position) is None
        assert stale.closed


def test_readers_are_kept_per_topic_and_client_options_and_idle_ones_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    first, other = FakeReader(), FakeReader()
    clients.keep_reader(SETTINGS, {}, T, first, (5, 10))
    assert clients.take_reader(SETTINGS, {"operation_timeout_seconds": 5}, T, (5, 10)) is None
    assert clients.take_reader(SETTINGS, {}, T + "x", (5, 10)) is None
    assert not first.closed
    now = clients.time.monotonic()
    monkeypatch.setattr(clients.time, "monotonic", lambda: now + clients.READER_IDLE_S + 1)
    clients.keep_reader(SETTINGS, {}, T + "x", other, (5, 10))
    assert first.closed and not other.closed
