"""`broker-ext status TOPIC`: the subscriptions of a topic, their positions and watermarks.

It reads what the generator published (the topic's compacted companion topic in the watermark
namespace, `watermark_topic_for`) and the cursors' positions from the admin API, so it works
whichever generator instance owns each partition. Events about an earlier incarnation of the topic
(deleted and created again under its name) are left out (pulsar_access/incarnations.py).
"""

from __future__ import annotations

import contextlib
import time

import pulsar

from pulsar_access.admin import AdminError, PulsarAdmin, TopicNotFound, durable_subscriptions
from pulsar_access.errors import explained
from pulsar_access.incarnations import Incarnations
from pulsar_access.settings import PulsarSettings
from pulsar_access.topics import base_topic_and_partition, full_name, partition_name, watermark_topic_for
from watermark_core.protocol import HEAD_KEY_PREFIX, MalformedMarker, WatermarkEvent, decode_table, key_topic


def latest_events(client: pulsar.Client, topic: str) -> dict[tuple[int, str], WatermarkEvent]:
    """The latest event per (partition, subscription) published for `topic`; events naming another topic are ignored.

    A table view of the companion topic holds the latest table per key (`table_key`: topic and partition, what
    compaction keeps); each table has every subscription's event of that partition.
    """
    base = base_topic_and_partition(topic)[0]
    latest: dict[tuple[int, str], WatermarkEvent] = {}

    def take(key: str, payload: bytes) -> None:
        if key.startswith(HEAD_KEY_PREFIX) or key_topic(key) != base:
            return  # a head event (a position's watermark, not a subscription's), or another topic's table
        with contextlib.suppress(MalformedMarker):  # counted and logged by consumers; status shows the rest
            for event in decode_table(payload):
                if event.topic == base:
                    latest[(event.partition, event.subscription)] = event

    view = client.create_table_view(watermark_topic_for(topic))
    try:
        view.for_each(take)
    finally:
        view.close()
    return latest


STATUS_TIMEOUT_S = 10
"""How long `broker-ext status` waits for a broker that does not answer (interactive: say so soon)."""


def status_rows(settings: PulsarSettings, topic: str, timeout_s: int = STATUS_TIMEOUT_S) -> list[dict[str, str]]:
    name = full_name(topic)
    admin = PulsarAdmin(settings)
    # errors only: closing the table view warns
    client = settings.client(operation_timeout_seconds=timeout_s, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        try:
            partitions = admin.partitions(name)
            partition_topics = [(i, partition_name(name, i)) for i in range(partitions)] if partitions else [(-1, name)]
            stats = {index: (admin.internal_stats(t), admin.topic_stats(t)) for index, t in partition_topics}
        except TopicNotFound:
            raise AdminError(
                f"topic {name} does not exist at {settings.admin_url}; check the name (short, or "
                "persistent://tenant/namespace/topic) and PULSAR_ADMIN_URL"
            ) from None
        with explained(service_url=settings.service_url, topic=watermark_topic_for(name), doing="read"):
            events = latest_events(client, name)
        # read after the events: the generator sets a token as the property before it publishes under it
        incarnations = Incarnations(admin, reader="broker-ext status")
        events = {key: e for key, e in events.items() if incarnations.holds(name, e.partition, e.incarnation)}
        rows = []
        for index, _ in partition_topics:
            internal, public = stats[index]
            cursors = internal.get("cursors", {})
            for sub in sorted(durable_subscriptions(public)):
                event = events.get((index, sub))
                rows.append({
                    "partition": str(index),
                    "subscription": sub,
                    "mark_delete": cursors.get(sub, {}).get("markDeletePosition", "?"),
                    "watermark": _format_time(event.event_time if event else None),
                    "at": f"{event.position[0]}:{event.position[1]}" if event else "-",
                    "active": ", ".join(f"{p}={t}" for p, t in sorted(event.active.items())) if event else "",
                    "idle": ", ".join(sorted(event.idle)) if event else "",
                    "pending_txns": str(event.pending) if event else "0",
                })  # fmt: skip
        return rows
    finally:
        client.close()
        admin.close()


def _format_time(event_time: int | None) -> str:
    if event_time is None:
        return "none"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(event_time / 1000))
    return f"{event_time} ({stamp}.{event_time % 1000:03d} UTC)"


def render(rows: list[dict[str, str]]) -> str:
    if not rows:
        return "no subscriptions"
    headers = list(rows[0])
    widths = {h: max(len(h), *(len(r[h]) for r in rows)) for h in headers}
    lines = ["  ".join(h.ljust(widths[h]) for h in headers), "  ".join("-" * widths[h] for h in headers)]
    lines += ["  ".join(r[h].ljust(widths[h]) for h in headers) for r in rows]
    return "\n".join(lines)
