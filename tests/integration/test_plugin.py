"""The broker plugin (broker_ext/plugin/) on the real broker: what it reports, and the generator with and without it."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pulsar
import pytest

from bench.common import metric_samples
from broker_ext.config import SNAPSHOT_PRODUCER_PREFIX
from broker_ext.engine.partition import decode_raw
from broker_ext.intake.plugin_stream import IntakeReport, intake_report
from consumer import WatermarkConsumer
from consumer.watermark_feed import WatermarkFeed
from devtools.local_cluster import free_port
from producer import WatermarkProducer
from pulsar_access.admin import AdminError, PulsarAdmin
from pulsar_access.settings import PulsarSettings
from tests.integration.generator_process import GeneratorProcess
from tests.integration.helpers import Recorder, wait_until, watermarks
from watermark_core.protocol import (
    GENERATOR_SUBSCRIPTION,
    INCARNATION_PROPERTY,
    MARKER_PROPERTY,
    MarkerKind,
    encode_set,
)


def _sent(result: pulsar.Result, _message_id: pulsar.MessageId) -> None:
    """A send's outcome: the client calls back with every send (a failure fails the test or bench at its end)."""
    if result != pulsar.Result.Ok:
        _failed_sends.append(result)


_failed_sends: list[pulsar.Result] = []


class Changes:
    """A generator's view of one broker's plugin: the long poll, and each topic as it was told last."""

    def __init__(self, admin: PulsarAdmin) -> None:
        self.admin, self.epoch, self.seq = admin, "", -1
        self.topics: dict[str, Any] = {}

    def poll(self, timeout_ms: int = 5_000) -> dict[str, Any]:
        answer = self.admin.plugin_changes(self.admin.base_url, self.epoch, self.seq, timeout_ms)
        self.epoch, self.seq = answer["epoch"], answer["seq"]
        if answer["full"]:
            self.topics.clear()
        self.topics.update(answer["topics"])
        for gone in answer["gone"]:
            self.topics.pop(gone, None)
        return answer

    def until(self, check: Any, what: str) -> None:
        deadline = time.monotonic() + 15
        while not check():
            assert time.monotonic() < deadline, f"the plugin never told {what}; last: {self.topics}"
            self.poll()


def test_the_plugin_tells_acknowledgements_seeks_resets_and_removals_as_internal_stats_state_them(
    pulsar_client: pulsar.Client, admin: PulsarAdmin, namespace: str
) -> None:
    topic = f"persistent://{namespace}/t-{uuid.uuid4().hex[:8]}"  # no generator follows it: the test's consumer owns it
    changes = Changes(admin)
    changes.poll(0)
    generator = pulsar_client.subscribe(topic, GENERATOR_SUBSCRIPTION, consumer_type=pulsar.ConsumerType.Failover,
                                        consumer_name="the-owner")  # fmt: skip
    app = pulsar_client.subscribe(topic, "app")
    producer = pulsar_client.create_producer(topic)
    ids = [producer.send(f"m{i}".encode()) for i in range(5)]
    changes.until(lambda: topic in changes.topics, "the followed topic")
    assert changes.topics[topic]["owner"] == "the-owner"
    assert changes.topics[topic]["created"] > 0
    assert changes.topics[topic]["incarnation"] is None  # the property is unset

    def position(subscription: str) -> list[int]:
        return list(changes.topics[topic]["cursors"][subscription])

    for message in [app.receive(5_000) for _ in range(3)]:
        app.acknowledge(message)
    expected = [ids[2].ledger_id(), ids[2].entry_id()]
    changes.until(lambda: position("app") == expected, "the acknowledgement")
    assert list(admin.mark_delete_position(topic, "app")) == expected  # the same as the admin API says
    assert changes.topics[topic]["lastConfirmed"][1] >= ids[4].entry_id()

    app.seek(pulsar.MessageId.earliest)  # passes no acknowledgement hook
    changes.until(lambda: position("app")[1] < ids[0].entry_id(), "the seek back")
    admin.reset_cursor(topic, "app", (ids[3].ledger_id(), ids[3].entry_id()))  # an admin call
    changes.until(lambda: position("app") == [ids[2].ledger_id(), ids[2].entry_id()], "the reset")
    admin.set_topic_properties(topic, {INCARNATION_PROPERTY: "00000000000000bb"})  # an admin call moving no cursor
    changes.until(lambda: changes.topics[topic]["incarnation"] == "00000000000000bb", "the incarnation set")

    def unsubscribed() -> bool:
        try:
            app.unsubscribe()
        except pulsar.NotConnected:  # the reset disconnected the consumer: it reconnects by itself
            return False
        return True

    wait_until(unsubscribed, what="the consumer to unsubscribe after the reset disconnected it")
    changes.until(lambda: "app" not in changes.topics[topic]["cursors"], "the removed subscription")
    generator.close()
    producer.close()
    admin.delete_topic(topic)
    changes.until(lambda: topic not in changes.topics, "the deleted topic")


