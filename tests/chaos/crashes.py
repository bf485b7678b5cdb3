"""What a `kill -9` of the broker may do to what consumers see, as the checks must allow it (pure).

Found by the suite's first broker kills (seed 7019): Pulsar persists a cursor's mark-delete position
(and its individually acknowledged ranges) lazily, at most once a second per cursor
(`managedLedgerDefaultMarkDeleteRateLimit`) and the rest by a flush every
`managedLedgerCursorPositionFlushSeconds` (60 s). A broker that is killed forgets the
acknowledgements it had not persisted: after the restart a subscription's mark-delete position is
back where it was persisted, and messages its consumers had acknowledged are delivered again. For
the contract that is the mark-delete position moving backward (section 1): the generator recomputes
the watermark there, and it may go back; the messages delivered again are duplicates of messages
the application acknowledged, below the watermark it had seen (a `WatermarkConsumer` counts them as
late). A graceful restart persists every cursor and shows none of this.

So after each kill, for the checks:

- a delivery of a message that an instance of the subscription had acknowledged before the kill is
  a duplicate and is dropped;
- in each instance, the watermarks below the highest one that the subscription's instances of the
  same seek epoch had seen before the kill are dropped until one reaches it again (the way back
  down and up).

Everything else is checked as before; in particular a message that no instance had acknowledged
before the kill and that arrives after a watermark above its event time is still premature.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from tests.chaos.checker import Delivery, InstanceLog, WatermarkSeen, WatermarkWithdrawn


@dataclass(frozen=True)
class Forgiven:
    """What the kills explain: duplicate deliveries and watermarks on the way back, dropped from the logs."""

    logs: list[InstanceLog]
    duplicates: int
    lowered_watermarks: int


def forgive_lost_acknowledgements(logs: list[InstanceLog], kill_times: Iterable[float]) -> Forgiven:
    """The logs of one subscription as the checks must see them after the broker kills at `kills` (monotonic)."""
    kills = sorted(kill_times)
    if not kills:
        return Forgiven(logs, 0, 0)
    acked_before = {kill: _acknowledged_before(logs, kill) for kill in kills}
    highest_before = {
        (kill, log.epoch): _highest_before(logs, log.epoch, kill) for kill in kills for log in logs
    }  # fmt: skip
    duplicates = lowered = 0
    forgiven = []
    for log in logs:
        events: list[Delivery | WatermarkSeen | WatermarkWithdrawn] = []
        # per kill, the watermark this instance has not reached again since (None: reached, or there was none)
        climbing = {kill: highest_before[(kill, log.epoch)] for kill in kills}
        for event in log.events:
            after = [kill for kill in kills if event.at > kill]
            if isinstance(event, Delivery):
                if any(event.payload in acked_before[kill] for kill in after):
                    duplicates += 1
                    continue
            elif isinstance(event, WatermarkSeen):
                below = False
                for kill in after:
                    high = climbing[kill]
                    if high is not None and event.event_time >= high:
                        climbing[kill] = None  # back where it was: from here on, checked as usual
                    elif high is not None:
                        below = True
                if below:
                    lowered += 1
                    continue
            events.append(event)
        forgiven.append(replace(log, events=events))
    return Forgiven(forgiven, duplicates, lowered)


def _acknowledged_before(logs: list[InstanceLog], kill: float) -> set[str]:
    return {
        event.payload
        for log in logs
        for event in log.events
        if isinstance(event, Delivery) and event.at < kill and event.payload in log.acknowledged
    }


def _highest_before(logs: list[InstanceLog], epoch: int, kill: float) -> int | None:
    seen = [w.event_time for log in logs if log.epoch == epoch for w in log.watermarks() if w.at < kill]
    return max(seen, default=None)
