"""Topics a broker's plugin announces are followed at once, and a topic list asked for before that does not drop them.

The service is built against nothing (its client connects lazily); no broker is involved: only the bookkeeping of which
partitions are followed, on what would be the loop's thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest

from broker_ext.config import GeneratorConfig
from broker_ext.intake.plugin_cursors import PluginCursors
from broker_ext.partition_io import INTAKE_STALL_S
from broker_ext.service import GeneratorService
from pulsar_access.settings import PulsarSettings

OURS = "persistent://acme/orders/clicks"


@pytest.fixture
def service() -> Iterator[GeneratorService]:
    config = GeneratorConfig(namespaces=("acme/orders",), cursor_source="admin", metrics_port=0)
    service = GeneratorService(config, PulsarSettings("pulsar://127.0.0.1:1", "http://127.0.0.1:1"))
    yield service
    service.close()


def test_an_announced_topic_of_ours_is_followed_at_once_and_others_are_not(service: GeneratorService) -> None:
    service._fresh_topics([OURS, "persistent://acme/other/x", "persistent://acme/orders/__internal"])
    assert set(service.partitions) == {OURS}


def test_a_list_asked_for_before_the_announcement_does_not_drop_the_topic_a_later_one_does(
    service: GeneratorService,
) -> None:
    listed_before = time.monotonic()
    service._fresh_topics([OURS])
    service._sync(set(), listed_before)  # the list did not have it yet
    assert OURS in service.partitions
    service._sync(set(), time.monotonic())  # asked for after: the topic is gone
    assert OURS not in service.partitions


def test_the_plugins_are_asked_for_the_namespaces_of_what_we_follow_only() -> None:
    config = GeneratorConfig(namespaces=("acme/orders",), topics=("acme/billing/invoices", "clicks"),
                             metrics_port=0)  # fmt: skip
    service = GeneratorService(config, PulsarSettings("pulsar://127.0.0.1:1", "http://127.0.0.1:1"))
    try:
        assert isinstance(service.cursors, PluginCursors)
        assert service.cursors.namespaces == ("acme/billing", "acme/orders", "public/default")
    finally:
        service.close()


def test_a_claimed_partition_a_plugin_follows_waits_for_its_findings_instead_of_subscribing_a_consumer() -> None:
    """A 5000-topic take-over granted claims before the plugin's first report of the topic: each such partition
    subscribed a consumer at the next discovery, only to close it once the plugin's findings came. Where a plugin
    made the subscription, the findings come next: no consumer, unless they have not come `INTAKE_STALL_S` after
    the claim."""
    config = GeneratorConfig(namespaces=("acme/orders",), metrics_port=0)  # the plugin's intake, by claim
    service = GeneratorService(config, PulsarSettings("pulsar://127.0.0.1:1", "http://127.0.0.1:1"))
    try:
        service._follow({OURS})
        partition = service.partitions[OURS]
        partition.subscribing = True  # the follow request, in flight
        partition.followed("0123456789abcdef")  # a plugin made the subscription; its report has not come yet
        partition.claim(True)  # Pulsar granted the claim before that report
        service._sync({OURS}, time.monotonic())  # a discovery: every partition is asked to subscribe
        assert not partition.subscribing and partition.consumer is None
        partition._claimed_at -= INTAKE_STALL_S  # the findings never came: the consumer receives
        service._sync({OURS}, time.monotonic())
        assert partition.subscribing
    finally:
        service.close()


def test_a_gone_topic_leaves_its_groups_companion_to_the_topics_still_followed(service: GeneratorService) -> None:
    """Issue 47: a companion topic carries a group's tables; a topic of the group that is gone takes nothing of the
    others' with it (what waits to be sent again, heads waiting for a table), and the last one lets it go."""
    from pulsar_access.topics import companion_group, watermark_topic_for
    from watermark_core.protocol import HeadWatermark

    names = (f"persistent://acme/orders/t-{i}" for i in range(1000))
    first = next(names)
    second = next(t for t in names if companion_group(t) == companion_group(first))
    companion = watermark_topic_for(first)
    dispatcher = service.dispatcher
    for topic in (first, second):
        dispatcher.publish_head(HeadWatermark(topic, -1, (1, 1), 100))  # waits for a table to ride on
    held = dispatcher._companions[companion]
    assert set(held.followed) == {first, second} and set(held.heads.waiting) == {(first, -1), (second, -1)}
    dispatcher.forget(first)
    assert dispatcher._companions[companion] is held and set(held.heads.waiting) == {(second, -1)}
    dispatcher.forget(second)
    assert companion not in dispatcher._companions


