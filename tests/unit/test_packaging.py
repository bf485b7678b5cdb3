"""Static checks of the files a user runs directly: docker-compose.yml, Dockerfile, pyproject."""

from __future__ import annotations

import tomllib
from pathlib import Path

import yaml

from devtools.local_cluster import PULSAR_VERSION

ROOT = Path(__file__).resolve().parents[2]


def test_compose_runs_the_pinned_broker_with_a_health_check() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    pulsar = compose["services"]["pulsar"]
    assert pulsar["image"] == f"apachepulsar/pulsar:{PULSAR_VERSION}"
    assert "standalone" in pulsar["command"]
    assert {"6650:6650", "8080:8080"} <= set(pulsar["ports"])
    assert "brokers/health" in " ".join(pulsar["healthcheck"]["test"])


def test_compose_starts_the_generator_after_a_healthy_broker() -> None:
    generator = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["watermark-generator"]
    build = generator["build"]
    assert (ROOT / build["context"] / build["dockerfile"]).is_file()
    assert generator["depends_on"]["pulsar"]["condition"] == "service_healthy"
    assert generator["environment"]["PULSAR_SERVICE_URL"] == "pulsar://pulsar:6650"


def test_dockerfile_copies_every_package_and_runs_the_generator() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    for package in packages:
        assert f"COPY {package} " in dockerfile, package
    assert 'ENTRYPOINT ["broker-ext"]' in dockerfile
    assert 'CMD ["serve"]' in dockerfile


def test_every_package_is_typed() -> None:
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    for package in packages:
        assert (ROOT / package / "py.typed").is_file(), package


def test_every_compose_broker_loads_the_plugin_built_from_source() -> None:
    from devtools.plugin import PLUGIN_NAME

    for name in ("docker-compose.yml", "docker-compose.cluster.yml"):
        services = yaml.safe_load((ROOT / name).read_text())["services"]
        builder = services["plugin"]
        assert "./broker_ext/plugin:/src:ro" in builder["volumes"] and "mvn" in builder["command"], name
        brokers = {k: v for k, v in services.items() if k == "pulsar" or k.startswith("broker-")}
        assert brokers, name
        for broker, service in brokers.items():
            env = service["environment"]
            folder = env["PULSAR_PREFIX_brokerInterceptorsDirectory"]
            assert env["PULSAR_PREFIX_brokerInterceptors"] == env["PULSAR_PREFIX_additionalServlets"] == PLUGIN_NAME
            assert env["PULSAR_PREFIX_additionalServletDirectory"] == folder, (name, broker)
            assert f"plugin-nar:{folder}:ro" in service["volumes"], (name, broker)
            assert service["depends_on"]["plugin"]["condition"] == "service_completed_successfully"
            assert "apply-config-from-env.py" in service["command"], (name, broker)
