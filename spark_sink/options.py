"""The Spark source's options: what a Spark user passes, checked once on the driver, with errors that name the fix."""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Sequence
from typing import Any

from pulsar_access.errors import checked_admin_url, checked_service_url
from pulsar_access.settings import PulsarSettings
from pulsar_access.topics import full_name
from spark_sink.clients import CLIENT_OPTION_PREFIX, client_options
from spark_sink.offsets import Entry, PartitionKey

SOURCE_OPTIONS = (
    "topic", "topics", "topicsPattern", "subscription", "serviceUrl", "service.url", "adminUrl", "admin.url",
    "authToken", "startingOffsets", "startingPosition", "maxOffsetsPerTrigger", "maxMessagesPerTrigger",
    "failOnDataLoss", "minPartitions", "path",
)  # fmt: skip
"""Known option names; `pulsar.client.*` pass through to `pulsar.Client`. "path" (last) is Spark's own."""


def check_option_names(options: Any, known: Sequence[str], prefixes: Sequence[str] = ()) -> None:
    """An option name we do not know is a typo until proven otherwise: say which one was meant."""
    by_lower = {name.lower(): name for name in known}
    for name in options:
        lowered = str(name).lower()
        if lowered in by_lower or any(lowered.startswith(prefix) for prefix in prefixes):
            continue
        close = difflib.get_close_matches(lowered, list(by_lower), n=1, cutoff=0.6)
        hint = f"did you mean '{by_lower[close[0]]}'? " if close else ""
        raise ValueError(
            f"unknown option '{name}' for format pulsar-watermark; {hint}known options: {', '.join(known[:-1])}"
            + "".join(f", {prefix}*" for prefix in prefixes)
        )


