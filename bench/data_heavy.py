"""Issue 47: what following a data-heavy topic costs the generator and the broker, per 1000 data messages.

Two batching producers (plain `pulsar` producers: markers as docs/PROTOCOL.md says, inside their batches) write
100 B messages, a `W_SET` every 1000 of each; one subscription reads and acknowledges everything. The same load
goes alternately to a topic the generator follows and to an identical topic in a namespace it does not follow
(the baseline): the generator's CPU over the followed runs, and the broker's CPU on the followed runs less the
unfollowed ones, per 1000 data messages.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pulsar

from bench.burst import broker_pid, generator_env
from bench.common import broker_cpu_seconds, say, wait_for_quiet_jit
from bench.generator import Generator, new_namespace
from pulsar_access.admin import PulsarAdmin
from pulsar_access.settings import PulsarSettings
from watermark_core.protocol import MARKER_PROPERTY, MarkerKind, encode_set

PRODUCERS = 2
MESSAGES_PER_PRODUCER = 100_000
WSET_EVERY = 1_000
PAYLOAD = b"x" * 100
ROUNDS = 2
SETTLE_LIMIT_S = 60.0


def _sent(result: pulsar.Result, _message_id: pulsar.MessageId) -> None:
    """A send's outcome: the client calls back with every send (a failure fails the test or bench at its end)."""
    if result != pulsar.Result.Ok:
        _failed_sends.append(result)


_failed_sends: list[pulsar.Result] = []


