"""A real multi-broker Apache Pulsar cluster on loopback, without Docker: `make cluster-up BROKERS=3`.

The same cached Maven jars as the standalone (devtools/local_cluster.py) hold every part a cluster
needs: ZooKeeper's `ZooKeeperServerMain` (the metadata store), `PulsarClusterMetadataSetup` (the
cluster, its tenants and BookKeeper's metadata), BookKeeper's server `Main` (bookies) and
`PulsarBrokerStarter` (brokers). Each process has its own loopback ports, its own folder under the
state directory and a pid file, so `down()` stops exactly what `up()` started, and a test can kill
one broker (`kill_broker`) while the others take over its bundles.

What it sets that a production cluster would not (docs/RELIABILITY.md says what follows):
one bookie unless asked (ensemble, write and ack quorum 1), a 10 s metadata session (brokers of a
killed one take its bundles after it, not after the default 30 s), and no automatic bundle shedding
or splitting (unloads and splits are the operator's, or the chaos suite's, to make).
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from devtools.local_cluster import (
    BROKER_SETTINGS,
    JAVA_OPENS,
    PULSAR_VERSION,
    REPO_ROOT,
    WATERMARK_COMPACTION_THRESHOLD_BYTES,
    ClusterError,
    check_java,
    ensure_pulsar_jars,
    free_listen_port,
    port_free,
    pulsar_jvm_options,
    recorded_pid,
    say,
    stop_recorded,
    write_log4j2,
)
from devtools.plugin import broker_settings as plugin_settings
from devtools.plugin import ensure_plugin
from pulsar_access.admin import AdminError, PulsarAdmin
from pulsar_access.settings import PulsarSettings
from pulsar_access.topics import namespace_of, watermark_namespace

CLUSTER_NAME = "local"
BUNDLES_PER_NAMESPACE = 16
"""More bundles than Pulsar's default 4, so that topics spread over three brokers (a bundle is what moves)."""


@dataclass
class BrokerPorts:
    """One broker's loopback ports: its binary protocol and its web service (admin, lookups, metrics)."""

    service: int
    web: int

    @property
    def service_url(self) -> str:
        return f"pulsar://127.0.0.1:{self.service}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.web}"


