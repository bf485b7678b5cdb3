"""Runs `broker-ext serve` as a real process against the test broker, so tests can kill -9 it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from pulsar_access.settings import PulsarSettings
from watermark_core.state import WatermarkConfig

FAST = {
    "WM_POLL_INTERVAL_S": "0.02",
    "WM_IDLE_POLL_INTERVAL_S": "0.5",
    "WM_SNAPSHOT_INTERVAL_S": "1",
    "WM_SNAPSHOT_INTERVAL_MESSAGES": "50",
    "WM_METRICS_PORT": "0",
    "WM_SNAPSHOT_KEY": "the-test-generators-shared-snapshot-key",
}
"""Every test generator shares one snapshot key, as the instances of one deployment do."""


class GeneratorProcess:
    """One generator instance; `kill()` is a `kill -9`."""

    def __init__(
        self, settings: PulsarSettings, log_path: Path, instance_id: str, log_level: str = "INFO", **env: str
    ) -> None:
        self.settings = settings
        self.log_level = log_level
        self.log_path = log_path
        self.instance_id = instance_id
        self.env = {**FAST, **env}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> GeneratorProcess:
        environment = {
            **os.environ,
            "PULSAR_SERVICE_URL": self.settings.service_url,
            "PULSAR_ADMIN_URL": self.settings.admin_url,
            "WM_INSTANCE_ID": self.instance_id,
            **self.env,
        }
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "broker_ext.cli", "--log-level", self.log_level, "serve"],
                env=environment,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    def dump_stacks(self) -> None:
        """Have the generator write every thread's stack to its log (SIGUSR1), to see where it waits."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGUSR1)

    @property
    def watermark_config(self) -> WatermarkConfig:
        """The timeouts this process folds with (what the oracle must fold with too)."""
        env = {**os.environ, **self.env}
        defaults = WatermarkConfig()
        return WatermarkConfig(
            producer_timeout_ms=int(env.get("WM_PRODUCER_TIMEOUT_MS") or defaults.producer_timeout_ms),
            txn_timeout_ms=int(env.get("WM_TXN_TIMEOUT_MS") or defaults.txn_timeout_ms),
            producer_retention_ms=int(env.get("WM_PRODUCER_RETENTION_MS") or defaults.producer_retention_ms),
        )

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
