"""The one place that gives tests a real Pulsar broker.

Order of choice: an existing cluster named by `PULSAR_SERVICE_URL`; else the official image through
testcontainers when a Docker engine answers; else the local standalone started with the same code
as `make cluster-up`, on free ports in a temporary directory so it never collides with a cluster
a developer already runs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from devtools.local_cluster import PULSAR_VERSION, LocalCluster, free_listen_port, wait_for_admin
from devtools.plugin import broker_settings as plugin_settings
from devtools.plugin import ensure_plugin
from pulsar_access.settings import PulsarSettings

GENERATOR_LISTENER = "generator"
"""The broker's second advertised listener, on a port where nothing listens until a test starts a proxy
there (`tests/loopback_proxy.py`): a client with `listener_name="generator"` reaches the broker only
through that proxy, lookups included, so a test can cut that one client off."""


@dataclass(frozen=True)
class RunningPulsar:
    """The session's broker; `restart` stops and starts it, `kill` is a `kill -9` (and `start` starts it
    again on the same data), and `generator_listener_port` is where the `generator` listener points
    (only for the local standalone we started)."""

    settings: PulsarSettings
    restart: Callable[[], None] | None = None
    kill: Callable[[], None] | None = None
    start: Callable[[], None] | None = None
    generator_listener_port: int | None = None


def docker_engine_available() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@contextlib.contextmanager
def _docker_pulsar() -> Iterator[PulsarSettings]:
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.waiting_utils import wait_for_logs

    plugin_dir = "/pulsar/watermark-plugin"
    start = "bin/apply-config-from-env.py conf/standalone.conf && exec bin/pulsar standalone --no-functions-worker "
    container = (
        DockerContainer(f"apachepulsar/pulsar:{PULSAR_VERSION}")
        .with_command(["bash", "-c", start + "--no-stream-storage"])
        .with_volume_mapping(str(ensure_plugin()), plugin_dir, "ro")  # the broker plugin, as docker-compose.yml
        .with_exposed_ports(6650, 8080)
    )
    for key, value in {**plugin_settings(), "brokerInterceptorsDirectory": plugin_dir,
                       "additionalServletDirectory": plugin_dir}.items():  # fmt: skip
        container = container.with_env(f"PULSAR_PREFIX_{key}", value)
    with container:
        wait_for_logs(container, "messaging service is ready", timeout=180)
        host = container.get_container_host_ip()
        admin_url = f"http://{host}:{container.get_exposed_port(8080)}"
        if not wait_for_admin(admin_url, 120):
            raise RuntimeError(f"the Pulsar container's admin API at {admin_url} never became healthy")
        yield PulsarSettings(f"pulsar://{host}:{container.get_exposed_port(6650)}", admin_url)


@contextlib.contextmanager
def _local_pulsar(state_dir: Path) -> Iterator[RunningPulsar]:
    # ports that stay the broker's across restarts and kills: outside the ephemeral range
    broker_port, listener_port = free_listen_port(), free_listen_port()
    cluster = LocalCluster(
        state_dir=state_dir,
        broker_port=broker_port,
        web_port=free_listen_port(),
        bookie_port=free_listen_port(),
        with_generator=False,
        extra_broker_config={
            "advertisedListeners": f"internal:pulsar://127.0.0.1:{broker_port},"
            f"{GENERATOR_LISTENER}:pulsar://127.0.0.1:{listener_port}",
            "internalListenerName": "internal",
        },
    )
    cluster.up()

    def restart() -> None:
        cluster.down()
        cluster.up()

    try:
        yield RunningPulsar(
            PulsarSettings(cluster.service_url, cluster.admin_url), restart, cluster.kill_broker, cluster.up,
            listener_port,
        )  # fmt: skip
    finally:
        cluster.down()


@contextlib.contextmanager
def real_pulsar(state_dir: Path) -> Iterator[RunningPulsar]:
    """A running broker for the whole test session."""
    if os.environ.get("PULSAR_SERVICE_URL"):
        yield RunningPulsar(PulsarSettings.from_env())
    elif docker_engine_available():
        with _docker_pulsar() as settings:
            yield RunningPulsar(settings)
    else:
        with _local_pulsar(state_dir) as running:
            yield running
