"""`make cluster-up` / `make cluster-down`: a real standalone broker with the watermark generator beside it.

One test: it starts a second broker (on free ports, in a temporary directory) next to the session's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import requests

from consumer import WatermarkConsumer
from devtools.local_cluster import REPO_ROOT, LocalCluster, free_port
from producer import WatermarkProducer
from pulsar_access.admin import PulsarAdmin
from pulsar_access.settings import PulsarSettings
from tests.integration.helpers import Recorder, wait_until, watermarks
from tests.oracle import assert_oracle_agrees, keep_history


def test_cluster_up_starts_the_broker_and_its_generator_and_a_watermark_flows(tmp_path: Path) -> None:
    state_dir = tmp_path / "cluster"
    ports = {"PULSAR_BROKER_PORT": free_port(), "PULSAR_WEB_PORT": free_port(), "PULSAR_BOOKIE_PORT": free_port()}
    metrics_port = free_port()
    env = {**os.environ, **{k: str(v) for k, v in ports.items()}, "WM_METRICS_PORT": str(metrics_port)}
    for name in ("PULSAR_SERVICE_URL", "PULSAR_ADMIN_URL", "WM_NAMESPACES", "WM_TOPICS", "PULSAR_WM_AUTH"):
        env.pop(name, None)  # what `make cluster-up` sees on a developer's machine

    def cluster_command(action: str) -> subprocess.CompletedProcess[str]:
        """What `make cluster-up` / `make cluster-down` run, with the state in a directory of our own."""
        return subprocess.run(
            [sys.executable, "-m", "devtools.local_cluster", action, "--state-dir", str(state_dir)],
            env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
        )  # fmt: skip

    cluster = LocalCluster(state_dir=state_dir, broker_port=ports["PULSAR_BROKER_PORT"],
                           web_port=ports["PULSAR_WEB_PORT"], bookie_port=ports["PULSAR_BOOKIE_PORT"])  # fmt: skip
    try:
        up = cluster_command("up")
        assert up.returncode == 0, up.stdout + up.stderr
        # it returned once both were ready
        assert cluster.running_pid("pulsar") is not None, up.stdout
        assert cluster.running_pid("generator") is not None, up.stdout
        settings = PulsarSettings(cluster.service_url, cluster.admin_url)
        admin = PulsarAdmin(settings)
        client = settings.client()
        try:
            assert admin.healthy()
            wait_until(lambda: _answers(f"http://127.0.0.1:{metrics_port}/metrics"), what="the generator's metrics")
            topic = f"persistent://public/default/cluster-up-{uuid.uuid4().hex[:6]}"
            keep_history(admin, topic)
            recorder = Recorder()
            consumer = WatermarkConsumer(client, topic, "sub", listener=recorder)
            producer = WatermarkProducer(client, topic, producer_name="cluster-up")
            producer.new_watermark().event_time(31_337).send()
            producer.send(b"x", event_timestamp=31_337)
            wait_until(lambda: watermarks(recorder) == [31_337], timeout_s=60, what="the generator's watermark")
            assert_oracle_agrees(client, admin, topic)
            consumer.close()
            producer.close()
        finally:
            client.close()
            admin.close()
        down = cluster_command("down")
        assert down.returncode == 0, down.stdout + down.stderr
        assert "stopped generator, pulsar" in down.stdout
        assert cluster.running_pid("pulsar") is None
        assert cluster.running_pid("generator") is None
    finally:
        cluster.down()  # whatever failed above: no broker left behind


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False
