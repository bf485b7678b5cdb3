"""Ownership by claim (`--ownership claim`): the generator holding a topic's companion producer in Pulsar's
`WaitForExclusive` mode owns the topic, with no consumer of its own on the data topic; standbys wait in Pulsar's
queue for that producer, and Pulsar refuses every other producer there."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pulsar
import pytest

from bench.common import metric_samples
from broker_ext.ownership import owner_of
from consumer import WatermarkConsumer
from devtools.local_cluster import free_port
from producer import WatermarkProducer
from pulsar_access.admin import PulsarAdmin
from pulsar_access.settings import PulsarSettings
from pulsar_access.topics import watermark_topic_for
from tests.integration.generator_process import GeneratorProcess
from tests.integration.helpers import Recorder, wait_until, watermarks
from tests.oracle import assert_oracle_agrees
from watermark_core.protocol import GENERATOR_SUBSCRIPTION

pytestmark = pytest.mark.integration


def _claimant(admin: PulsarAdmin, topic: str) -> tuple[str, str] | None:
    """The instance holding the topic's companion producer, and that producer's access mode."""
    owner = owner_of(admin, topic)
    modes = [p.get("accessMode") for p in admin.topic_stats(watermark_topic_for(topic))["publishers"]]
    return (owner, str(modes[0])) if owner and modes else None


def test_two_claiming_generators_one_killed_the_standby_takes_over_and_pulsar_fences_the_companion(
    pulsar_settings: PulsarSettings, pulsar_client: pulsar.Client, admin: PulsarAdmin, namespace: str, tmp_path: Path
) -> None:
    topic = f"persistent://{namespace}/claimed"
    names = [f"claim-a-{uuid.uuid4().hex[:4]}", f"claim-b-{uuid.uuid4().hex[:4]}"]
    ports = {name: free_port() for name in names}
    gens = {
        name: GeneratorProcess(pulsar_settings, tmp_path / f"{name}.log", name, WM_NAMESPACES=namespace,
                               WM_OWNERSHIP="claim", WM_METRICS_PORT=str(ports[name])).start()
        for name in names
    }  # fmt: skip
    recorder = Recorder()
    consumer = WatermarkConsumer(pulsar_client, topic, "sub", listener=recorder)
    producer = WatermarkProducer(pulsar_client, topic, producer_name="claimed-producer")
    try:
        producer.new_watermark().event_time(100).send()
        producer.send(b"x", event_timestamp=100)
        wait_until(lambda: watermarks(recorder) == [100], timeout_s=30, what="the first watermark")
        wait_until(lambda: (_claimant(admin, topic) or ("", ""))[0] in gens, what="a claimant")
        victim, mode = _claimant(admin, topic) or ("", "")
        assert mode == "WaitForExclusive"
        # no generator holds a consumer on the data topic: the plugin hands the markers over
        generator = admin.topic_stats(topic)["subscriptions"][GENERATOR_SUBSCRIPTION]
        assert generator["consumers"] == []
        # Pulsar refuses any other producer on the companion topic while the claim is held
        with pytest.raises(pulsar.PulsarException):
            pulsar_client.create_producer(watermark_topic_for(topic), producer_name="intruder")

        gens[victim].kill()
        killed_at = time.monotonic()
        producer.new_watermark().event_time(200).send()
        producer.send(b"y", event_timestamp=200)
        wait_until(lambda: watermarks(recorder) == [100, 200], timeout_s=30, what="a watermark from the standby")
        took_s = time.monotonic() - killed_at
        survivor = next(name for name in gens if name != victim)
        assert (_claimant(admin, topic) or ("", ""))[0] == survivor
        assert "claimed" in gens[survivor].log_text()
        # the topic's incarnation came in the plugin's report, not through the admin API
        assert sum(metric_samples(ports[survivor], "wm_admin_calls_total", call="properties")) == 0
        print(f"the standby's first watermark came {took_s:.2f} s after the kill")
        assert_oracle_agrees(pulsar_client, admin, topic, gens[survivor].watermark_config)
    finally:
        for gen in gens.values():
            gen.stop()
    consumer.close()
    producer.close()


def test_a_claiming_generator_follows_a_partitioned_topic_without_consumers(
    pulsar_settings: PulsarSettings, pulsar_client: pulsar.Client, admin: PulsarAdmin, namespace: str, tmp_path: Path
) -> None:
    topic = f"persistent://{namespace}/claimed-parts"
    admin.create_topic(topic, partitions=3)
    gen = GeneratorProcess(pulsar_settings, tmp_path / "gen.log", "claim-parts", WM_NAMESPACES=namespace,
                           WM_OWNERSHIP="claim").start()  # fmt: skip
    recorder = Recorder()
    consumer = WatermarkConsumer(pulsar_client, topic, "sub", listener=recorder)
    producer = WatermarkProducer(pulsar_client, topic, producer_name="parts-producer")
    try:
        producer.new_watermark().event_time(500).send()  # to every partition
        for key in range(12):
            producer.send(b"d", event_timestamp=600, partition_key=str(key))
        wait_until(lambda: watermarks(recorder)[-1:] == [500], timeout_s=30, what="the watermark of all partitions")
        for index in range(3):
            stats = admin.topic_stats(f"{topic}-partition-{index}")["subscriptions"][GENERATOR_SUBSCRIPTION]
            assert stats["consumers"] == []
    finally:
        gen.stop()
    consumer.close()
    producer.close()


def _two_topics_of_one_group(namespace: str) -> tuple[str, str]:
    """Two topics whose tables share a companion topic (a group's), so one claim covers both."""
    first = f"persistent://{namespace}/group-a"
    companion = watermark_topic_for(first)
    second = next(
        name for i in range(1000) if watermark_topic_for(name := f"persistent://{namespace}/group-b{i}") == companion
    )
    return first, second


def test_generators_following_different_topics_of_one_group_publish_both_whoever_holds_its_claim(
    pulsar_settings: PulsarSettings, pulsar_client: pulsar.Client, admin: PulsarAdmin, namespace: str, tmp_path: Path
) -> None:
    """Found by chaos (session 32): a claim is a group's, so the generator holding it while following only the
    other topic of the group published that one, and ours waited for the claim without end. The holder publishes
    every topic of its group that a member follows; killed, the other one takes the claim and both topics over."""
    topics = _two_topics_of_one_group(namespace)
    gens = [
        GeneratorProcess(pulsar_settings, tmp_path / f"gen-{i}.log", f"group-{i}-{uuid.uuid4().hex[:4]}",
                         WM_TOPICS=topic, WM_OWNERSHIP="claim").start()
        for i, topic in enumerate(topics)
    ]  # fmt: skip
    recorders = [Recorder() for _ in topics]
    consumers = [WatermarkConsumer(pulsar_client, t, "sub", listener=r) for t, r in zip(topics, recorders, strict=True)]
    producers = [WatermarkProducer(pulsar_client, t, producer_name=f"p-{i}") for i, t in enumerate(topics)]

    def both_move_to(times: tuple[int, int], by: str) -> None:
        for time_ms, producer in zip(times, producers, strict=True):
            producer.new_watermark().event_time(time_ms).send()
            producer.send(b"x", event_timestamp=time_ms)
        wait_until(lambda: [watermarks(r)[-1:] for r in recorders] == [[t] for t in times], timeout_s=40,
                   what=f"watermarks {times} of the two topics from {by}")  # fmt: skip

    try:
        both_move_to((100, 200), "whichever holds the claim")
        victim = next(g for g in gens if g.instance_id == owner_of(admin, topics[0]))
        victim.kill()
        both_move_to((300, 400), "the other generator")
        assert owner_of(admin, topics[1]) == next(g for g in gens if g is not victim).instance_id
    finally:
        for gen in gens:
            gen.stop()
        for consumer in consumers:
            consumer.close()
        for producer in producers:
            producer.close()
