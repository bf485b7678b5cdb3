"""Issue 27: many non-partitioned topics, markers that fall due together, and consumers that acknowledge late.

- burst: 200 non-partitioned topics, one subscription each, one `W_SET` per topic per second sent together at
  the start of each second, each consumer acknowledging at once. The broker's process CPU (from /proc) over
  the same length of time without and with a generator following the namespace, the generator's CPU, and
  from each acknowledgement to the watermark at the consumer's `WatermarkFeed`;
- slow ack: 1000 non-partitioned topics, one `W_SET` per topic per 10 s, each acknowledged 10 s after it was
  received; from that acknowledgement to the watermark at the consumer's feed.
"""

from __future__ import annotations

import bisect
import contextlib
import heapq
import math
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pulsar

from bench.common import (
    JIT_QUIET_S,
    JIT_QUIET_SHARE,
    broker_cpu_seconds,
    metric_samples,
    process_cpu_seconds,
    say,
    wait_for_quiet_jit,
)
from bench.generator import FAST_ENV, Generator, new_namespace
from bench.generator_scale import Latencies
from bench.plain_floor import SUBSCRIPTION, TABLE, table_topic
from bench.plugin_floor import GROUPS, group_topic
from consumer.watermark_feed import WatermarkFeed
from producer import WatermarkProducer
from pulsar_access.admin import AdminError, PulsarAdmin
from pulsar_access.settings import PulsarSettings
from watermark_core.protocol import GENERATOR_SUBSCRIPTION

BURST_TOPICS = 200
BURST_WARMUP_S = 8.0
BURST_MEASURE_S = 20.0
BURST_ROUNDS = 3
"""With the plugin: rounds of the three windows, alternating (`burst`)."""
SLOW_TOPICS = 1000
SLOW_PERIOD_S = 10.0
SLOW_ACK_DELAY_S = 10.0
SLOW_MEASURE_S = 50.0
SLOW_FEEDS = 100
"""Latency is sampled on this many of the topics: a thousand feeds' threads would starve the bench's own process."""


def listening_pid(port: int) -> int | None:
    """The process (of this user) that listens on TCP `port` on this machine, from /proc."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    return int(pid)
        except OSError:
            continue
    return None


def broker_pid(settings: PulsarSettings) -> int:
    url = urlsplit(settings.admin_url)
    pid = listening_pid(url.port or 80)
    if pid is None:
        raise RuntimeError(f"no local process of this user listens at {settings.admin_url}: the burst benchmark reads "
                           "the broker's CPU from /proc, so it needs a broker on this machine")  # fmt: skip
    return pid


class Topics:
    """Non-partitioned topics, each with a watermark producer, a plain consumer and a `WatermarkFeed`."""

    def __init__(self, client: pulsar.Client, admin: PulsarAdmin, namespace: str, count: int, prefix: str,
                 ack: Callable[[int], Callable[[pulsar.Consumer, pulsar.Message], None]],
                 record: Latencies, feeds: int | None = None) -> None:  # fmt: skip
        self.names = [f"persistent://{namespace}/{prefix}-{i}" for i in range(count)]
        for name in self.names:
            admin.create_topic(name)
        self.producers = [WatermarkProducer(client, name, producer_name=f"{prefix}{i}", keepalive_interval_ms=None)
                          for i, name in enumerate(self.names)]  # fmt: skip
        self.consumers = [client.subscribe(name, "app", message_listener=ack(i),
                                           initial_position=pulsar.InitialPosition.Earliest)
                          for i, name in enumerate(self.names)]  # fmt: skip
        self.feeds = [WatermarkFeed(client, name, "app", record.watermark(i))
                      for i, name in enumerate(self.names[:feeds])]  # fmt: skip

    def close(self) -> None:
        for feed in self.feeds:
            feed.close()
        for consumer in self.consumers:
            consumer.close()
        for producer in self.producers:
            producer.close(idle=False)


CALLS = (
    "internalStats",
    "stats",
    "metrics",
    "partitioned-stats-summed",
    "partitioned-stats",
    "partitioned-internalStats",
)


def _calls(gen: Generator) -> dict[str, float]:
    """The generator's admin calls so far, by kind."""
    return {call: sum(metric_samples(gen.metrics_port, "wm_admin_calls_total", call=call)) for call in CALLS}


