"""A real Apache Pulsar standalone broker on loopback, without Docker, plus the watermark generator.

`make cluster-up` and the test session both use this module. The broker's jars come from Maven
Central through Maven (Pulsar's server tarball is not published there) into a cache outside the
source tree, shared by every clone: `$PULSAR_WM_CACHE` or `~/.cache/pulsar-watermarks`.
Each cluster keeps its configuration, data, logs and process ids in one state directory, so
`cluster-down` stops exactly the processes that `cluster-up` started.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from devtools.plugin import MAVEN_SETTINGS, ensure_plugin
from devtools.plugin import broker_settings as plugin_settings
from pulsar_access.auth_tokens import (
    ADMIN_ROLE,
    APPLICATION_WATERMARK_ACTIONS,
    CLIENT_ACTIONS,
    CLIENT_ROLE,
    DEFAULT_NAMESPACE,
    GENERATOR_ACTIONS,
    GENERATOR_ROLE,
    GENERATOR_WATERMARK_ACTIONS,
    TokenAuth,
    write_private,
)
from pulsar_access.settings import PulsarSettings
from pulsar_access.topics import watermark_namespace

PULSAR_VERSION = "4.0.7"
"""Pinned: the newest 4.0 LTS release whose every broker dependency is on Maven Central."""

MIN_JAVA = 17
REPO_ROOT = Path(__file__).resolve().parent.parent


AUTH_MODES = (None, "token")
WATERMARK_COMPACTION_THRESHOLD_BYTES = 256 * 1024
"""The broker compacts a companion topic itself past this backlog (the generator's role may not ask it to)."""


BROKER_SETTINGS = {
    "managedLedgerDefaultEnsembleSize": "1",
    "managedLedgerDefaultWriteQuorum": "1",
    "managedLedgerDefaultAckQuorum": "1",
    "allowAutoTopicCreation": "true",
    "allowAutoTopicCreationType": "non-partitioned",
    "brokerDeleteInactiveTopicsEnabled": "false",
    "systemTopicEnabled": "true",
    "topicLevelPoliciesEnabled": "true",
    "functionsWorkerEnabled": "false",
    "transactionCoordinatorEnabled": "false",
    "webSocketServiceEnabled": "false",
    "exposeTopicLevelMetricsInPrometheus": "true",
    "brokerShutdownTimeoutMs": "5000",
}
"""What every local broker sets, standalone or in a cluster: one bookie's quorums, topics created on use
and kept, no functions, transactions or websocket, per-topic metrics, a quick shutdown."""


class ClusterError(RuntimeError):
    """Something stops the local cluster; the message is one line that says what to do."""


def _auth_mode(value: str | None) -> str | None:
    """`--auth` / `PULSAR_WM_AUTH`: empty or "none" is off, "token" is token authentication."""
    value = (value or "").strip().lower()
    return None if value in ("", "none", "off") else value


def cache_dir() -> Path:
    return Path(os.environ.get("PULSAR_WM_CACHE", Path.home() / ".cache" / "pulsar-watermarks"))


def say(message: str) -> None:
    print(f"[cluster] {message}", flush=True)


# -- fetching the broker ------------------------------------------------------------------------

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.pulsar-watermarks</groupId>
  <artifactId>pulsar-standalone-runtime</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencyManagement>
    <dependencies>
      <dependency>
        <groupId>org.apache.pulsar</groupId>
        <artifactId>pulsar</artifactId>
        <version>{version}</version>
        <type>pom</type>
        <scope>import</scope>
      </dependency>
    </dependencies>
  </dependencyManagement>
  <dependencies>
    <dependency>
      <groupId>org.apache.pulsar</groupId>
      <artifactId>pulsar-broker</artifactId>
      <version>{version}</version>
    </dependency>
  </dependencies>
</project>
"""


EXPECTED_FILES = 1080
"""What Maven downloads into an empty repository for Pulsar 4.0.7 (measured), to say how much is left."""


def pulsar_lib_dir(version: str = PULSAR_VERSION) -> Path:
    return cache_dir() / f"pulsar-{version}" / "lib"


def ensure_pulsar_jars(version: str = PULSAR_VERSION) -> Path:
    """Fetch the broker and its dependencies once; later calls return the cached folder.

    Pulsar's own parent pom is imported for dependency management, so every library has the
    version that Pulsar's release was built and tested with.
    """
    lib = pulsar_lib_dir(version)
    done = lib.parent / ".complete"
    if done.exists():
        return lib
    if shutil.which("mvn") is None:
        raise ClusterError("Maven ('mvn') is not installed; install it (apt-get install maven) and retry")
    work = lib.parent
    work.mkdir(parents=True, exist_ok=True)
    (work / "pom.xml").write_text(_POM.format(version=version))
    (work / "settings.xml").write_text(MAVEN_SETTINGS)
    log_path = work / "maven.log"
    say(
        f"fetching Apache Pulsar {version} (broker and dependencies, about {EXPECTED_FILES} files and 245 MB, once for "
        f"every clone) from Maven Central into {lib}"
    )
    command = [
        "mvn", "-B", "-s", str(work / "settings.xml"), "-f", str(work / "pom.xml"),
        "dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={lib}",
    ]  # fmt: skip
    downloaded = 0
    last_report = time.monotonic()
    with (
        log_path.open("w") as log,
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc,
    ):
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            if "Downloaded from" in line:
                downloaded += 1
                if time.monotonic() - last_report > 5:
                    say(f"  ... {downloaded} of about {EXPECTED_FILES} files downloaded")
                    last_report = time.monotonic()
    if proc.returncode != 0:
        reason = _maven_failure(log_path)
        raise ClusterError(
            f"downloading Pulsar {version} failed ({reason}); check access to Maven Central, see {log_path}, then retry"
        )
    size_mb = sum(p.stat().st_size for p in lib.glob("*.jar")) / 1e6
    say(f"fetched {len(list(lib.glob('*.jar')))} jars, {size_mb:.0f} MB ({downloaded} files downloaded)")
    done.write_text(f"{version}\n")
    return lib


def _maven_failure(log_path: Path) -> str:
    for line in log_path.read_text(errors="replace").splitlines():
        if line.startswith("[ERROR]") and len(line) > 10:
            return line[8:200].strip()
    return "maven failed"


def check_java() -> str:
    """The java executable, if it is 17 or newer."""
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if not java or not Path(java).exists():
        raise ClusterError("Java is not installed; install Java 17+ (apt-get install openjdk-17-jre-headless)")
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    major = int(match.group(1)) if match else 0
    if major == 1 and match and match.group(2):  # "1.8" style
        major = int(match.group(2))
    if major < MIN_JAVA:
        raise ClusterError(f"Java {major} found at {java}; Pulsar needs Java {MIN_JAVA}+, install it or set JAVA_HOME")
    return java


# -- the cluster's files ------------------------------------------------------------------------


@dataclass
class LocalCluster:
    """A standalone broker and the generator, their files under `state_dir`."""

    state_dir: Path = field(default_factory=lambda: REPO_ROOT / ".cluster")
    broker_port: int = 6650
    web_port: int = 8080
    bookie_port: int = 3181
    with_generator: bool = True
    heap: str = "1g"
    extra_broker_config: dict[str, str] = field(default_factory=dict)
    generator_env: dict[str, str] = field(default_factory=dict)
    auth: str | None = None
    """None, or "token": token authentication and authorization (docs/SECURITY.md)."""
    plugin: bool = True
    """Load the broker plugin (broker_ext/plugin/); False: a broker without it, as a managed service may be."""

    def __post_init__(self) -> None:
        if self.auth not in AUTH_MODES:
            raise ClusterError(f"unknown authentication {self.auth!r}; use one of: {', '.join(map(str, AUTH_MODES))}")

    @classmethod
    def from_env(cls, state_dir: Path | None = None) -> LocalCluster:
        cluster = cls(
            broker_port=int(os.environ.get("PULSAR_BROKER_PORT", "6650")),
            web_port=int(os.environ.get("PULSAR_WEB_PORT", "8080")),
            bookie_port=int(os.environ.get("PULSAR_BOOKIE_PORT", "3181")),
            auth=_auth_mode(os.environ.get("PULSAR_WM_AUTH")),
        )
        if state_dir is not None:
            cluster.state_dir = state_dir
        return cluster

    @property
    def tokens(self) -> TokenAuth:
        """The key and the roles' token files (used when `auth` is "token")."""
        return TokenAuth(self.state_dir / "auth")

    def admin_settings(self) -> PulsarSettings:
        """Settings for the cluster's own calls: the super user's token when authentication is on."""
        token = self.tokens.token(ADMIN_ROLE) if self.auth == "token" else None
        return PulsarSettings(self.service_url, self.admin_url, token)

    @property
    def snapshot_key_file(self) -> Path:
        """The key the generator signs its snapshots with (`WM_SNAPSHOT_KEY_FILE`), kept across restarts."""
        return self.state_dir / "snapshot.key"

    def ensure_snapshot_key(self) -> Path:
        """Create the snapshot key once (32 random bytes, hex, mode 0600); delete it to rotate (docs/SECURITY.md)."""
        if not self.snapshot_key_file.exists():
            write_private(self.snapshot_key_file, (secrets.token_hex(32) + "\n").encode())
        return self.snapshot_key_file

    @property
    def service_url(self) -> str:
        return f"pulsar://127.0.0.1:{self.broker_port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    def _pid_file(self, name: str) -> Path:
        return self.state_dir / f"{name}.pid"

    def running_pid(self, name: str) -> int | None:
        """The recorded process id of `name` if that process is still alive."""
        return recorded_pid(self._pid_file(name))

    def write_config(self) -> Path:
        """A standalone configuration of our own: one bookie, no functions, loopback only."""
        settings = {
            "clusterName": "standalone",
            "bindAddress": "127.0.0.1",
            "advertisedAddress": "127.0.0.1",
            "brokerServicePort": str(self.broker_port),
            "webServicePort": str(self.web_port),
            **BROKER_SETTINGS,
            "loadBalancerEnabled": "false",
            "managedLedgerCacheSizeMB": "128",
            "dbStorage_writeCacheMaxSizeMb": "64",
            "dbStorage_readAheadCacheMaxSizeMb": "64",
            **(self.tokens.broker_config() if self.auth == "token" else {}),
            **(plugin_settings() if self.plugin else {}),
            **self.extra_broker_config,
        }
        conf = self.state_dir / "standalone.conf"
        conf.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        write_log4j2(self.state_dir / "log4j2.xml", self.state_dir / "pulsar.log")
        return conf

    # -- start and stop ---------------------------------------------------------------------------

    def up(self, timeout_s: float = 180.0) -> None:
        """Start the broker (and the generator) unless already running; return once ready."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        pid = self.running_pid("pulsar")
        if pid is not None:
            running_auth = self._configured_auth()
            say(
                f"already running: Pulsar standalone pid {pid} at {self.service_url} ({self.state_dir})"
                + (", token authentication on" if running_auth else "")
            )
            self.auth = running_auth
            if self.with_generator and self.running_pid("generator") is None:
                self._start_generator()
            if self.auth == "token":
                self._say_how_to_authenticate()
            return
        java = check_java()
        for port in (self.broker_port, self.web_port, self.bookie_port):
            if not port_free(port):
                raise ClusterError(
                    f"port {port} on 127.0.0.1 is already in use by another process; stop it or choose "
                    "other ports (PULSAR_BROKER_PORT, PULSAR_WEB_PORT, PULSAR_BOOKIE_PORT)"
                )
        lib = ensure_pulsar_jars()
        if self.plugin:
            ensure_plugin()
        if self.auth == "token":
            self.tokens.ensure()
        conf = self.write_config()
        started = time.monotonic()
        say(f"starting Pulsar {PULSAR_VERSION} standalone on {self.service_url}, admin {self.admin_url}")
        command = [
            java, "-Xms256m", *pulsar_jvm_options(self.heap, "1g", self.state_dir / "log4j2.xml"),
            "-Dzookeeper.4lw.commands.whitelist=*",
            "-cp", f"{lib}/*",
            "org.apache.pulsar.PulsarStandaloneStarter",
            "--config", str(conf), "--no-functions-worker", "--no-stream-storage",
            "--bookkeeper-port", str(self.bookie_port),
            "--metadata-dir", str(self.state_dir / "data" / "metadata"),
            "--bookkeeper-dir", str(self.state_dir / "data" / "bookkeeper"),
            "--zookeeper-dir", str(self.state_dir / "data" / "zookeeper"),
        ]  # fmt: skip
        env = {**os.environ, "PULSAR_STANDALONE_USE_ZOOKEEPER": "0"}
        with (self.state_dir / "pulsar.out").open("ab") as out:
            proc = subprocess.Popen(
                command, cwd=self.state_dir, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=env, start_new_session=True,
            )  # fmt: skip
        self._pid_file("pulsar").write_text(f"{proc.pid}\n")
        self._wait_ready(proc, started, timeout_s)
        say(f"Pulsar is ready after {time.monotonic() - started:.1f} s (pid {proc.pid})")
        self.prepare_watermark_namespace()
        if self.auth == "token":
            self.grant_permissions()
        if self.with_generator and self.running_pid("generator") is None:
            self._start_generator()
        if self.auth == "token":
            self._say_how_to_authenticate()

    def _configured_auth(self) -> str | None:
        """The authentication the running broker was started with (from its standalone.conf)."""
        conf = self.state_dir / "standalone.conf"
        text = conf.read_text() if conf.exists() else ""
        return "token" if "authenticationEnabled=true" in text.splitlines() else None

    def prepare_watermark_namespace(self) -> None:
        """As the super user: the namespace of the watermark tables, compacted by the broker itself."""
        from pulsar_access.admin import PulsarAdmin

        admin = PulsarAdmin(self.admin_settings())
        try:
            admin.create_namespace(watermark_namespace())
            admin.set_compaction_threshold(watermark_namespace(), WATERMARK_COMPACTION_THRESHOLD_BYTES)
        finally:
            admin.close()

    def grant_permissions(self) -> None:
        """As the super user: the generator's least permissions and the sample client's on public/default;
        on the watermark namespace produce for the generator alone, consume for the client (docs/SECURITY.md)."""
        from pulsar_access.admin import PulsarAdmin

        tables = watermark_namespace()
        admin = PulsarAdmin(self.admin_settings())
        try:
            admin.grant_namespace_permission(DEFAULT_NAMESPACE, GENERATOR_ROLE, GENERATOR_ACTIONS)
            admin.grant_namespace_permission(DEFAULT_NAMESPACE, CLIENT_ROLE, CLIENT_ACTIONS)
            admin.grant_namespace_permission(tables, GENERATOR_ROLE, GENERATOR_WATERMARK_ACTIONS)
            admin.grant_namespace_permission(tables, CLIENT_ROLE, APPLICATION_WATERMARK_ACTIONS)
        finally:
            admin.close()
        say(
            f"granted {DEFAULT_NAMESPACE}: role {GENERATOR_ROLE!r} {','.join(GENERATOR_ACTIONS)}, "
            f"role {CLIENT_ROLE!r} {','.join(CLIENT_ACTIONS)}; {tables} (the watermark tables): role "
            f"{GENERATOR_ROLE!r} {','.join(GENERATOR_WATERMARK_ACTIONS)}, role {CLIENT_ROLE!r} "
            f"{','.join(APPLICATION_WATERMARK_ACTIONS)}; super user {ADMIN_ROLE!r}"
        )

    def _say_how_to_authenticate(self) -> None:
        say(f"token authentication is on; tokens in {self.tokens.directory}:")
        for role in (CLIENT_ROLE, GENERATOR_ROLE, ADMIN_ROLE):
            say(f"  role {role!r}: export PULSAR_AUTH_TOKEN_FILE={self.tokens.token_file(role)}")
        say("  (Spark: .option('authToken', <the file's content>); see docs/SECURITY.md)")

    def _wait_ready(self, proc: subprocess.Popen[bytes], started: float, timeout_s: float) -> None:
        from pulsar_access.admin import PulsarAdmin

        admin = PulsarAdmin(self.admin_settings(), timeout_s=5)
        last_report = 0.0
        while True:
            if proc.poll() is not None:
                self._pid_file("pulsar").unlink(missing_ok=True)
                raise ClusterError(
                    f"Pulsar exited with code {proc.returncode} while starting; "
                    f"see {self.state_dir}/pulsar.log and {self.state_dir}/pulsar.out"
                )
            if admin.healthy():
                admin.close()
                return
            waited = time.monotonic() - started
            if waited > timeout_s:
                self.down()
                raise ClusterError(
                    f"Pulsar did not become healthy within {timeout_s:.0f} s; see {self.state_dir}/pulsar.log"
                )
            if waited - last_report >= 10:
                say(f"  ... waiting for the broker's health check ({waited:.0f} s)")
                last_report = waited
            time.sleep(0.5)

    def _start_generator(self) -> None:
        env = {
            **os.environ,
            "PULSAR_SERVICE_URL": self.service_url,
            "PULSAR_ADMIN_URL": self.admin_url,
            **self.generator_env,
        }
        if self.auth == "token":  # the generator's own role, never a token of the caller's shell
            env.pop("PULSAR_AUTH_TOKEN", None)
            env["PULSAR_AUTH_TOKEN_FILE"] = str(self.tokens.token_file(GENERATOR_ROLE))
        if not env.get("WM_SNAPSHOT_KEY") and not env.get("WM_SNAPSHOT_KEY_FILE"):
            env["WM_SNAPSHOT_KEY_FILE"] = str(self.ensure_snapshot_key())
        with (self.state_dir / "generator.log").open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "broker_ext.cli", "serve"], stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=env, start_new_session=True, cwd=REPO_ROOT,
            )  # fmt: skip
        self._pid_file("generator").write_text(f"{proc.pid}\n")
        time.sleep(0.5)
        if proc.poll() is not None:
            last = (self.state_dir / "generator.log").read_text(errors="replace").strip().splitlines()[-1:]
            raise ClusterError(
                f"the watermark generator exited at once ({last[0] if last else 'no output'}); "
                f"see {self.state_dir}/generator.log"
            )
        say(f"watermark generator started (pid {proc.pid}), log {self.state_dir}/generator.log")

    def refuse_if_running(self, what: str) -> None:
        """One local cluster at a time: they share the default ports and the state directory."""
        pid = self.running_pid("pulsar")
        if pid is not None:
            raise ClusterError(f"a standalone broker (pid {pid}) is running; stop it with 'make cluster-down' "
                               f"before starting {what}")  # fmt: skip

    def kill_broker(self) -> None:
        """`kill -9` the broker by its recorded process id: a crash, no shutdown; `up()` starts it on the same data."""
        pid = self.running_pid("pulsar")
        self._pid_file("pulsar").unlink(missing_ok=True)
        if pid is None:
            return
        _signal_group(pid, signal.SIGKILL)
        while _pid_alive(pid):
            time.sleep(0.1)
        self._wait_ports_free()
        say(f"killed Pulsar (pid {pid}) with SIGKILL")

    def _wait_ports_free(self) -> None:
        """A broker's connections linger in the kernel after it is gone until their peers close them
        (FIN_WAIT2, at most tcp_fin_timeout, 60 s): wait until its ports can be bound again, so that
        `up()` can start it on them (a restart)."""
        deadline = time.monotonic() + 90
        while not all(port_free(p) for p in (self.broker_port, self.web_port)) and time.monotonic() < deadline:
            time.sleep(0.5)

    def stop_generator(self) -> None:
        self._stop("generator", grace_s=10)

    def down(self) -> None:
        """Stop the generator and the broker by their recorded process ids."""
        stopped = [name for name in ("generator", "pulsar") if self._stop(name, grace_s=30)]
        if "pulsar" in stopped:
            self._wait_ports_free()  # a broker that needed SIGKILL (a slow shutdown) leaves them bound a while
        say("stopped " + ", ".join(stopped) if stopped else "nothing was running")

    def _stop(self, name: str, grace_s: float) -> bool:
        return stop_recorded(self._pid_file(name), grace_s)


def recorded_pid(pid_file: Path) -> int | None:
    """The process id recorded in `pid_file` if that process is still alive."""
    try:
        pid = int(pid_file.read_text().strip())
        return pid if _pid_alive(pid) else None
    except (OSError, ValueError):  # no file, no number, or a pid reused by another user's process
        return None


def stop_recorded(pid_file: Path, grace_s: float) -> bool:
    """Stop the process group recorded in `pid_file` (TERM, then KILL after `grace_s`) and forget it;
    whether a live process was found. `grace_s` 0: a `kill -9` at once."""
    pid = recorded_pid(pid_file)
    pid_file.unlink(missing_ok=True)
    if pid is None:
        return False
    if grace_s > 0:
        _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
    if _pid_alive(pid):
        _signal_group(pid, signal.SIGKILL)
        while _pid_alive(pid):
            time.sleep(0.1)
    return True


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        os.kill(pid, sig)


def _pid_alive(pid: int) -> bool:
    """Alive and not a zombie (a child we have not reaped yet counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            return False
    except (OSError, IndexError):
        pass
    return True


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_listen_port() -> int:
    """A free port below the kernel's ephemeral range, for a broker that is restarted on the same ports.

    A port from `free_port()` is an ephemeral one: while the broker is down, any outgoing connection
    (a client's, an HTTP keep-alive) may take it as its local port and keep the restart out.
    """
    low = 32768
    with contextlib.suppress(OSError, ValueError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10_000, max(10_001, low))
        if port_free(port):
            return port
    return free_port()


def wait_for_admin(admin_url: str, timeout_s: float) -> bool:
    """Poll a health URL until it answers; used for clusters we did not start."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{admin_url}/admin/v2/brokers/health", timeout=3).text == "ok":
                return True
        except requests.RequestException:
            pass
        time.sleep(1)
    return False


JAVA_OPENS = [
    "--add-opens", "java.base/java.io=ALL-UNNAMED",
    "--add-opens", "java.base/java.nio=ALL-UNNAMED",
    "--add-opens", "java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens", "java.base/java.lang=ALL-UNNAMED",
    "--add-opens", "java.base/java.util=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-opens", "java.management/sun.management=ALL-UNNAMED",
    "--add-opens", "jdk.management/com.sun.management.internal=ALL-UNNAMED",
]  # fmt: skip
"""The `--add-opens` every Pulsar JVM needs on Java 17 (netty, BookKeeper, the JVM's metrics): here for the
standalone and devtools/broker_cluster.py alike."""


def pulsar_jvm_options(heap: str, direct_memory: str, log4j2: Path) -> list[str]:
    """The options every Pulsar JVM we start takes (the standalone; a cluster's metadata store, bookies, brokers):
    its heap and direct memory, G1, `JAVA_OPENS`, logging as `log4j2` says (see `write_log4j2`), netty's
    reflection, and exiting on an out-of-memory error rather than limping on."""
    return [
        f"-Xmx{heap}", f"-XX:MaxDirectMemorySize={direct_memory}", "-XX:+UseG1GC", *JAVA_OPENS,
        f"-Dlog4j.configurationFile={log4j2}", "-Dio.netty.tryReflectionSetAccessible=true",
        "-Dpulsar.allocator.exit_on_oom=true",
    ]  # fmt: skip


def write_log4j2(config: Path, log: Path) -> None:
    """Write a log4j2 configuration at `config` that logs to `log` (rolled at 50 MB, three kept)."""
    config.write_text(_LOG4J2.format(log=log))


_LOG4J2 = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN">
  <Appenders>
    <RollingFile name="file" fileName="{log}" filePattern="{log}.%i">
      <PatternLayout pattern="%d{{ISO8601}} %-5level [%t] %c{{1}} - %msg%n"/>
      <Policies><SizeBasedTriggeringPolicy size="50 MB"/></Policies>
      <DefaultRolloverStrategy max="3"/>
    </RollingFile>
  </Appenders>
  <Loggers>
    <Root level="info"><AppenderRef ref="file"/></Root>
  </Loggers>
</Configuration>
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.local_cluster",
        description="Start or stop the local Pulsar standalone broker and the watermark generator.",
    )
    parser.add_argument("action", choices=["up", "down", "status", "fetch"])
    parser.add_argument("--state-dir", type=Path, default=None, help="where config, data, logs and pids live")
    parser.add_argument("--no-generator", action="store_true", help="start only the broker")
    parser.add_argument(
        "--brokers", type=int, default=int(os.environ.get("BROKERS") or 1),
        help="1 (default): a standalone; N > 1: a cluster of a metadata store, a bookie and N brokers, one "
        "generator per broker (devtools/broker_cluster.py; env BROKERS)",
    )  # fmt: skip
    parser.add_argument(
        "--auth",
        choices=["none", "token"],
        default=None,
        help="'token': token authentication and authorization, tokens written to <state dir>/auth "
        "(default: $PULSAR_WM_AUTH, else none; see docs/SECURITY.md)",
    )
    args = parser.parse_args(argv)
    try:
        if args.brokers > 1 or args.action in ("down", "status"):
            from devtools.broker_cluster import MultiBrokerCluster

            multi = MultiBrokerCluster(state_dir=args.state_dir or REPO_ROOT / ".cluster", brokers=max(args.brokers, 2))
            if args.brokers > 1 and args.action == "up":
                if args.auth not in (None, "none"):
                    raise ClusterError("--auth token is for the standalone only; start a cluster without it")
                if args.no_generator:
                    multi.generators = 0
                LocalCluster.from_env(args.state_dir).refuse_if_running("a multi-broker cluster")
                multi.up()
                return 0
            if args.action == "down":
                stopped = multi.down()
                if stopped:
                    say("stopped " + ", ".join(stopped))
            elif args.action == "status":
                for name, pid in multi.status().items():
                    if pid is not None:
                        say(f"{name}: running, pid {pid}")
        cluster = LocalCluster.from_env(args.state_dir)
        if args.auth is not None:
            cluster.auth = _auth_mode(args.auth)
        cluster.with_generator = not args.no_generator
        if args.action == "up":
            cluster.up()
        elif args.action == "down":
            cluster.down()
        elif args.action == "fetch":
            say(f"Apache Pulsar {PULSAR_VERSION}'s jars are in {ensure_pulsar_jars()}")
        else:
            for name in ("pulsar", "generator"):
                pid = cluster.running_pid(name)
                say(f"{name}: " + (f"running, pid {pid}" if pid else "not running"))
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
