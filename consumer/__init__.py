"""Consumers that hide markers and hand watermarks to listeners."""

from consumer.engine import NO_WATERMARK
from consumer.listener import WatermarkListener
from consumer.watermark_consumer import WatermarkConsumer
from watermark_core.protocol import Watermark

__all__ = ["NO_WATERMARK", "Watermark", "WatermarkConsumer", "WatermarkListener"]