def latency_quantiles(record: Latencies, after_ms: int, until: float, sampled: range,
               settle_s: float = 2.0) -> tuple[float, float, int]:  # fmt: skip
    """p50, p99 and samples of the time from each acknowledged W_SET to a watermark at least as high at the feed.

    A W_SET whose value the feed never showed because a higher one came first counts until that higher one; one
    that no watermark as high followed by `until` (the run's end) counts until then (a lower bound). Only W_SETs
    acknowledged `settle_s` before the end count.
    """
    with record.lock:
        seen: dict[int, list[tuple[int, float]]] = {}
        for (topic, event_time), at in record.seen.items():
            seen.setdefault(topic, []).append((event_time, at))
        acked = [(key, at) for key, at in record.acked.items()
                 if key[1] > after_ms and at <= until - settle_s and key[0] in sampled]  # fmt: skip
    for values in seen.values():
        values.sort()
    latencies, missing = [], 0
    for (topic, event_time), at in acked:
        values = seen.get(topic, [])
        i = bisect.bisect_left(values, (event_time, -math.inf))
        if i == len(values):
            missing += 1
            latencies.append((until - at) * 1000)
        else:
            latencies.append((values[i][1] - at) * 1000)
    if missing:
        say(f"  {missing} acknowledged W_SETs: no watermark as high reached the feed by the run's end (counted so)")
    q = statistics.quantiles(latencies, n=100)
    return q[49], q[98], len(latencies)


def generator_env(cursor_source: str) -> dict[str, str]:
    """The bench generator's settings for one path of cursor positions: "auto" (the plugin) or "admin"."""
    return {**FAST_ENV, "WM_CURSOR_SOURCE": cursor_source}


def suffixed(figures: dict[str, float | int | str], cursor_source: str) -> dict[str, float | int | str]:
    """The admin API path's figures under keys ending `_no_plugin` (before `_how`), beside the plugin's."""
    path = "cursor positions from the broker plugin" if cursor_source == "auto" else "through the admin API"
    figures = {key: f"{value}; {path}" if key.endswith("_how") else value for key, value in figures.items()}
    if cursor_source == "auto":
        return figures
    return {(f"{key[:-4]}_no_plugin_how" if key.endswith("_how") else f"{key}_no_plugin"): value
            for key, value in figures.items()}  # fmt: skip


