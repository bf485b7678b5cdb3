"""The listener interface of `WatermarkConsumer` (contract section 3): its one home.

`Listener` is what the consumer's thread calls (consumer/dispatcher.py); `WatermarkListener` is the class to subclass,
with a default for each method. `consumer` is the `WatermarkConsumer` that received the message, typed `Any` here so
that this module imports nothing of the shell (which imports it): no module of `consumer/` imports one that imports it
back (tests/unit/test_layout.py). A subclass may name it `WatermarkConsumer` in its own hints.
"""

from __future__ import annotations

from typing import Any, Protocol

import pulsar

from consumer.engine import NO_WATERMARK
from watermark_core.protocol import Watermark


class Listener(Protocol):
    """What the consumer calls on a listener: a `WatermarkListener`, or any object with its three methods."""

    def received(self, consumer: Any, message: pulsar.Message) -> None: ...

    def received_watermark(self, consumer: Any, watermark: Watermark) -> None: ...

    def watermark_withdrawn(self, consumer: Any) -> None: ...


class WatermarkListener:
    """Subclass and override; both methods run on one thread, in the order events happened."""

    def received(self, consumer: Any, message: pulsar.Message) -> None:
        """A data message (never a marker). Acknowledge it with `consumer.acknowledge(message)`."""

    def received_watermark(self, consumer: Any, watermark: Watermark) -> None:
        """The subscription's watermark changed: no unacknowledged message of an honest producer is older.

        It goes back only after the subscription moved back (a seek, a reset-cursor): then it is
        the watermark recomputed before the messages that come again, handed over before them.
        """

    def watermark_withdrawn(self, consumer: Any) -> None:
        """The subscription moved back to where it has no watermark (e.g. before any producer's W_SET).

        The watermark received last no longer holds; until the next `received_watermark` there is
        none, and the messages that come meanwhile may have any event time. By default this hands
        `received_watermark` the watermark `NO_WATERMARK` (event time 0: true of every message), so a
        listener that only keeps the latest value it received is right after every kind of seek.
        Override it to tell "no watermark" apart.
        """
        self.received_watermark(consumer, NO_WATERMARK)
