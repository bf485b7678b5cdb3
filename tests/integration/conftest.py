"""Fixtures shared by the integration tests that use Spark (test_spark, test_auth)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from broker_ext.settings import PulsarSettings


@pytest.fixture(scope="session")
def spark(pulsar_settings: PulsarSettings) -> Iterator[Any]:
    """The session's one SparkSession (local[2]); its executors run this venv's Python."""
    pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable  # executors run this venv's Python
    os.environ["PULSAR_SERVICE_URL"] = pulsar_settings.service_url
    os.environ["PULSAR_ADMIN_URL"] = pulsar_settings.admin_url
    session = (
        SparkSession.builder.master("local[2]")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