def burst(settings: PulsarSettings, client: pulsar.Client, admin: PulsarAdmin, log_dir: Path,
          topics: int = BURST_TOPICS, cursor_source: str = "auto") -> dict[str, float | int | str]:  # fmt: skip
    """Broker CPU without and with a generator, generator CPU and latency, W_SETs sent together each second.

    With the plugin, `BURST_ROUNDS` rounds alternate the three windows (no generator, the generator, the plain
    client) and each figure is the median of the rounds' (a ratio is taken within its round): one window's broker
    figure swings by half on this shared machine, and the broker warms from round to round. After each generator
    its subscription `__wm_generator` is deleted, so the next window without a generator has no plugin following the
    topics either (the next generator takes them over afresh, from their snapshots)."""
    broker = broker_pid(settings)
    namespace = new_namespace(admin)
    record = Latencies()
    acking = Topics(client, admin, namespace, topics, "burst",
                     lambda i: acknowledging_listener(record.ack(i)), record)  # fmt: skip
    stop = threading.Event()
    sent = [0]

    def ticks() -> None:
        t, second = 0, time.perf_counter()
        while not stop.is_set():
            t += 1_000
            for producer in acking.producers:
                producer.new_watermark().event_time(t).send_async()
            sent[0] += len(acking.producers)
            second += 1.0
            stop.wait(max(0.0, second - time.perf_counter()))

    ticker = threading.Thread(target=ticks, daemon=True)
    ticker.start()
    gen: Generator | None = None
    jit_waits: list[float] = []
    rounds: list[_Round] = []
    windows: list[float] = []  # when each window with the generator opened
    calls: dict[str, float] = {}
    try:
        time.sleep(BURST_WARMUP_S)
        for number in range(1, (BURST_ROUNDS if cursor_source == "auto" else 1) + 1):
            jit_waits.append(wait_for_quiet_jit(broker))
            cpu, wsets = broker_cpu_seconds(broker), sent[0]
            time.sleep(BURST_MEASURE_S)
            without = (broker_cpu_seconds(broker) - cpu) / BURST_MEASURE_S
            say(f"  round {number}, without a generator: broker {without:.3f} of a core over {sent[0] - wsets} W_SETs")
            plugin_floor = (_plugin_floor(settings, client, broker, namespace, acking.names, sent, jit_waits)
                            if cursor_source == "auto" else None)  # fmt: skip
            gen = Generator(settings, namespace, log_dir, generator_env(cursor_source))
            gen.wait_published(topics, within_s=300)
            time.sleep(BURST_WARMUP_S)
            jit_waits.append(wait_for_quiet_jit(broker))
            calls_before = _calls(gen)  # scraping the generator's /metrics costs it CPU: before the window starts
            cpu, gen_cpu, wsets = broker_cpu_seconds(broker), gen.cpu_seconds(), sent[0]
            windows.append(time.perf_counter())
            time.sleep(BURST_MEASURE_S)
            with_gen = (broker_cpu_seconds(broker) - cpu) / BURST_MEASURE_S
            gen_share = (gen.cpu_seconds() - gen_cpu) / BURST_MEASURE_S
            wsets_with = sent[0] - wsets
            for call, count in _calls(gen).items():
                if count > calls_before[call]:
                    calls[call] = calls.get(call, 0) + count - calls_before[call]
            gen.kill()
            gen = None
            for name in acking.names:  # the next round's window without a generator has no plugin following either
                admin.delete_subscription(name, GENERATOR_SUBSCRIPTION)
            say(f"  round {number}, with it: broker {with_gen:.3f}, generator {gen_share:.3f} of a core over "
                f"{wsets_with} W_SETs")  # fmt: skip
            floor = (_plain_floor(settings, client, admin, broker, namespace, acking.names, sent, jit_waits)
                     if cursor_source == "auto" else None)  # fmt: skip
            rounds.append(_Round(without, with_gen, gen_share, wsets_with / BURST_MEASURE_S, floor, plugin_floor))
        stop.set()
        ticker.join()
        time.sleep(2)
        per_call = {kind: _broker_ms_per_call(admin, broker, acking.names, kind) for kind in ("internalStats", "stats")}
    finally:
        stop.set()
        if gen is not None:
            gen.kill()
        acking.close()
    wsets_measured = sum(r.rate for r in rounds) * BURST_MEASURE_S
    say(f"  admin calls while measuring: {calls}")
    with record.lock:  # only the W_SETs acknowledged while measuring
        record.acked = {key: at for key, at in record.acked.items()
                        if any(opened <= at <= opened + BURST_MEASURE_S for opened in windows)}  # fmt: skip
    p50, p99, samples = latency_quantiles(record, 0, windows[-1] + BURST_MEASURE_S + 2, range(topics))
    median = statistics.median
    gen_ms = [r.generator * 1000 / r.rate for r in rounds]
    extra_ms = [(r.with_generator - r.without) * 1000 / r.rate for r in rounds]
    figures: dict[str, float | int | str] = {
        "generator_cpu_ms_per_wset_burst": round(median(gen_ms), 3),
        "broker_extra_cpu_ms_per_wset_burst": round(median(extra_ms), 3),
        "watermark_latency_burst_p50_ms": round(p50, 1),
        "watermark_latency_burst_p99_ms": round(p99, 1),
        "broker_cpu_burst_without_generator": round(median(r.without for r in rounds), 4),
        "broker_cpu_burst_with_generator": round(median(r.with_generator for r in rounds), 4),
        "generator_admin_calls_per_wset_burst": round(sum(calls.values()) / wsets_measured, 3),
        "broker_cpu_ms_per_internal_stats_call": round(per_call["internalStats"], 3),
        "broker_cpu_ms_per_stats_call": round(per_call["stats"], 3),
        "broker_cpu_ms_per_internal_stats_call_how": "after the burst run, generator and W_SETs stopped: "
        "the broker's CPU over 600 calls (internalStats, resp. stats without producers and consumers) made one at a "
        "time on the generator's keep-alive connection, minus the same time without calls, per call",
        "generator_admin_calls_per_wset_burst_how": f"the same run, while measuring: {calls}",
        "generator_cpu_ms_per_wset_burst_how": f"{topics} non-partitioned topics, one subscription each acknowledging "
        f"every message at once; one W_SET per topic sent together at the start of each second; generator process "
        f"CPU over {BURST_MEASURE_S:.0f} s (after {BURST_WARMUP_S:.0f} s of warm-up past its take-over) over the "
        f"W_SETs sent meanwhile; the median of {len(rounds)} rounds ({_listed(gen_ms)} ms), each with a generator "
        f"started anew (it restores from its snapshots); each window opened once the broker's JIT compilers had used "
        f"less than {JIT_QUIET_SHARE} of a core over {JIT_QUIET_S:.0f} s (bench/common.py wait_for_quiet_jit; waited "
        f"{', '.join(f'{w:.0f}' for w in jit_waits)} s, in the order the windows came)",
        "broker_extra_cpu_ms_per_wset_burst_how": f"the same run: the standalone broker's process CPU (less its JIT "
        f"compiler threads, bench/common.py broker_cpu_seconds) over "
        f"{BURST_MEASURE_S:.0f} s with the generator minus over {BURST_MEASURE_S:.0f} s of the same load just before "
        f"the generator started (feeds and consumers attached in both), per W_SET; the median of the rounds "
        f"({_listed(extra_ms)} ms)",
        "watermark_latency_burst_p50_ms_how": f"the same run: from each consumer's acknowledge() of a W_SET to that "
        f"value at its WatermarkFeed, W_SETs acknowledged while measuring (every round); {samples} samples",
    }
    floors = [(r, r.floor) for r in rounds if r.floor is not None]
    if floors:
        plain_ms = [_own_ms(floor) for _, floor in floors]
        floor_extra = [_broker_extra_ms(floor, r.without) for r, floor in floors]
        gen_ratio = [g / p for g, p in zip(gen_ms, plain_ms, strict=True)]
        extra_ratio = [e / f for e, f in zip(extra_ms, floor_extra, strict=True)]
        figures |= {
            "plain_client_cpu_ms_per_wset_burst": round(median(plain_ms), 3),
            "broker_extra_cpu_ms_per_wset_burst_plain_client": round(median(floor_extra), 3),
            "generator_over_plain_client_cpu_burst": round(median(gen_ratio), 2),
            "broker_extra_over_plain_client_burst": round(median(extra_ratio), 2),
            "plain_client_cpu_ms_per_wset_burst_how": f"the same run, each round after its generator was stopped, the "
            f"same W_SETs: a process doing only the messaging a generator cannot avoid per W_SET "
            f"(bench/plain_floor.py: a Failover subscription of its own on each topic with a message listener that "
            f"acknowledges cumulatively "
            f"and sends one {len(TABLE)}-byte message with send_async, no batching, to a topic a reader follows), its "
            f"CPU over {BURST_MEASURE_S:.0f} s after {BURST_WARMUP_S:.0f} s of warm-up, per W_SET ({_listed(plain_ms)} "
            f"ms); broker_extra_cpu_ms_per_wset_burst_plain_client is the broker's CPU over the same window less its "
            f"CPU without a generator in that round, per W_SET ({_listed(floor_extra)} ms); "
            f"generator_over_plain_client_cpu_burst ({_listed(gen_ratio)}) and broker_extra_over_plain_client_burst "
            f"({_listed(extra_ratio)}) are the medians of each round's generator figure over its plain client's "
            f"(ratios within a round: they hold on a slower or faster machine, where the figures in ms do not)",
        }
    plugin_floors = [(r, r.plugin_floor, r.floor) for r in rounds if r.plugin_floor is not None and r.floor]
    if plugin_floors:
        path_ms = [_own_ms(path) for _, path, _ in plugin_floors]
        path_extra = [_broker_extra_ms(path, r.without) for r, path, _ in plugin_floors]
        path_ratio = [_own_ms(path) / _own_ms(plain) for _, path, plain in plugin_floors]
        path_extra_ratio = [_broker_extra_ms(path, r.without) / _broker_extra_ms(plain, r.without)
                            for r, path, plain in plugin_floors]  # fmt: skip
        figures |= {
            "plugin_path_floor_cpu_ms_per_wset_burst": round(median(path_ms), 3),
            "plugin_path_floor_over_plain_client_cpu_burst": round(median(path_ratio), 2),
            "broker_extra_plugin_path_floor_over_plain_client_burst": round(median(path_extra_ratio), 2),
            "plugin_path_floor_cpu_ms_per_wset_burst_how": f"the same run, each round before its generator (on "
            f"__wm_generator subscriptions made at the tail, which the plugin follows), the same W_SETs: a process "
            f"doing only the messaging a generator fed by the plugin cannot avoid per W_SET (bench/plugin_floor.py: "
            f"the plugin's long poll with "
            f"the intake, one {len(TABLE)}-byte table per W_SET found sent with send_async, batched on {GROUPS} group "
            f"topics a reader each follows, the __wm_generator cursor moved once a second; no fold), its CPU per "
            f"W_SET ({_listed(path_ms)} ms), and its broker's extra over the same window ({_listed(path_extra)} ms); "
            f"the two ratios are each round's over that round's plain client ({_listed(path_ratio)}; "
            f"{_listed(path_extra_ratio)}): the lowest the generator's two ratios can be on this path",
        }
    return suffixed(figures, cursor_source)


