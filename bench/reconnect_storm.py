"""Issue 46: a reconnect storm. Thousands of producers connect to a broker at once (after it restarted, after a
network cut); the plugin's hooks (`producerCreated`) run on the broker's threads for each, for every persistent
topic, followed or not.

Two standalone brokers one after the other (never together), alike but for the plugin: one loads it, one does not.
On each: `FOLLOWED` topics of another namespace with the generator's subscription (what generators follow, in
the plugin's report) and, with the plugin, `GENERATORS` long polls that name that namespace, as generators' would
(before issue 46 each new producer walked the report once per waiting poll, on the broker's thread). Then rounds,
each of two storms of `STORM` producers created at once (from `CONNECTORS` threads, one client) on `STORM` topics of
a namespace no generator follows:

- loaded (`LOADED_PER_ROUND` a round): the topics are loaded (the producers closed a moment before), as when
  clients reconnect after a network cut: what a producer costs the broker is small, so the plugin's hooks weigh
  the most here (the key figure);
- reloaded: every topic unloaded first, so each loads again as after a broker restart (opening its ledger costs
  far more than any hook).

The broker's CPU (less its JIT compiler threads) from the first producer asked for to `TAIL_S` after the last one
connected; the first round warms the broker up and does not count; the median of the rest, with the plugin over
without. `WM_BENCH_STORM_PRODUCERS` sets another count (the keys then name it).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pulsar

from bench.burst import broker_pid
from bench.common import BENCH_BROKER_HEAP, broker_cpu_seconds, say
from devtools.local_cluster import LocalCluster, free_port
from pulsar_access.admin import AdminError, PulsarAdmin
from pulsar_access.settings import PulsarSettings
from watermark_core.protocol import GENERATOR_SUBSCRIPTION

STORM = int(os.environ.get("WM_BENCH_STORM_PRODUCERS", "5000"))
FOLLOWED = 1000
GENERATORS = 3
ROUNDS = 2
"""Measured rounds per broker, after one that warms it up."""
LOADED_PER_ROUND = 3
"""Storms on loaded topics per round (a second each): the key figure, the noisier for being small."""
CONNECTORS = 32
TAIL_S = 3.0
QUIET_S = 3.0
STORM_NAMESPACE = "public/storm"
FOLLOWED_NAMESPACE = "public/followed"
KINDS = ("loaded", "reloaded")


def _long_poll(admin: PulsarAdmin, stop: threading.Event) -> None:
    """A generator's long poll on the followed namespace, answered at each move there (none during the storm)."""
    epoch, seq = "", -1
    while not stop.is_set():
        try:
            answer = admin.plugin_changes(admin.base_url, epoch, seq, 0 if seq < 0 else 5_000, [FOLLOWED_NAMESPACE])
        except AdminError:
            stop.wait(1.0)
            continue
        epoch, seq = str(answer["epoch"]), int(answer["seq"])


def _storm(client: pulsar.Client, topics: list[str], pid: int) -> tuple[float, float]:
    """Every topic's producer created at once, then closed; the broker's CPU seconds over it, and its length (s)."""
    cpu, started = broker_cpu_seconds(pid), time.perf_counter()
    with ThreadPoolExecutor(CONNECTORS) as pool:
        producers = list(pool.map(lambda topic: client.create_producer(topic, batching_enabled=False), topics))
    took = time.perf_counter() - started
    time.sleep(TAIL_S)  # what the hooks set going after the last producer (the plugin's drain, a poll's answer)
    used = broker_cpu_seconds(pid) - cpu
    with ThreadPoolExecutor(CONNECTORS) as pool:
        list(pool.map(lambda producer: producer.close(), producers))
    return used, took