def test_a_topic_no_generator_follows_costs_nothing_and_is_not_told(
    pulsar_client: pulsar.Client, admin: PulsarAdmin, namespace: str
) -> None:
    # a namespace of its own: the session's generator follows public/default, and a topic the plugin announces
    # there is followed at once
    topic = f"persistent://{namespace}/t-{uuid.uuid4().hex[:8]}"
    changes = Changes(admin)
    changes.poll(0)
    app = pulsar_client.subscribe(topic, "app")
    producer = pulsar_client.create_producer(topic)
    producer.send(b"x")
    app.acknowledge(app.receive(5_000))
    marker = f"{topic}-followed"
    pulsar_client.subscribe(marker, GENERATOR_SUBSCRIPTION, consumer_type=pulsar.ConsumerType.Failover).close()
    changes.until(lambda: marker in changes.topics, "a followed topic created after")
    assert topic not in changes.topics


def test_a_generator_is_told_only_of_the_namespaces_it_follows(
    pulsar_client: pulsar.Client, admin: PulsarAdmin, namespace: str
) -> None:
    """Several generators share a broker: each long poll names its namespaces, and another's moves neither
    reach it nor wake it."""
    other = f"public/other-{uuid.uuid4().hex[:8]}"
    admin.create_namespace(other)
    ours, theirs = f"persistent://{namespace}/ours", f"persistent://{other}/theirs"
    everything = Changes(admin)
    everything.poll(0)
    start = everything.seq
    for topic in (theirs, ours):
        pulsar_client.subscribe(topic, GENERATOR_SUBSCRIPTION, consumer_type=pulsar.ConsumerType.Failover).close()
    # both read again after their consumers closed (no owner named any more): no move of ours is still to come
    everything.until(lambda: all(t in everything.topics and everything.topics[t].get("owner") is None
                                 for t in (ours, theirs)), "both topics, their consumers gone")  # fmt: skip
    answer = admin.plugin_changes(admin.base_url, everything.epoch, start, 0, namespaces=[namespace])
    assert list(answer["topics"]) == [ours]
    pulsar_client.subscribe(theirs, "app").close()  # a move in the other namespace only
    everything.until(lambda: "app" in everything.topics[theirs]["cursors"], "the other namespace's new subscription")
    quiet = admin.plugin_changes(admin.base_url, everything.epoch, int(answer["seq"]), 0, namespaces=[namespace])
    assert (quiet["full"], quiet["topics"], quiet["gone"], quiet["new"]) == (False, {}, [], [])
    with pytest.raises(AdminError) as refused:
        admin.plugin_changes(admin.base_url, everything.epoch, start, 0, namespaces=["not-a-namespace"])
    assert refused.value.status == 400