@dataclass(frozen=True)
class _Round:
    """One round of the burst: shares of a core, and the plain client's window (its CPU, the broker's, W_SETs)."""

    without: float
    with_generator: float
    generator: float
    rate: float
    """W_SETs a second while the generator was measured."""
    floor: tuple[float, float, int] | None
    plugin_floor: tuple[float, float, int] | None
    """bench/plugin_floor.py's window, as `floor`."""


def _own_ms(window: tuple[float, float, int]) -> float:
    """A floor window's process CPU per W_SET (ms)."""
    cpu, _, wsets = window
    return cpu * 1000 / (wsets / BURST_MEASURE_S)


def _broker_extra_ms(window: tuple[float, float, int], without: float) -> float:
    """A floor window's broker CPU above the round's window without a generator, per W_SET (ms)."""
    _, broker, wsets = window
    return (broker - without) * 1000 / (wsets / BURST_MEASURE_S)


def _listed(values: list[float]) -> str:
    return ", ".join(f"{value:.3f}" for value in values)


def _plain_floor(settings: PulsarSettings, client: pulsar.Client, admin: PulsarAdmin, broker: int, namespace: str,
                 names: list[str], sent: list[int], jit_waits: list[float]) -> tuple[float, float, int]:  # fmt: skip
    """bench/plain_floor.py on the burst's topics while the W_SETs go on: its CPU and the broker's (shares of a
    core) and the W_SETs sent meanwhile; a reader follows each of its table topics, as each feed follows a
    companion topic."""
    try:
        readers = [table_topic(namespace, "burst", i) for i in range(len(names))]
        return _floor_window(settings, client, broker, ["bench.plain_floor", namespace, "burst", str(len(names))],
                             readers, sent, jit_waits)  # fmt: skip
    finally:
        for name in names:  # a later round's plain client starts at the tail, not from this one's position
            with contextlib.suppress(AdminError):
                admin.delete_subscription(name, SUBSCRIPTION)


