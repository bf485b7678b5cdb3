"""The chaos harness's listener records what a consumer handed over, also when a crash comes mid-processing."""

from __future__ import annotations

from typing import Any

from tests.chaos.checker import Delivery, InstanceLog, WatermarkSeen, check_stale
from tests.chaos.scenario import ChaosListener
from watermark_core.protocol import Watermark

EVENT_TIME = 1_000


class _Id:
    def partition(self) -> int:
        return -1

    def ledger_id(self) -> int:
        return 24

    def entry_id(self) -> int:
        return 52


class _Message:
    def data(self) -> bytes:
        return b"p0:26"

    def producer_name(self) -> str:
        return "p0"

    def event_timestamp(self) -> int:
        return EVENT_TIME + 5

    def publish_timestamp(self) -> int:
        return 0

    def message_id(self) -> _Id:
        return _Id()


class _Consumer:
    """What the listener asks of a `WatermarkConsumer`: the watermark it holds now, and acknowledgements."""

    def __init__(self, last: Watermark) -> None:
        self.last = last
        self.acknowledged: list[Any] = []

    def get_last_watermark(self) -> Watermark:
        return self.last

    def acknowledge(self, message: Any) -> None:
        self.acknowledged.append(message)


class _CrashDuringTheDelay:
    """The processing delay's draw, during which the scenario crashes the instance (seeds 2 and 60559)."""

    def __init__(self) -> None:
        self.listener: ChaosListener | None = None

    def uniform(self, low: float, high: float) -> float:
        assert self.listener is not None
        self.listener.dead = True
        return 0.0


def test_a_crash_while_processing_still_records_the_restated_watermark_the_message_was_handed_under() -> None:
    """The consumer restated its watermark at an earlier position (same value) and then handed entry 52: the
    log has both, in that order, even though the instance crashed before the listener wrote them down."""
    log = InstanceLog("shared", "shared-c1-8", 0.0, 1)
    rng = _CrashDuringTheDelay()
    listener = ChaosListener(log, rng, 0.5, {}, {})  # type: ignore[arg-type]
    rng.listener = listener
    listener.received_watermark(_Consumer(Watermark(EVENT_TIME)), Watermark(EVENT_TIME, ((-1, 24, 87),)))
    restated = Watermark(EVENT_TIME, ((-1, 24, 51),))
    consumer = _Consumer(restated)

    listener.received(consumer, _Message())  # type: ignore[arg-type]

    kinds = [type(event) for event in log.events]
    assert kinds == [WatermarkSeen, WatermarkSeen, Delivery]
    assert log.events[1] == WatermarkSeen(EVENT_TIME, log.events[1].at, ((-1, 24, 51),))
    assert check_stale(log) == []
    assert consumer.acknowledged == [], "crashed while processing: no acknowledgement"
