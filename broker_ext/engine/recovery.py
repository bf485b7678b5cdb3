"""Recovery from the log: snapshots, their chain, and when a state rebuilt from the log can be used.

Pure: the engine (broker_ext/engine/partition.py) asks the shell to read, and decides with these.

Why rebuilding needs care (docs/RELIABILITY.md, the seed-7007 bug): without retention Pulsar deletes
the ledgers every subscription (the generator's own included) has acknowledged, and a reader opened
before them silently begins at the first ledger left. A state folded from there misses the deleted
ledgers' markers and can be premature. The generator therefore snapshots the state at the start of
every ledger it enters (`ledger_start`), walks the snapshot chain back to the nearest snapshot before
a position (`SnapshotCatalog.nearest`), and refuses a rebuilt state that could have missed markers
(`refusal`): the subscription's watermark then waits (late, never premature) and the rebuild is retried.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from watermark_core.protocol import LAST_BATCH_INDEX, Position
from watermark_core.snapshot import Snapshot
from watermark_core.state import WatermarkState

BEFORE_EVERYTHING: Position = (-1, -1, -1)
"""Where a fold from the partition's start begins."""

KEEP_SNAPSHOTS = 100
"""Snapshots a catalog keeps (those stating the latest positions); older ones are found by the chain."""

KEEP_WALKED = 100
"""Older snapshots a catalog keeps of those a chain walk read, thinned evenly beyond this many.

A subscription far behind (a query's new one at the start of a backlog) acknowledges in steps, and
every step is a rebuild; keeping what the first walk found lets each later step read on from a
snapshot near it instead of walking the chain back again (one reader per link)."""


def ledger_start(ledger: int) -> Position:
    """The position before a ledger's first entry: after every entry of the ledgers before it."""
    return (ledger, -1, LAST_BATCH_INDEX)


def position_before(position: Position) -> Position:
    """The last position before `position`'s entry (its ledger's start for an entry 0)."""
    return (position[0], position[1] - 1, LAST_BATCH_INDEX)


def normalized_cursor(cursor: tuple[int, int], ledgers: Iterable[tuple[int, int]]) -> tuple[int, int]:
    """A cursor's mark-delete, with Pulsar's "(next ledger, -1)" written as the last entry before it.

    `ledgers` are (ledger id, entries). With no earlier non-empty ledger, the cursor stays as it is.
    """
    ledger, entry = cursor
    if entry != -1:
        return cursor
    earlier = [(lid, entries) for lid, entries in ledgers if lid < ledger and entries > 0]
    if not earlier:
        return cursor
    previous, entries = max(earlier)
    return previous, entries - 1


def read_lag(head: Position, last_confirmed: tuple[int, int], ledgers: Iterable[tuple[int, int]]) -> int:
    """Entries between the head and the partition's last entry."""
    tail_ledger, tail_entry = last_confirmed
    if tail_ledger == head[0]:
        return max(0, tail_entry - head[1])
    sizes = dict(ledgers)
    lag = max(0, sizes.get(head[0], 0) - head[1] - 1)
    lag += sum(entries for ledger, entries in sizes.items() if head[0] < ledger < tail_ledger)
    return lag + tail_entry + 1


def rebuilt_is_consistent(rebuilt: WatermarkState, head: WatermarkState) -> bool:
    """Whether a state rebuilt for a position at or before `head`'s can be right: its watermark is not above.

    The fold only moves the watermark up along the log, so a higher one means the rebuild read the
    log differently from the head's own reading, e.g. without the markers of a deleted ledger.
    """
    if rebuilt.watermark is None:
        return True
    return head.watermark is not None and rebuilt.watermark <= head.watermark


def history_deleted(start: Position, first_read: Position, earliest_read: Position) -> bool:
    """Whether a fold from the partition's start began after an entry read before: its ledger is gone."""
    return start == BEFORE_EVERYTHING and first_read > earliest_read