def _plugin_floor(settings: PulsarSettings, client: pulsar.Client, broker: int, namespace: str, names: list[str],
                  sent: list[int], jit_waits: list[float]) -> tuple[float, float, int]:  # fmt: skip
    """bench/plugin_floor.py on the burst's topics, before the generator: like `_plain_floor`, a reader on each of
    its group topics. The plugin follows a topic with a `__wm_generator` subscription: made here at the tail (the
    generator that follows takes them over from there), so nothing before the window (a killed generator) is
    measured with it."""
    for name in names:
        client.subscribe(name, GENERATOR_SUBSCRIPTION, initial_position=pulsar.InitialPosition.Latest).close()
    readers = [group_topic(namespace, "burst", g) for g in range(GROUPS)]
    return _floor_window(settings, client, broker, ["bench.plugin_floor", namespace, "burst"], readers, sent,
                         jit_waits)  # fmt: skip


def _floor_window(settings: PulsarSettings, client: pulsar.Client, broker: int, command: list[str],
                  read: list[str], sent: list[int], jit_waits: list[float]) -> tuple[float, float, int]:  # fmt: skip
    """Run a floor process (`python -m` `command`) with readers on the topics it writes (`read`) for one window:
    its CPU and the broker's (shares of a core) and the W_SETs sent meanwhile."""
    readers = [client.create_reader(topic, pulsar.MessageId.latest, reader_listener=lambda _reader, _message: None)
               for topic in read]  # fmt: skip
    env = {**os.environ, "PULSAR_SERVICE_URL": settings.service_url, "PULSAR_ADMIN_URL": settings.admin_url}
    floor = subprocess.Popen([sys.executable, "-m", *command], env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)  # fmt: skip
    try:
        assert floor.stdout is not None
        if floor.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"{command[0]} did not start (exit code {floor.wait()})")
        time.sleep(BURST_WARMUP_S)
        jit_waits.append(wait_for_quiet_jit(broker))
        broker_cpu, own_cpu, wsets = broker_cpu_seconds(broker), process_cpu_seconds(floor.pid), sent[0]
        time.sleep(BURST_MEASURE_S)
        own_cpu = process_cpu_seconds(floor.pid) - own_cpu
        broker_cpu = broker_cpu_seconds(broker) - broker_cpu
        if floor.poll() is not None:
            raise RuntimeError(f"{command[0]} stopped in its window (exit code {floor.returncode})")
        say(f"  {command[0]} alone: {own_cpu / BURST_MEASURE_S:.3f} of a core, broker "
            f"{broker_cpu / BURST_MEASURE_S:.3f}, over {sent[0] - wsets} W_SETs")  # fmt: skip
        return own_cpu / BURST_MEASURE_S, broker_cpu / BURST_MEASURE_S, sent[0] - wsets
    finally:
        floor.kill()
        floor.wait()
        for reader in readers:
            reader.close()


