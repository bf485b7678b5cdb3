"""Issue 26: what the generator keeps per partition stays bounded whatever producers and subscriptions do.

`abandoned_subscription_figures` runs generator processes on the broker. `snapshot_figures` needs no
broker: the W_SNAPSHOT the generator would write next is the head state (the fold of the partition's
markers, watermark_core/state.py) encoded by watermark_core/snapshot.py, exactly what the shell
writes for a `WriteSnapshot` command.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from pathlib import Path

import pulsar

from bench.common import say
from bench.generator import Generator, WatermarkTimes, drain_until, new_namespace
from consumer.watermark_feed import WatermarkFeed
from producer import WatermarkProducer
from pulsar_access.admin import PulsarAdmin
from pulsar_access.settings import PulsarSettings
from watermark_core.protocol import Marker, MarkerKind
from watermark_core.snapshot import SnapshotKeys, encode_snapshot
from watermark_core.state import WatermarkConfig, WatermarkState

TOPIC = "persistent://public/default/bench-bounds"


def _churned_state(producers: int, config: WatermarkConfig) -> tuple[WatermarkState, int]:
    """`producers` names that each assert once and go idle (one per pod or task), one producer steady.

    Returns the state just before the retention passes and the log clock then.
    """
    state = WatermarkState.initial(config)
    entry = 0

    def fold(kind: MarkerKind, producer: str, publish: int, event_time: int | None = None) -> None:
        nonlocal state, entry
        entry += 1
        state = state.apply(Marker(kind, producer, (1, entry, -1), publish, event_time))

    start = 1_700_000_000_000
    fold(MarkerKind.W_SET, "steady", start, start)
    for i in range(producers):
        at = start + i
        fold(MarkerKind.W_SET, f"pod-{i}", at, at)
        fold(MarkerKind.W_IDLE, f"pod-{i}", at)
    fold(MarkerKind.W_SET, "steady", start + producers, start + producers)
    return state, start + producers


def _apply_us(state: WatermarkState, publish: int, rounds: int = 200) -> float:
    """Microseconds to fold one W_SET of the steady producer into `state`."""
    position = state.position or (1, 0, -1)
    started = time.perf_counter()
    for i in range(rounds):
        state.apply(Marker(MarkerKind.W_SET, "steady", (position[0], position[1] + 1 + i, -1), publish, publish))
    return (time.perf_counter() - started) / rounds * 1e6


def snapshot_figures(producers: int = 10_000) -> dict[str, float | int | str]:
    config = WatermarkConfig()
    keys = SnapshotKeys.random()
    remembered, clock = _churned_state(producers, config)
    after = clock + config.producer_retention_ms + 1  # the steady producer's next W_SET, once the retention passed
    last = remembered.position or (1, 0, -1)
    forgotten = remembered.apply(Marker(MarkerKind.W_SET, "steady", (last[0], last[1] + 1, -1), after, after))
    return {
        f"snapshot_bytes_{producers}_producers": len(encode_snapshot(forgotten, keys=keys, topic=TOPIC)),
        f"snapshot_bytes_{producers}_producers_how": f"{producers} producer names each send W_SET then W_IDLE, one "
        f"producer stays; its next W_SET comes once the retention ({config.producer_retention_ms} ms, the default) "
        "passed on the log clock; the size of the next W_SNAPSHOT payload (the head state, signed). Before the "
        f"retention passed it is {len(encode_snapshot(remembered, keys=keys, topic=TOPIC))} bytes",
        f"marker_apply_us_{producers}_producers": round(_apply_us(forgotten, after), 1),
        f"marker_apply_us_{producers}_producers_how": "microseconds to fold one W_SET into that state, once the "
        f"retention passed (before: {_apply_us(remembered, clock):.0f} us)",
    }


# -- on a broker: an abandoned subscription's cost ---------------------------------------------------------


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def _write_markers(client: pulsar.Client, topic: str, count: int) -> None:
    """`count` W_SETs as fast as one batched producer goes; the last one is `count`."""
    producer = WatermarkProducer(
        client, topic, producer_name="bounds", keepalive_interval_ms=None,
        batching_enabled=True, block_if_queue_full=True, max_pending_messages=10_000,
    )  # fmt: skip
    done = threading.Semaphore(0)
    for t in range(1, count + 1):
        producer.new_watermark().event_time(t).send_async(lambda _result, _id: done.release())
    producer.flush()
    for _ in range(count):
        done.acquire(timeout=60)
    producer.close(idle=False)


def abandoned_subscription_rss(
    settings: PulsarSettings, client: pulsar.Client, admin: PulsarAdmin, log_dir: Path, abandoned: bool, markers: int
) -> int:
    """The generator's RSS once it followed `markers` W_SETs on one partition that "live" acknowledges as they come."""
    namespace = new_namespace(admin)
    topic = f"persistent://{namespace}/bounds"
    gen = Generator(settings, namespace, log_dir, config_env={})
    live = client.subscribe(topic, "live")
    if abandoned:
        client.subscribe(topic, "abandoned").close()  # durable, no consumer: never acknowledges
    times = WatermarkTimes()
    feed = WatermarkFeed(client, topic, "live", times)
    stop = threading.Event()
    drain = threading.Thread(target=drain_until, args=(live, stop), daemon=True)
    drain.start()
    try:
        time.sleep(3)  # discovery
        _write_markers(client, topic, markers)
        if times.wait_for(markers, 180) is None:
            raise RuntimeError(f"'live' never got watermark {markers}; generator log in {log_dir}")
        time.sleep(12)  # a periodic snapshot after the last marker (10 s): the marker log is trimmed then
        return _rss_bytes(gen.proc.pid)
    finally:
        stop.set()
        drain.join()
        feed.close()
        live.close()
        gen.kill()


def abandoned_subscription_figures(settings: PulsarSettings, markers: int = 100_000) -> dict[str, float | int | str]:
    client = settings.client()
    admin = PulsarAdmin(settings)
    rss: dict[bool, list[int]] = {False: [], True: []}
    try:
        with tempfile.TemporaryDirectory(prefix="wm-bench-bounds-") as logs:
            for abandoned in (False, True, False, True):
                value = abandoned_subscription_rss(settings, client, admin, Path(logs), abandoned, markers)
                rss[abandoned].append(value)
                say(f"  {'with' if abandoned else 'without'} an abandoned subscription: RSS {value / 2**20:.1f} MiB")
    finally:
        client.close()
        admin.close()
    without, with_abandoned = statistics.median(rss[False]), statistics.median(rss[True])
    return {
        "generator_memory_abandoned_subscription_ratio": round(with_abandoned / without, 3),
        "generator_memory_abandoned_subscription_ratio_how": f"one partition, {markers} W_SETs written by one "
        "batched producer, acknowledged as they come by a subscription 'live'; the generator process's VmRSS once "
        "'live' got the last watermark and a periodic snapshot passed, with a second subscription that never "
        "acknowledges over without it; generator defaults; median of 2 runs each "
        f"({with_abandoned / 2**20:.1f} MiB over {without / 2**20:.1f} MiB)",
    }
