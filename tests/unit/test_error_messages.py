"""Every entry point fails with one line that names the fix (the parts that need no broker).

The Pulsar exceptions below are the client's own classes, instantiated as the client raises them;
what is checked is how the project explains them. Broker-backed cases are in
tests/integration/test_errors.py.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest

from pulsar_access.errors import PulsarClientError, checked_admin_url, checked_service_url, explain

URL = "pulsar://broker.example:6650"
TOPIC = "persistent://acme/orders/created"


def one_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (pulsar.Timeout("Pulsar error: TimeOut"), [URL, "make cluster-up", "PULSAR_SERVICE_URL"]),
        (pulsar.ConnectError("Pulsar error: ConnectError"), [URL, "make cluster-up", "PULSAR_SERVICE_URL"]),
        (pulsar.LookupError("Pulsar error: LookupError"), [URL, "PULSAR_SERVICE_URL", "pulsar://host:6650"]),
        (pulsar.TopicNotFound("Pulsar error: TopicNotFound"), [TOPIC, "namespaces create acme/orders"]),
        (pulsar.InvalidTopicName("Pulsar error: InvalidTopicName"), ["'tenant/namespace/name'"]),
        (pulsar.AuthenticationError("Pulsar error: AuthenticationError"), [URL, "PULSAR_AUTH_TOKEN", "_FILE"]),
        (pulsar.AuthorizationError("Pulsar error: AuthorizationError"),
         ["grant-permission acme/orders", "PULSAR_AUTH_TOKEN"]),
        (pulsar.ProducerBusy("Pulsar error: ProducerBusy"), ["producer_name"]),
        (pulsar.ConsumerBusy("Pulsar error: ConsumerBusy"), ["Shared or Failover"]),
    ],
)  # fmt: skip
def test_each_client_error_is_one_line_naming_the_fix_and_stays_what_it_was(
    exc: pulsar.PulsarException, expected: list[str]
) -> None:
    error = explain(exc, service_url=URL, topic=TOPIC, doing="create a producer on")
    assert isinstance(error, PulsarClientError)
    message = one_line(str(error))
    for part in expected:
        assert part in message
    assert type(exc).__name__ in message
    assert isinstance(error, type(exc)), "`except pulsar.<TheError>` must keep catching it"
    assert error.__cause__ is exc
    assert error.fix and error.fix in message


def test_errors_on_the_watermark_tables_name_their_namespace_and_never_suggest_produce_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("WM_WATERMARK_NAMESPACE", raising=False)
    tables = "persistent://public/__watermarks/acme~orders~created"
    missing = explain(pulsar.TopicNotFound("Pulsar error: TopicNotFound"), service_url=URL, topic=tables)
    assert missing is not None
    assert "watermark namespace public/__watermarks" in str(missing) and "generator" in str(missing)
    denied = explain(pulsar.AuthorizationError("Pulsar error: AuthorizationError"), service_url=URL, topic=tables)
    assert denied is not None
    assert "grant-permission public/__watermarks --role ROLE --actions consume)" in str(denied)
    assert "produce" not in str(denied).split("--actions", 1)[1].split(")")[0]


def test_a_broker_that_does_not_answer_is_also_a_connect_error() -> None:
    error = explain(pulsar.Timeout("Pulsar error: TimeOut"), service_url=URL)
    assert isinstance(error, pulsar.ConnectError) and isinstance(error, pulsar.Timeout)
    with pytest.raises(pulsar.ConnectError):
        raise error


def test_what_is_not_a_pulsar_client_error_is_left_alone() -> None:
    assert explain(ValueError("x"), service_url=URL) is None
    assert explain(pulsar.ReadError("Pulsar error: ReadError"), service_url=URL) is None
    already = explain(pulsar.Timeout("t"), service_url=URL)
    assert already is not None
    assert explain(already, service_url=URL) is None


def test_without_a_service_url_the_message_still_says_where_to_look() -> None:
    error = explain(pulsar.Timeout("t"))
    assert error is not None
    assert "the service URL given to pulsar.Client" in str(error)


@pytest.mark.parametrize("url", ["localhost:6650", "pulsar//127.0.0.1:6650", "tcp://127.0.0.1:6650", "pulsar://", ""])
def test_a_malformed_service_url_names_the_setting_and_an_example(url: str) -> None:
    with pytest.raises(ValueError, match=r"PULSAR_SERVICE_URL .* e\.g\. pulsar://127\.0\.0\.1:6650"):
        checked_service_url(url)


@pytest.mark.parametrize("url", ["localhost:8080", "pulsar://127.0.0.1:8080", "http://"])
def test_a_malformed_admin_url_names_the_setting_and_an_example(url: str) -> None:
    with pytest.raises(ValueError, match=r"PULSAR_ADMIN_URL .* e\.g\. http://127\.0\.0\.1:8080"):
        checked_admin_url(url)


@pytest.mark.parametrize("url", ["pulsar://127.0.0.1:6650", "pulsar+ssl://b:6651", "http://b:8080", "HTTPS://b"])
def test_well_formed_urls_pass(url: str) -> None:
    assert checked_service_url(url) == url


# -- the command lines ------------------------------------------------------------------------------------


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port something is listening on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=120, env={**os.environ, **env}
    )


def test_make_cluster_up_with_a_busy_port_prints_one_line_and_fails(tmp_path: Path, held_port: int) -> None:
    """What `make cluster-up` runs (`python -m devtools.local_cluster up`), with its port taken."""
    java_home = tmp_path / "jdk"
    (java_home / "bin").mkdir(parents=True)
    java = java_home / "bin" / "java"
    java.write_text("#!/bin/sh\necho 'openjdk version \"17.0.15\" 2025-04-15' >&2\n")
    java.chmod(java.stat().st_mode | stat.S_IEXEC)
    result = run(
        ["-m", "devtools.local_cluster", "up", "--state-dir", str(tmp_path / "state")],
        JAVA_HOME=str(java_home), PULSAR_BROKER_PORT=str(held_port),
        PULSAR_WEB_PORT=str(free_port()), PULSAR_BOOKIE_PORT=str(free_port()),
    )  # fmt: skip
    assert result.returncode == 1
    line = one_line(result.stderr)
    assert f"port {held_port}" in line and "already in use" in line and "PULSAR_BROKER_PORT" in line


@pytest.mark.parametrize(
    ("env", "setting"),
    [
        ({"PULSAR_SERVICE_URL": "localhost:6650"}, "PULSAR_SERVICE_URL"),
        ({"PULSAR_ADMIN_URL": "127.0.0.1:8080"}, "PULSAR_ADMIN_URL"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("command", [["status", "some-topic"], ["serve", "--metrics-port", "0"]])
def test_broker_ext_with_a_malformed_url_exits_with_one_line(
    command: list[str], env: dict[str, str], setting: str
) -> None:
    result = run(["-m", "broker_ext.cli", *command], **env)
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert line.startswith("broker-ext: error:") and setting in line and "e.g." in line


def test_broker_ext_status_with_no_broker_exits_with_one_line_naming_the_fix() -> None:
    dead = free_port()
    result = run(
        ["-m", "broker_ext.cli", "status", "some-topic"],
        PULSAR_ADMIN_URL=f"http://127.0.0.1:{dead}", PULSAR_SERVICE_URL=f"pulsar://127.0.0.1:{dead}",
    )  # fmt: skip
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert f"http://127.0.0.1:{dead}" in line and "make cluster-up" in line and "PULSAR_ADMIN_URL" in line


def test_broker_ext_serve_with_its_metrics_port_taken_exits_with_one_line(held_port: int) -> None:
    dead = free_port()
    result = run(
        ["-m", "broker_ext.cli", "serve", "--metrics-port", str(held_port)],
        PULSAR_ADMIN_URL=f"http://127.0.0.1:{dead}", PULSAR_SERVICE_URL=f"pulsar://127.0.0.1:{dead}",
    )  # fmt: skip
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert f"127.0.0.1:{held_port}" in line and "--metrics-port" in line and "WM_METRICS_PORT" in line


def test_broker_ext_serve_with_a_bad_flag_value_exits_with_one_line() -> None:
    result = run(["-m", "broker_ext.cli", "serve", "--producer-timeout-ms", "0", "--metrics-port", "0"])
    assert result.returncode == 2
    assert "--producer-timeout-ms must be positive" in one_line(result.stderr)


# -- Spark options (checked on the driver before anything connects) -----------------------------------------


@pytest.fixture
def source_options() -> Callable[[dict[str, str]], Any]:
    """SourceOptions as Spark builds it: from a case-insensitive dict of what the user passed."""
    pytest.importorskip("pyspark")
    from pyspark.sql.datasource import CaseInsensitiveDict

    from spark_sink.options import SourceOptions

    return lambda options: SourceOptions(CaseInsensitiveDict(options))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscription": "s"}, "option 'topic' is required"),
        ({"topic": "t"}, "option 'subscription' is required"),
        ({"topic": "t", "topics": "a,b", "subscription": "s"}, "one of the options"),
        ({"topic": "a/b", "subscription": "s"}, "option 'topic': 'a/b' is not a topic name"),
        ({"topicsPattern": "persistent://x.*", "subscription": "s"}, "must be a regex over topic names"),
        ({"topicsPattern": "persistent://t/n/x(", "subscription": "s"}, "is not a regex"),
        ({"topic": "t", "subscription": "s", "startingPosition": "first"}, "'earliest' or 'latest'"),
        ({"topic": "t", "subscription": "s", "startingOffsets": "first"}, "option 'startingOffsets' must be"),
        ({"topic": "t", "subscription": "s", "startingOffsets": '{"t": {"0": 5}}'}, "per-partition JSON"),
        ({"topic": "t", "subscription": "s", "maxMessagesPerTrigger": "many"}, "positive integer"),
        ({"topic": "t", "subscription": "s", "maxMessagesPerTrigger": "0"}, "positive integer"),
        ({"topic": "t", "subscription": "s", "maxOffsetsPerTrigger": "-3"}, "'maxOffsetsPerTrigger' must be a pos"),
        ({"topic": "t", "subscription": "s", "minPartitions": "0"}, "'minPartitions' must be a positive"),
        ({"topic": "t", "subscription": "s", "failOnDataLoss": "maybe"}, "'failOnDataLoss' must be 'true' or"),
        ({"topic": "t", "subscription": "s", "startPosition": "latest"}, "did you mean 'startingPosition'"),
        ({"topic": "t", "subscription": "s", "startingOffset": "latest"}, "did you mean 'startingOffsets'"),
        ({"topic": "t", "subscription": "s", "maxOffsetPerTrigger": "5"}, "did you mean 'maxOffsetsPerTrigger'"),
        ({"topic": "t", "subscription": "s", "serviceUrl": "localhost:6650"}, "option 'serviceUrl'.*e\\.g\\."),
        ({"topic": "t", "subscription": "s", "service.url": "localhost:6650"}, "option 'serviceUrl'.*e\\.g\\."),
        ({"topic": "t", "subscription": "s", "adminUrl": "pulsar://x:8080"}, "option 'adminUrl'.*e\\.g\\."),
        ({"topic": "t", "subscription": "s", "pulsar.client.ioThreadz": "2"}, "did you mean 'pulsar.client.io_th"),
        ({"topic": "t", "subscription": "s", "pulsar.client.ioThreads": "two"}, "must be a number"),
        ({"topic": "t", "subscription": "s", "pulsar.client.useTls": "yes"}, "must be true or false"),
    ],
)
def test_bad_source_options_name_the_fix(
    source_options: Callable[[dict[str, str]], Any], options: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        source_options(options)


def test_good_source_options_pass(source_options: Callable[[dict[str, str]], Any]) -> None:
    options = source_options({"topic": "t", "subscription": "s", "startingPosition": "LATEST", "path": "ignored"})
    assert (options.topic, options.starting_position) == ("persistent://public/default/t", "latest")
    assert options.max_offsets is None and options.fail_on_data_loss


def test_source_options_as_spark_and_pulsar_users_know_them(source_options: Callable[[dict[str, str]], Any]) -> None:
    options = source_options({
        "topics": "b, a,persistent://tenant/ns/c", "subscription": "s", "service.url": "pulsar://h:6651",
        "admin.url": "http://h:8081/", "maxOffsetsPerTrigger": "1000", "failOnDataLoss": "false",
        "minPartitions": "4", "pulsar.client.operationTimeoutSeconds": "7", "pulsar.client.io_threads": "2",
        "startingOffsets": '{"a": {"0": [5, 3], "1": "latest", "2": -2}}',
    })  # fmt: skip
    assert options.topics == [
        "persistent://public/default/a", "persistent://public/default/b", "persistent://tenant/ns/c"
    ]  # fmt: skip
    assert options.topic is None  # several topics: no one-topic checkpoint layout
    assert (options.service_url, options.admin_url) == ("pulsar://h:6651", "http://h:8081")
    assert (options.max_offsets, options.fail_on_data_loss, options.min_partitions) == (1000, False, 4)
    assert options.client_options == {"operation_timeout_seconds": 7, "io_threads": 2}
    a = "persistent://public/default/a"
    assert options.starting_offsets == {(a, 0): (5, 2), (a, 1): "latest", (a, 2): "earliest"}
    assert options.starting_position == "json"
    aliases = source_options({"topic": "t", "subscription": "s", "maxMessagesPerTrigger": "9"})
    assert aliases.max_offsets == 9 and aliases.starting_position == "earliest"


def test_a_topics_pattern_is_a_regex_over_full_names(source_options: Callable[[dict[str, str]], Any]) -> None:
    bare = source_options({"topicsPattern": "sensor-.*", "subscription": "s"})
    assert bare.pattern.fullmatch("persistent://public/default/sensor-1")
    assert not bare.pattern.fullmatch("persistent://public/default/other")
    assert (bare.topics, bare.pattern_namespace, bare.topic) == ([], "public/default", None)
    full = source_options({"topicsPattern": "persistent://acme/iot/s-[0-9]+", "subscription": "s"})
    assert full.pattern_namespace == "acme/iot" and full.pattern.fullmatch("persistent://acme/iot/s-12")
