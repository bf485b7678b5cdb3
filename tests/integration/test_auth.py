"""Security on a real broker: token authentication and authorization, who can move a watermark, and
producer identity.

One extra standalone broker for the module, started like `make cluster-up AUTH=token` (its own
free ports and state directory), with the generator running under its own role and only the
permissions that `make cluster-up AUTH=token` grants it. The attacker is the sample application
role `client` (produce and consume on public/default, consume on the watermark namespace); each
attack asserts what the victim's consumer (and once a Spark query) sees afterwards. The test of
names in payloads runs on the session's ordinary broker.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import msgpack
import pulsar
import pytest

from bench.common import metric_samples
from broker_ext.status import latest_events
from consumer import Watermark, WatermarkConsumer
from consumer.watermark_feed import WatermarkFeed
from devtools.local_cluster import LocalCluster, free_port
from producer import WatermarkProducer
from pulsar_access.admin import AdminError, PluginMissing, PulsarAdmin
from pulsar_access.auth_tokens import (
    ADMIN_ROLE,
    CLIENT_ROLE,
    DEFAULT_NAMESPACE,
    GENERATOR_ACTIONS,
    GENERATOR_ROLE,
    create_token,
)
from pulsar_access.settings import PulsarSettings
from pulsar_access.topics import full_name, watermark_namespace, watermark_topic_for
from spark_sink.watermarks import CompanionFollower, KnownWatermarks
from tests.integration.generator_process import GeneratorProcess
from tests.integration.helpers import Recorder, wait_until, watermarks
from watermark_core.protocol import (
    EVENT_PROPERTY,
    INCARNATION_PROPERTY,
    MARKER_PROPERTY,
    SEND_WATERMARK,
    SNAPSHOT_PRODUCER_PREFIX,
    MarkerKind,
    WatermarkEvent,
    encode_table,
)
from watermark_core.snapshot import SnapshotKeys, encode_snapshot, state_to_dict
from watermark_core.state import ProducerRecord, WatermarkConfig, WatermarkState

pyspark = pytest.importorskip("pyspark")
from pyspark.sql import SparkSession  # noqa: E402

import spark_sink  # noqa: E402

BASE = 1_700_000_000_000
FORGED = 9_999_999_999_999
"""The event time every attack tries to make a victim's subscription see."""


@dataclass
class AuthCluster:
    cluster: LocalCluster
    generator: GeneratorProcess
    metrics_port: int

    def token_file(self, role: str) -> Path:
        return self.cluster.tokens.token_file(role)

    def settings(self, role: str | None) -> PulsarSettings:
        token = self.cluster.tokens.token(role) if role else None
        return PulsarSettings(self.cluster.service_url, self.cluster.admin_url, token)

    def env(self, token_file: Path | None) -> dict[str, str]:
        """The environment of a command line tool: this cluster, and a token file or no credentials at all."""
        env = {k: v for k, v in os.environ.items() if k not in ("PULSAR_AUTH_TOKEN", "PULSAR_AUTH_TOKEN_FILE")}
        env.update(PULSAR_SERVICE_URL=self.cluster.service_url, PULSAR_ADMIN_URL=self.cluster.admin_url)
        if token_file is not None:
            env["PULSAR_AUTH_TOKEN_FILE"] = str(token_file)
        return env


@pytest.fixture(scope="module")
def auth_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthCluster]:
    state = tmp_path_factory.mktemp("auth-cluster")
    cluster = LocalCluster(
        state_dir=state, broker_port=free_port(), web_port=free_port(), bookie_port=free_port(),
        with_generator=False, auth="token",
    )  # fmt: skip
    cluster.up()  # writes the tokens and grants the generator and client roles their permissions
    metrics_port = free_port()
    generator = GeneratorProcess(
        PulsarSettings(cluster.service_url, cluster.admin_url), state / "generator.log", "auth-generator",
        PULSAR_AUTH_TOKEN="", PULSAR_AUTH_TOKEN_FILE=str(cluster.tokens.token_file(GENERATOR_ROLE)),
        WM_SNAPSHOT_KEY="", WM_SNAPSHOT_KEY_FILE=str(cluster.ensure_snapshot_key()), WM_METRICS_PORT=str(metrics_port),
    )  # fmt: skip
    generator.start()
    try:
        yield AuthCluster(cluster, generator, metrics_port)
    finally:
        generator.stop()
        cluster.down()


