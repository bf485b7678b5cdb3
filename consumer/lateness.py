"""Late messages: handed to the application with an event time below the watermark it held then.

An honest producer's message is never late (docs/SEMANTICS.md section 1); a producer that asserts too far ahead
makes its own later messages late. The consumer counts them (`late_messages`) and answers `is_late(message)` while
the application keeps the message. One home for both paths that hand messages over: the pull path judges inline
(it reads `event_timestamp()` only while a watermark is held, and calls `late` for a late one: rare), the listener's
thread through `judge`.
"""

from __future__ import annotations

import weakref

import pulsar

from watermark_core.protocol import Watermark


class Lateness:
    """The count of late messages, and which of those the application still holds."""

    __slots__ = ("_late", "count")

    def __init__(self) -> None:
        self.count = 0
        self._late: weakref.WeakSet[pulsar.Message] = weakref.WeakSet()

    def judge(self, message: pulsar.Message, watermark: Watermark | None) -> None:
        """`message` is handed over under `watermark` (None: none held, nothing is late)."""
        if watermark is not None:
            event_time = message._message.event_timestamp()
            if event_time and event_time < watermark.event_time:
                self.late(message)

    def late(self, message: pulsar.Message) -> None:
        self.count += 1
        self._late.add(message)

    def __contains__(self, message: object) -> bool:
        return message in self._late
