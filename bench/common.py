"""What every benchmark shares: a real cluster, timing, and the results file."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

from devtools.local_cluster import LocalCluster, free_port
from pulsar_access.settings import PulsarSettings

DOCS = Path(__file__).resolve().parent.parent / "docs"
RESULTS = DOCS / "benchmarks.json"
BENCH_BROKER_HEAP = "2g"
"""The standalone's heap for benchmarks (1 GB elsewhere): 1000 partitions and their cursors need more."""


@contextlib.contextmanager
def bench_cluster() -> Iterator[PulsarSettings]:
    """`PULSAR_SERVICE_URL` if set, else a local standalone and generator of its own on free ports."""
    if os.environ.get("PULSAR_SERVICE_URL"):
        yield PulsarSettings.from_env()
        return
    with tempfile.TemporaryDirectory(prefix="wm-bench-") as state:
        cluster = LocalCluster(
            state_dir=Path(state), broker_port=free_port(), web_port=free_port(), bookie_port=free_port(),
            with_generator=True, generator_env={"WM_METRICS_PORT": str(free_port())},
            heap=BENCH_BROKER_HEAP,
        )  # fmt: skip
        cluster.up()
        try:
            yield PulsarSettings(cluster.service_url, cluster.admin_url)
        finally:
            cluster.down()


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def median_ratio(pairs: list[tuple[float, float]]) -> float:
    """Median of candidate/baseline over interleaved rounds (rates, higher is better)."""
    return statistics.median(candidate / baseline for candidate, baseline in pairs)


def say(message: str) -> None:
    print(f"[bench] {message}", flush=True)


