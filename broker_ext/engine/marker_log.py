"""The markers of one partition after a base state: the generator's in-memory secondary cursors.

The generator reads each partition once; every subscription's watermark is the fold of the same
markers up to that subscription's own mark-delete position. Keeping the markers after a base state
lets every subscription's state move forward by folding just the markers between its old and new
position, and lets the base move forward once no subscription needs the markers before it.
Pure: no I/O.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace

from watermark_core.protocol import Marker, Position, WatermarkEvent
from watermark_core.state import WatermarkState


class BeforeBase(LookupError):
    """The position is before the log's base; the caller must rebuild from a snapshot."""


class MarkerLog:
    """Markers in log order after `base_position`, whose state is `base`."""

    def __init__(self, base: WatermarkState, base_position: Position) -> None:
        self.base = base
        self.base_position = base_position
        self.head_position = base_position
        self._positions: list[Position] = []
        self._markers: list[Marker] = []

    def __len__(self) -> int:
        return len(self._markers)

    @property
    def last_marker_position(self) -> Position | None:
        return self._positions[-1] if self._positions else None

    def append(self, marker: Marker) -> None:
        """Add the next marker read from the partition (positions only go up).

        A W_SNAPSHOT is kept without its payload: folding it only moves the position.
        """
        if marker.position <= self.head_position:
            raise ValueError(f"marker at {marker.position} is not after the log's head {self.head_position}")
        self._positions.append(marker.position)
        self._markers.append(replace(marker, body=None) if marker.body is not None else marker)
        self.head_position = marker.position

    def advance_head(self, position: Position) -> None:
        """A data message was read: the log is complete up to `position`."""
        self.head_position = max(self.head_position, position)

    def fold(self, state: WatermarkState, after: Position, up_to: Position) -> WatermarkState:
        """Apply the markers in (`after`, `up_to`] to `state`, which must be the state at `after`."""
        if after < self.base_position:
            raise BeforeBase(f"{after} is before the marker log's base {self.base_position}")
        start = bisect.bisect_right(self._positions, after)
        end = bisect.bisect_right(self._positions, up_to)
        for marker in self._markers[start:end]:
            state = state.apply(marker)
        return state

    def state_at(self, position: Position, head: WatermarkState | None = None) -> WatermarkState:
        """The state after every marker at or before `position`; `head`, the state at `head_position` where the
        caller has it, is that state when `position` is there (the common case: no fold)."""
        if head is not None and position >= self.head_position:
            return head
        return self.fold(self.base, self.base_position, position)

    def keeping(self, limit: int) -> Position:
        """The position to trim up to so that at most `limit` markers stay (the base if they do already)."""
        if len(self._positions) <= limit:
            return self.base_position
        return self._positions[len(self._positions) - limit - 1]

    def trim(self, up_to: Position, known: WatermarkState | None = None) -> None:
        """Fold the markers at or before `up_to` into the base; no position before it can be asked again.

        `known`, where the caller has it, is the state at `up_to` (a subscription's there already): no fold."""
        up_to = min(up_to, self.head_position)
        if up_to <= self.base_position:
            return
        self.base = known if known is not None else self.state_at(up_to)
        cut = bisect.bisect_right(self._positions, up_to)
        del self._positions[:cut]
        del self._markers[:cut]
        self.base_position = up_to


def roster(state: WatermarkState) -> tuple[tuple[str, ...], tuple[str, ...], int]:
    """Who holds the watermark, as a table shows it beside the watermark: the active producers (not their
    assertions, which move with every W_SET), the idle ones, and the number of open transactions."""
    return tuple(state.active_producers()), tuple(state.idle_producers()), len(state.pending_txns)


@dataclass
class SubscriptionTracker:
    """One subscription's secondary cursor: its state folded up to `applied_to` <= its mark-delete."""

    name: str
    state: WatermarkState
    applied_to: Position
    mark_delete: Position
    published: WatermarkState | None = None
    """The state the last table was made from: its watermark, and (`roster`) who held it."""
    announced: bool = False
    """Whether a table holding this subscription was published since it appeared or moved back."""
    rebuilding: bool = False
    """Its state is being rebuilt from the log (the marker log does not reach back to its position)."""
    last_event: WatermarkEvent | None = None
    """The event last published for it: tables repeat it while it is not ready, so each names it."""

    def unpublished(self) -> bool:
        """Whether a table would show something new for it: it is new or moved back, its watermark changed, or who
        holds the watermark did (`roster`: a producer went idle or came, a transaction opened or closed)."""
        last = self.published
        if not self.announced or last is None or last.watermark != self.state.watermark:
            return True
        return self.state is not last and roster(self.state) != roster(last)

    def mark_published(self) -> None:
        self.announced, self.published = True, self.state

    def advance(self, log: MarkerLog, head: WatermarkState) -> None:
        """Fold forward toward the mark-delete position, never past what the log has read; `head` is the state at
        the log's head position: a subscription that reaches the head takes it instead of folding the same markers
        again (each state is the fold of the log up to its position, whoever folded it)."""
        target = min(self.mark_delete, log.head_position)
        if target > self.applied_to:
            self.state = head if target == log.head_position else log.fold(self.state, self.applied_to, target)
            self.applied_to = target
