"""Issue 47: how long watermarks stand still when the generator that owns the topics is killed with -9.

1000 non-partitioned topics, each with a plain consumer acknowledging at once, a producer that sent one `W_SET`,
and (on `FEEDS` of them) a `WatermarkFeed`. Two generator instances follow them. Once every topic has its first
watermark and the take-over's snapshots are written, the instance that owns the most partitions (its
`wm_partitions{owned="true"}`) is killed with -9, and every topic at once gets a `W_SET` of a new value: from the
kill to that value at each feed, the median and the slowest. Ownership follows `WM_OWNERSHIP` (the generator's
default unless set): by claim the standby's requests wait in Pulsar's queue; by Failover subscription the broker
makes the standby's consumers active after its failover delay.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

from bench.burst import Topics, acknowledging_listener, generator_env
from bench.common import metric_samples, say
from bench.generator import Generator, new_namespace
from bench.generator_scale import Latencies
from pulsar_access.admin import PulsarAdmin
from pulsar_access.settings import PulsarSettings

TOPICS = 1000
FEEDS = 200
SETTLE_S = 15.0
WAIT_S = 120.0


def _owned(gen: Generator) -> float:
    return sum(metric_samples(gen.metrics_port, "wm_partitions", owned="true"))


def run(settings: PulsarSettings, log_dir: Path, topics: int = TOPICS) -> dict[str, float | int | str]:
    client = settings.client(message_listener_threads=4)
    admin = PulsarAdmin(settings)
    namespace = new_namespace(admin)
    record = Latencies()
    many = Topics(client, admin, namespace, topics, "kill", lambda i: acknowledging_listener(record.ack(i)),
                   record, feeds=FEEDS)  # fmt: skip
    for producer in many.producers:
        producer.new_watermark().event_time(1_000).send_async()
    gens = [Generator(settings, namespace, log_dir, generator_env("auto")) for _ in range(2)]
    ownership = os.environ.get("WM_OWNERSHIP", "the default")
    try:
        deadline = time.monotonic() + 600
        while sum(g.subscriptions_published() for g in gens) < topics:
            for gen in gens:
                gen.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError("the generators did not publish every topic's first watermark within 600 s")
            time.sleep(0.5)
        time.sleep(SETTLE_S)
        owned = [_owned(g) for g in gens]
        victim = gens[owned.index(max(owned))]
        say(f"  ownership ({ownership}): {owned} partitions; killing the instance owning {max(owned):.0f}")
        victim.kill()
        killed_at = time.perf_counter()
        for producer in many.producers:
            producer.new_watermark().event_time(2_000).send_async()
        gaps: list[float] = []
        for index in range(FEEDS):
            while (index, 2_000) not in record.seen and time.perf_counter() - killed_at < WAIT_S:
                time.sleep(0.05)
            gaps.append(record.seen.get((index, 2_000), killed_at + WAIT_S) - killed_at)
    finally:
        for gen in gens:
            if gen.proc.poll() is None:
                gen.kill()
        many.close()
        client.close()
        admin.close()
    p50, worst = statistics.median(gaps), max(gaps)
    say(f"  from the kill to the new watermark at {FEEDS} feeds: p50 {p50:.2f} s, max {worst:.2f} s")
    return {
        "watermark_gap_after_generator_kill_1000_topics_s": round(worst, 2),
        "watermark_gap_after_generator_kill_1000_topics_p50_s": round(p50, 2),
        "watermark_gap_after_generator_kill_1000_topics_s_how": f"{topics} non-partitioned topics (one subscription "
        f"acknowledging at once, one W_SET each), two generator instances (ownership: {ownership}); {SETTLE_S:.0f} s "
        "after every topic's first watermark the instance owning the most partitions is killed with -9 and every "
        f"topic gets a W_SET of a new value at once: from the kill to that value at {FEEDS} WatermarkFeeds, the "
        "slowest (the _p50_s key: the median); cursor positions and markers from the broker plugin",
    }
