"""What the dispatcher sends again (only the latest table or head of a partition), and when it compacts."""

from __future__ import annotations

from broker_ext.dispatch import (
    COMPACT_EVERY_EVENTS,
    COMPACT_EVERY_EVENTS_CAP,
    COMPACT_EVERY_S,
    HEAD_WAIT_S,
    HeadPairing,
    LatestSent,
    compaction_due,
)
from broker_ext.engine.vocabulary import PublishTable
from watermark_core.protocol import HeadWatermark, WatermarkEvent

TOPIC = "persistent://public/default/t"


OTHER = "persistent://public/default/u"
"""A topic whose tables go to the same companion topic (issue 47: a companion topic carries a group's)."""


def table(partition: int, seq: int, topic: str = TOPIC) -> PublishTable:
    return PublishTable((WatermarkEvent(topic, partition, "sub", 1000 + seq, (1, seq), seq),))


def head(partition: int, entry: int, topic: str = TOPIC) -> HeadWatermark:
    return HeadWatermark(topic, partition, (1, entry), 1000 + entry)


def test_a_failed_table_is_sent_again_while_it_is_the_latest_of_its_partition() -> None:
    sent = LatestSent()
    first = table(0, 1)
    sent.sending_table(first)
    sent.sending_table(table(1, 7))  # another partition does not supersede it
    assert sent.resend_table(first)


def test_a_failed_table_superseded_by_a_later_one_of_its_partition_is_dropped() -> None:
    sent = LatestSent()
    first, later = table(0, 1), table(0, 2)
    sent.sending_table(first)
    sent.sending_table(later)
    assert not sent.resend_table(first)
    assert sent.resend_table(later)


def test_head_events_follow_the_same_rule_apart_from_tables() -> None:
    sent = LatestSent()
    first, later, other = head(0, 3), head(0, 9), head(-1, 3)
    sent.sending_head(first)
    sent.sending_table(table(0, 5))  # a table does not supersede a head event
    sent.sending_head(other)
    assert sent.resend_head(first)
    sent.sending_head(later)
    assert not sent.resend_head(first)
    assert sent.resend_head(later) and sent.resend_head(other)


def test_the_same_partition_of_another_topic_on_the_companion_supersedes_nothing() -> None:
    sent = LatestSent()
    first, first_head = table(-1, 1), head(-1, 1)
    sent.sending_table(first)
    sent.sending_head(first_head)
    sent.sending_table(table(-1, 2, OTHER))
    sent.sending_head(head(-1, 2, OTHER))
    assert sent.resend_table(first) and sent.resend_head(first_head)


def test_nothing_sent_means_nothing_to_send_again() -> None:
    sent = LatestSent()
    assert not sent.resend_table(table(0, 1))
    assert not sent.resend_head(head(0, 1))


def test_a_companion_topic_is_compacted_every_thousand_events_or_ten_minutes_not_at_each_take_over() -> None:
    created = 100.0
    assert compaction_due(1, created, created + 1, first_of_run=True)  # once a run: is this role allowed to?
    assert not compaction_due(1, created, created + 1, first_of_run=False)  # a take-over of 5000 topics: none
    assert not compaction_due(COMPACT_EVERY_EVENTS - 1, created, created + COMPACT_EVERY_S - 1, first_of_run=False)
    assert compaction_due(COMPACT_EVERY_EVENTS, created, created + 1, first_of_run=False)
    assert compaction_due(1, created, created + COMPACT_EVERY_S, first_of_run=False)


def test_a_companion_shared_by_a_group_is_compacted_after_as_many_events_per_topic_within_a_cap() -> None:
    created = 100.0
    assert not compaction_due(COMPACT_EVERY_EVENTS, created, created + 1, first_of_run=False, topics=3)
    assert compaction_due(3 * COMPACT_EVERY_EVENTS, created, created + 1, first_of_run=False, topics=3)
    assert compaction_due(COMPACT_EVERY_EVENTS_CAP, created, created + 1, first_of_run=False, topics=5000)
    assert compaction_due(1, created, created + COMPACT_EVERY_S, first_of_run=False, topics=5000)


# -- a head event rides on its partition's next table when one comes soon ----------------------------------------


def test_head_events_wait_for_a_table_to_ride_on_all_of_them_in_order() -> None:
    pairing = HeadPairing()
    assert pairing.on_head(head(0, 3), now=10.0) == "wait"  # a timer: due alone at 10.0 + HEAD_WAIT_S
    assert pairing.on_head(head(0, 5), now=10.1) == "added"  # the same timer still runs
    assert pairing.on_head(head(1, 5), now=10.1) == "wait"  # partitions are apart
    assert pairing.on_table((TOPIC, 0), now=10.2) == [head(0, 3), head(0, 5)]  # a reader's batch may end between them
    assert pairing.on_table((TOPIC, 0), now=10.3) == []
    assert pairing.due((TOPIC, 0), now=10.0 + HEAD_WAIT_S) == []  # nothing left for the timer


def test_heads_nobody_acknowledged_in_time_go_alone_and_the_next_ones_at_once_until_a_table_follows_soon() -> None:
    pairing = HeadPairing()
    pairing.on_head(head(0, 3), now=10.0)
    assert pairing.due((TOPIC, 0), now=10.0 + HEAD_WAIT_S) == [head(0, 3)]  # a reader of heads (Spark) waits no longer
    assert pairing.on_head(head(0, 4), now=11.0) == "send"  # no subscription acknowledges soon: no wait at all
    assert pairing.on_table((TOPIC, 0), now=11.0 + 2 * HEAD_WAIT_S) == []  # a table long after: still at once
    assert pairing.on_head(head(0, 5), now=12.0) == "send"
    assert pairing.on_table((TOPIC, 0), now=12.0 + HEAD_WAIT_S / 2) == []  # a table soon after the head: wait again
    assert pairing.on_head(head(0, 6), now=13.0) == "wait"
    assert pairing.on_table((TOPIC, 0), now=13.1) == [head(0, 6)]


def test_the_heads_of_two_topics_of_one_companion_wait_apart() -> None:
    pairing = HeadPairing()
    assert pairing.on_head(head(-1, 3), now=10.0) == "wait"
    assert pairing.on_head(head(-1, 3, OTHER), now=10.0) == "wait"  # a timer of its own
    assert pairing.on_table((OTHER, -1), now=10.1) == [head(-1, 3, OTHER)]
    assert pairing.due((TOPIC, -1), now=10.0 + HEAD_WAIT_S) == [head(-1, 3)]
