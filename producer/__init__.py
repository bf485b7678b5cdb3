"""Producers that write watermark markers into their topic."""

from producer.watermark_producer import (
    TransactionClosedError,
    WatermarkBuilder,
    WatermarkProducer,
    WatermarkTransaction,
)

__all__ = ["TransactionClosedError", "WatermarkBuilder", "WatermarkProducer", "WatermarkTransaction"]