@dataclass
class MultiBrokerCluster:
    """A metadata store, `bookies` bookies, `brokers` brokers and `generators` watermark generators."""

    state_dir: Path = field(default_factory=lambda: REPO_ROOT / ".cluster")
    brokers: int = 3
    bookies: int = 1
    generators: int | None = None
    """Generator instances (each pointed at its own broker first); None: one per broker."""
    zookeeper_port: int = 2181
    first_bookie_port: int = 3181
    first_broker_port: int = 6650
    first_web_port: int = 8080
    broker_heap: str = "512m"
    ports: list[BrokerPorts] = field(default_factory=list)
    bookie_ports: list[int] = field(default_factory=list)
    extra_broker_config: dict[str, str] = field(default_factory=dict)
    generator_env: dict[str, str] = field(default_factory=dict)
    plugin: bool = True
    """Every broker loads the broker plugin (broker_ext/plugin/)."""

    def __post_init__(self) -> None:
        if not self.ports:
            self.ports = [BrokerPorts(self.first_broker_port + i, self.first_web_port + i) for i in range(self.brokers)]
        if not self.bookie_ports:
            self.bookie_ports = [self.first_bookie_port + i for i in range(self.bookies)]
        self.brokers, self.bookies = len(self.ports), len(self.bookie_ports)
        if self.generators is None:
            self.generators = self.brokers

    @property
    def home(self) -> Path:
        return self.state_dir / "multi"

    @property
    def service_url(self) -> str:
        """Every broker, as a Pulsar client takes a list: the client looks up each topic's owner through any."""
        return "pulsar://" + ",".join(f"127.0.0.1:{p.service}" for p in self.ports)

    @property
    def admin_url(self) -> str:
        """Every broker's web service, a list the project's admin client goes through in turn."""
        return "http://" + ",".join(f"127.0.0.1:{p.web}" for p in self.ports)

    def settings(self, broker: int | None = None) -> PulsarSettings:
        """Settings for one broker only (`broker` = its index), or for the whole list."""
        if broker is None:
            return PulsarSettings(self.service_url, self.admin_url)
        return PulsarSettings(self.ports[broker].service_url, self.ports[broker].admin_url)

    @property
    def metadata_store(self) -> str:
        return f"zk:127.0.0.1:{self.zookeeper_port}"

    # -- processes -----------------------------------------------------------------------------------

    def _pid_file(self, name: str) -> Path:
        return self.home / f"{name}.pid"

    def running_pid(self, name: str) -> int | None:
        return recorded_pid(self._pid_file(name))

    def _java(self, name: str, main_class: str, args: list[str], heap: str, extra: list[str] | None = None) -> int:
        """Start one JVM of the cluster in its own session (so a signal reaches only it), logging to `name`.log."""
        folder = self.home / name
        folder.mkdir(parents=True, exist_ok=True)
        write_log4j2(folder / "log4j2.xml", folder / f"{name}.log")
        lib = ensure_pulsar_jars()
        command = [
            check_java(), *pulsar_jvm_options(heap, "512m", folder / "log4j2.xml"),
            "-Dzookeeper.admin.enableServer=false",
            *(extra or []), "-cp", f"{lib}/*", main_class, *args,
        ]  # fmt: skip
        with (folder / f"{name}.out").open("ab") as out:
            proc = subprocess.Popen(
                command, cwd=folder, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        self._pid_file(name).write_text(f"{proc.pid}\n")
        return proc.pid

    def _check_ports_free(self) -> None:
        wanted = [self.zookeeper_port, *self.bookie_ports, *(p for b in self.ports for p in (b.service, b.web))]
        taken = [port for port in wanted if not port_free(port)]
        if taken:
            raise ClusterError(
                f"ports {taken} on 127.0.0.1 are in use by another process; stop it (a standalone: "
                "'make cluster-down') or choose other first ports"
            )

    def up(self, timeout_s: float = 180.0) -> None:
        """Start the metadata store, bookies, brokers and generators; return once every broker serves lookups."""
        if self.running_pid("broker-0") is not None:
            say(f"already running: {self.brokers} brokers at {self.service_url} ({self.home})")
            self._start_generators()
            return
        started = time.monotonic()
        self.home.mkdir(parents=True, exist_ok=True)
        self._check_ports_free()
        ensure_pulsar_jars()
        if self.plugin:
            ensure_plugin()
        say(f"starting a Pulsar {PULSAR_VERSION} cluster: 1 metadata store, {self.bookies} bookie(s), "
            f"{self.brokers} brokers on 127.0.0.1 (state in {self.home})")  # fmt: skip
        first_start = not (self.home / "zookeeper" / "data").exists()
        (self.home / "zookeeper" / "data").mkdir(parents=True, exist_ok=True)
        self._java(
            "zookeeper", "org.apache.zookeeper.server.ZooKeeperServerMain",
            [str(self.zookeeper_port), str(self.home / "zookeeper" / "data")], "256m",
        )  # fmt: skip
        self._wait(lambda: not port_free(self.zookeeper_port), "the metadata store (ZooKeeper)", started, timeout_s)
        if first_start:
            self._setup_metadata()
        for index in range(self.bookies):
            self._start_bookie(index)
        for index in range(self.brokers):
            self._start_broker(index)
        for index in range(self.brokers):
            self._wait(functools.partial(self._serves_lookups, index), f"broker {index}", started, timeout_s)
        self._wait(lambda: len(self.active_brokers()) == self.brokers, "every broker to register", started, timeout_s)
        say(f"{self.brokers} brokers ready after {time.monotonic() - started:.1f} s: service {self.service_url}, "
            f"admin {self.admin_url}")  # fmt: skip
        self.prepare_namespaces()
        self._start_generators()

    def _setup_metadata(self) -> None:
        """The cluster, tenant `public`, namespace `public/default` and BookKeeper's metadata, once."""
        say("  initialising the cluster's metadata")
        lib = ensure_pulsar_jars()
        first = self.ports[0]
        result = subprocess.run(
            [
                check_java(), "-Xmx256m", *JAVA_OPENS, "-cp", f"{lib}/*",
                "org.apache.pulsar.PulsarClusterMetadataSetup",
                "--cluster", CLUSTER_NAME,
                "--metadata-store", self.metadata_store,
                "--configuration-metadata-store", self.metadata_store,
                "--web-service-url", first.admin_url,
                "--broker-service-url", first.service_url,
            ],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        (self.home / "metadata-setup.log").write_text(result.stdout + result.stderr)
        if result.returncode != 0:
            raise ClusterError(f"setting up the cluster's metadata failed; see {self.home}/metadata-setup.log")

    def _start_bookie(self, index: int) -> None:
        folder = self.home / f"bookie-{index}"
        folder.mkdir(parents=True, exist_ok=True)
        conf = {
            "bookiePort": str(self.bookie_ports[index]),
            "advertisedAddress": "127.0.0.1",
            "allowLoopback": "true",
            "metadataServiceUri": f"zk+hierarchical://127.0.0.1:{self.zookeeper_port}/ledgers",
            "journalDirectory": str(folder / "journal"),
            "ledgerDirectories": str(folder / "ledgers"),
            "ledgerStorageClass": "org.apache.bookkeeper.bookie.storage.ldb.DbLedgerStorage",
            "dbStorage_writeCacheMaxSizeMb": "32",
            "dbStorage_readAheadCacheMaxSizeMb": "32",
            "journalSyncData": "false",
            "httpServerEnabled": "false",
            "statsProviderClass": "org.apache.bookkeeper.stats.NullStatsProvider",
        }
        path = folder / "bookkeeper.conf"
        path.write_text("".join(f"{k}={v}\n" for k, v in conf.items()))
        self._java(f"bookie-{index}", "org.apache.bookkeeper.server.Main", ["--conf", str(path)], "256m")

    def broker_config(self, index: int) -> dict[str, str]:
        ports = self.ports[index]
        return {
            "clusterName": CLUSTER_NAME,
            "metadataStoreUrl": self.metadata_store,
            "configurationMetadataStoreUrl": self.metadata_store,
            "metadataStoreSessionTimeoutMillis": "10000",
            "bindAddress": "127.0.0.1",
            "advertisedAddress": "127.0.0.1",
            "brokerServicePort": str(ports.service),
            "webServicePort": str(ports.web),
            **BROKER_SETTINGS,
            "defaultNumberOfNamespaceBundles": str(BUNDLES_PER_NAMESPACE),
            "loadBalancerEnabled": "true",
            "loadBalancerSheddingEnabled": "false",
            "loadBalancerAutoBundleSplitEnabled": "false",
            "loadBalancerAutoUnloadSplitBundlesEnabled": "false",
            "managedLedgerCacheSizeMB": "64",
            **(plugin_settings() if self.plugin else {}),
            **self.extra_broker_config,
        }

    def _start_broker(self, index: int) -> None:
        folder = self.home / f"broker-{index}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "broker.conf"
        path.write_text("".join(f"{k}={v}\n" for k, v in self.broker_config(index).items()))
        self._java(f"broker-{index}", "org.apache.pulsar.PulsarBrokerStarter", ["--broker-conf", str(path)],
                   self.broker_heap)  # fmt: skip

    def start_broker(self, index: int, timeout_s: float = 120.0) -> None:
        """Start a broker that was killed or stopped again, on its ports and data; return once it serves lookups."""
        if self.running_pid(f"broker-{index}") is not None:
            return
        started = time.monotonic()
        self._wait(lambda: port_free(self.ports[index].service) and port_free(self.ports[index].web),
                   f"broker {index}'s ports to be free", started, timeout_s)  # fmt: skip
        self._start_broker(index)
        self._wait(lambda: self._serves_lookups(index), f"broker {index}", started, timeout_s)

    def _serves_lookups(self, index: int) -> bool:
        """The broker answers its health check (which writes and reads a topic it owns) and has `public/default`."""
        url = self.ports[index].admin_url
        try:
            if requests.get(f"{url}/admin/v2/brokers/health", timeout=5).text != "ok":
                return False
            return "public/default" in requests.get(f"{url}/admin/v2/namespaces/public", timeout=5).json()
        except (requests.RequestException, ValueError):
            return False

    def active_brokers(self) -> list[str]:
        """The brokers registered in the metadata store (host:webport), as any live broker reports them."""
        for ports in self.ports:
            with contextlib.suppress(requests.RequestException, ValueError):
                answer = requests.get(f"{ports.admin_url}/admin/v2/brokers/{CLUSTER_NAME}", timeout=5)
                if answer.status_code == 200:
                    return sorted(answer.json())
        return []

    def _wait(self, ready: Callable[[], bool], what: str, started: float, timeout_s: float) -> None:
        last_report = time.monotonic()
        while not ready():
            dead = [name for name in self._names() if self._pid_file(name).exists() and self.running_pid(name) is None]
            if dead:
                raise ClusterError(f"{dead[0]} exited while starting; see {self.home / dead[0] / (dead[0] + '.log')}")
            if time.monotonic() - started > timeout_s:
                raise ClusterError(f"waiting for {what} took over {timeout_s:.0f} s; see the logs under {self.home}")
            if time.monotonic() - last_report >= 10:
                say(f"  ... waiting for {what} ({time.monotonic() - started:.0f} s)")
                last_report = time.monotonic()
            time.sleep(0.5)

    def prepare_namespaces(self) -> None:
        """The watermark tables' namespace, compacted by the brokers themselves (as the standalone's)."""
        admin = PulsarAdmin(self.settings())
        try:
            admin.create_namespace(watermark_namespace())
            admin.set_compaction_threshold(watermark_namespace(), WATERMARK_COMPACTION_THRESHOLD_BYTES)
        finally:
            admin.close()

    def _snapshot_key_file(self) -> Path:
        from devtools.local_cluster import LocalCluster

        return LocalCluster(state_dir=self.state_dir).ensure_snapshot_key()

    def _start_generators(self) -> None:
        """One generator per broker (or as many as asked), each pointed at its own broker first; they share
        the partitions through their Failover subscriptions and one snapshot key."""
        assert self.generators is not None
        for index in range(self.generators):
            name = f"generator-{index}"
            if self.running_pid(name) is not None:
                continue
            first = index % self.brokers
            order = self.ports[first:] + self.ports[:first]
            env = {
                **os.environ,
                "PULSAR_SERVICE_URL": "pulsar://" + ",".join(f"127.0.0.1:{p.service}" for p in order),
                "PULSAR_ADMIN_URL": "http://" + ",".join(f"127.0.0.1:{p.web}" for p in order),
                "WM_SNAPSHOT_KEY_FILE": str(self._snapshot_key_file()),
                "WM_METRICS_PORT": str(9108 + index),
                **self.generator_env,
            }
            log_path = self.home / f"{name}.log"
            with log_path.open("ab") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "broker_ext.cli", "serve"], stdout=out, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, env=env, start_new_session=True, cwd=REPO_ROOT,
                )  # fmt: skip
            self._pid_file(name).write_text(f"{proc.pid}\n")
            say(f"watermark generator {index} started (pid {proc.pid}), log {log_path}")

    # -- moving topics -------------------------------------------------------------------------------

    def move_topic(self, admin: PulsarAdmin, topic: str, to: int, timeout_s: float = 60.0) -> float:
        """Unload `topic`'s bundle with broker `to` as its destination, retried as an operator would (a bundle
        just moved may still be in transit, and a lookup meanwhile may fail); seconds until `to` owns it."""
        started = time.monotonic()
        target = self.ports[to]
        while self.owner(admin, topic) != target.admin_url:
            if time.monotonic() - started > timeout_s:
                raise ClusterError(f"{topic} did not move to broker {to} within {timeout_s:.0f} s")
            try:
                admin.unload_bundle(namespace_of(topic), admin.bundle_of(topic), f"127.0.0.1:{target.web}")
            except AdminError as exc:
                say(f"unloading the bundle of {topic} was refused ({exc}); retrying")
                time.sleep(1)
                continue
            deadline = time.monotonic() + 5
            while self.owner(admin, topic) != target.admin_url and time.monotonic() < deadline:
                time.sleep(0.05)
        return time.monotonic() - started

    def move_elsewhere(self, admin: PulsarAdmin, topic: str, avoid: set[int] | None = None, pick: int = 0) -> int:
        """Move `topic`'s bundle to a broker that does not own it and is not in `avoid` (`pick` chooses among
        them); that broker's index."""
        owner = self.owner_index(admin, topic, timeout_s=60)
        others = [i for i in range(len(self.ports)) if i != owner and i not in (avoid or set())]
        to = others[pick % len(others)]
        self.move_topic(admin, topic, to)
        return to

    @classmethod
    def on_free_ports(cls, state_dir: Path, brokers: int, **options: Any) -> MultiBrokerCluster:
        """A cluster of `brokers` brokers, one bookie and its metadata store on free loopback ports (tests, chaos)."""
        return cls(
            state_dir=state_dir,
            ports=[BrokerPorts(free_listen_port(), free_listen_port()) for _ in range(brokers)],
            bookie_ports=[free_listen_port()],
            zookeeper_port=free_listen_port(),
            **options,
        )

    @staticmethod
    def owner(admin: PulsarAdmin, topic: str) -> str | None:
        """The owner's admin URL, None while no broker has it (a bundle in transit answers lookups with 500)."""
        try:
            return admin.owner(topic)
        except AdminError:
            return None

    def owner_index(
        self, admin: PulsarAdmin, topic: str, timeout_s: float = 30.0, other_than: int | None = None
    ) -> int:
        """The index of the broker that owns `topic`, waiting while its bundle is in transit (or, with
        `other_than`, while that broker still owns it: a killed broker's until its session expires)."""
        deadline = time.monotonic() + timeout_s
        unwanted = {None} | ({self.ports[other_than].admin_url} if other_than is not None else set())
        while (owner := self.owner(admin, topic)) in unwanted:
            if time.monotonic() > deadline:
                raise ClusterError(f"no broker (but {other_than}) owns {topic} after {timeout_s:.0f} s")
            time.sleep(0.1)
        return next(i for i, p in enumerate(self.ports) if p.admin_url == owner)

    # -- faults and stopping -------------------------------------------------------------------------

    def kill_broker(self, index: int) -> None:
        """`kill -9` one broker: its bundles go to the others once its metadata session expires (10 s here)."""
        self._kill(f"broker-{index}")

    def kill_generator(self, index: int) -> None:
        self._kill(f"generator-{index}")

    def _kill(self, name: str) -> None:
        stop_recorded(self._pid_file(name), grace_s=0)

    def _names(self) -> list[str]:
        """Every process of the cluster, those to stop first first: the configured ones and any with a pid
        file (a cluster started with more brokers than this object was told of)."""
        configured = (
            [f"generator-{i}" for i in range(self.generators or 0)]
            + [f"broker-{i}" for i in range(self.brokers)]
            + [f"bookie-{i}" for i in range(self.bookies)]
            + ["zookeeper"]
        )
        recorded = [p.stem for p in self.home.glob("*.pid")] if self.home.exists() else []
        order = {"generator": 0, "broker": 1, "bookie": 2, "zookeeper": 3}
        return sorted(set(configured) | set(recorded), key=lambda n: (order.get(n.split("-")[0], 4), n))

    def down(self) -> list[str]:
        """Stop generators, brokers, bookies and the metadata store, in that order, by their recorded pids."""
        return [
            name
            for name in self._names()
            if stop_recorded(self._pid_file(name), grace_s=10 if name.startswith("generator") else 20)
        ]

    def status(self) -> dict[str, int | None]:
        return {name: self.running_pid(name) for name in reversed(self._names())}