def _load(client: pulsar.Client, topic: str, start_event_time: int) -> int:
    """Both producers' messages and W_SETs, sent as fast as the client takes them; the messages sent."""

    def one(index: int) -> None:
        producer = client.create_producer(
            topic, producer_name=f"heavy-{index}-{uuid.uuid4().hex[:6]}", batching_enabled=True,
            batching_max_messages=1_000, batching_max_publish_delay_ms=10, block_if_queue_full=True,
            max_pending_messages=10_000,
        )  # fmt: skip
        event_time = start_event_time
        for sent in range(MESSAGES_PER_PRODUCER):
            if sent % WSET_EVERY == 0:
                producer.send_async(encode_set(event_time), _sent, properties={MARKER_PROPERTY: MarkerKind.W_SET.value})
            producer.send_async(PAYLOAD, _sent, event_timestamp=event_time + 1)
            event_time += 1
        producer.flush()
        producer.close()
        if _failed_sends:
            raise RuntimeError(f"sends failed: {_failed_sends[:5]}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(PRODUCERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return PRODUCERS * MESSAGES_PER_PRODUCER


def _acknowledged_all(consumer_count: list[int], expected: int, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while consumer_count[0] < expected and time.monotonic() < deadline:
        time.sleep(0.1)


def _settled(gen: Generator, limit_s: float = SETTLE_LIMIT_S) -> None:
    """Until the generator's CPU is quiet (it read all there was), at most `limit_s`."""
    deadline = time.monotonic() + limit_s
    before = gen.cpu_seconds()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = gen.cpu_seconds()
        if now - before < 0.01:
            return
        before = now


INTAKES = {
    "plugin": ({"WM_INTAKE": "plugin"}, "", "markers found inside the broker by its plugin (--intake plugin)"),
    "consumer": ({"WM_INTAKE": "consumer"}, "_consumer_intake",
                 "the generator's consumer receiving every message, cursor moves from the plugin (--intake consumer)"),
    "admin": ({"WM_INTAKE": "consumer", "WM_CURSOR_SOURCE": "admin"}, "_no_plugin",
              "no plugin: the generator's consumer receiving every message, cursors through the admin API"),
}  # fmt: skip
"""The paths measured: the plugin's intake, today's default, and the fallback where no broker has the plugin."""


def data_heavy(settings: PulsarSettings, client: pulsar.Client, admin: PulsarAdmin, log_dir: Path,
               intake: str = "plugin") -> dict[str, float | int | str]:  # fmt: skip
    broker = broker_pid(settings)
    followed, other = new_namespace(admin), new_namespace(admin)
    topics = {ns: f"persistent://{ns}/data-heavy" for ns in (followed, other)}
    received = {ns: [0] for ns in topics}

    def listener(ns: str) -> object:
        def on_message(consumer: pulsar.Consumer, message: pulsar.Message) -> None:
            consumer.acknowledge(message)
            received[ns][0] += 1

        return on_message

    consumers = [client.subscribe(topic, "app", message_listener=listener(ns), receiver_queue_size=5_000)
                 for ns, topic in topics.items()]  # fmt: skip
    first = client.create_producer(topics[followed])
    first.send(encode_set(1), properties={MARKER_PROPERTY: MarkerKind.W_SET.value})
    first.close()
    env, suffix, path = INTAKES[intake]
    gen = Generator(settings, followed, log_dir, {**generator_env("auto"), **env})
    gen_ms: list[float] = []
    broker_extra_ms: list[float] = []
    rates: list[float] = []
    try:
        gen.wait_published(1, within_s=120)
        for round_ in range(ROUNDS):
            say(f"  round {round_ + 1} of {ROUNDS}: waiting for the broker's JIT ({wait_for_quiet_jit(broker):.0f} s)")
            cpu: dict[str, float] = {}
            for ns in (other, followed):
                expected = received[ns][0] + PRODUCERS * MESSAGES_PER_PRODUCER
                broker_before, gen_before, started = broker_cpu_seconds(broker), gen.cpu_seconds(), time.perf_counter()
                sent = _load(client, topics[ns], 1_000_000 * (round_ + 2))
                _acknowledged_all(received[ns], expected, SETTLE_LIMIT_S)
                if ns == followed:
                    _settled(gen)
                    gen_cpu = gen.cpu_seconds() - gen_before
                    rates.append(sent / (time.perf_counter() - started))
                cpu[ns] = broker_cpu_seconds(broker) - broker_before
            thousands = PRODUCERS * MESSAGES_PER_PRODUCER / 1000
            gen_ms.append(gen_cpu * 1000 / thousands)
            broker_extra_ms.append((cpu[followed] - cpu[other]) * 1000 / thousands)
            say(f"    generator {gen_ms[-1]:.2f} ms, broker extra {broker_extra_ms[-1]:.2f} ms per 1000 data messages "
                f"(broker {cpu[followed]:.2f} s followed, {cpu[other]:.2f} s not)")  # fmt: skip
    finally:
        gen.kill()
        for consumer in consumers:
            consumer.close()
    how = (
        f"{PRODUCERS} batching producers (plain pulsar producers, batches of up to 1000, LZ4 off), "
        f"{MESSAGES_PER_PRODUCER} messages of {len(PAYLOAD)} B each with a W_SET every {WSET_EVERY} (inside the "
        f"batches), one subscription acknowledging every message; the same load alternately on a topic the generator "
        f"follows and on one in a namespace it does not; median of {ROUNDS} rounds, each after the broker's JIT was "
        f"quiet; about {statistics.median(rates):.0f} messages a second"
    )
    figures: dict[str, float | int | str] = {
        "generator_cpu_ms_per_1000_data_msgs": round(statistics.median(gen_ms), 3),
        "broker_extra_cpu_ms_per_1000_data_msgs": round(statistics.median(broker_extra_ms), 3),
        "generator_cpu_ms_per_1000_data_msgs_how": f"{how}; {path}: the generator process's CPU from the load's "
        f"start until it was quiet, per 1000 data messages",
        "broker_extra_cpu_ms_per_1000_data_msgs_how": f"{how}; {path}: the standalone broker's CPU (less its JIT "
        f"compilers) over the followed run less over the unfollowed one, per 1000 data messages",
    }
    return {(f"{key[:-4]}{suffix}_how" if key.endswith("_how") else f"{key}{suffix}"): value
            for key, value in figures.items()}  # fmt: skip


def run(settings: PulsarSettings) -> dict[str, float | int | str]:
    """Each path (`INTAKES`), on the same standalone one after the other."""
    client = settings.client(message_listener_threads=2)
    admin = PulsarAdmin(settings)
    figures: dict[str, float | int | str] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="wm-bench-heavy-") as logs:
            for intake in os.environ.get("WM_BENCH_INTAKES", ",".join(INTAKES)).split(","):
                say(f"a data-heavy topic: {INTAKES[intake][2]}")
                figures |= data_heavy(settings, client, admin, Path(os.environ.get("WM_BENCH_LOGS") or logs), intake)
    finally:
        client.close()
        admin.close()
    return figures
