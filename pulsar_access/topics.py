"""Topic names as Pulsar spells them: the one place that parses, completes and derives them.

Pulsar's own rules: "x" is persistent://public/default/x, "t/n/x" is persistent://t/n/x, and the
partitions of a partitioned topic "x" are the topics "x-partition-0", "x-partition-1", ...
The generator publishes a topic's watermarks on its companion topic `<topic>__watermarks`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote

DEFAULT_NAMESPACE = "public/default"
WATERMARK_TOPIC_SUFFIX = "__watermarks"
TOPIC_FORMS = "'name', 'tenant/namespace/name' or 'persistent://tenant/namespace/name'"

_PARTITION_SUFFIX = re.compile(r"-partition-(\d+)$")


@dataclass(frozen=True)
class TopicName:
    """A parsed topic name: domain://tenant/namespace/local."""

    domain: str
    tenant: str
    namespace: str
    local: str

    @classmethod
    def parse(cls, name: str) -> TopicName:
        """Accept short names (`my-topic`, `tenant/namespace/my-topic`) like the Pulsar clients do."""
        domain, sep, rest = name.partition("://")
        if not sep:
            domain, rest = "persistent", name
        parts = rest.split("/")
        if len(parts) == 1 and parts[0]:
            tenant, namespace = DEFAULT_NAMESPACE.split("/")
            return cls(domain, tenant, namespace, parts[0])
        if len(parts) == 3 and all(parts):
            return cls(domain, parts[0], parts[1], parts[2])
        raise ValueError(f"{name!r} is not a topic name; use {TOPIC_FORMS}")

    @property
    def tenant_namespace(self) -> str:
        """`tenant/namespace`, as the admin API and permissions name a namespace."""
        return f"{self.tenant}/{self.namespace}"

    @property
    def full(self) -> str:
        return f"{self.domain}://{self.tenant_namespace}/{self.local}"

    @property
    def rest_path(self) -> str:
        """The topic's path in the admin REST API (v2)."""
        return f"{self.domain}/{self.tenant_namespace}/{quote(self.local, safe='')}"


def full_name(topic: str) -> str:
    """The full name of `topic`; ValueError for what is not a topic name."""
    return TopicName.parse(topic).full


def namespace_of(topic: str) -> str:
    """`tenant/namespace` of a topic; the default namespace for a name that does not parse."""
    try:
        return TopicName.parse(topic).tenant_namespace
    except ValueError:
        return DEFAULT_NAMESPACE


def partition_name(topic: str, partition: int) -> str:
    """The topic of one partition; `partition` -1 names the (non-partitioned) topic itself."""
    full = full_name(topic)
    return full if partition < 0 else f"{full}-partition-{partition}"


def partition_names(topic: str, partitions: int) -> list[str]:
    """Every partition topic of `topic` with `partitions` partitions (0: the topic itself)."""
    return [partition_name(topic, i) for i in range(partitions)] if partitions else [full_name(topic)]


def base_topic_and_partition(topic: str) -> tuple[str, int]:
    """(full base topic name, partition index), the index -1 for a topic that is not a partition."""
    full = full_name(topic)
    match = _PARTITION_SUFFIX.search(full)
    if match is None:
        return full, -1
    return full[: match.start()], int(match.group(1))


def watermark_topic_for(topic: str) -> str:
    """The companion topic where the generator publishes a topic's watermarks (one for all partitions)."""
    return base_topic_and_partition(topic)[0] + WATERMARK_TOPIC_SUFFIX


def is_watermark_topic(topic: str) -> bool:
    """Whether `topic` is a companion topic (the generator must not follow those)."""
    return base_topic_and_partition(topic)[0].endswith(WATERMARK_TOPIC_SUFFIX)