def _broker_ms_per_call(admin: PulsarAdmin, broker: int, topics: list[str], kind: str, calls: int = 600) -> float:
    """The broker's CPU per admin call of `kind` on these topics, net of what it does meanwhile anyway."""
    call = admin.fast_internal_stats if kind == "internalStats" else admin.brief_stats
    cpu, started = process_cpu_seconds(broker), time.perf_counter()
    for i in range(calls):
        call(topics[i % len(topics)])
    busy, elapsed = process_cpu_seconds(broker) - cpu, time.perf_counter() - started
    cpu = process_cpu_seconds(broker)
    time.sleep(elapsed)
    idle = process_cpu_seconds(broker) - cpu
    return (busy - idle) * 1000 / calls


def spread_wsets(producers: list[WatermarkProducer], period_s: float, stop: threading.Event) -> None:
    """Until `stop`: each producer sends one W_SET a period (event time 2 s, 3 s, ...) at a random time of it, so
    a late acknowledgement seldom comes just as the topic's next W_SET is read (which would arm a fast poll)."""
    period, start = 0, time.perf_counter()
    while not stop.is_set():
        t = 2_000 + period * 1_000
        for offset, i in sorted((random.uniform(0, period_s), i) for i in range(len(producers))):
            if stop.wait(max(0.0, start + offset - time.perf_counter())):
                return
            producers[i].new_watermark().event_time(t).send_async()
        period += 1
        start += period_s
        stop.wait(max(0.0, start - time.perf_counter()))


def acknowledging_listener(on_ack: Callable[[pulsar.Message], None]
                            ) -> Callable[[pulsar.Consumer, pulsar.Message], None]:  # fmt: skip
    def listener(consumer: pulsar.Consumer, message: pulsar.Message) -> None:
        on_ack(message)
        consumer.acknowledge(message)

    return listener


class _LateAcks:
    """Acknowledges each message `delay_s` after it was received, on a thread of its own."""

    def __init__(self, record: Latencies, delay_s: float) -> None:
        self.record = record
        self.delay_s = delay_s
        self._due: list[tuple[float, int, int, pulsar.Consumer, pulsar.Message]] = []
        self._order = 0
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def listener(self, topic: int) -> Callable[[pulsar.Consumer, pulsar.Message], None]:
        def received(consumer: pulsar.Consumer, message: pulsar.Message) -> None:
            with self._cond:
                self._order += 1
                heapq.heappush(self._due, (time.monotonic() + self.delay_s, self._order, topic, consumer, message))
                self._cond.notify()

        return received

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stop and (not self._due or self._due[0][0] > time.monotonic()):
                    self._cond.wait(max(0.001, self._due[0][0] - time.monotonic()) if self._due else 1.0)
                if self._stop:
                    return
                _, _, topic, consumer, message = heapq.heappop(self._due)
            self.record.ack(topic)(message)
            with contextlib.suppress(pulsar.PulsarException):
                consumer.acknowledge(message)

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join()