def write_results(figures: dict[str, float | int | str]) -> None:
    """Merge `figures` into docs/benchmarks.json (flat: one key per figure) and render BENCHMARKS.md."""
    data: dict[str, object] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    data.update(figures)
    data["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    data["machine"] = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    RESULTS.write_text(json.dumps(dict(sorted(data.items())), indent=2) + "\n")
    render(data)


GOALS = {
    "consumer_throughput_ratio": ">= 0.6",
    "consumer_pull_throughput_ratio": ">= 0.6",
    "consumer_pull_cpu_ratio": ">= 0.6",
    "consumer_batch_receive_ratio": ">= 0.6",
    "consumer_listener_throughput_ratio": ">= 0.9",
    "consumer_listener_vs_plain_receive_ratio": ">= 0.9",
    "producer_throughput_ratio": ">= 0.98",
    "watermark_latency_p50_ms": "< 200",
    "watermark_latency_p99_ms": "< 500",
    "generator_vs_producer_rate_ratio": ">= 1.0",
    "subscriptions_10_vs_1_cost": "<= 1.3",
    "restart_1m_vs_10k_ratio": "within 1.2",
    "spark_window_close_latency_p50_ms": "< trigger + generator latency",
    "spark_close_from_wset_p50_ms": "<= 2000",
    "spark_close_from_wset_p99_ms": "<= 3000",
    "spark_source_steady_vs_readers_ratio": ">= 1.0",
    "spark_source_vs_client_batch_ratio": ">= 0.6",
    "demo_ontime_rows_dropped_broker": "0",
    "generator_idle_cpu_1000_partitions": "<= 0.05",
    "generator_threads_1000_partitions": "<= 50, within 10% of 10 partitions",
    "watermark_latency_cadence_p50_ms": "<= 150",
    "watermark_latency_cadence_p99_ms": "<= 400",
    "generator_ownership_max_share_3_instances": "<= 0.45",
    "seek_to_recomputed_watermark_p50_ms": "<= 1000",
    "watermark_gap_on_topic_move_p50_ms": "<= 2000",
    "watermark_gap_on_topic_move_max_ms": "<= 10000",
    "generator_ownership_max_share_3_instances_3_brokers": "<= 0.45",
    "multi_broker_cluster_up_s": "< 90",
    "sink_exactly_once_vs_at_least_once_rate": ">= 0.8",
    "snapshot_bytes_10000_producers": "<= 16384",
    "generator_memory_abandoned_subscription_ratio": "<= 2",
    "generator_cpu_ms_per_wset_burst": "<= 0.3",
    "broker_extra_cpu_ms_per_wset_burst": "<= 0.2",
    "watermark_latency_burst_p50_ms": "<= 150",
    "watermark_latency_burst_p99_ms": "<= 300",
    "watermark_latency_slow_ack_1000_topics_p99_ms": "<= 300",
    "generator_idle_cpu_5000_topics": "<= 0.02",
    "generator_takeover_s_5000_topics": "<= 10",
    "watermark_gap_after_generator_kill_1000_topics_s": "<= 10",
    "broker_extra_idle_cpu_5000_topics": "<= 0.02",
    "watermark_latency_5000_topics_p99_ms": "<= 500",
    "first_watermark_new_topic_p50_ms": "<= 1000",
    "first_watermark_new_topic_max_ms": "<= 2000",
    "broker_cpu_reconnect_storm_5000_over_no_plugin": "<= 1.1",
}


def render(data: dict[str, object]) -> None:
    lines = [
        "# Benchmarks",
        "",
        "Written by `make bench` from `docs/benchmarks.json`; do not edit by hand.",
        f"Measured {data.get('measured_at')} on {data.get('machine')}, against a real Pulsar "
        f"{data.get('pulsar_version', '')} standalone on loopback. Ratios compare two variants measured in the "
        "same run, interleaved, and take the median over rounds, because the machine is shared and noisy.",
        "",
        "| figure | value | goal | how |",
        "| --- | --- | --- | --- |",
    ]
    for key, value in sorted(data.items()):
        if key in ("measured_at", "machine", "pulsar_version") or key.endswith("_how"):
            continue
        lines.append(f"| `{key}` | {value} | {GOALS.get(key, '')} | {data.get(key + '_how', '')} |")
    (DOCS / "BENCHMARKS.md").write_text("\n".join(lines) + "\n")


def metric_samples(port: int, name: str, **labels: str) -> list[float]:
    """The values of a generator's metric `name` (a sample name, e.g. `wm_admin_calls_total`) on its
    /metrics at `port`, one per label set that has `labels`."""
    # that family alone, uncompressed: whole scrapes every 0.5 s were an eighth of a 5000-topic take-over's profile
    text = requests.get(f"http://127.0.0.1:{port}/metrics", params={"name[]": name},
                        headers={"Accept-Encoding": "identity"}, timeout=5).text  # fmt: skip
    return [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    ]


def process_cpu_seconds(pid: int) -> float:
    """CPU seconds (user and system) process `pid` has used, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


JIT_THREADS = ("C1 CompilerThre", "C2 CompilerThre")
JIT_QUIET_SHARE = 0.03
"""Below this share of a core over `JIT_QUIET_S`, a JVM's compilers are done with the load it runs."""
JIT_QUIET_S = 10.0


def broker_cpu_seconds(pid: int, *, compilers: bool = False) -> float:
    """CPU seconds the broker's JVM `pid` has used, less its JIT compiler threads (from /proc/<pid>/task): a broker
    compiles the code paths a generator starts using for a minute or two (0.04-0.16 of a core in the burst's
    windows), a one-time warm-up that would otherwise count as the generator's steady cost. `compilers`: those
    threads' CPU only."""
    total = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if (task / "comm").read_text().startswith(JIT_THREADS) != compilers:
                continue
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def wait_for_quiet_jit(pid: int, limit_s: float = 120.0) -> float:
    """Wait until the broker's JIT compilers are done with the load now running (or `limit_s`); the seconds waited.

    A fresh broker compiles each new code path for a minute or more, at up to 0.8 of a core here: on a 2-core
    machine that takes CPU from everything measured beside it (the generator, the clients, the latency), which
    a broker that has run for a while does not. Measuring after it is what a user's broker does all day."""
    started = time.monotonic()
    recent = [broker_cpu_seconds(pid, compilers=True)]  # one reading a second, the last JIT_QUIET_S of them
    while time.monotonic() - started < limit_s:
        time.sleep(1.0)
        recent = [*recent[-int(JIT_QUIET_S) :], broker_cpu_seconds(pid, compilers=True)]
        if len(recent) > JIT_QUIET_S and recent[-1] - recent[0] < JIT_QUIET_SHARE * JIT_QUIET_S:
            break
    return time.monotonic() - started


def machine_busy_seconds() -> float:
    """CPU seconds every core of the machine spent not idle (nor waiting for I/O) since boot, from /proc/stat."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")
