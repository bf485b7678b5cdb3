"""The generator's metrics: what `record_watermark` sets shows on /metrics, also after it was forgotten."""

from __future__ import annotations

from broker_ext.metrics import GeneratorMetrics

LABELS = {"topic": "persistent://public/default/t", "partition": "0", "subscription": "s"}


def test_a_watermark_recorded_again_after_it_was_forgotten_shows_again() -> None:
    metrics = GeneratorMetrics()
    for forget in (metrics.forget_watermark, metrics.forget_subscription):
        metrics.record_watermark(LABELS["topic"], 0, "s", 1_000)
        assert metrics.registry.get_sample_value("wm_watermark_ms", LABELS) == 1_000
        forget(LABELS["topic"], 0, "s")
        assert metrics.registry.get_sample_value("wm_watermark_ms", LABELS) is None
        metrics.record_watermark(LABELS["topic"], 0, "s", 2_000)
        assert metrics.registry.get_sample_value("wm_watermark_ms", LABELS) == 2_000
        assert metrics.registry.get_sample_value("wm_watermark_age_seconds", LABELS) is not None