def refusal(
    start: Position, first_read: Position | None, ledgers: frozenset[int], earliest_read: Position | None
) -> str | None:
    """Why a fold of the entries after `start` cannot be exact, or None when it can.

    From the partition's start, the fold must begin at or before the earliest entry ever read; from
    a snapshot, a fold that leaves the snapshot's ledger at once is exact only if that ledger still
    exists (then it simply ended there).
    """
    if first_read is None:
        return None
    if start == BEFORE_EVERYTHING:
        if earliest_read is not None and history_deleted(start, first_read, earliest_read):
            return (
                f"the partition now starts at {first_read[:2]}, after {earliest_read[:2]} which was read "
                "earlier: the ledgers before it were deleted (no retention), so the state there cannot be "
                "rebuilt (set a retention policy on the namespace to keep that history)"
            )
        return None
    if first_read[0] != start[0] and start[0] not in ledgers:
        return (
            f"rebuilding from the snapshot stating {start[:2]}: ledger {start[0]} was deleted, entries after "
            "that position may be gone with it"
        )
    return None


@dataclass(frozen=True)
class ReadSnapshotAt:
    """The chain goes on at `position`: read the snapshot there."""

    position: Position


class SnapshotCatalog:
    """The snapshots of one partition the engine knows of, and the link of the next one it writes.

    Each snapshot names the one written before it (`previous`), so the snapshots form a chain in
    write order. The catalog keeps the `KEEP_SNAPSHOTS` stating the latest positions; a rebuild
    for an earlier position walks back the chain from the earliest one kept, and the catalog keeps
    up to `KEEP_WALKED` of the older snapshots walks read (`remember`).
    """

    def __init__(self) -> None:
        self._by_at: list[Snapshot] = []
        self._walked: list[Snapshot] = []
        self.last_written: Position | None = None
        """Where the engine's latest snapshot landed (it may not have been read back yet)."""

    def __len__(self) -> int:
        return len(self._by_at)

    def add(self, snapshot: Snapshot) -> None:
        if any(known.message == snapshot.message for known in self._by_at):
            return
        self._by_at.append(snapshot)
        self._by_at.sort(key=lambda s: s.at)
        del self._by_at[:-KEEP_SNAPSHOTS]

    def remember(self, found: Iterable[Snapshot]) -> None:
        """Keep older snapshots a chain walk read, evenly thinned to `KEEP_WALKED` (the earliest stays: the
        chain goes on from it)."""
        known = {s.message for s in (*self._by_at, *self._walked)}
        self._walked.extend(s for s in found if s.message not in known)
        self._walked.sort(key=lambda s: s.at)
        while len(self._walked) > KEEP_WALKED:
            self._walked = self._walked[::2]

    def forget_walked_through(self, ledger: int) -> None:
        """Drop the snapshots known stating positions in `ledger` or before: it was deleted (the ones before it
        too: Pulsar deletes the oldest ledgers), so a fold from them is refused. Without them the next rebuild
        walks the chain again and finds the snapshot at the start of a ledger that is left (it may have been
        thinned away). Those kept as the latest go too: an engine that took the partition over again after a
        deletion may still know them from its earlier ownership."""
        self._walked = [s for s in self._walked if s.at[0] > ledger]
        self._by_at = [s for s in self._by_at if s.at[0] > ledger]

    def previous_for_next(self) -> Position | None:
        """The `previous` of the next snapshot written: the latest one in the log that we know of."""
        messages = [s.message for s in self._by_at]
        if self.last_written is not None:
            messages.append(self.last_written)
        return max(messages, default=None)

    def nearest(
        self, target: Position, found: Iterable[Snapshot] = (), visited: Iterable[Position] = ()
    ) -> Snapshot | ReadSnapshotAt | None:
        """The nearest snapshot stating a position at or before `target`, the next link to read, or None.

        `found` are snapshots a walk read so far (kept apart: the catalog may not keep old ones);
        `visited` the links it read. None: the chain ends (its first snapshot, a link already
        visited, or nothing known), so the state there is folded from the partition's start.
        """
        known = [*self._by_at, *self._walked, *found]
        candidates = [s for s in known if s.at <= target]
        if candidates:
            return max(candidates, key=lambda s: s.at)
        earliest = min(known, key=lambda s: s.message, default=None)
        if earliest is None or earliest.previous is None or earliest.previous in set(visited):
            return None
        return ReadSnapshotAt(earliest.previous)
