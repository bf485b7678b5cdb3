"""The generator's settings as `broker-ext serve` reads them from flags and the environment."""

from __future__ import annotations

import argparse

import pytest

from broker_ext import config as generator_config
from broker_ext.config import GeneratorConfig


def serve_args(*argv: str) -> GeneratorConfig:
    """The settings `broker-ext serve` would run with, given these flags."""
    parser = argparse.ArgumentParser()
    generator_config.add_arguments(parser)
    return generator_config.from_arguments(parser.parse_args(list(argv)))


def test_the_intake_is_the_plugin_wherever_cursors_may_come_from_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 47: by default the plugin finds the markers (the consumer receives only where no plugin reports a topic);
    with cursors through the admin API only, there is no plugin to ask, so the consumer receives everything."""
    for name in ("WM_INTAKE", "WM_CURSOR_SOURCE"):
        monkeypatch.delenv(name, raising=False)
    assert serve_args().intake == "plugin"
    assert serve_args("--cursor-source", "admin").intake == "consumer"
    assert serve_args("--intake", "consumer").intake == "consumer"
    monkeypatch.setenv("WM_INTAKE", "consumer")
    assert serve_args().intake == "consumer"
    with pytest.raises(ValueError, match="--cursor-source"):
        serve_args("--intake", "plugin", "--cursor-source", "admin")


def test_ownership_is_by_claim_wherever_the_plugin_is_the_intake(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 47: with no consumer per partition, a topic is owned by the holder of its companion producer; where
    the consumer receives everything anyway, its Failover subscription decides as before."""
    for name in ("WM_INTAKE", "WM_CURSOR_SOURCE", "WM_OWNERSHIP"):
        monkeypatch.delenv(name, raising=False)
    assert serve_args().ownership == "claim"
    assert serve_args("--intake", "consumer").ownership == "failover"
    assert serve_args("--cursor-source", "admin").ownership == "failover"
    assert serve_args("--intake", "consumer", "--ownership", "claim").ownership == "claim"
    monkeypatch.setenv("WM_OWNERSHIP", "failover")
    assert serve_args().ownership == "failover"
