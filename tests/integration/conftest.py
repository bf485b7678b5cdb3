"""Fixtures shared by the integration tests that use Spark (test_spark, test_auth)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from pulsar_access.settings import PulsarSettings


@pytest.fixture(scope="session")
def spark(pulsar_settings: PulsarSettings) -> Iterator[Any]:
    """The session's one SparkSession (local[2]); its executors run this venv's Python."""
    pytest.importorskip("pyspark")
    import spark_sink

    session = spark_sink.local_session(pulsar_settings.service_url, pulsar_settings.admin_url)
    yield session
    session.stop()
