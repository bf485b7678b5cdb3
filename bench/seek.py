"""Issue 16: from a seek with the consumer attached to the listener holding the recomputed watermark."""

from __future__ import annotations

import random
import statistics
import tempfile
import threading
import time
from pathlib import Path

import pulsar

from bench.common import say
from bench.generator import Generator, new_namespace
from consumer import Watermark, WatermarkConsumer, WatermarkListener
from producer import WatermarkProducer
from pulsar_access.admin import PulsarAdmin
from pulsar_access.settings import PulsarSettings

BASE = 1_000_000
MESSAGES = 3_000
SET_EVERY = 10
SAMPLES = 15


class _Arrivals(WatermarkListener):
    """Acknowledges everything; notes when each watermark reached the listener."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.watermarks: list[tuple[float, Watermark | None]] = []
        self.handed = 0

    def received(self, consumer: WatermarkConsumer, message: pulsar.Message) -> None:
        consumer.acknowledge(message)
        with self.changed:
            self.handed += 1

    def received_watermark(self, consumer: WatermarkConsumer, watermark: Watermark) -> None:
        with self.changed:
            self.watermarks.append((time.perf_counter(), watermark))
            self.changed.notify_all()

    def watermark_withdrawn(self, consumer: WatermarkConsumer) -> None:
        with self.changed:
            self.watermarks.append((time.perf_counter(), None))
            self.changed.notify_all()

    def holds(self, event_time: int, timeout_s: float) -> bool:
        with self.changed:
            return self.changed.wait_for(
                lambda: bool(self.watermarks) and (w := self.watermarks[-1][1]) is not None
                and w.event_time == event_time,
                timeout=timeout_s,
            )  # fmt: skip

    def first_after(self, count: int, timeout_s: float) -> tuple[float, Watermark | None] | None:
        with self.changed:
            if not self.changed.wait_for(lambda: len(self.watermarks) > count, timeout=timeout_s):
                return None
            return self.watermarks[count]


def seek_latency(
    settings: PulsarSettings, client: pulsar.Client, admin: PulsarAdmin, log_dir: Path,
    config_env: dict[str, str], samples: int = SAMPLES,
) -> list[float]:  # fmt: skip
    """Milliseconds from calling `seek()` to the recomputed watermark reaching the attached consumer's listener.

    A topic of MESSAGES messages with a W_SET every SET_EVERY, long enough for the generator to
    snapshot along it; each sample seeks to a random acknowledged message, so the generator rebuilds
    the state there (from the nearest snapshot), then lets the replay finish before the next one.
    """
    namespace = new_namespace(admin)
    topic = f"persistent://{namespace}/seek"
    gen = Generator(settings, namespace, log_dir, config_env)
    listener = _Arrivals()
    consumer = WatermarkConsumer(client, topic, "seek", listener=listener)
    producer = WatermarkProducer(
        client, topic, producer_name="bench-seek", keepalive_interval_ms=None, batching_enabled=False
    )
    ids = []
    for i in range(MESSAGES):
        if i % SET_EVERY == 0:
            producer.new_watermark().event_time(BASE + i).send()
        ids.append(producer.send(b"x" * 100, event_timestamp=BASE + i))
    final = BASE + MESSAGES
    producer.new_watermark().event_time(final).send()
    latencies: list[float] = []
    try:
        if not listener.holds(final, 120):
            raise RuntimeError("the generator never published the final watermark")
        rng = random.Random(16)
        for _ in range(samples):
            index = rng.randrange(SET_EVERY, MESSAGES - 2 * SET_EVERY)
            expected = BASE + index // SET_EVERY * SET_EVERY  # Pulsar resumes after the message sought to
            seen = len(listener.watermarks)
            sought = time.perf_counter()  # from the call: seek() subscribes again before it returns
            consumer.seek(ids[index])
            arrived = listener.first_after(seen, 60)
            if arrived is None or arrived[1] is None or arrived[1].event_time != expected:
                raise RuntimeError(f"seek to message {index}: expected {expected} first, got {arrived}")
            latencies.append((arrived[0] - sought) * 1000)
            if not listener.holds(final, 120):
                raise RuntimeError("the replay never got back to the final watermark")
    finally:
        consumer.close()
        producer.close(idle=False)
        gen.kill()
    return latencies


def run(settings: PulsarSettings) -> dict[str, float | int | str]:
    client = settings.client()
    admin = PulsarAdmin(settings)
    figures: dict[str, float | int | str] = {}
    with tempfile.TemporaryDirectory(prefix="wm-bench-seek-") as logs:
        say("seek with the consumer attached to the recomputed watermark (generator defaults: idle poll 1 s)")
        default = seek_latency(settings, client, admin, Path(logs), {})
        say("the same with the idle poll at 0.2 s")
        fast = seek_latency(settings, client, admin, Path(logs), {"WM_IDLE_POLL_INTERVAL_S": "0.2"})
    client.close()
    admin.close()
    figures.update({
        "seek_to_recomputed_watermark_p50_ms": round(statistics.median(default), 1),
        "seek_to_recomputed_watermark_max_ms": round(max(default), 1),
        "seek_to_recomputed_watermark_p50_ms_how": f"{MESSAGES} messages with a W_SET every {SET_EVERY} (the "
        "generator snapshots along them), a WatermarkConsumer with a listener attached and everything "
        f"acknowledged; {SAMPLES} seeks by message id to random messages, time from calling seek() to the "
        "listener receiving the watermark recomputed there, the replay finished before the next; generator "
        "with its default settings (idle poll 1 s: the change detector reads each owned topic once a second)",
        "seek_to_recomputed_watermark_idle_poll_200ms_p50_ms": round(statistics.median(fast), 1),
    })  # fmt: skip
    return figures