@pytest.fixture(scope="module")
def client(auth_cluster: AuthCluster) -> Iterator[pulsar.Client]:
    """A client of the sample application role (produce and consume on public/default)."""
    client = auth_cluster.settings(CLIENT_ROLE).client()
    yield client
    client.close()


def _topic(prefix: str) -> str:
    return f"persistent://public/default/{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def watermarked_topic(auth_cluster: AuthCluster, client: pulsar.Client) -> Iterator[tuple[str, Recorder]]:
    """A topic where the client role's producer and consumer exchanged messages and got a watermark."""
    topic = _topic("auth")
    recorder = Recorder()
    consumer = WatermarkConsumer(client, topic, "app", listener=recorder)
    producer = WatermarkProducer(client, topic, producer_name="sensor-1")
    producer.new_watermark().event_time(BASE).send()
    producer.send(b"reading", event_timestamp=BASE + 500)
    wait_until(lambda: BASE in watermarks(recorder), timeout_s=30, what="a watermark from the generator")
    yield topic, recorder
    consumer.close()
    producer.close()


def test_with_the_client_token_messages_flow_and_the_generator_with_least_permissions_sends_watermarks(
    auth_cluster: AuthCluster, watermarked_topic: tuple[str, Recorder]
) -> None:
    _, recorder = watermarked_topic
    assert recorder.messages() == [b"reading"]
    assert watermarks(recorder) == [BASE]
    admin = PulsarAdmin(auth_cluster.settings(ADMIN_ROLE))
    try:
        granted = admin.namespace_permissions(DEFAULT_NAMESPACE)
        tables = admin.namespace_permissions(watermark_namespace())
    finally:
        admin.close()
    assert sorted(granted[GENERATOR_ROLE]) == sorted(GENERATOR_ACTIONS) == ["consume", "produce"]
    assert sorted(granted[CLIENT_ROLE]) == ["consume", "produce"]
    # the watermark tables: only the generator's role may write them, the application may read them
    assert {role: sorted(actions) for role, actions in tables.items()} == {
        GENERATOR_ROLE: ["consume", "produce"], CLIENT_ROLE: ["consume"],
    }  # fmt: skip

    # the generator did its work with those permissions alone: only compaction and setting the incarnation property
    # (both a tenant admin's) were refused
    def refused() -> list[str]:
        return [
            line for line in auth_cluster.generator.log_text().splitlines() if "refused" in line or "Author" in line
        ]

    wait_until(refused, what="the generator to say once that it may not trigger compaction")
    assert all("operation COMPACT" in line or INCARNATION_PROPERTY in line for line in refused()), refused()
    assert auth_cluster.generator.running


