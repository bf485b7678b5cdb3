"""The generator's metrics: what `record_watermark` sets shows on /metrics, also after it was forgotten."""

from __future__ import annotations

import pytest

from broker_ext.metrics import GeneratorMetrics

LABELS = {"topic": "persistent://public/default/t", "partition": "0", "subscription": "s"}


def test_a_watermark_recorded_again_after_it_was_forgotten_shows_again() -> None:
    metrics = GeneratorMetrics()

    def no_watermark(topic: str, partition: int, subscription: str) -> None:  # a table giving it none
        metrics.record_watermark(topic, partition, subscription, None)

    for forget in (no_watermark, metrics.forget_subscription):
        metrics.record_watermark(LABELS["topic"], 0, "s", 1_000)
        assert metrics.registry.get_sample_value("wm_watermark_ms", LABELS) == 1_000
        forget(LABELS["topic"], 0, "s")
        assert metrics.registry.get_sample_value("wm_watermark_ms", LABELS) is None
        metrics.record_watermark(LABELS["topic"], 0, "s", 2_000)
        assert metrics.registry.get_sample_value("wm_watermark_ms", LABELS) == 2_000
        assert metrics.registry.get_sample_value("wm_watermark_age_seconds", LABELS) is not None


def test_counters_have_no_created_series_so_a_scrape_of_thousands_of_topics_stays_small() -> None:
    """A scrape's cost grows with the series per followed partition; `_created` ones would add a third."""
    metrics = GeneratorMetrics()
    metrics.record_watermark(LABELS["topic"], 0, "s", 1_000)
    metrics.markers_applied.labels(LABELS["topic"], "0").inc()
    names = {sample.name for family in metrics.registry.collect() for sample in family.samples}
    assert "wm_watermarks_published_total" in names and "wm_markers_applied_total" in names
    assert not [name for name in names if name.endswith("_created")], names


def test_a_watermarks_age_is_taken_when_scraped_and_every_table_is_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 47: what a table changes is kept in plain values and read by each scrape, not set on metric objects per
    table; the age is the wall clock at the scrape less the watermark, so a watermark that stands still ages."""
    import broker_ext.metrics as module

    metrics = GeneratorMetrics()
    clock = [100.0]
    monkeypatch.setattr(module.time, "time", lambda: clock[0])
    metrics.record_watermark(LABELS["topic"], 0, "s", 90_000)
    metrics.record_watermark(LABELS["topic"], 0, "s", 95_000)
    assert metrics.registry.get_sample_value("wm_watermark_age_seconds", LABELS) == 5.0
    clock[0] = 130.0
    assert metrics.registry.get_sample_value("wm_watermark_age_seconds", LABELS) == 35.0
    assert metrics.registry.get_sample_value("wm_watermarks_published_total", LABELS) == 2
    metrics.record_watermark(LABELS["topic"], 0, "s", None)  # a table giving it no watermark is a table published too
    assert metrics.registry.get_sample_value("wm_watermarks_published_total", LABELS) == 3
    assert metrics.registry.get_sample_value("wm_watermark_age_seconds", LABELS) is None


def test_a_scrape_asking_for_one_series_by_name_gets_the_subscriptions_series() -> None:
    """`/metrics?name[]=...` (how the benches wait for a take-over) serves only the collectors that name it."""
    metrics = GeneratorMetrics()
    metrics.record_watermark(LABELS["topic"], 0, "s", 1_000)
    for name, value in (("wm_watermarks_published_total", 1), ("wm_watermark_ms", 1_000)):
        restricted = metrics.registry.restricted_registry([name])
        assert [s.value for f in restricted.collect() for s in f.samples if s.name == name] == [value]
