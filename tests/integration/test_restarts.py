"""The generator across broker restarts that delete consumed ledgers (runs last: it restarts the session's broker).

Without retention Pulsar deletes the ledgers every subscription has acknowledged, and a reader from
the topic's start then silently begins at the first ledger left. Rebuilding a subscription's state
from there misses the markers of the deleted ledgers (the chaos suite's restart stress, seed 7007).
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pulsar

from producer import WatermarkProducer
from pulsar_access.admin import PulsarAdmin
from tests.harness import RunningPulsar
from tests.integration.generator_process import GeneratorProcess
from tests.integration.helpers import recomputed_watermark, wait_until, watermark_table_reader
from tests.oracle import TopicOracle, assert_oracle_agrees


def drain(consumer: pulsar.Consumer) -> list[pulsar.MessageId]:
    """Receive and acknowledge everything there is (markers too); the ids of the data messages."""
    ids = []
    while True:
        try:
            message = consumer.receive(timeout_millis=2_000)
        except pulsar.Timeout:
            return ids
        consumer.acknowledge(message)
        if "wm.marker" not in message.properties():
            ids.append(message.message_id())


def test_a_seek_after_deleted_ledgers_recomputes_the_watermark_with_their_markers(
    pulsar_broker: RunningPulsar, admin: PulsarAdmin, tmp_path: Path
) -> None:
    assert pulsar_broker.restart is not None, "needs the session's own standalone broker"
    settings = pulsar_broker.settings
    topic = f"persistent://public/default/deleted-ledgers-{uuid.uuid4().hex[:6]}"
    admin.create_topic(topic)
    generator = GeneratorProcess(settings, tmp_path / "generator.log", "restarts", WM_TOPICS=topic, WM_NAMESPACES="")
    generator.start()
    client = settings.client(operation_timeout_seconds=30)
    # No retention here (the point is that Pulsar deletes ledgers): the oracle reads each ledger
    # before it can be deleted, and reads on from there at the end.
    oracle = TopicOracle(client, admin, topic, generator.watermark_config, require_retention=False)
    try:
        consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
        # no keepalive: the markers counted below are exactly the test's (the broker restart takes ~20 s)
        p0 = WatermarkProducer(client, topic, producer_name="p0", send_timeout_millis=0, keepalive_interval_ms=None)
        p3 = WatermarkProducer(client, topic, producer_name="p3", send_timeout_millis=0, keepalive_interval_ms=None)
        # First ledger: p3 joins at 1000, goes idle and comes back at 1000; p0 asserts 1000.
        p0.new_watermark().event_time(1_000).send()
        p3.new_watermark().event_time(1_000).send()
        p3.new_watermark().mark_idle().send()
        p3.new_watermark().event_time(1_000).send()
        drain(consumer)
        oracle.catch_up()
        first_ledger = admin.internal_stats(topic)["ledgers"][0]["ledgerId"]
        consumer.close()
        pulsar_broker.restart()

        # Second ledger: p0 moves to 5000; p3 (still at 1000) sends data at 2000, honestly.
        consumer = client.subscribe(topic, "sub")
        p0.new_watermark().event_time(5_000).send()
        for i in range(5):
            p3.send(f"m{i}".encode(), event_timestamp=2_000)
        ids = drain(consumer)
        assert len(ids) == 5
        oracle.catch_up()
        assert oracle.folds[-1].markers == 5, "the oracle must have read both ledgers before one is deleted"

        def first_ledger_deleted() -> bool:
            admin.trim_topic(topic)
            return all(info["ledgerId"] != first_ledger for info in admin.internal_stats(topic)["ledgers"])

        wait_until(first_ledger_deleted, timeout_s=60, what=f"ledger {first_ledger} deleted (every cursor past it)")

        # A generator that never read the deleted ledger takes over (in 7007: one that started late).
        generator.kill()
        generator.start()
        # Seek back to p3's first message: the watermark there is 1000 (p3 holds it), not p0's 5000.
        seek_at = time.time_ns() // 1000
        consumer.seek(ids[0])
        consumer.close()
        target = (ids[0].ledger_id(), ids[0].entry_id())
        reader = watermark_table_reader(client, topic)
        try:
            watermark = recomputed_watermark(reader, "sub", target, seek_at, within_s=60)
        finally:
            reader.close()
        assert watermark == 1_000, generator.log_text()[-3000:]
        assert_oracle_agrees(client, admin, topic, oracle=oracle)
    finally:
        generator.kill()
        client.close()
