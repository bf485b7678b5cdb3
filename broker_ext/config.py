"""The generator's configuration: flags, each with an environment variable of the same meaning."""

from __future__ import annotations

import argparse
import os
import uuid
from dataclasses import dataclass, field

from watermark_core.state import WatermarkConfig

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
    snapshot_interval_messages: int = 1_000
    snapshot_interval_s: float = 10.0
    poll_interval_s: float = 0.05
    idle_poll_interval_s: float = 1.0
    stats_rate: float = 10.0
    discovery_interval_s: float = 2.0
    metrics_port: int = 9108
    instance_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    @property
    def watermark_config(self) -> WatermarkConfig:
        return WatermarkConfig(producer_timeout_ms=self.producer_timeout_ms, txn_timeout_ms=self.txn_timeout_ms)


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
        "--metrics-port", type=int, default=int(_env("WM_METRICS_PORT", str(d.metrics_port))),
        help="Prometheus metrics on this port, 0 to disable (env WM_METRICS_PORT; default 9108)",
    )  # fmt: skip
    parser.add_argument(
        "--instance-id", default=_env("WM_INSTANCE_ID", d.instance_id),
        help="this instance's name among several generators (env WM_INSTANCE_ID; default random)",
    )  # fmt: skip


def from_arguments(args: argparse.Namespace) -> GeneratorConfig:
    topics = tuple(args.topics or _split(_env("WM_TOPICS", "")))
    namespaces = tuple(args.namespaces or _split(_env("WM_NAMESPACES", "")))
    if not namespaces and not topics:
        namespaces = ("public/default",)
    for value, name in ((args.producer_timeout_ms, "--producer-timeout-ms"), (args.txn_timeout_ms, "--txn-timeout-ms"),
                        (args.snapshot_interval_messages, "--snapshot-interval-messages"),
                        (args.stats_rate, "--stats-rate")):  # fmt: skip
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    return GeneratorConfig(
        namespaces=namespaces,
        topics=topics,
        producer_timeout_ms=args.producer_timeout_ms,
        txn_timeout_ms=args.txn_timeout_ms,
        snapshot_interval_messages=args.snapshot_interval_messages,
        snapshot_interval_s=args.snapshot_interval_s,
        poll_interval_s=args.poll_interval_s,
        idle_poll_interval_s=args.idle_poll_interval_s,
        stats_rate=args.stats_rate,
        metrics_port=args.metrics_port,
        instance_id=args.instance_id,
    )


def _split(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]
