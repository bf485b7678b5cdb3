"""The generator's configuration: flags, each with an environment variable of the same meaning."""

from __future__ import annotations

import argparse
import logging
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from pulsar_access.topics import WATERMARK_NAMESPACE_ENV, watermark_namespace
from watermark_core.snapshot import SnapshotKeys
from watermark_core.state import WatermarkConfig

log = logging.getLogger(__name__)

GENERATOR_SUBSCRIPTION = "__wm_generator"
"""The generator's own durable Failover subscription on every partition it follows."""

INTERNAL_SUBSCRIPTIONS = frozenset({GENERATOR_SUBSCRIPTION, "__compaction"})
SNAPSHOT_PRODUCER_PREFIX = "__wm_generator-"


@dataclass(frozen=True)
class GeneratorConfig:
    """What the generator follows and how often it acts."""

    namespaces: tuple[str, ...] = ("public/default",)
    topics: tuple[str, ...] = ()
    producer_timeout_ms: int = 60_000
    txn_timeout_ms: int = 60_000
    producer_retention_ms: int = 600_000
    """A producer out (idle or timed out) for this long on the log clock is forgotten (bounded state)."""
    snapshot_interval_messages: int = 1_000
    snapshot_interval_s: float = 10.0
    poll_interval_s: float = 0.05
    first_poll_s: float = 0.12
    idle_poll_interval_s: float = 1.0
    ack_watch_interval_s: float = 1.0
    stats_rate: float = 10.0
    cursor_source: str = "auto"
    """"auto": the broker plugin where brokers serve it, else the admin API; "admin": the admin API only."""
    intake: str = "plugin"
    """Where markers and data come from: "plugin", the broker plugin finds the markers and sums the data inside the
    broker, and the consumer only holds the partition (it receives nothing while a plugin reports the topic; where
    none does, it receives every message); "consumer", the generator's consumer receives every message. "plugin"
    needs `cursor_source` "auto"."""
    ownership: str = "claim"
    """How instances share the topics: "claim", the holder of a topic's companion producer in Pulsar's
    `WaitForExclusive` mode owns it (broker_ext/claims.py; no consumer per partition where a plugin hands the
    markers over); "failover", the active consumer of each partition's Failover subscription `__wm_generator`."""
    discovery_interval_s: float = 2.0
    metrics_port: int = 9108
    instance_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    watermark_namespace: str = field(default_factory=watermark_namespace)
    """Where the companion topics are published: only the generator's role may produce there."""
    snapshot_keys: SnapshotKeys = field(default_factory=SnapshotKeys.random)
    """Signs the W_SNAPSHOT records this generator writes, verifies those it restores from (docs/SECURITY.md)."""
    snapshot_key_source: str | None = None
    """Where `snapshot_keys` came from (a variable's name or a file), None for a random key of this process."""

    @property
    def watermark_config(self) -> WatermarkConfig:
        return WatermarkConfig(
            producer_timeout_ms=self.producer_timeout_ms, txn_timeout_ms=self.txn_timeout_ms,
            producer_retention_ms=self.producer_retention_ms,
        )  # fmt: skip


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `broker-ext serve` flags; each defaults to its environment variable."""
    d = GeneratorConfig()
    parser.add_argument(
        "--namespace", action="append", dest="namespaces",
        help="follow every topic of this namespace, including topics created later (repeatable; "
        "env WM_NAMESPACES, comma-separated; default public/default unless --topic is given)",
    )  # fmt: skip
    parser.add_argument(
        "--topic", action="append", dest="topics",
        help="follow this topic (repeatable; env WM_TOPICS, comma-separated)",
    )  # fmt: skip
    parser.add_argument(
        "--producer-timeout-ms", type=int, default=int(_env("WM_PRODUCER_TIMEOUT_MS", str(d.producer_timeout_ms))),
        help="a producer with no marker for this long (by the log's publish times) stops holding the "
        "watermark back (env WM_PRODUCER_TIMEOUT_MS; default 60000)",
    )  # fmt: skip
    parser.add_argument(
        "--txn-timeout-ms", type=int, default=int(_env("WM_TXN_TIMEOUT_MS", str(d.txn_timeout_ms))),
        help="a watermark transaction without commit or abort for this long is discarded "
        "(env WM_TXN_TIMEOUT_MS; default 60000)",
    )  # fmt: skip
    parser.add_argument(
        "--producer-retention-ms", type=int,
        default=int(_env("WM_PRODUCER_RETENTION_MS", str(d.producer_retention_ms))),
        help="a producer idle, or timed out, for this long more (by the log's publish times) is forgotten, so "
        "that producers coming and going never grow the state; if it comes back it is a late joiner "
        "(env WM_PRODUCER_RETENTION_MS; default 600000)",
    )  # fmt: skip
    parser.add_argument(
        "--snapshot-interval-messages", type=int,
        default=int(_env("WM_SNAPSHOT_INTERVAL_MESSAGES", str(d.snapshot_interval_messages))),
        help="write a W_SNAPSHOT after this many messages (env WM_SNAPSHOT_INTERVAL_MESSAGES; default 1000)",
    )  # fmt: skip
    parser.add_argument(
        "--snapshot-interval-s", type=float,
        default=float(_env("WM_SNAPSHOT_INTERVAL_S", str(d.snapshot_interval_s))),
        help="write a W_SNAPSHOT at least this often while messages arrive (env WM_SNAPSHOT_INTERVAL_S; default 10)",
    )  # fmt: skip
    parser.add_argument(
        "--poll-interval-s", type=float, default=float(_env("WM_POLL_INTERVAL_S", str(d.poll_interval_s))),
        help="how often to read subscription positions just after a marker was read, backing off while "
        "nothing moves (env WM_POLL_INTERVAL_S; default 0.05)",
    )  # fmt: skip
    parser.add_argument(
        "--first-poll-s", type=float, default=float(_env("WM_FIRST_POLL_S", str(d.first_poll_s))),
        help="how long after a marker is read to first read the subscription positions: an acknowledgement shows "
        "at the broker after the client's acknowledgement grouping, 100 ms by default (env WM_FIRST_POLL_S; "
        "default 0.12)",
    )  # fmt: skip
    parser.add_argument(
        "--ack-watch-interval-s", type=float,
        default=float(_env("WM_ACK_WATCH_INTERVAL_S", str(d.ack_watch_interval_s))),
        help="while a marker waits for a late acknowledgement, read the broker's /metrics this often to see which "
        "subscriptions moved, one call for all its topics; 0 leaves late acknowledgements to the sweep "
        "(env WM_ACK_WATCH_INTERVAL_S; default 1)",
    )  # fmt: skip
    parser.add_argument(
        "--idle-poll-interval-s", type=float,
        default=float(_env("WM_IDLE_POLL_INTERVAL_S", str(d.idle_poll_interval_s))),
        help="how often at most to look for changes (acknowledgements, seeks, new subscriptions) on a topic where "
        "no marker was read lately (env WM_IDLE_POLL_INTERVAL_S; default 1)",
    )  # fmt: skip
    parser.add_argument(
        "--stats-rate", type=float, default=float(_env("WM_STATS_RATE", str(d.stats_rate))),
        help="at most this many of those looks per second, over all owned topics: with more topics each is looked "
        "at less often (env WM_STATS_RATE; default 10)",
    )  # fmt: skip
    parser.add_argument(
        "--cursor-source", choices=("auto", "admin"), default=_env("WM_CURSOR_SOURCE", d.cursor_source),
        help="where cursor positions come from: 'auto' uses the broker plugin watermark-cursors where the broker "
        "serves it and the admin API elsewhere; 'admin' only the admin API (env WM_CURSOR_SOURCE; default auto)",
    )  # fmt: skip
    parser.add_argument(
        "--intake", choices=("auto", "plugin", "consumer"), default=_env("WM_INTAKE", "auto"),
        help="where markers come from: 'plugin' has the broker plugin find them inside the broker where it is "
        "installed, the generator's consumer receiving only where no plugin reports the topic; 'consumer' receives "
        "every message of a followed topic; 'auto' is 'plugin' unless --cursor-source is admin (env WM_INTAKE; "
        "default auto; docs/OPERATIONS.md)",
    )  # fmt: skip
    parser.add_argument(
        "--ownership", choices=("auto", "claim", "failover"), default=_env("WM_OWNERSHIP", "auto"),
        help="how generator instances share the topics: 'claim', the one holding a topic's companion producer (in "
        "Pulsar's WaitForExclusive mode) owns it, with no consumer per partition where the broker plugin hands the "
        "markers over; 'failover', the active consumer of each partition's Failover subscription __wm_generator; "
        "'auto' is 'claim' where the plugin is the intake (--intake), else 'failover'. Every instance of a "
        "deployment must use the same (env WM_OWNERSHIP; default auto; docs/OPERATIONS.md)",
    )  # fmt: skip
    parser.add_argument(
        "--metrics-port", type=int, default=int(_env("WM_METRICS_PORT", str(d.metrics_port))),
        help="Prometheus metrics on this port, 0 to disable (env WM_METRICS_PORT; default 9108)",
    )  # fmt: skip
    parser.add_argument(
        "--instance-id", default=_env("WM_INSTANCE_ID", d.instance_id),
        help="this instance's name among several generators (env WM_INSTANCE_ID; default random)",
    )  # fmt: skip
    parser.add_argument(
        "--snapshot-key-file", default=_env("WM_SNAPSHOT_KEY_FILE", "") or None,
        help="the key that signs and verifies W_SNAPSHOT records, shared by every generator instance and no one "
        "else: one key per line, the signing key first (older keys after it while rotating); WM_SNAPSHOT_KEY (the "
        "key itself) wins over it (env WM_SNAPSHOT_KEY_FILE; default: a random key per process, see docs/SECURITY.md)",
    )  # fmt: skip
    parser.add_argument(
        "--watermark-namespace", default=None,
        help="publish the watermark tables in this namespace, where only the generator's role may produce; "
        f"consumers, Spark and 'broker-ext status' read {WATERMARK_NAMESPACE_ENV} (env {WATERMARK_NAMESPACE_ENV}; "
        "default public/__watermarks; see docs/SECURITY.md)",
    )  # fmt: skip


def snapshot_keys(key_file: str | None) -> tuple[SnapshotKeys, str | None]:
    """The keys and where they came from: `WM_SNAPSHOT_KEY` (the key itself; wins), else the file `key_file`
    (one key per line, the signing key first, older ones after it while a rotation is under way), else a
    random key of this process (source None: see `warn_about_snapshot_key`)."""
    value = os.environ.get("WM_SNAPSHOT_KEY", "").strip()
    if value:
        return SnapshotKeys.from_text(value), "WM_SNAPSHOT_KEY"
    if key_file:
        path = Path(key_file)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ValueError(f"cannot read the snapshot key file {path} ({exc.strerror or exc}); check "
                             "--snapshot-key-file / WM_SNAPSHOT_KEY_FILE") from None  # fmt: skip
        if not text.strip():
            raise ValueError(f"the snapshot key file {path} is empty; put a key in it (32 random bytes, hex)")
        return SnapshotKeys.from_text(text), str(path)
    return SnapshotKeys.random(), None


def warn_about_snapshot_key(config: GeneratorConfig) -> None:
    """Say what a generator without a configured snapshot key gives up (once, when it starts)."""
    if config.snapshot_key_source is None:
        log.warning(
            "no snapshot key (WM_SNAPSHOT_KEY, or a key file in --snapshot-key-file / WM_SNAPSHOT_KEY_FILE): this "
            "generator signs its W_SNAPSHOT records with a random key of its own. Snapshots written before a "
            "restart or by another instance will not verify, so a restart or a take-over rebuilds each partition's "
            "state by reading it from its start, which is exact only while the namespace retains the topics' whole "
            "history. Give every generator instance the same key (docs/SECURITY.md)"
        )


def from_arguments(args: argparse.Namespace) -> GeneratorConfig:
    topics = tuple(args.topics or _split(_env("WM_TOPICS", "")))
    namespaces = tuple(args.namespaces or _split(_env("WM_NAMESPACES", "")))
    if not namespaces and not topics:
        namespaces = ("public/default",)
    for value, name in ((args.producer_timeout_ms, "--producer-timeout-ms"), (args.txn_timeout_ms, "--txn-timeout-ms"),
                        (args.producer_retention_ms, "--producer-retention-ms"),
                        (args.snapshot_interval_messages, "--snapshot-interval-messages"),
                        (args.stats_rate, "--stats-rate")):  # fmt: skip
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    for value, name in ((args.first_poll_s, "--first-poll-s"), (args.ack_watch_interval_s, "--ack-watch-interval-s")):
        if value < 0:
            raise ValueError(f"{name} must not be negative, got {value}")
    if args.intake == "auto":
        args.intake = "plugin" if args.cursor_source == "auto" else "consumer"
    if args.intake == "plugin" and args.cursor_source != "auto":
        raise ValueError("--intake plugin needs the broker plugin for cursor positions too: leave --cursor-source at "
                         "auto (WM_CURSOR_SOURCE)")  # fmt: skip
    keys, key_source = snapshot_keys(args.snapshot_key_file)
    return GeneratorConfig(
        namespaces=namespaces,
        topics=topics,
        producer_timeout_ms=args.producer_timeout_ms,
        txn_timeout_ms=args.txn_timeout_ms,
        producer_retention_ms=args.producer_retention_ms,
        snapshot_interval_messages=args.snapshot_interval_messages,
        snapshot_interval_s=args.snapshot_interval_s,
        poll_interval_s=args.poll_interval_s,
        first_poll_s=args.first_poll_s,
        ack_watch_interval_s=args.ack_watch_interval_s,
        idle_poll_interval_s=args.idle_poll_interval_s,
        stats_rate=args.stats_rate,
        cursor_source=args.cursor_source,
        intake=args.intake,
        ownership=args.ownership if args.ownership != "auto" else "claim" if args.intake == "plugin" else "failover",
        metrics_port=args.metrics_port,
        instance_id=args.instance_id,
        watermark_namespace=watermark_namespace(args.watermark_namespace),
        snapshot_keys=keys,
        snapshot_key_source=key_source,
    )


def _split(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]
