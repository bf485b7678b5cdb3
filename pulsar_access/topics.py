"""Topic names as Pulsar spells them: the one place that parses, completes and derives them.

Pulsar's own rules: "x" is persistent://public/default/x, "t/n/x" is persistent://t/n/x, and the
partitions of a partitioned topic "x" are the topics "x-partition-0", "x-partition-1", ...

The generator publishes a topic's watermarks on its companion topic (`watermark_topic_for`), in a
namespace of their own where only the generator's role may produce (docs/SECURITY.md): no
application that may write the data topics can write what consumers read as watermarks. A companion
topic carries the watermarks of a group of topics of one namespace (`COMPANION_GROUPS` per namespace).
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from urllib.parse import quote

DEFAULT_NAMESPACE = "public/default"
WATERMARK_NAMESPACE_ENV = "WM_WATERMARK_NAMESPACE"
DEFAULT_WATERMARK_NAMESPACE = "public/__watermarks"
"""Where the companion topics live unless `WM_WATERMARK_NAMESPACE` names another namespace."""
LEGACY_WATERMARK_SUFFIX = "__watermarks"
"""Companion topics used to be `<topic>__watermarks` beside the data topic: never followed, never read."""
COMPANION_SEPARATOR = "~"
"""Joins tenant, namespace and topic in a companion's name; Pulsar allows it in no tenant or namespace name."""
COMPANION_GROUPS = 16
"""How many companion topics the topics of one namespace share, each topic by a fixed hash of its name (issue 47):
the generator sends, and the broker writes and dispatches, one batched entry for a group's tables instead of one
per topic, and a client reads each group once. Every generator and reader must agree on it: part of the
protocol (docs/PROTOCOL.md section 7)."""
TOPIC_FORMS = "'name', 'tenant/namespace/name' or 'persistent://tenant/namespace/name'"

_PARTITION_SUFFIX = re.compile(r"-partition-(\d+)$")
_NAMED_ENTITY = re.compile(r"^[-=:.\w]+$")
"""Pulsar's rule for tenant and namespace names (NamedEntity): no '~', no '/'."""


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


def watermark_namespace(namespace: str | None = None) -> str:
    """The namespace of the companion topics: `namespace`, else `WM_WATERMARK_NAMESPACE`, else public/__watermarks.

    Every component reads it the same way (the generator also takes `--watermark-namespace`);
    ValueError naming the variable for a value that is not `tenant/namespace`.
    """
    value = (namespace or os.environ.get(WATERMARK_NAMESPACE_ENV) or DEFAULT_WATERMARK_NAMESPACE).strip()
    parts = value.split("/")
    if len(parts) != 2 or not all(_NAMED_ENTITY.match(part) for part in parts):
        raise ValueError(
            f"{WATERMARK_NAMESPACE_ENV} (or --watermark-namespace) must be 'tenant/namespace', got {value!r}; "
            f"the default is {DEFAULT_WATERMARK_NAMESPACE}"
        )
    return value


def watermark_topic_for(topic: str, namespace: str | None = None) -> str:
    """The companion topic where the generator publishes a topic's watermarks (with every partition's, and those
    of the other topics of its group).

    It lives in the watermark namespace (`watermark_namespace(namespace)`), where only the generator
    may produce, and its name encodes the data topic's tenant, namespace and group, joined by '~':
    `persistent://public/default/my-topic` has `persistent://public/__watermarks/public~default~group-<g>`, `g`
    (0 to `COMPANION_GROUPS` - 1) from a hash of the topic's full base name (`companion_group`). Pulsar allows no
    '~' in tenant or namespace names, so topics of two namespaces never share a companion (a non-persistent
    topic's name starts with '~non-persistent~', which no tenant can).
    """
    name = TopicName.parse(base_topic_and_partition(topic)[0])
    group = f"group-{companion_group(name.full)}"
    local = COMPANION_SEPARATOR.join((name.tenant, name.namespace, group))
    if name.domain != "persistent":
        local = COMPANION_SEPARATOR.join(("", name.domain, local))
    return f"persistent://{watermark_namespace(namespace)}/{local}"


def companion_group(base_topic: str) -> int:
    """The group of a (full, base) topic: the same in every process and version of Python (not `hash`)."""
    digest = hashlib.blake2b(base_topic.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % COMPANION_GROUPS


def is_watermark_topic(topic: str, namespace: str | None = None) -> bool:
    """Whether `topic` is a companion topic, or an old `<topic>__watermarks` one (the generator follows neither)."""
    base = base_topic_and_partition(topic)[0]
    return TopicName.parse(base).tenant_namespace == watermark_namespace(namespace) or base.endswith(
        LEGACY_WATERMARK_SUFFIX
    )