def test_without_a_token_the_admin_api_and_status_fail_naming_the_fix(
    auth_cluster: AuthCluster, watermarked_topic: tuple[str, Recorder]
) -> None:
    topic, _ = watermarked_topic
    admin = PulsarAdmin(auth_cluster.settings(None))
    try:
        with pytest.raises(AdminError, match=r"401: authentication required.*PULSAR_AUTH_TOKEN_FILE") as refused:
            admin.list_topics(DEFAULT_NAMESPACE)
        assert refused.value.status == 401
    finally:
        admin.close()

    status = subprocess.run(
        [sys.executable, "-m", "broker_ext.cli", "status", topic],
        env=auth_cluster.env(None), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert status.returncode == 2
    assert "authentication required" in status.stderr and "PULSAR_AUTH_TOKEN" in status.stderr, status.stderr


def test_a_role_without_permission_gets_an_error_naming_the_grant(auth_cluster: AuthCluster) -> None:
    key = auth_cluster.cluster.tokens.secret_key_file.read_bytes()
    stranger = PulsarSettings(
        auth_cluster.cluster.service_url, auth_cluster.cluster.admin_url, create_token(key, "nobody")
    )
    admin = PulsarAdmin(stranger)
    try:
        with pytest.raises(AdminError, match=r"role 'nobody' lacks permission .* on namespace public/default.*grant"):
            admin.list_topics(DEFAULT_NAMESPACE)
    finally:
        admin.close()
    forged = PulsarSettings(
        auth_cluster.cluster.service_url, auth_cluster.cluster.admin_url, create_token(b"k" * 32, "admin")
    )
    admin = PulsarAdmin(forged)
    try:
        with pytest.raises(AdminError, match="was not accepted"):
            admin.list_topics(DEFAULT_NAMESPACE)
    finally:
        admin.close()
    client = stranger.client(operation_timeout_seconds=5)
    try:
        with pytest.raises(pulsar.AuthorizationError) as denied:
            WatermarkProducer(client, _topic("denied"), producer_name="x")
        assert "grant-permission public/default" in str(denied.value), str(denied.value)
    finally:
        client.close()


def test_without_a_token_a_producer_and_a_consumer_fail(auth_cluster: AuthCluster) -> None:
    """The broker refuses the connection; the C++ client retries until its operation timeout and
    raises `pulsar.Timeout` (Pulsar 3.x clients never surface the broker's AuthenticationError here)."""
    log = auth_cluster.cluster.state_dir / "pulsar.log"
    refusals_before = log.read_text(errors="replace").count("Failed to authenticate: operation=connect")
    client = auth_cluster.settings(None).client(operation_timeout_seconds=3)
    topic = _topic("anonymous")
    try:
        with pytest.raises(pulsar.PulsarException) as producer_error:
            WatermarkProducer(client, topic, producer_name="anonymous")
        with pytest.raises(pulsar.PulsarException) as consumer_error:
            WatermarkConsumer(client, topic, "anonymous")
    finally:
        client.close()
    for error in (producer_error, consumer_error):
        assert isinstance(error.value, pulsar.Timeout | pulsar.ConnectError | pulsar.AuthenticationError), error.value
        assert "PULSAR_AUTH_TOKEN" in str(error.value), str(error.value)
    # it is the missing credential that the broker refused, not a broker that is down
    assert log.read_text(errors="replace").count("Failed to authenticate: operation=connect") > refusals_before
    admin = PulsarAdmin(auth_cluster.settings(ADMIN_ROLE))
    try:
        assert not [t for t in admin.list_topics(DEFAULT_NAMESPACE) if t.startswith(topic)]
    finally:
        admin.close()


def test_status_works_with_a_token_file(auth_cluster: AuthCluster, watermarked_topic: tuple[str, Recorder]) -> None:
    topic, _ = watermarked_topic
    status = subprocess.run(
        [sys.executable, "-m", "broker_ext.cli", "status", topic],
        env=auth_cluster.env(auth_cluster.token_file(CLIENT_ROLE)), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
    row = next(line for line in status.stdout.splitlines() if " app " in line)
    assert str(BASE) in row and "sensor-1" in row


def test_the_spark_source_and_sink_work_with_the_authToken_option(
    auth_cluster: AuthCluster, client: pulsar.Client, spark: SparkSession, tmp_path: Path
) -> None:
    topic, output = _topic("spark-in"), _topic("spark-out")
    downstream = Recorder()
    consumer = WatermarkConsumer(client, output, "downstream", listener=downstream)
    producer = WatermarkProducer(client, topic, producer_name="spark-upstream")
    producer.new_watermark().event_time(BASE).send()
    for second in range(3):
        producer.send(f"e{second}".encode(), partition_key="k", event_timestamp=BASE + second * 1000)
    producer.new_watermark().event_time(BASE + 5_000).send()
    # the attacker, before the query starts: a table for the query's subscription where consumers used to read
    _forge_legacy_table(client, topic, "spark")
    connection = {
        "serviceUrl": auth_cluster.cluster.service_url,
        "adminUrl": auth_cluster.cluster.admin_url,
        "authToken": auth_cluster.cluster.tokens.token(CLIENT_ROLE),
    }
    rows = spark_sink.read_stream(spark, topic=topic, subscription="spark", **connection).select(
        "key", "value", "event_time"
    )
    query = (
        rows.writeStream.format("pulsar-watermark").options(**connection).option("topic", output)
        .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(processingTime="500 milliseconds").start()
    )  # fmt: skip
    try:
        wait_until(lambda: len(downstream.messages()) == 3, timeout_s=90, what="three rows downstream")
        wait_until(lambda: bool(watermarks(downstream)), timeout_s=60, what="the query's watermark downstream")
    finally:
        query.stop()
    assert sorted(downstream.messages()) == [b"e0", b"e1", b"e2"]  # type: ignore[type-var]
    # the sink's W_SET (written with the token) reached the downstream consumer through the generator; the
    # query's watermark came from the generator's table, not from the forged one (which would give FORGED)
    assert BASE <= watermarks(downstream)[-1] <= BASE + 5_000
    assert FORGED not in watermarks(downstream)
    consumer.close()
    producer.close()

    # the same source without credentials: the query fails and says which option or variable to set
    anonymous = {k: v for k, v in connection.items() if k != "authToken"}
    failing = (
        spark_sink.read_stream(spark, topic=topic, subscription="anonymous", **anonymous)
        .writeStream.format("console").option("checkpointLocation", str(tmp_path / "ckpt-anonymous")).start()
    )  # fmt: skip
    with pytest.raises(Exception, match="authToken") as error:
        failing.awaitTermination(60)
    failing.stop()
    assert "PULSAR_AUTH_TOKEN" in str(error.value)


# -- who can move a watermark: the client role attacks another application's subscription ----------------


def _forged_table(topic: str, subscription: str) -> bytes:
    """A SendWatermark table as the generator would write it, saying the subscription is at FORGED."""
    event = WatermarkEvent(full_name(topic), -1, subscription, FORGED, (2**40, 0), 2**62, {"mallory": FORGED})
    return encode_table([event])


def _forge_legacy_table(client: pulsar.Client, topic: str, subscription: str) -> None:
    """Write a forged table to `<topic>__watermarks`, where consumers read before issue #15: the client role
    may produce there (produce on public/default), under any producer name."""
    forger = client.create_producer(f"{full_name(topic)}__watermarks", producer_name="__wm_dispatch-x-0")
    forger.send(_forged_table(topic, subscription), partition_key="-1", properties={EVENT_PROPERTY: SEND_WATERMARK})
    forger.close()


def test_a_forged_watermark_table_changes_nothing_that_consumers_or_status_see(
    auth_cluster: AuthCluster, client: pulsar.Client, watermarked_topic: tuple[str, Recorder]
) -> None:
    topic, recorder = watermarked_topic
    _forge_legacy_table(client, topic, "app")  # accepted by the broker, read by no one
    # the tables' own place: the client role may read there, never write, whatever the producer name
    for name in (None, "__wm_dispatch-auth-generator-0"):
        with pytest.raises(pulsar.AuthorizationError):
            client.create_producer(watermark_topic_for(topic), producer_name=name)
    with pytest.raises(pulsar.AuthorizationError):  # nor any other topic of that namespace
        client.create_producer(f"persistent://{watermark_namespace()}/public~default~mallory")

    time.sleep(3.0)  # the finding of issue #15: the forged value arrived within two seconds
    assert watermarks(recorder) == [BASE]
    feed = WatermarkFeed(client, topic, "app", lambda _w: None)  # what a consumer attaching now starts from
    try:
        assert feed.current == Watermark(BASE)
    finally:
        feed.close()
    assert latest_events(client, topic)[(-1, "app")].event_time == BASE  # what `broker-ext status` shows
    # what a Spark query's driver takes as the watermark at the topic's end (spark_sink.source reads it so)
    known = KnownWatermarks()
    follower = CompanionFollower(client, known)
    try:
        follower.follow([full_name(topic)])
        assert known.watermark({(full_name(topic), -1): (2**62, 0)}) == BASE
    finally:
        follower.close()
    status = subprocess.run(
        [sys.executable, "-m", "broker_ext.cli", "status", topic],
        env=auth_cluster.env(auth_cluster.token_file(CLIENT_ROLE)), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert status.returncode == 0 and str(FORGED) not in status.stdout, status.stdout + status.stderr


def _read_all(client: pulsar.Client, topic: str) -> list[pulsar.Message]:
    """Everything on a topic, as a role with consume reads it."""
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    messages = []
    try:
        while reader.has_message_available():
            messages.append(reader.read_next(timeout_millis=5_000))
    finally:
        reader.close()
    return messages


def _generator_snapshot_of(client: pulsar.Client, topic: str, producer: str, event_time: int) -> bytes | None:
    """The payload of a genuine W_SNAPSHOT on `topic` whose (readable, signed) state has `producer` at `event_time`."""
    for message in reversed(_read_all(client, topic)):
        if message.properties().get(MARKER_PROPERTY) != MarkerKind.W_SNAPSHOT.value:
            continue
        signed = msgpack.unpackb(msgpack.unpackb(message.data())["signed"])
        if signed["state"]["producers"].get(producer, {}).get("event_time") == event_time:
            return bytes(message.data())
    return None


def test_snapshots_written_under_the_generators_name_are_skipped_when_a_generator_starts_from_them(
    auth_cluster: AuthCluster, client: pulsar.Client
) -> None:
    """A generator that takes a partition over starts from the first snapshot after its cursor; before
    signatures, a W_SNAPSHOT that anyone wrote under the generator's name prefix was that snapshot."""
    topic, own = _topic("snap-victim"), _topic("snap-mallory")
    # a genuine, signed snapshot of a state with 'alice' at FORGED: the attacker has the generator write one on
    # a topic of its own, where it may produce, and reads it back (consume)
    decoy = WatermarkProducer(client, own, producer_name="alice")
    decoy.new_watermark().event_time(FORGED).send()
    decoy.send(b"x", event_timestamp=FORGED)
    genuine: list[bytes] = []
    wait_until(lambda: genuine.append(_generator_snapshot_of(client, own, "alice", FORGED) or b"") or genuine[-1],
               timeout_s=30, what="the generator's snapshot on the attacker's topic")  # fmt: skip
    decoy.close()

    # the victim's topic while no generator follows it yet (deployed later, or dead: kill -9)
    auth_cluster.generator.kill()
    recorder = Recorder()
    consumer = WatermarkConsumer(client, topic, "app", listener=recorder)
    alice = WatermarkProducer(client, topic, producer_name="alice")
    alice.new_watermark().event_time(BASE).send()
    alice.send(b"one", event_timestamp=BASE)
    wait_until(lambda: recorder.messages() == [b"one"], timeout_s=30, what="the victim's first message")
    last = _read_all(client, topic)[-1].message_id()
    forged_state = WatermarkState(
        config=WatermarkConfig(60_000, 60_000), position=(last.ledger_id(), last.entry_id(), -1), clock=BASE,
        watermark=FORGED, producers={"alice": ProducerRecord(FORGED, False, BASE)}, pending_txns={},
    )  # fmt: skip
    forger = client.create_producer(topic, producer_name=f"{SNAPSHOT_PRODUCER_PREFIX}mallory", batching_enabled=False)
    forgeries = [
        msgpack.packb({"v": 1, "state": state_to_dict(forged_state)}),  # the format before signatures
        encode_snapshot(  # signed, with a key of the attacker's own
            forged_state, keys=SnapshotKeys.from_text("mallorys-own-key-0123456789"), topic=full_name(topic)
        ),
        genuine[-1],  # signed with the generators' key, for another topic
    ]
    for payload in forgeries:
        forger.send(payload, properties={MARKER_PROPERTY: MarkerKind.W_SNAPSHOT.value})
    forger.close()

    auth_cluster.generator.start()  # it starts from the log: the three forgeries are the snapshots it finds
    wait_until(lambda: watermarks(recorder), timeout_s=60, what="the victim's watermark")
    assert watermarks(recorder) == [BASE]  # before signatures: [FORGED], from the unsigned forgery
    generator_name = f"{SNAPSHOT_PRODUCER_PREFIX}{auth_cluster.generator.instance_id}"
    wait_until(lambda: any(m.producer_name() == generator_name for m in _read_all(client, topic)), timeout_s=30,
               what="a snapshot of the generator's own")  # fmt: skip
    # the broker's plugin wrote it, so no producer holds the generator's own name: anyone with produce may take it
    impostor = client.create_producer(topic, producer_name=generator_name, batching_enabled=False)
    impostor.send(forgeries[0], properties={MARKER_PROPERTY: MarkerKind.W_SNAPSHOT.value})
    impostor.close()
    alice.new_watermark().event_time(BASE + 1_000).send()
    alice.send(b"two", event_timestamp=BASE + 1_000)
    wait_until(lambda: BASE + 1_000 in watermarks(recorder), timeout_s=60, what="the victim's next watermark")
    time.sleep(1.0)
    assert watermarks(recorder) == [BASE, BASE + 1_000]  # never FORGED
    assert recorder.messages() == [b"one", b"two"]
    skipped = sum(metric_samples(auth_cluster.metrics_port, "wm_malformed_markers_total", reason="bad-signature"))
    assert skipped >= len(forgeries) + 1, skipped  # each skipped and counted like a malformed marker
    log = auth_cluster.generator.log_text()
    assert "skipping unusable snapshot" in log and "bad-signature" in log
    consumer.close()
    alice.close()


def test_a_w_set_under_the_name_of_a_disconnected_producer_moves_its_watermark_a_documented_limit(
    auth_cluster: AuthCluster, client: pulsar.Client
) -> None:
    """Pulsar binds no producer name to a role (docs/SECURITY.md, "Producer identity"): a live producer's
    name is refused, a free one is anyone's with produce on the topic. Topic-level grants keep roles apart."""
    topic = _topic("identity")
    recorder = Recorder()
    consumer = WatermarkConsumer(client, topic, "app", listener=recorder)
    alice = WatermarkProducer(client, topic, producer_name="alice")
    alice.new_watermark().event_time(BASE).send()
    alice.send(b"one", event_timestamp=BASE)
    wait_until(lambda: BASE in watermarks(recorder), timeout_s=30, what="alice's watermark")
    with pytest.raises(pulsar.ProducerBusy):  # while alice is connected, her name is hers
        client.create_producer(topic, producer_name="alice")

    alice.close(idle=False)  # gone without W_IDLE (a crash): her name is free
    mallory = client.create_producer(topic, producer_name="alice", batching_enabled=False)
    _raw_marker(mallory, MarkerKind.W_SET, {"event_time": FORGED})
    mallory.send(b"from mallory", event_timestamp=FORGED)
    wait_until(lambda: FORGED in watermarks(recorder), timeout_s=30, what="the limit: mallory speaking as alice")
    mallory.close()

    # the mitigation: an application role granted produce on its own topic only cannot write this one at all
    key = auth_cluster.cluster.tokens.secret_key_file.read_bytes()
    own = _topic("app-b-own")
    admin = PulsarAdmin(auth_cluster.settings(ADMIN_ROLE))
    try:
        admin.create_topic(own)
        admin.grant_topic_permission(own, "app-b", ["produce", "consume"])
    finally:
        admin.close()
    app_b = PulsarSettings(
        auth_cluster.cluster.service_url, auth_cluster.cluster.admin_url, create_token(key, "app-b")
    ).client(operation_timeout_seconds=10)
    try:
        app_b.create_producer(own, producer_name="alice").close()
        with pytest.raises(pulsar.AuthorizationError):
            app_b.create_producer(topic, producer_name="alice")
    finally:
        app_b.close()
    consumer.close()


# -- producer identity, on the session's ordinary broker ------------------------------------------------


def _raw_marker(producer: pulsar.Producer, kind: MarkerKind, body: dict[str, object]) -> None:
    producer.send(msgpack.packb({"v": 1, **body}, use_bin_type=True), properties={MARKER_PROPERTY: kind.value})


@pytest.mark.usefixtures("generator")
def test_a_marker_naming_another_producer_in_its_payload_changes_nothing_for_it(
    pulsar_client: pulsar.Client, topic: str
) -> None:
    recorder = Recorder()
    consumer = WatermarkConsumer(pulsar_client, topic, "sub", listener=recorder)
    alice = WatermarkProducer(pulsar_client, topic, producer_name="alice")
    mallory = pulsar_client.create_producer(topic, producer_name="mallory", batching_enabled=False)
    alice.new_watermark().event_time(100).send()
    claims: dict[str, object] = {"producer": "alice", "producer_name": "alice", "producerName": "alice"}
    _raw_marker(mallory, MarkerKind.W_SET, {"event_time": 500, **claims})  # "alice is at 500"
    _raw_marker(mallory, MarkerKind.W_IDLE, claims)  # "alice is idle"
    alice.send(b"after", event_timestamp=150)  # the subscription acknowledges past both forged markers

    def latest() -> object:
        return latest_events(pulsar_client, topic).get((-1, "sub"))

    wait_until(lambda: getattr(latest(), "idle", ()) == ("mallory",), timeout_s=30, what="mallory's W_IDLE folded")
    event = latest_events(pulsar_client, topic)[(-1, "sub")]
    assert dict(event.active) == {"alice": 100}  # neither moved to 500 nor idled
    assert event.event_time == 100  # had either marker counted for alice, the watermark would be 500
    # the sentinel: alice's own W_SET(200); a 500 (or any other value) would have reached the listener before it
    alice.new_watermark().event_time(200).send()
    alice.send(b"sentinel", event_timestamp=200)
    wait_until(lambda: 200 in watermarks(recorder), timeout_s=30, what="the sentinel watermark 200")
    assert watermarks(recorder) == [100, 200]
    assert recorder.messages() == [b"after", b"sentinel"]
    mallory.close()
    alice.close()
    consumer.close()


def test_the_broker_plugin_lets_in_the_generators_role_and_super_users_and_refuses_everyone_else(
    auth_cluster: AuthCluster, watermarked_topic: tuple[str, Recorder]
) -> None:
    """What the plugin serves (every followed subscription's position) is the generator's: the broker authenticates
    its requests, the plugin authorizes them (produce on the watermark namespace, or a super-user)."""
    topic, _ = watermarked_topic
    key = auth_cluster.cluster.tokens.secret_key_file.read_bytes()
    answers: dict[str, dict[str, object]] = {}
    for role in (GENERATOR_ROLE, ADMIN_ROLE):
        admin = PulsarAdmin(auth_cluster.settings(role))
        try:
            answers[role] = admin.plugin_changes(auth_cluster.cluster.admin_url, "", -1, 0)
        finally:
            admin.close()
    assert topic in cast(dict[str, object], answers[GENERATOR_ROLE]["topics"])
    assert answers[ADMIN_ROLE]["topics"] == answers[GENERATOR_ROLE]["topics"]
    refused: dict[str | None, int | None] = {}
    for role, settings in ((None, auth_cluster.settings(None)), (CLIENT_ROLE, auth_cluster.settings(CLIENT_ROLE)),
                           ("nobody", PulsarSettings(auth_cluster.cluster.service_url, auth_cluster.cluster.admin_url,
                                                     create_token(key, "nobody")))):  # fmt: skip
        admin = PulsarAdmin(settings)
        try:
            with pytest.raises(PluginMissing) as denied:
                admin.plugin_changes(auth_cluster.cluster.admin_url, "", -1, 0)
            refused[role] = denied.value.status
        finally:
            admin.close()
    assert refused == {None: 401, CLIENT_ROLE: 403, "nobody": 403}
    # and the generator with least permissions took its positions from the plugin
    assert "cursor positions come from the broker plugin" in auth_cluster.generator.log_text()


def test_the_broker_plugin_tells_a_role_only_of_the_namespaces_where_it_may_consume(
    auth_cluster: AuthCluster, watermarked_topic: tuple[str, Recorder]
) -> None:
    """A second tenant whose namespace the generator's role may not consume: naming it is refused (403, naming the
    namespace and the grant), a poll without namespaces does not list its topics, and the generator's own namespace
    is served as before. A super-user sees every namespace."""
    topic, _ = watermarked_topic
    private = "acme/private"
    hidden = f"persistent://{private}/orders-{uuid.uuid4().hex[:8]}"
    admin = PulsarAdmin(auth_cluster.settings(ADMIN_ROLE))
    admin.create_tenant("acme")
    admin.create_namespace(private)
    admin.grant_namespace_permission(private, CLIENT_ROLE, ["produce", "consume"])  # an application's, not ours
    owner = auth_cluster.settings(ADMIN_ROLE).client()
    try:
        # followed (it has the generator's subscription) and fresh (a producer appeared): both would be told
        follower = owner.subscribe(hidden, "__wm_generator", consumer_type=pulsar.ConsumerType.Failover)
        producer = owner.create_producer(hidden)
        producer.send(b"secret")

        def told(answer: dict[str, Any]) -> set[str]:
            return {*cast(dict[str, object], answer["topics"]), *cast(list[str], answer["new"])}

        wait_until(lambda: hidden in told(admin.plugin_changes(auth_cluster.cluster.admin_url, "", -1, 0)),
                   what="the plugin to report the other tenant's topic to a super-user")  # fmt: skip
        generator = PulsarAdmin(auth_cluster.settings(GENERATOR_ROLE))
        try:
            with pytest.raises(PluginMissing) as refused:  # (a) naming a namespace it may not consume
                generator.plugin_changes(auth_cluster.cluster.admin_url, "", -1, 0,
                                         namespaces=[DEFAULT_NAMESPACE, private])  # fmt: skip
            assert refused.value.status == 403
            assert private in str(refused.value) and "consume" in str(refused.value), str(refused.value)
            everything = generator.plugin_changes(auth_cluster.cluster.admin_url, "", -1, 0)  # (b) no namespaces
            assert not any(name.startswith(f"persistent://{private}/") for name in told(everything)), everything
            assert topic in cast(dict[str, object], everything["topics"])  # (c) its own namespace, as before
            own = generator.plugin_changes(auth_cluster.cluster.admin_url, "", -1, 0, namespaces=[DEFAULT_NAMESPACE])
            assert topic in cast(dict[str, object], own["topics"])
            # a long poll without namespaces is not answered for the other tenant's moves, nor told of them
            waited = generator.plugin_changes(auth_cluster.cluster.admin_url, str(everything["epoch"]),
                                              int(everything["seq"]), 0)  # fmt: skip
            producer.send(b"more")
            follower.close()  # the owner went: a move of the hidden topic
            later = generator.plugin_changes(auth_cluster.cluster.admin_url, str(waited["epoch"]),
                                             int(waited["seq"]), 3_000)  # fmt: skip
            assert hidden not in told(later), later
        finally:
            generator.close()
        producer.close()
    finally:
        owner.close()
        admin.close()