def _broker(plugin: bool, count: int) -> dict[str, list[tuple[float, float]]]:
    """One broker's measured rounds: per kind of storm, (broker CPU seconds, length in s) of each."""
    with tempfile.TemporaryDirectory(prefix="wm-bench-storm-") as state:
        cluster = LocalCluster(
            state_dir=Path(state), broker_port=free_port(), web_port=free_port(), bookie_port=free_port(),
            with_generator=False, heap=BENCH_BROKER_HEAP, plugin=plugin,
        )  # fmt: skip
        cluster.up()
        settings = PulsarSettings(cluster.service_url, cluster.admin_url)
        admin, poller = PulsarAdmin(settings), PulsarAdmin(settings, timeout_s=30)
        client = settings.client(operation_timeout_seconds=120, io_threads=2)
        stop = threading.Event()
        try:
            pid = broker_pid(settings)
            for namespace in (STORM_NAMESPACE, FOLLOWED_NAMESPACE):
                admin.create_namespace(namespace)
            for i in range(FOLLOWED):  # the generator's subscription on each: in the plugin's report
                client.subscribe(f"persistent://{FOLLOWED_NAMESPACE}/f-{i}", GENERATOR_SUBSCRIPTION,
                                 consumer_type=pulsar.ConsumerType.Failover).close()  # fmt: skip
            for _ in range(GENERATORS if plugin else 0):
                threading.Thread(target=_long_poll, args=(poller, stop), daemon=True).start()
            topics = [f"persistent://{STORM_NAMESPACE}/t-{i}" for i in range(count)]
            measured: dict[str, list[tuple[float, float]]] = {kind: [] for kind in KINDS}
            for round_ in range(ROUNDS + 1):
                admin.unload_namespace(STORM_NAMESPACE)  # each topic loads again, as after a restart
                time.sleep(QUIET_S)
                reloaded = _storm(client, topics, pid)
                loaded = []
                for _ in range(LOADED_PER_ROUND):
                    time.sleep(QUIET_S)
                    loaded.append(_storm(client, topics, pid))  # the topics stayed loaded
                say(f"  {'with' if plugin else 'without'} the plugin, round {round_}: {count} producers, topics "
                    f"reloaded {reloaded[1]:.1f} s, broker {reloaded[0]:.2f} CPU s; loaded "
                    + ", ".join(f"{took:.1f} s, broker {cpu:.2f} CPU s" for cpu, took in loaded)
                    + (" (warm-up)" if round_ == 0 else ""))  # fmt: skip
                if round_:
                    measured["loaded"].extend(loaded)
                    measured["reloaded"].append(reloaded)
            return measured
        finally:
            stop.set()
            client.close()
            admin.close()
            poller.close()
            cluster.down()


def run(_settings: PulsarSettings | None = None) -> dict[str, float | int | str]:
    with_plugin, without = _broker(True, STORM), _broker(False, STORM)
    figures: dict[str, float | int | str] = {}
    for kind in KINDS:
        cpu_with = statistics.median(cpu for cpu, _ in with_plugin[kind])
        cpu_without = statistics.median(cpu for cpu, _ in without[kind])
        say(f"  {kind}: broker CPU for {STORM} producers at once {cpu_with:.2f} s with the plugin, {cpu_without:.2f} "
            f"s without: {cpu_with / cpu_without:.3f}")  # fmt: skip
        name = f"reconnect_storm_{STORM}" + ("" if kind == "loaded" else "_topics_reloaded")
        figures[f"broker_cpu_{name}_over_no_plugin"] = round(cpu_with / cpu_without, 3)
        figures[f"broker_cpu_s_{name}"] = round(cpu_with, 2)
        figures[f"broker_cpu_s_{name}_no_plugin"] = round(cpu_without, 2)
        figures[f"{name}_s"] = round(statistics.median(took for _, took in with_plugin[kind]), 1)
        figures[f"{name}_s_no_plugin"] = round(statistics.median(took for _, took in without[kind]), 1)
    setting = (
        f"{STORM} producers created at once ({CONNECTORS} threads, one client) on {STORM} topics of a namespace no "
        f"generator follows; beside them {FOLLOWED} followed topics of another namespace and, with the plugin, "
        f"{GENERATORS} generators' long polls naming it. The standalone broker's CPU (less its JIT compiler threads) "
        f"from the first producer asked for to {TAIL_S:.0f} s after the last connected, median over {ROUNDS} rounds "
        "after a warm-up round; a broker with the plugin over one without it, measured one after the other"
    )
    figures[f"broker_cpu_reconnect_storm_{STORM}_over_no_plugin_how"] = (
        f"{setting}; the topics loaded (their producers closed {QUIET_S:.0f} s before, as clients reconnecting after "
        f"a network cut), {LOADED_PER_ROUND} such storms a round: the storm where the plugin's hooks weigh the most"
    )
    figures[f"broker_cpu_reconnect_storm_{STORM}_topics_reloaded_over_no_plugin_how"] = (
        f"{setting}; every topic unloaded before, so each loads again as after a broker restart"
    )
    return figures
