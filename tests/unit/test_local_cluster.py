"""The local cluster's checks and files, without starting a broker."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from devtools.local_cluster import ClusterError, LocalCluster, check_java, free_listen_port, free_port, port_free


def test_port_free_sees_a_listening_socket() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert not port_free(port)
    assert port_free(free_port())


def test_a_taken_port_is_one_clear_error(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        cluster = LocalCluster(state_dir=tmp_path, broker_port=sock.getsockname()[1], with_generator=False)
        with pytest.raises(ClusterError, match=r"already in use.*PULSAR_BROKER_PORT"):
            cluster.up()


def _fake_java(tmp_path: Path, version_line: str) -> Path:
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    java.chmod(java.stat().st_mode | stat.S_IEXEC)
    return home


def test_java_too_old_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(_fake_java(tmp_path, 'openjdk version "11.0.2" 2019-01-15')))
    with pytest.raises(ClusterError, match=r"Java 11 .*Java 17\+"):
        check_java()


def test_java_8_style_version_is_parsed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(_fake_java(tmp_path, 'java version "1.8.0_292"')))
    with pytest.raises(ClusterError, match="Java 8 "):
        check_java()


def test_java_missing_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "nowhere"))
    with pytest.raises(ClusterError, match="Java is not installed"):
        check_java()


def test_java_17_is_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = _fake_java(tmp_path, 'openjdk version "17.0.15" 2025-04-15')
    monkeypatch.setenv("JAVA_HOME", str(home))
    assert check_java() == str(home / "bin" / "java")


def test_config_is_loopback_single_bookie_and_uses_the_ports(tmp_path: Path) -> None:
    cluster = LocalCluster(state_dir=tmp_path, broker_port=16650, web_port=18080, bookie_port=13181)
    conf = dict(line.split("=", 1) for line in cluster.write_config().read_text().splitlines() if "=" in line)
    assert conf["bindAddress"] == "127.0.0.1"
    assert conf["brokerServicePort"] == "16650"
    assert conf["webServicePort"] == "18080"
    assert conf["managedLedgerDefaultEnsembleSize"] == "1"
    assert conf["functionsWorkerEnabled"] == "false"
    assert cluster.service_url == "pulsar://127.0.0.1:16650"
    assert (tmp_path / "log4j2.xml").read_text().count(str(tmp_path / "pulsar.log")) == 2


def test_a_stale_pid_file_is_not_a_running_cluster(tmp_path: Path) -> None:
    cluster = LocalCluster(state_dir=tmp_path)
    (tmp_path / "pulsar.pid").write_text("999999999\n")
    assert cluster.running_pid("pulsar") is None
    (tmp_path / "pulsar.pid").write_text(f"{os.getpid()}\n")
    assert cluster.running_pid("pulsar") == os.getpid()


def test_ports_for_a_broker_that_restarts_are_free_and_not_ephemeral() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_listen_port() for _ in range(5)}
    assert all(10_000 <= port < low and port_free(port) for port in ports)


def test_every_broker_we_start_loads_the_plugin_unless_told_not_to(tmp_path: Path) -> None:
    from devtools.broker_cluster import MultiBrokerCluster
    from devtools.plugin import NAR_DIR, PLUGIN_NAME

    def conf(cluster: LocalCluster) -> dict[str, str]:
        cluster.state_dir.mkdir()
        return dict(line.split("=", 1) for line in cluster.write_config().read_text().splitlines() if "=" in line)

    loaded = conf(LocalCluster(state_dir=tmp_path / "with"))
    assert loaded["brokerInterceptors"] == loaded["additionalServlets"] == PLUGIN_NAME
    assert loaded["brokerInterceptorsDirectory"] == loaded["additionalServletDirectory"] == str(NAR_DIR)
    assert "brokerInterceptors" not in conf(LocalCluster(state_dir=tmp_path / "without", plugin=False))
    multi = MultiBrokerCluster(state_dir=tmp_path / "multi", brokers=3).broker_config(1)
    assert multi["brokerInterceptors"] == multi["additionalServlets"] == PLUGIN_NAME