@pytest.mark.parametrize("source", ["auto", "admin"])
def test_the_generator_follows_acknowledgements_with_the_plugin_and_through_the_admin_api(
    source: str,
    pulsar_settings: PulsarSettings,
    pulsar_client: pulsar.Client,
    admin: PulsarAdmin,
    namespace: str,
    tmp_path: Path,
) -> None:
    """The same watermarks whichever path the positions take; with the plugin, no admin call per topic while
    acknowledgements move the watermark (steady state), the log says which path the generator took, and the
    plugin writes the snapshots (through the admin API, a producer per partition does)."""
    metrics_port = free_port()
    generator = GeneratorProcess(pulsar_settings, tmp_path / "generator.log", f"plugin-{source}",
                                 WM_NAMESPACES=namespace, WM_CURSOR_SOURCE=source,
                                 WM_METRICS_PORT=str(metrics_port)).start()  # fmt: skip
    topics = [f"persistent://{namespace}/t-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    try:
        recorders = [Recorder() for _ in topics]
        consumers = [
            WatermarkConsumer(pulsar_client, t, "app", listener=r) for t, r in zip(topics, recorders, strict=True)
        ]
        producers = [WatermarkProducer(pulsar_client, t, producer_name="P") for t in topics]
        for p in producers:
            p.new_watermark().event_time(1_000).send()
        for r in recorders:
            wait_until(lambda r=r: 1_000 in watermarks(r), what="the first watermark", timeout_s=30)

        def per_topic_calls() -> float:
            return sum(sum(metric_samples(metrics_port, "wm_admin_calls_total", call=call))
                       for call in ("internalStats", "stats", "partitioned-internalStats"))  # fmt: skip

        before = per_topic_calls()
        for step in range(1, 4):
            for p in producers:
                p.new_watermark().event_time(1_000 + step * 100).send()
            for r in recorders:
                wait_until(lambda r=r, step=step: 1_000 + step * 100 in watermarks(r), what=f"watermark step {step}")
        calls = per_topic_calls() - before
        log = generator.log_text()
        if source == "auto":
            assert calls == 0, f"{calls} admin calls per topic with the plugin"
            assert "cursor positions come from the broker plugin" in log
        else:
            assert calls > 0
            assert "through the admin API" in log
        assert all(watermarks(r) == [1_000, 1_100, 1_200, 1_300] for r in recorders)
        wait_until(lambda: sum(metric_samples(metrics_port, "wm_snapshots_written_total")) >= len(topics),
                   what="a snapshot of every topic")  # fmt: skip
        snapshot_producers = [p["producerName"] for t in topics for p in admin.topic_stats(t)["publishers"]
                              if p["producerName"].startswith(SNAPSHOT_PRODUCER_PREFIX)]  # fmt: skip
        if source == "auto":  # the plugin writes them: no producer of the generator's on the data topics
            assert snapshot_producers == []
        else:
            assert len(snapshot_producers) == len(topics)
        for c in consumers:
            c.close()
    finally:
        generator.stop()


@pytest.mark.parametrize("intake", ["consumer", "plugin"])
def test_a_topic_that_appears_while_the_generator_runs_reads_ahead_and_folds_each_marker_once(
    intake: str, pulsar_settings: PulsarSettings, pulsar_client: pulsar.Client, namespace: str, tmp_path: Path
) -> None:
    """Pulsar delivers to the generator's new Failover consumer only after its failover delay (1 s): meanwhile the
    generator reads the topic with a reader, then hands over to the consumer's delivery (with the plugin's intake,
    to the plugin's findings, which may come first). Markers sent on both sides of the hand-over are folded once
    each, and every watermark comes, in order."""
    metrics_port = free_port()
    generator = GeneratorProcess(pulsar_settings, tmp_path / "generator.log", "read-ahead", WM_NAMESPACES=namespace,
                                 WM_INTAKE=intake, WM_METRICS_PORT=str(metrics_port)).start()  # fmt: skip
    topic = f"persistent://{namespace}/fresh-{uuid.uuid4().hex[:8]}"
    try:
        wait_until(lambda: "cursor positions come from the broker plugin" in generator.log_text(),
                   what="the generator's first plugin answer", timeout_s=30)  # fmt: skip
        recorder = Recorder()
        consumer = WatermarkConsumer(pulsar_client, topic, "app", listener=recorder)
        producer = WatermarkProducer(pulsar_client, topic, producer_name="P")
        sent = [1_000 + 100 * step for step in range(6)]
        for event_time in sent:  # 0.4 s apart: past the failover delay, so past the hand-over
            producer.new_watermark().event_time(event_time).send()
            wait_until(lambda t=event_time: t in watermarks(recorder), what=f"the watermark {event_time}")
            time.sleep(0.4)
        assert watermarks(recorder) == sent
        if intake == "consumer":  # with the plugin's, it reads ahead only until the plugin's first findings come
            assert f"{topic}: reading ahead until Pulsar delivers to our consumer" in generator.log_text()

        def folded_beyond_our_snapshots() -> list[float]:  # the generator folds its own snapshots as it reads them
            applied = metric_samples(metrics_port, "wm_markers_applied_total", topic=topic)
            written = metric_samples(metrics_port, "wm_snapshots_written_total", topic=topic)
            return [a - w for a, w in zip(applied, written, strict=True)]

        wait_until(lambda: folded_beyond_our_snapshots() == [len(sent)], what="each W_SET folded once")
        consumer.close()
        producer.close()
    finally:
        generator.stop()


def test_the_plugins_intake_finds_a_plain_batching_producers_markers_in_order_and_sums_the_data_between(
    pulsar_client: pulsar.Client, admin: PulsarAdmin, namespace: str
) -> None:
    """Issue 47: markers as docs/PROTOCOL.md says, sent by a plain pulsar producer that batches and compresses,
    found inside the broker; what the generator's subscription acknowledged is no longer kept."""
    topic = f"persistent://{namespace}/intake-{uuid.uuid4().hex[:8]}"
    follower = pulsar_client.subscribe(topic, GENERATOR_SUBSCRIPTION, consumer_type=pulsar.ConsumerType.Failover,
                                       receiver_queue_size=1_000)  # fmt: skip
    admin.plugin_changes(admin.base_url, "", -1, 0, namespaces=[namespace], intake=True)  # asks for the intake
    producer = pulsar_client.create_producer(
        topic, producer_name="plain-batching", batching_enabled=True, batching_max_messages=50,
        batching_max_publish_delay_ms=20, compression_type=pulsar.CompressionType.LZ4,
    )  # fmt: skip
    for stretch in range(3):
        for i in range(100):
            producer.send_async(b"data", _sent, event_timestamp=1_000 * stretch + i + 1)
        producer.send_async(encode_set(1_000 * (stretch + 1)), _sent, properties={MARKER_PROPERTY: "W_SET"})
    producer.flush()
    last = producer.send(b"last", event_timestamp=5_000)

    def kept() -> IntakeReport | None:
        answer = admin.plugin_changes(admin.base_url, "", -1, 0, namespaces=[namespace], intake=True)  # everything
        report = answer["topics"].get(topic, {}).get("intake")
        return intake_report(report) if report is not None else None

    def scanned_to_the_end() -> bool:
        report = kept()
        return report is not None and report.scanned_to >= (last.ledger_id(), last.entry_id())

    wait_until(scanned_to_the_end, what="the plugin to read the topic to its last entry")
    report = kept()
    assert report is not None and not report.overflowed and not _failed_sends
    markers = [decode_raw(e.raw) for e in report.entries if e.raw is not None]  # as the engine decodes them
    assert [(m.kind, m.event_time, m.producer) for m in markers] == [
        (MarkerKind.W_SET, 1_000 * (i + 1), "plain-batching") for i in range(3)
    ]
    assert all(m.position[2] >= 0 for m in markers)  # inside batches
    stretches = [e.stretch for e in report.entries if e.raw is None]
    assert [sum(messages for _, messages, _ in s) for s in stretches] == [100, 100, 100, 1]
    assert [min(lowest for _, _, lowest in s) for s in stretches] == [1, 1_001, 2_001, 5_000]
    after_second = (markers[1].position[0], markers[1].position[1] + 1, -1)
    follower.acknowledge_cumulative(_message_at(follower, after_second))  # up to the second marker's entry at least

    def forgotten() -> bool:
        report = kept()
        left = [decode_raw(e.raw).event_time for e in report.entries if e.raw is not None] if report else None
        return left == [3_000]

    wait_until(forgotten, what="the plugin to forget what the generator's subscription acknowledged")
    follower.close()
    producer.close()


@pytest.mark.parametrize("intake", ["plugin", "consumer"])
def test_a_data_heavy_flush_moves_the_watermark_with_either_intake_and_counts_a_late_message(
    intake: str, pulsar_settings: PulsarSettings, pulsar_client: pulsar.Client, admin: PulsarAdmin, namespace: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    """A plain batching producer writes 1000 data messages, then a W_SET, and flushes, three times: each watermark
    comes, and a producer's late message is counted.
    With `--intake plugin` the generator's consumer is dispatched at most what it took before the first report.
    The application is a plain consumer that acknowledges everything; the watermarks are read as a consumer reads
    them (`WatermarkFeed`)."""
    metrics_port = free_port()
    generator = GeneratorProcess(pulsar_settings, tmp_path / "generator.log", f"intake-{intake}", "DEBUG",
                                 WM_NAMESPACES=namespace, WM_INTAKE=intake,
                                 WM_METRICS_PORT=str(metrics_port)).start()  # fmt: skip
    topic = f"persistent://{namespace}/intake-{uuid.uuid4().hex[:8]}"
    seen: list[int] = []
    stop = threading.Event()
    try:
        wait_until(lambda: "cursor positions come from the broker plugin" in generator.log_text(),
                   what="the generator's first plugin answer", timeout_s=30)  # fmt: skip
        app = pulsar_client.subscribe(topic, "app")

        def acknowledge_everything() -> None:  # on a thread of its own: the client's listener thread is shared
            while not stop.is_set():
                with contextlib.suppress(pulsar.Timeout):
                    app.acknowledge(app.receive(200))

        acknowledging = threading.Thread(target=acknowledge_everything, daemon=True)
        acknowledging.start()
        feed = WatermarkFeed(pulsar_client, topic, "app", lambda w: seen.append(w.event_time) if w else None)
        producer = pulsar_client.create_producer(
            topic, producer_name="plain", batching_enabled=True, batching_max_messages=100,
            batching_max_publish_delay_ms=10, block_if_queue_full=True,  # 1001 sends: past the default queue of 1000
        )  # fmt: skip
        for step in range(1, 4):
            for i in range(1_000):
                producer.send_async(b"data", _sent, event_timestamp=step * 1_000 + i)
            producer.send_async(encode_set(step * 1_000), _sent, properties={MARKER_PROPERTY: "W_SET"})
            producer.flush()
            assert not _failed_sends, f"sends failed: {_failed_sends}"
            try:
                wait_until(lambda s=step: s * 1_000 in seen, what=f"the watermark {step * 1_000}", timeout_s=30)
            except AssertionError:
                generator.dump_stacks()
                time.sleep(1)
                raise
        producer.send(b"late", event_timestamp=10)  # below its own 3000

        def broken() -> float:
            return sum(metric_samples(metrics_port, "wm_broken_assertions_total", topic=topic))

        wait_until(lambda: broken() >= 1, what="the late message counted")
        assert sorted(set(seen)) == [1_000, 2_000, 3_000] and not _failed_sends
        dispatched = admin.topic_stats(topic)["subscriptions"][GENERATOR_SUBSCRIPTION]["msgOutCounter"]
        if intake == "plugin":
            assert dispatched <= 1_500, f"the generator's consumer was dispatched {dispatched} of 3004 messages"
        stop.set()
        acknowledging.join()
        feed.close()
        app.close()
        producer.close()
    finally:
        stop.set()
        generator.stop()


def test_the_generators_cursor_is_moved_inside_the_broker_with_no_consumer_of_its_own(
    pulsar_client: pulsar.Client, admin: PulsarAdmin, namespace: str
) -> None:
    """Issue 47: the generator's `__wm_generator` cursor kept inside the broker at the generator's word (so that
    retention holds the markers no snapshot covers yet), made where it is missing, never moved back."""
    topic = f"persistent://{namespace}/acknowledged-{uuid.uuid4().hex[:8]}"
    producer = pulsar_client.create_producer(topic, batching_enabled=False)
    ids = [producer.send(f"m{i}".encode()) for i in range(3)]
    assert GENERATOR_SUBSCRIPTION not in admin.topic_stats(topic)["subscriptions"]
    first, second = ((i.ledger_id(), i.entry_id()) for i in ids[:2])
    elsewhere = f"persistent://{namespace}/never-made-{uuid.uuid4().hex[:8]}"

    def cursor() -> str:
        return str(admin.internal_stats(topic)["cursors"][GENERATOR_SUBSCRIPTION]["markDeletePosition"])

    answer = admin.plugin_acknowledge(admin.base_url, {topic: second, elsewhere: (1, 1)})
    assert answer == {topic: "done", elsewhere: "elsewhere"}
    assert cursor() == f"{second[0]}:{second[1]}"
    assert GENERATOR_SUBSCRIPTION in admin.topic_stats(topic)["subscriptions"]  # a durable subscription
    assert admin.plugin_acknowledge(admin.base_url, {topic: first}) == {topic: "done"}
    assert cursor() == f"{second[0]}:{second[1]}", "an older position does not move the cursor back"
    with pytest.raises(AdminError) as refused:
        admin.plugin_acknowledge(admin.base_url, {"not-a-topic": (1, 1)})
    assert refused.value.status == 400
    producer.close()


def test_the_plugin_writes_a_snapshot_record_into_a_topic_it_serves_as_a_producer_would(
    pulsar_client: pulsar.Client, admin: PulsarAdmin, namespace: str
) -> None:
    """Issue 47: a `W_SNAPSHOT` written by the plugin, with no producer of the generator's, reads back as the
    message a producer would have sent: at the position answered, with the marker property and the payload."""
    topic = f"persistent://{namespace}/snapshotted-{uuid.uuid4().hex[:8]}"
    producer = pulsar_client.create_producer(topic, batching_enabled=False)
    producer.send(b"data")
    elsewhere = f"persistent://{namespace}/never-made-{uuid.uuid4().hex[:8]}"
    payload = bytes(range(256))
    name = f"{SNAPSHOT_PRODUCER_PREFIX}g1"
    answer = admin.plugin_write_snapshots(admin.base_url, {topic: (name, payload), elsewhere: (name, b"x")})
    assert answer[elsewhere] == "elsewhere"
    written, ledger, entry = answer[topic].split()
    assert written == "written"
    reader = pulsar_client.create_reader(topic, pulsar.MessageId.earliest)
    try:
        data, record = reader.read_next(10_000), reader.read_next(10_000)
    finally:
        reader.close()
    assert data.data() == b"data" and MARKER_PROPERTY not in data.properties()
    assert (record.message_id().ledger_id(), record.message_id().entry_id()) == (int(ledger), int(entry))
    assert record.properties() == {MARKER_PROPERTY: MarkerKind.W_SNAPSHOT.value}
    assert record.data() == payload
    assert [p["producerName"] for p in admin.topic_stats(topic)["publishers"]] == [producer.producer_name()]
    with pytest.raises(AdminError) as refused:
        admin.plugin_write_snapshots(admin.base_url, {"not-a-topic": ("p", b"x")})
    assert refused.value.status == 400
    producer.close()


def test_following_topics_makes_their_subscriptions_and_sets_their_incarnation_only_where_unset(
    pulsar_client: pulsar.Client, admin: PulsarAdmin, namespace: str
) -> None:
    """Issue 47's take-over: one request for what took two admin calls per partition. The token set is the topic
    property readers read through the admin API; one set before is kept and answered."""
    fresh, named = (f"persistent://{namespace}/follow-{uuid.uuid4().hex[:8]}" for _ in range(2))
    producers = [pulsar_client.create_producer(t) for t in (fresh, named)]
    admin.set_topic_properties(named, {INCARNATION_PROPERTY: "00000000000000aa"})
    elsewhere = f"persistent://{namespace}/never-made-{uuid.uuid4().hex[:8]}"
    answer = admin.plugin_follow(
        admin.base_url, {fresh: "0123456789abcdef", named: "1111111111111111", elsewhere: "2222222222222222"}
    )
    assert answer.incarnations == {fresh: "0123456789abcdef", named: "00000000000000aa"}
    assert answer.elsewhere == [elsewhere] and answer.failed == {}
    assert admin.topic_properties(fresh)[INCARNATION_PROPERTY] == "0123456789abcdef"
    assert admin.topic_properties(named)[INCARNATION_PROPERTY] == "00000000000000aa"
    for topic in (fresh, named):
        assert GENERATOR_SUBSCRIPTION in admin.topic_stats(topic)["subscriptions"]  # a durable subscription
    again = admin.plugin_follow(admin.base_url, {fresh: "3333333333333333"})
    assert again.incarnations == {fresh: "0123456789abcdef"}, "a token in place is never replaced"
    changes = Changes(admin)  # and every report of the topics tells it: a take-over needs no admin read
    changes.until(lambda: {t: changes.topics.get(t, {}).get("incarnation") for t in (fresh, named)}
                  == {fresh: "0123456789abcdef", named: "00000000000000aa"}, "the incarnations in place")  # fmt: skip
    with pytest.raises(AdminError) as refused:
        admin.plugin_follow(admin.base_url, {fresh: "not-a-token"})
    assert refused.value.status == 400
    for producer in producers:
        producer.close()


def _message_at(consumer: pulsar.Consumer, position: tuple[int, int, int]) -> pulsar.Message:
    """The first message the consumer receives in the entry at `position` (to acknowledge up to that entry)."""
    while True:
        message = consumer.receive(10_000)
        if (message.message_id().ledger_id(), message.message_id().entry_id()) >= position[:2]:
            return message