class _Sending:
    """A companion producer's stand-in (the client binding's `send_async`): keeps what was sent."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self._producer = self

    def send_async(self, message: object, _callback: object) -> None:
        self.sent.append(message.data())  # type: ignore[attr-defined]


def test_a_head_handed_with_its_partitions_table_rides_on_it_without_waiting(service: GeneratorService) -> None:
    """Issue 47: a marker folded and acknowledged in one answer gives a head event and a table in one turn; the head
    rides on that table at once (one message, no timer to wait on), after any head of the partition still waiting.
    Without a producer yet, both wait for it in their order."""
    from broker_ext.engine.vocabulary import PublishTable
    from pulsar_access.topics import watermark_topic_for
    from watermark_core.protocol import HeadWatermark, WatermarkEvent, decode_table_with_heads

    dispatcher, companion = service.dispatcher, watermark_topic_for(OURS)
    first = PublishTable((WatermarkEvent(OURS, -1, "app", 100, (1, 1), 7),), ("app",))
    head = HeadWatermark(OURS, -1, (1, 1), 100)
    dispatcher.publish(first, (head,))
    assert dispatcher._companions[companion].waiting == [head, first]  # no producer yet
    producer = _Sending()
    dispatcher.claimed(companion, producer)  # type: ignore[arg-type]
    assert len(producer.sent) == 2  # what waited, in order
    waiting, riding = HeadWatermark(OURS, -1, (1, 2), 150), HeadWatermark(OURS, -1, (1, 3), 200)
    dispatcher.publish_head(waiting)  # its marker not acknowledged yet: waits for a table
    table = PublishTable((WatermarkEvent(OURS, -1, "app", 200, (1, 3), 8),), ("app",))
    dispatcher.publish(table, (riding,))
    assert len(producer.sent) == 3
    assert decode_table_with_heads(producer.sent[-1]) == (list(table.events), [waiting, riding])
    assert not any(key[0] == "head" for key in service.loop._due), service.loop._due  # no head timer left


def test_a_topic_of_a_held_group_another_generator_follows_is_followed_then_let_go_with_the_claim(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Found by chaos (session 32): generators following different topics of one group (one companion topic, one
    claim) starved each other's. The holder follows the group's topics another member follows, as soon as it holds
    the claim (a look at the topic list at once), and lets them go once it loses the claim."""
    import pulsar

    from broker_ext.claims import Follows
    from pulsar_access.topics import watermark_topic_for

    mine = "persistent://acme/orders/t-1"
    group = watermark_topic_for(mine)
    theirs = next(t for i in range(1000) if watermark_topic_for(t := f"persistent://acme/orders/u-{i}") == group)
    config = GeneratorConfig(topics=(mine,), cursor_source="admin", metrics_port=0)
    service = GeneratorService(config, PulsarSettings("pulsar://127.0.0.1:1", "http://127.0.0.1:1"))
    try:
        claims = service.claims
        assert claims is not None
        claims._members = {"b": Follows(frozenset(), frozenset({theirs}))}
        service._follow({mine})
        service._fresh_topics([theirs])
        assert theirs not in service.partitions  # the claim is not ours: b publishes it
        claim = claims._claims[group]
        claim.asking = 1
        claims._answered(claim, 1, pulsar.Result.Ok, _Sending())  # Pulsar grants us the group's claim
        assert service._discover_now.is_set()  # the topic list is looked at now, for the topics to follow for b
        service._fresh_topics([theirs])
        assert service.partitions[theirs].claimed and service.partitions[mine].claimed
        claims.fenced(group)  # b holds the claim now
        with caplog.at_level(logging.INFO, logger="broker_ext.service"):
            service._sync({mine}, time.monotonic())  # the next look lists it no more
        assert set(service.partitions) == {mine}
        assert "another generator holds its group's claim" in caplog.text, caplog.text
    finally:
        service.close()