def _positive_int(name: str, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number <= 0:
        raise ValueError(f"option '{name}' must be a positive integer, got {value!r}")
    return number


class SourceOptions:
    """The options a Spark user passes, checked once with errors that name the fix.

    Named as in Spark's Kafka source where there is a match: `topic` / `topics` (comma list) /
    `topicsPattern` (a regex over full topic names; a bare one means `persistent://public/default/`),
    `startingOffsets`, `maxOffsetsPerTrigger`, `failOnDataLoss`, `minPartitions`; `serviceUrl` /
    `service.url`, `adminUrl` / `admin.url` and `pulsar.client.*` as Pulsar users know them.
    """

    def __init__(self, options: Any) -> None:
        check_option_names(options, SOURCE_OPTIONS, (CLIENT_OPTION_PREFIX,))

        def get(*names: str) -> str | None:
            for name in names:  # Spark's options are case-insensitive (stored lower-case)
                value = options.get(name)
                if value is not None:
                    return str(value)
            return None

        topic, topics, pattern = get("topic"), get("topics"), get("topicsPattern")
        given = [name for name, value in (("topic", topic), ("topics", topics), ("topicsPattern", pattern)) if value]
        if not given:
            raise ValueError(
                "option 'topic' is required (or 'topics', a comma list, or 'topicsPattern', a regex): "
                ".option('topic', 'my-topic')"
            )
        if len(given) > 1:
            raise ValueError(f"give one of the options 'topic', 'topics' and 'topicsPattern', not {given}")
        names = [topic] if topic else [t.strip() for t in (topics or "").split(",") if t.strip()]
        try:
            self.topics: list[str] = sorted({full_name(name) for name in names})
        except ValueError as exc:
            raise ValueError(f"option '{given[0]}': {exc}") from None
        self.pattern: re.Pattern[str] | None = None
        self.pattern_namespace = ""
        if pattern:
            self.pattern, self.pattern_namespace = _topic_pattern(pattern)
        subscription = get("subscription")
        if not subscription:
            raise ValueError("option 'subscription' is required: .option('subscription', 'my-spark-job')")
        self.subscription: str = subscription

        env = PulsarSettings.from_env()
        self.service_url = get("serviceUrl", "service.url") or env.service_url
        self.admin_url = (get("adminUrl", "admin.url") or env.admin_url).rstrip("/")
        checked_service_url(self.service_url, "option 'serviceUrl' (or PULSAR_SERVICE_URL)")
        checked_admin_url(self.admin_url, "option 'adminUrl' (or PULSAR_ADMIN_URL)")
        self.auth_token = get("authToken") or env.auth_token
        self.client_options = client_options(options)

        starting_name = "startingOffsets" if get("startingOffsets") is not None else "startingPosition"
        self.starting_offsets = _starting_offsets(starting_name, get("startingOffsets", "startingPosition"))
        cap_name = "maxOffsetsPerTrigger" if get("maxOffsetsPerTrigger") is not None else "maxMessagesPerTrigger"
        self.max_offsets = _positive_int(cap_name, get("maxOffsetsPerTrigger", "maxMessagesPerTrigger"))
        fail = (get("failOnDataLoss") or "true").lower()
        if fail not in ("true", "false"):
            raise ValueError(f"option 'failOnDataLoss' must be 'true' or 'false', got {fail!r}")
        self.fail_on_data_loss = fail == "true"
        self.min_partitions = _positive_int("minPartitions", get("minPartitions")) or os.cpu_count() or 1
        """Tasks a batch planned now is cut for; a batch keeps its count in its end offset (`SourceOffset.tasks`)."""

    @property
    def topic(self) -> str | None:
        """The one topic named by option 'topic' (or a one-element 'topics'): the topic of older checkpoints."""
        return self.topics[0] if len(self.topics) == 1 and self.pattern is None else None

    @property
    def starting_position(self) -> str:
        """'earliest', 'latest' or 'json' (per-partition positions in `starting_offsets`)."""
        return self.starting_offsets if isinstance(self.starting_offsets, str) else "json"

    def settings(self) -> PulsarSettings:
        return PulsarSettings(self.service_url, self.admin_url, self.auth_token)


def _topic_pattern(pattern: str) -> tuple[re.Pattern[str], str]:
    """A regex over full topic names, and the namespace to list (a bare regex: public/default)."""
    domain, sep, rest = pattern.partition("://")
    if not sep:
        domain, rest = "persistent", f"public/default/{pattern}"
    parts = rest.split("/", 2)
    if len(parts) != 3 or not all(parts):
        raise ValueError(
            f"option 'topicsPattern' {pattern!r} must be a regex over topic names, e.g. 'sensor-.*' or "
            "'persistent://tenant/namespace/sensor-.*'"
        )
    try:
        return re.compile(f"{domain}://{rest}"), f"{parts[0]}/{parts[1]}"
    except re.error as exc:
        raise ValueError(f"option 'topicsPattern' {pattern!r} is not a regex: {exc}") from None


StartingOffsets = str | dict[PartitionKey, Entry | str]


def _starting_offsets(name: str, value: str | None) -> StartingOffsets:
    """'earliest' (the default), 'latest', or per partition: {"topic": {"0": [ledger, entry] | "earliest" |
    "latest" | -2 | -1}}, [ledger, entry] being the first entry to read, as Kafka's offsets are."""
    text = (value or "earliest").strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    fix = (
        f"option '{name}' must be 'earliest' or 'latest' or per-partition JSON like "
        '{"my-topic": {"0": [ledger, entry], "1": "earliest"}}'
    )
    try:
        data = json.loads(text)
    except ValueError:
        raise ValueError(f"{fix}, got {value!r}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{fix}, got {value!r}")
    starts: dict[PartitionKey, Entry | str] = {}
    try:
        for topic, partitions in data.items():
            for index, start in dict(partitions).items():
                key = (full_name(str(topic)), int(index))
                if start in ("earliest", -2):
                    starts[key] = "earliest"
                elif start in ("latest", -1):
                    starts[key] = "latest"
                else:
                    ledger, entry = (int(x) for x in start)
                    starts[key] = (ledger, entry - 1)  # the entry before the first one to read
    except (TypeError, ValueError):
        raise ValueError(f"{fix}, got {value!r}") from None
    return starts
