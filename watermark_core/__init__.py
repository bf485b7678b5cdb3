"""The marker protocol and the pure watermark state machine that every component imports."""

from watermark_core.protocol import (
    MARKER_PROPERTY,
    MalformedMarker,
    Marker,
    MarkerKind,
    Position,
    Watermark,
    WatermarkEvent,
    decode_marker,
)
from watermark_core.state import WatermarkConfig, WatermarkState, apply_all, is_broken_assertion

__all__ = [
    "MARKER_PROPERTY",
    "MalformedMarker",
    "Marker",
    "MarkerKind",
    "Position",
    "Watermark",
    "WatermarkConfig",
    "WatermarkEvent",
    "WatermarkState",
    "apply_all",
    "decode_marker",
    "is_broken_assertion",
]
