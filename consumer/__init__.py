"""Consumers that hide markers and hand watermarks to listeners."""

from consumer.listener import WatermarkListener
from consumer.watermark_consumer import WatermarkConsumer
from watermark_core.protocol import Watermark

__all__ = ["Watermark", "WatermarkConsumer", "WatermarkListener"]