def slow_ack(settings: PulsarSettings, client: pulsar.Client, admin: PulsarAdmin, log_dir: Path,
             topics: int = SLOW_TOPICS, cursor_source: str = "auto") -> dict[str, float | int | str]:  # fmt: skip
    """From a late acknowledgement to the watermark, one W_SET per topic per 10 s, many topics, one generator."""
    broker = broker_pid(settings)
    namespace = new_namespace(admin)
    record = Latencies()
    late = _LateAcks(record, SLOW_ACK_DELAY_S)
    slow = Topics(client, admin, namespace, topics, "slow", late.listener, record, feeds=SLOW_FEEDS)
    for producer in slow.producers:
        producer.new_watermark().event_time(1_000).send_async()
    gen = Generator(settings, namespace, log_dir, generator_env(cursor_source))
    stop = threading.Event()
    try:
        takeover = gen.wait_published(topics, within_s=600)
        calls_before, gen_cpu, broker_cpu, started = (
            _calls(gen),
            gen.cpu_seconds(),
            process_cpu_seconds(broker),
            time.perf_counter(),
        )
        say(f"  {topics} topics taken over in {takeover:.0f} s; one W_SET per topic per {SLOW_PERIOD_S:.0f} s, "
            f"each acknowledged {SLOW_ACK_DELAY_S:.0f} s after it arrives, for {SLOW_MEASURE_S:.0f} s")  # fmt: skip

        ticker = threading.Thread(target=spread_wsets, args=(slow.producers, SLOW_PERIOD_S, stop), daemon=True)
        ticker.start()
        time.sleep(SLOW_MEASURE_S + SLOW_ACK_DELAY_S + 5)
        stop.set()
        ticker.join()
        calls = {call: count - calls_before[call] for call, count in _calls(gen).items() if count > calls_before[call]}
        ended = time.perf_counter()
        elapsed = ended - started
        gen_share = (gen.cpu_seconds() - gen_cpu) / elapsed
        broker_share = (process_cpu_seconds(broker) - broker_cpu) / elapsed
    finally:
        stop.set()
        gen.kill()
        late.close()
        slow.close()
    p50, p99, samples = latency_quantiles(record, 1_000, ended, range(SLOW_FEEDS), settle_s=5.0)
    figures: dict[str, float | int | str] = {
        "watermark_latency_slow_ack_1000_topics_p50_ms": round(p50, 1),
        "watermark_latency_slow_ack_1000_topics_p99_ms": round(p99, 1),
        "generator_admin_calls_slow_ack": str(calls),
        "generator_cpu_slow_ack_1000_topics": round(gen_share, 4),
        "broker_cpu_slow_ack_1000_topics": round(broker_share, 4),
        "generator_cpu_slow_ack_1000_topics_how": "the slow-ack run: generator and broker CPU (shares of a core) from "
        "the take-over's end to the run's end; the admin calls in generator_admin_calls_slow_ack",
        "watermark_latency_slow_ack_1000_topics_p99_ms_how": f"{topics} non-partitioned topics, one generator; one "
        f"W_SET per topic per {SLOW_PERIOD_S:.0f} s (at a random time of each period), each subscription "
        f"acknowledging it {SLOW_ACK_DELAY_S:.0f} s after receiving it; from that acknowledge() to the value at "
        f"its WatermarkFeed over {SLOW_MEASURE_S:.0f} s, sampled on {SLOW_FEEDS} of the topics; {samples} samples",
    }
    return suffixed(figures, cursor_source)


def run(settings: PulsarSettings, log_dir: Path) -> dict[str, float | int | str]:
    client = settings.client(message_listener_threads=4)
    admin = PulsarAdmin(settings)
    figures: dict[str, float | int | str] = {}
    try:
        which = os.environ.get("WM_BENCH_BURST", "burst,slow").split(",")
        for source in os.environ.get("WM_BENCH_CURSOR_SOURCES", "auto,admin").split(","):
            path = "the broker plugin" if source == "auto" else "the admin API"
            if "burst" in which:
                say(f"burst: {BURST_TOPICS} non-partitioned topics, W_SETs sent together each second; {path}")
                figures.update(burst(settings, client, admin, log_dir, cursor_source=source))
            if "slow" in which:
                say(f"slow acknowledgements: {SLOW_TOPICS} non-partitioned topics; {path}")
                figures.update(slow_ack(settings, client, admin, log_dir, cursor_source=source))
    finally:
        client.close()
        admin.close()
    return figures
