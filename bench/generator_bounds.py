"""Issue 26: what the generator keeps per partition stays bounded whatever producers and subscriptions do.

`snapshot_figures` needs no broker: the W_SNAPSHOT the generator would write next is the head state
(the fold of the partition's markers, watermark_core/state.py) encoded by watermark_core/snapshot.py,
exactly what the shell writes for a `WriteSnapshot` command.
"""

from __future__ import annotations

import time

from watermark_core.protocol import Marker, MarkerKind
from watermark_core.snapshot import SnapshotKeys, encode_snapshot
from watermark_core.state import WatermarkConfig, WatermarkState

TOPIC = "persistent://public/default/bench-bounds"


def _churned_state(producers: int, config: WatermarkConfig) -> tuple[WatermarkState, int]:
    """`producers` names that each assert once and go idle (one per pod or task), one producer steady.

    Returns the state just before the retention passes and the log clock then.
    """
    state = WatermarkState.initial(config)
    entry = 0

    def fold(kind: MarkerKind, producer: str, publish: int, event_time: int | None = None) -> None:
        nonlocal state, entry
        entry += 1
        state = state.apply(Marker(kind, producer, (1, entry, -1), publish, event_time))

    start = 1_700_000_000_000
    fold(MarkerKind.W_SET, "steady", start, start)
    for i in range(producers):
        at = start + i
        fold(MarkerKind.W_SET, f"pod-{i}", at, at)
        fold(MarkerKind.W_IDLE, f"pod-{i}", at)
    fold(MarkerKind.W_SET, "steady", start + producers, start + producers)
    return state, start + producers


def _apply_us(state: WatermarkState, publish: int, rounds: int = 200) -> float:
    """Microseconds to fold one W_SET of the steady producer into `state`."""
    position = state.position or (1, 0, -1)
    started = time.perf_counter()
    for i in range(rounds):
        state.apply(Marker(MarkerKind.W_SET, "steady", (position[0], position[1] + 1 + i, -1), publish, publish))
    return (time.perf_counter() - started) / rounds * 1e6


def snapshot_figures(producers: int = 10_000) -> dict[str, float | int | str]:
    config = WatermarkConfig()
    keys = SnapshotKeys.random()
    remembered, clock = _churned_state(producers, config)
    after = clock + config.producer_retention_ms + 1  # the steady producer's next W_SET, once the retention passed
    last = remembered.position or (1, 0, -1)
    forgotten = remembered.apply(Marker(MarkerKind.W_SET, "steady", (last[0], last[1] + 1, -1), after, after))
    return {
        f"snapshot_bytes_{producers}_producers": len(encode_snapshot(forgotten, keys=keys, topic=TOPIC)),
        f"snapshot_bytes_{producers}_producers_how": f"{producers} producer names each send W_SET then W_IDLE, one "
        f"producer stays; its next W_SET comes once the retention ({config.producer_retention_ms} ms, the default) "
        "passed on the log clock; the size of the next W_SNAPSHOT payload (the head state, signed). Before the "
        f"retention passed it is {len(encode_snapshot(remembered, keys=keys, topic=TOPIC))} bytes",
        f"marker_apply_us_{producers}_producers": round(_apply_us(forgotten, after), 1),
        f"marker_apply_us_{producers}_producers_how": "microseconds to fold one W_SET into that state, once the "
        f"retention passed (before: {_apply_us(remembered, clock):.0f} us)",
    }
