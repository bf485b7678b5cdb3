"""What a followed partition and the source of its cursor positions say to each other (the intake's interface)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from broker_ext.engine.vocabulary import CursorsPolled
from broker_ext.intake.plugin_stream import IntakeReport
from watermark_core.protocol import Position

SnapshotDone = Callable[[Position | None, str | None], None]
"""How a snapshot record written by a plugin is answered: (where it is, None) or (None, why it is not)."""


class Followed(Protocol):
    """What the poller needs of a partition (broker_ext/partition_io.py `PartitionIO`)."""

    topic: str
    base_topic: str
    partition: int
    consumer_name: str
    closed: bool

    @property
    def owner(self) -> bool: ...

    @property
    def wants_cursors(self) -> bool: ...

    def cursors(self, polled: CursorsPolled) -> None: ...

    def lost(self, owner: str) -> None: ...

    def ours(self, owner: str | None) -> bool: ...

    def named_owner(self, polled: CursorsPolled) -> None: ...

    def followed(self, incarnation: str | None) -> None:
        """A plugin made the partition's `__wm_generator` subscription (`CursorSource.follow`): `incarnation` is its
        topic property `wm.incarnation` now; None where no plugin could (the admin API makes it)."""
        ...

    def intake(self, report: IntakeReport | None, cursors: CursorsPolled | None = None) -> bool:
        """What the plugin found on the partition since its last answer, or None once no plugin reports it (only
        while the generator asks for the intake); with the answer's `cursors`, True when they were taken with it
        (one event), False when the caller is to hand them."""
        ...


class CursorSource(Protocol):
    """Where each cursor is: the admin API (`CursorPoller`) or the broker plugin (`PluginCursors`).

    Partitions tell it what happened (`after`: an event, maybe a marker read; `owned`: it owns the
    partition now) or ask (`request`: the cursors now); it answers with `partition.cursors(...)` or
    `partition.lost(owner)` on the loop thread, whenever the cursors move.
    """

    def start(self) -> None: ...

    def close(self) -> None: ...

    def add(self, partition: Followed) -> None: ...

    def remove(self, partition: Followed) -> None: ...

    def owned(self, partition: Followed) -> None: ...

    def after(self, partition: Followed, marker_read: bool) -> None: ...

    def request(self, partition: Followed) -> None: ...

    def acknowledge(self, partition: Followed, position: tuple[int, int]) -> bool:
        """Move the partition's generator cursor to `position` without its consumer; False: the consumer must."""
        ...

    def write_snapshot(self, partition: Followed, producer: str, payload: bytes, done: SnapshotDone) -> bool:
        """Have a broker's plugin write the partition's snapshot record (under the producer name `producer`),
        answered by `done` on the loop thread; False where none can (the partition's own producer writes it)."""
        ...

    def follow(self, partition: Followed, token: str) -> bool:
        """Have a broker's plugin make the partition's `__wm_generator` subscription and set its incarnation
        property to `token` where unset, answered by `partition.followed`; False where none can be asked."""
        ...

    def incarnation(self, partition: Followed) -> str | None:
        """The partition's topic property `wm.incarnation` as a broker's plugin reported it last; None where none
        reports it or it is unset there (the admin API then reads it)."""
        ...

    def reports(self, partition: Followed) -> bool:
        """Whether a broker's plugin reports the partition now (its `__wm_generator` subscription exists)."""
        ...

    def served_by(self, partition: Followed) -> str | None:
        """The broker whose plugin reports the partition, None where none does."""
        ...

    def claimed(self, partition: Followed) -> bool:
        """By claim, the partition became ours: True where a plugin hands its markers over (everything it keeps
        comes next), False where our consumer must receive them."""
        ...
