"""Security on a real broker: token authentication and authorization, and producer identity.

One extra standalone broker for the module, started like `make cluster-up AUTH=token` (its own
free ports and state directory), with the generator running under its own role and only the
permissions that `make cluster-up AUTH=token` grants it. The identity test runs on the session's
ordinary broker.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgpack
import pulsar
import pytest

from broker_ext.status import latest_events
from consumer import WatermarkConsumer
from devtools.local_cluster import LocalCluster, free_port
from producer import WatermarkProducer
from pulsar_access.admin import AdminError, PulsarAdmin
from pulsar_access.auth_tokens import (
    ADMIN_ROLE,
    CLIENT_ROLE,
    DEFAULT_NAMESPACE,
    GENERATOR_ACTIONS,
    GENERATOR_ROLE,
    create_token,
)
from pulsar_access.settings import PulsarSettings
from tests.integration.generator_process import GeneratorProcess
from tests.integration.helpers import Recorder, wait_until, watermarks
from watermark_core.protocol import MARKER_PROPERTY, MarkerKind

pyspark = pytest.importorskip("pyspark")
from pyspark.sql import SparkSession  # noqa: E402

import spark_sink  # noqa: E402

BASE = 1_700_000_000_000


@dataclass
class AuthCluster:
    cluster: LocalCluster
    generator: GeneratorProcess

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
    generator = GeneratorProcess(
        PulsarSettings(cluster.service_url, cluster.admin_url), state / "generator.log", "auth-generator",
        PULSAR_AUTH_TOKEN="", PULSAR_AUTH_TOKEN_FILE=str(cluster.tokens.token_file(GENERATOR_ROLE)),
    )  # fmt: skip
    generator.start()
    try:
        yield AuthCluster(cluster, generator)
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
    finally:
        admin.close()
    assert sorted(granted[GENERATOR_ROLE]) == sorted(GENERATOR_ACTIONS) == ["consume", "produce"]
    assert sorted(granted[CLIENT_ROLE]) == ["consume", "produce"]

    # the generator did its work with those permissions alone: only compaction (tenant admin) was refused
    def refused() -> list[str]:
        return [
            line for line in auth_cluster.generator.log_text().splitlines() if "refused" in line or "Author" in line
        ]

    wait_until(refused, what="the generator to say once that it may not trigger compaction")
    assert all("operation COMPACT" in line for line in refused()), refused()
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
    # the sink's W_SET (written with the token) reached the downstream consumer through the generator
    assert BASE <= watermarks(downstream)[-1] <= BASE + 5_000
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
