"""The listener interface of `WatermarkConsumer` (contract section 3)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pulsar

from watermark_core.protocol import Watermark

if TYPE_CHECKING:
    from consumer.watermark_consumer import WatermarkConsumer


class WatermarkListener:
    """Subclass and override; both methods run on one thread, in the order events happened."""

    def received(self, consumer: WatermarkConsumer, message: pulsar.Message) -> None:
        """A data message (never a marker). Acknowledge it with `consumer.acknowledge(message)`."""

    def received_watermark(self, consumer: WatermarkConsumer, watermark: Watermark) -> None:
        """The subscription's watermark changed: no unacknowledged message of an honest producer is older."""
