"""Shared fixtures: one real broker per test session, and per-test topic names."""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import pulsar
import pytest

from pulsar_access.admin import PulsarAdmin
from pulsar_access.settings import PulsarSettings
from tests.harness import RunningPulsar, real_pulsar
from tests.integration.generator_process import GeneratorProcess
from tests.oracle import keep_watermark_history

_HERE = Path(__file__).parent


class Heartbeat:
    """A line on the terminal every 25 s while one test runs (its set-up and teardown included, so the session's
    broker start and stop too): nothing runs for more than 30 s without a line, even with `-q` and its output
    captured. It writes past pytest's capture, to the terminal pytest started with."""

    EVERY_S = 25.0

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.running: tuple[str, float] | None = None
        self.lock = threading.Lock()
        threading.Thread(target=self.beat, name="test-heartbeat", daemon=True).start()

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        with self.lock:
            self.running = (nodeid, time.monotonic())

    def pytest_runtest_logfinish(self) -> None:
        with self.lock:
            self.running = None

    def beat(self) -> None:
        said: tuple[str, float] | None = None  # the test and the time of the last line
        while True:
            time.sleep(1.0)
            with self.lock:
                running = self.running
            if running is None:
                continue
            if said is None or said[0] != running[0] or said[1] < running[1]:
                said = running
            if time.monotonic() - said[1] >= self.EVERY_S:
                self.out.write(f"\n  ... {running[0]}: {time.monotonic() - running[1]:.0f} s\n")
                self.out.flush()
                said = (running[0], time.monotonic())


def pytest_configure(config: pytest.Config) -> None:
    # here pytest's capture is suspended: file descriptor 1 is still the terminal (or CI's log)
    if not hasattr(sys.stdout, "fileno") or config.option.collectonly:
        return
    try:
        terminal = open(os.dup(sys.stdout.fileno()), "w", buffering=1)  # noqa: SIM115 (open for the session)
    except (OSError, ValueError):
        return
    config.pluginmanager.register(Heartbeat(terminal), "heartbeat")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests under tests/unit are unit tests, the others integration tests (marked apart)."""
    for item in items:
        kind = "unit" if (_HERE / "unit") in Path(str(item.fspath)).parents else "integration"
        item.add_marker(getattr(pytest.mark, kind))
    # These restart the session's broker: run them after everything else, the chaos tests (which kill it
    # with SIGKILL; its bookie may refuse writes for a while after) last of all.
    last = {"test_multi_broker.py": 0.5, "test_restarts.py": 1, "test_chaos.py": 2}
    # A partition added to a live topic waits a minute for the clients' refresh: the scenario starts first and is
    # checked late, the minute passing while the rest runs (tests/integration/test_partitions.py).
    by_name = {
        "test_a_partition_added_later_joins_the_feeds_and_holds_the_watermark_back": -1,
        "test_a_partition_added_later_gets_markers_before_data_and_then_moves_the_watermark": 0.4,
    }
    items.sort(key=lambda item: by_name.get(item.name, last.get(Path(str(item.fspath)).name, 0)))


@pytest.fixture(scope="session")
def pulsar_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningPulsar]:
    with real_pulsar(tmp_path_factory.mktemp("pulsar-cluster")) as running:
        yield running


@pytest.fixture(scope="session")
def pulsar_settings(pulsar_broker: RunningPulsar) -> PulsarSettings:
    return pulsar_broker.settings


@pytest.fixture(scope="session")
def pulsar_client(pulsar_settings: PulsarSettings) -> Iterator[pulsar.Client]:
    client = pulsar_settings.client()
    yield client
    client.close()


@pytest.fixture(scope="session")
def admin(pulsar_settings: PulsarSettings) -> Iterator[PulsarAdmin]:
    api = PulsarAdmin(pulsar_settings)
    yield api
    api.close()


@pytest.fixture
def topic() -> str:
    """A fresh topic name in public/default for each test."""
    return f"persistent://public/default/test-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def generator(pulsar_settings: PulsarSettings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GeneratorProcess]:
    """One `broker-ext serve` process following public/default for the whole session."""
    process = GeneratorProcess(
        pulsar_settings, tmp_path_factory.mktemp("generator") / "generator.log", "session-generator",
        WM_NAMESPACES="public/default",
    ).start()  # fmt: skip
    yield process
    process.stop()


@pytest.fixture
def namespace(admin: PulsarAdmin) -> str:
    """A namespace of its own, for tests that run (and kill) generators of their own.

    It keeps every message (retention), so that the oracle (tests/oracle.py) can read the whole log.
    """
    name = f"public/ns-{uuid.uuid4().hex[:10]}"
    admin.create_namespace(name)
    admin.set_namespace_retention(name)
    keep_watermark_history(admin)
    return name
