"""Bad input at every entry point, on the real broker: one clear error that names the fix.

The library raises `PulsarClientError` (still the pulsar exception it explains); `broker-ext` exits
non-zero with one line on stderr; Spark shows our line in the query's error. Pure cases (messages,
URL checks, `make cluster-up` on a busy port) are in tests/unit/test_error_messages.py.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest

from consumer import WatermarkConsumer
from producer import WatermarkProducer
from pulsar_access.admin import PulsarAdmin
from pulsar_access.errors import PulsarClientError
from pulsar_access.incarnations import Incarnations
from pulsar_access.settings import PulsarSettings
from tests.integration.helpers import Recorder, wait_until


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def dead_client() -> Iterator[tuple[pulsar.Client, str]]:
    """A client of a URL where nothing listens (a broker that is down, or a wrong port)."""
    url = f"pulsar://127.0.0.1:{free_port()}"
    client = pulsar.Client(url, operation_timeout_seconds=2, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    yield client, url
    client.close()


def wm_threads(subscription: str) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.endswith(f"-{subscription}") and t.name.startswith("wm-")]


# -- the library -----------------------------------------------------------------------------------------


def test_a_producer_on_a_broker_that_is_down_names_the_url_and_the_fix(dead_client: tuple[pulsar.Client, str]) -> None:
    client, url = dead_client
    with pytest.raises(PulsarClientError) as raised:
        WatermarkProducer(client, "sensors", producer_name="p")
    message = str(raised.value)
    assert url in message and "make cluster-up" in message and "PULSAR_SERVICE_URL" in message
    assert "\n" not in message
    assert isinstance(raised.value, pulsar.ConnectError), "`except pulsar.ConnectError` keeps working"


def test_a_consumer_on_a_broker_that_is_down_names_the_url_and_leaves_nothing_running(
    dead_client: tuple[pulsar.Client, str],
) -> None:
    client, url = dead_client
    subscription = f"down-{uuid.uuid4().hex[:6]}"
    with pytest.raises(pulsar.ConnectError, match=r"make cluster-up") as raised:
        WatermarkConsumer(client, "sensors", subscription, listener=Recorder())
    assert isinstance(raised.value, PulsarClientError) and url in str(raised.value)
    assert wm_threads(subscription) == []


@pytest.mark.parametrize(
    ("topic", "namespace"),
    [
        ("persistent://public/no-such-namespace/t", "public/no-such-namespace"),
        ("persistent://no-such-tenant/ns/t", "no-such-tenant/ns"),
        ("no-such-tenant/ns/t", "no-such-tenant/ns"),
    ],
)
def test_a_topic_in_a_namespace_that_does_not_exist_says_to_create_it(
    pulsar_client: pulsar.Client, pulsar_settings: PulsarSettings, topic: str, namespace: str
) -> None:
    for create in (
        lambda: WatermarkProducer(pulsar_client, topic, producer_name="p"),
        lambda: WatermarkConsumer(pulsar_client, topic, "s"),
    ):
        with pytest.raises(pulsar.TopicNotFound) as raised:
            create()
        message = str(raised.value)
        assert isinstance(raised.value, PulsarClientError)
        assert f"pulsar-admin namespaces create {namespace}" in message
        assert topic in message and pulsar_settings.service_url in message


def test_an_invalid_topic_name_lists_the_accepted_forms(pulsar_client: pulsar.Client) -> None:
    with pytest.raises(PulsarClientError, match=r"'a/b' is not a valid topic name.*'tenant/namespace/name'"):
        WatermarkProducer(pulsar_client, "a/b")
    with pytest.raises(PulsarClientError, match=r"not a valid topic name"):
        WatermarkConsumer(pulsar_client, "persistent://x", "s")


def test_a_producer_name_already_connected_says_to_choose_another(pulsar_client: pulsar.Client, topic: str) -> None:
    first = WatermarkProducer(pulsar_client, topic, producer_name="only-one")
    try:
        with pytest.raises(PulsarClientError, match=r"already connected.*producer_name"):
            WatermarkProducer(pulsar_client, topic, producer_name="only-one")
    finally:
        first.close()


def test_a_three_part_short_name_is_not_mistaken_for_a_partitioned_topic(
    pulsar_client: pulsar.Client, admin: PulsarAdmin
) -> None:
    """Bug found here: "tenant/ns/topic" was compared with "persistent://public/default/tenant/ns/topic"."""
    name = f"public/default/short-{uuid.uuid4().hex[:8]}"
    producer = WatermarkProducer(pulsar_client, name, producer_name="short")
    try:
        assert producer._is_partitioned is False
        producer.new_watermark().event_time(5).send()
    finally:
        producer.close()
    reader = pulsar_client.create_reader(name, pulsar.MessageId.earliest)
    try:
        properties = reader.read_next(timeout_millis=10_000).properties()
    finally:
        reader.close()
    assert properties == {"wm.marker": "W_SET"}, "a marker on a non-partitioned topic names no partition"


# -- broker-ext ------------------------------------------------------------------------------------------


def broker_ext(args: list[str], settings: PulsarSettings, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {
        **os.environ, "PULSAR_SERVICE_URL": settings.service_url, "PULSAR_ADMIN_URL": settings.admin_url, **env,
    }  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "broker_ext.cli", *args], capture_output=True, text=True, timeout=120, env=environment
    )


def the_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr
    assert len(lines) == 1, stderr
    assert lines[0].startswith("broker-ext: error:")
    return lines[0]


def test_status_of_a_topic_in_an_unknown_namespace_is_one_line(pulsar_settings: PulsarSettings) -> None:
    result = broker_ext(["status", "persistent://public/no-such-namespace/t"], pulsar_settings)
    assert result.returncode == 2
    line = the_line(result.stderr)
    assert "public/no-such-namespace/t does not exist" in line and "PULSAR_ADMIN_URL" in line


def test_status_with_a_wrong_admin_url_is_one_line(pulsar_settings: PulsarSettings, topic: str) -> None:
    wrong = f"http://127.0.0.1:{free_port()}"
    result = broker_ext(["status", topic], pulsar_settings, PULSAR_ADMIN_URL=wrong)
    assert result.returncode == 2
    line = the_line(result.stderr)
    assert wrong in line and "make cluster-up" in line and "PULSAR_ADMIN_URL" in line


def test_status_with_a_wrong_service_url_is_one_line(
    pulsar_settings: PulsarSettings, admin: PulsarAdmin, topic: str
) -> None:
    admin.create_topic(topic)
    wrong = f"pulsar://127.0.0.1:{free_port()}"
    result = broker_ext(["status", topic, "--timeout", "2"], pulsar_settings, PULSAR_SERVICE_URL=wrong)
    assert result.returncode == 2
    line = the_line(result.stderr)
    assert wrong in line and "PULSAR_SERVICE_URL" in line


def test_serve_while_the_broker_is_away_keeps_running_and_says_once_what_to_fix(
    pulsar_settings: PulsarSettings, tmp_path: Path
) -> None:
    """A service: it waits for the broker rather than exit, logs the fix once, and stops cleanly."""
    dead = free_port()
    log_path = tmp_path / "serve.log"
    environment = {
        **os.environ, "PULSAR_SERVICE_URL": f"pulsar://127.0.0.1:{dead}", "PULSAR_ADMIN_URL": f"http://127.0.0.1:{dead}",
        "WM_METRICS_PORT": "0", "WM_NAMESPACES": "public/default",
    }  # fmt: skip
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "broker_ext.cli", "--log-level", "DEBUG", "serve"],
            env=environment, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    retries = "DEBUG broker_ext.service: topic discovery failed"
    try:
        # two quiet retries after the warning: it keeps trying, and does not repeat the warning each time
        wait_until(lambda: log_path.read_text().count(retries) >= 2, timeout_s=90, what="two retries")
        assert proc.poll() is None, "serve exited while the broker was away"
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    text = log_path.read_text()
    assert code == 0
    assert "Traceback" not in text
    warnings = [line for line in text.splitlines() if "WARNING broker_ext.service: topic discovery failed" in line]
    assert len(warnings) == 1, text
    assert f"http://127.0.0.1:{dead}" in warnings[0] and "make cluster-up" in warnings[0]


# -- Spark -----------------------------------------------------------------------------------------------


def query_error(spark: Any, tmp_path: Path, **options: str) -> str:
    """The error a user sees from start() or the first batch of a query on our source."""
    import spark_sink

    spark_sink.register(spark)
    try:
        query = (
            spark.readStream.format("pulsar-watermark").options(**options).load()
            .writeStream.format("console").option("checkpointLocation", str(tmp_path / "ckpt")).start()
        )  # fmt: skip
        try:
            query.awaitTermination(180)
        finally:
            query.stop()
    except Exception as exc:
        return str(exc)
    raise AssertionError("the query ran without an error")


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"topic": "t", "subscription": "s", "startPosition": "latest"}, "did you mean 'startingPosition'"),
        ({"topic": "t", "subscription": "s", "maxMessagesPerTrigger": "-3"}, "must be a positive integer"),
        ({"topic": "t", "subscription": "s", "serviceUrl": "127.0.0.1:6650"}, "option 'serviceUrl'"),
        ({"topic": "t"}, "option 'subscription' is required"),
    ],
)
def test_bad_spark_options_show_our_line(spark: Any, tmp_path: Path, options: dict[str, str], expected: str) -> None:
    assert expected in query_error(spark, tmp_path, **options)


def test_a_spark_query_on_an_unknown_topic_names_the_fix(spark: Any, tmp_path: Path) -> None:
    message = query_error(spark, tmp_path, topic=f"no-such-topic-{uuid.uuid4().hex[:6]}", subscription="s")
    assert "does not exist; create it first or check option 'topic'" in message


def test_a_spark_query_with_a_wrong_admin_url_names_the_fix(spark: Any, tmp_path: Path, topic: str) -> None:
    wrong = f"http://127.0.0.1:{free_port()}"
    message = query_error(spark, tmp_path, topic=topic, subscription="s", adminUrl=wrong)
    assert wrong in message and "PULSAR_ADMIN_URL" in message


def test_a_spark_query_with_a_wrong_service_url_names_the_fix(
    spark: Any, tmp_path: Path, admin: PulsarAdmin, topic: str
) -> None:
    admin.create_topic(topic)
    wrong = f"pulsar://127.0.0.1:{free_port()}"
    # the client's own timeout (30 s by default) is what the query waits for: 3 s says the same
    timeout = {"pulsar.client.operationTimeoutSeconds": "3"}
    message = query_error(spark, tmp_path, topic=topic, subscription="s", serviceUrl=wrong, **timeout)
    assert f"no Pulsar broker answered at {wrong}" in message and "PULSAR_SERVICE_URL" in message


def test_serve_with_a_topic_that_does_not_exist_follows_the_others_and_says_so(
    pulsar_settings: PulsarSettings, admin: PulsarAdmin, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    from broker_ext.config import GeneratorConfig
    from broker_ext.service import GeneratorService

    admin.create_topic(topic)
    missing = f"persistent://public/default/not-yet-{uuid.uuid4().hex[:6]}"
    service = GeneratorService(GeneratorConfig(namespaces=(), topics=(missing, topic), metrics_port=0), pulsar_settings)
    try:
        with caplog.at_level("WARNING", logger="broker_ext.service"):
            assert service.partition_topics() == {topic}
            assert service.partition_topics() == {topic}
    finally:
        service.close()
    warnings = [r.getMessage() for r in caplog.records if missing in r.getMessage()]
    assert len(warnings) == 1 and "followed once created" in warnings[0]


def test_an_admin_api_that_does_not_know_the_topic_is_not_taken_as_its_incarnation(
    pulsar_settings: PulsarSettings, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by the chaos suite: a consumer on the default admin URL while another cluster's broker answered there
    took its "topic not found" as "no property", found every event's token stale and never had a watermark. Here the
    real broker answers for a topic it has never had, as another cluster's would; unnamed is the default URL's reader
    (`Incarnations.for_consumer` without admin_url or PULSAR_ADMIN_URL), named the user's."""
    elsewhere = f"persistent://public/default/another-cluster-{uuid.uuid4().hex[:12]}"

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]

    unnamed = Incarnations(PulsarAdmin(pulsar_settings), reader="subscription 's'", named=False, owns_admin=True)
    try:
        with caplog.at_level(logging.WARNING, logger="pulsar_access.incarnations"):
            assert unnamed.holds(elsewhere, -1, "a") and unnamed.holds(elsewhere, -1, "a")
        assert warnings() == []  # the user named no URL
    finally:
        unnamed.close()
    named = Incarnations(PulsarAdmin(pulsar_settings), reader="subscription 's'", named=True, owns_admin=True)
    try:
        with caplog.at_level(logging.WARNING, logger="pulsar_access.incarnations"):
            assert named.holds(elsewhere, 0, "a")
        (warning,) = warnings()
        assert "does not know the topic" in warning and "PULSAR_ADMIN_URL" in warning
    finally:
        named.close()
