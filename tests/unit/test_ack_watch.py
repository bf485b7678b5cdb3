"""The ack watch: reading mark-delete times from a broker's metrics, when to scrape, which cursors to read, and
when the fast poll hands a waiting marker over to it."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any, cast

import pytest

from broker_ext.intake.ack_watch import MAX_IDLE_BACKOFF, AckWatch, mark_delete_times
from broker_ext.intake.admin_polling import CursorPoller
from broker_ext.loop import EventLoop

pytestmark = pytest.mark.unit

T0 = "persistent://public/default/t0"
T1 = "persistent://public/default/t1-partition-3"


def _line(topic: str, subscription: str, value: str, metric: str = "last_mark_delete_advanced_timestamp") -> str:
    return (f'pulsar_subscription_{metric}{{cluster="standalone",namespace="public/default",topic="{topic}",'
            f'subscription="{subscription}"}} {value}\n')  # fmt: skip


METRICS = (
    "# TYPE pulsar_subscription_last_mark_delete_advanced_timestamp gauge\n"
    + _line(T0, "app", "1795632153728")
    + _line(T0, "__wm_generator", "1795632150000")
    + _line(T1, "app", "1.795632153729E12")
    + _line("persistent://other/ns/x", "app", "5")
    + _line(T0, "weird", "NaN")
    + "# TYPE pulsar_subscription_back_log gauge\n"
    + _line(T0, "app", "7", metric="back_log")
    + _line(T0, "app2", "8", metric="last_mark_delete_advanced_timestamp_other")
).encode()


def test_mark_delete_times_are_read_for_the_wanted_topics_only() -> None:
    times = mark_delete_times(METRICS, {T0, T1}.__contains__)
    assert times == {
        T0: {"app": 1795632153728, "__wm_generator": 1795632150000},
        T1: {"app": 1795632153729},
    }  # the other namespace's topic, the NaN and the other metrics are left out


def test_a_sample_with_a_timestamp_and_a_last_line_without_newline_are_read() -> None:
    body = (b"# x\n" + _line(T0, "app", "12 1700000000000").encode()).rstrip(b"\n")
    assert mark_delete_times(body, lambda topic: True) == {T0: {"app": 12}}


def test_nothing_is_scraped_while_nothing_is_watched() -> None:
    watch = AckWatch(interval_s=1.0)
    assert watch.next_scrape(100.0) is None
    watch.watch(T0)
    assert watch.next_scrape(100.0) == 100.0  # the first one at once
    watch.unwatch(T0)
    assert watch.next_scrape(100.0) is None


def test_only_watched_partitions_whose_subscriptions_moved_are_read() -> None:
    watch = AckWatch(interval_s=1.0)
    watch.watch(T0)
    watch.watch(T1)
    # never seen before: read both (their acknowledgement may have come before the first scrape)
    assert watch.scraped(100.0, {T0: {"app": 1}, T1: {"app": 5}}) == [T0, T1]
    assert watch.next_scrape(100.2) == 101.0
    assert watch.scraped(101.0, {T0: {"app": 1}, T1: {"app": 5}}) == []  # nothing moved: no internal stats read
    assert watch.scraped(102.0, {T0: {"app": 2}, T1: {"app": 5}}) == [T0]
    assert watch.scraped(103.0, {T0: {"app": 2}, T1: {"app": 5, "new": 1}}) == [T1]  # a new subscription
    watch.unwatch(T0)
    assert watch.scraped(104.0, {T0: {"app": 3}, T1: {"app": 5, "new": 1}}) == []  # T0 no longer waits


def test_a_partition_watched_later_is_read_once_then_compared_with_the_scrapes_since() -> None:
    # until issue 33 the first scrape compared with one made while T0 was not watched, and found nothing
    watch = AckWatch(interval_s=1.0)
    watch.watch(T1)
    watch.scraped(100.0, {T0: {"app": 1}, T1: {"app": 1}})
    watch.watch(T0)
    assert watch.scraped(101.0, {T0: {"app": 1}, T1: {"app": 1}}) == [T0]
    assert watch.scraped(102.0, {T0: {"app": 1}, T1: {"app": 1}}) == []
    assert watch.scraped(103.0, {T0: {"app": 4}, T1: {"app": 1}}) == [T0]


def test_scrapes_that_show_no_watched_topic_slow_down_and_recover() -> None:
    watch = AckWatch(interval_s=1.0)
    watch.watch(T0)  # served by another broker: never in this broker's metrics
    now = 100.0
    gaps = []
    for _ in range(8):
        watch.scraped(now, {T1: {"app": 1}})
        due = watch.next_scrape(now)
        assert due is not None
        gaps.append(due - now)
        now = due
    assert gaps == [2.0, 4.0, 8.0, 16.0, 32.0, 32.0, 32.0, 32.0]
    assert max(gaps) == MAX_IDLE_BACKOFF
    watch.scraped(now, {T0: {"app": 1}})
    assert watch.next_scrape(now) == now + 1.0


def test_a_failed_scrape_is_retried_more_slowly() -> None:
    watch = AckWatch(interval_s=1.0)
    watch.watch(T0)
    watch.failed(100.0)
    assert watch.next_scrape(100.0) == 102.0
    for _ in range(20):
        watch.failed(100.0)
    assert watch.next_scrape(100.0) == 100.0 + MAX_IDLE_BACKOFF


def test_a_forgotten_partition_is_read_again_when_it_comes_back() -> None:
    watch = AckWatch(interval_s=1.0)
    watch.watch(T0)
    watch.scraped(100.0, {T0: {"app": 1}})
    watch.forget(T0)
    assert watch.next_scrape(101.0) is None
    watch.watch(T0)  # a topic deleted and created again: nothing of the old one holds
    assert watch.scraped(101.0, {T0: {"app": 1}}) == [T0]


def _poller(ack_watch_interval_s: float) -> CursorPoller:
    """A poller on a loop that is never started: its timers are only recorded, nothing is called."""
    return CursorPoller(EventLoop("test-loop"), cast(Any, None), cast(Any, None), poll_interval_s=0.05,
                        idle_poll_interval_s=1.0, stats_rate=10.0, first_poll_s=0.12,
                        ack_watch_interval_s=ack_watch_interval_s)  # fmt: skip


def _partition(topic: str = T0) -> Any:
    return SimpleNamespace(topic=topic, base_topic=topic, partition=-1, consumer_name="c",
                           closed=False, owner=True, wants_cursors=True)  # fmt: skip


def _followed(ack_watch_interval_s: float) -> tuple[CursorPoller, Any]:
    poller, partition = _poller(ack_watch_interval_s), _partition()
    poller.add(partition)
    return poller, partition


def _fast_polls_until_handed_over(poller: CursorPoller, partition: Any) -> list[float]:
    intervals = [poller.states[partition.topic].fast_interval]
    while poller.states[partition.topic].fast_interval:
        poller._after_poll(partition, moved=False)
        intervals.append(poller.states[partition.topic].fast_interval)
    return [round(i, 3) for i in intervals[:-1]]


def test_the_first_read_after_a_marker_waits_for_the_acknowledgement_grouping() -> None:
    poller, partition = _followed(1.0)
    before = time.time()
    poller.after(partition, marker_read=True)
    scheduled = poller.loop.scheduled((T0, "poll"))
    assert scheduled is not None and before + 0.12 <= scheduled <= time.time() + 0.12


def test_a_marker_still_waiting_goes_from_the_fast_poll_to_the_ack_watch_within_a_fraction_of_a_second() -> None:
    poller, partition = _followed(1.0)
    poller.after(partition, marker_read=True)
    assert _fast_polls_until_handed_over(poller, partition) == [0.12, 0.18]  # two reads, then the metrics
    assert poller.states[partition.topic].handed_over and poller.watch is not None and T0 in poller.watch.watched
    assert poller.loop.scheduled("ack-watch") is not None
    partition.wants_cursors = False  # acknowledged past every marker: nothing to watch for
    poller.after(partition, marker_read=False)
    assert T0 not in poller.watch.watched


def test_without_the_ack_watch_or_where_the_metrics_do_not_show_the_topic_the_sweep_takes_over_after_a_second() -> None:
    for poller in (_poller(0.0), _poller(1.0)):
        if poller.watch is not None:
            poller.watch.scraped(time.time(), {T1: {"app": 1}})  # the broker's metrics show another topic only
        partition = _partition()
        poller.add(partition)
        poller.after(partition, marker_read=True)
        assert _fast_polls_until_handed_over(poller, partition) == [0.12, 0.18, 0.27, 0.405, 0.608, 0.911]
        assert poller.states[partition.topic].handed_over
        assert poller.watch is None or not poller.watch.watched


def test_a_late_acknowledgement_with_markers_still_waiting_stays_with_the_watch_a_prompt_one_polls_fast() -> None:
    poller, partition = _followed(1.0)
    poller.after(partition, marker_read=True)
    poller._after_poll(partition, moved=True)  # within the fast window: the next acknowledgement is likely near
    assert poller.states[partition.topic].fast_interval == 0.05
    _fast_polls_until_handed_over(poller, partition)
    assert poller.states[partition.topic].handed_over
    poller._after_poll(partition, moved=True)  # the watch saw a late acknowledgement; an older marker still waits
    assert poller.states[partition.topic].fast_interval == 0.0 and poller.states[partition.topic].handed_over
    assert poller.watch is not None and T0 in poller.watch.watched
    poller.after(partition, marker_read=True)  # a new marker: its own fast poll
    assert poller.states[partition.topic].fast_interval == 0.12


def test_a_partition_that_acknowledges_late_gets_no_fast_polls_but_one_marker_in_four_probes() -> None:
    poller, partition = _followed(1.0)
    poller.after(partition, marker_read=True)
    _fast_polls_until_handed_over(poller, partition)  # two reads find nothing
    poller.states[
        partition.topic
    ].marker_read_at -= 10.0  # ... and the watch finds the move ten seconds after the marker
    poller._after_poll(partition, moved=True)
    assert poller.states[partition.topic].late
    fast = []
    for _ in range(8):
        poller.after(partition, marker_read=True)
        fast.append(poller.states[partition.topic].fast_interval > 0)
        poller.states[partition.topic].fast_interval = 0.0  # (the probe's reads find nothing)
        poller.states[partition.topic].handed_over = True
    assert fast == [False, False, False, True] * 2
    assert poller.watch is not None and T0 in poller.watch.watched
    poller.after(partition, marker_read=True)
    poller._after_poll(partition, moved=True)  # found at once: prompt again
    assert not poller.states[partition.topic].late
    poller.after(partition, marker_read=True)
    assert poller.states[partition.topic].fast_interval == 0.12


def test_without_the_watch_a_late_partition_keeps_its_fast_polls() -> None:
    poller, partition = _followed(0.0)
    poller.states[partition.topic].late = True
    poller.after(partition, marker_read=True)
    assert poller.states[partition.topic].fast_interval == 0.12


def test_an_acknowledgement_seen_while_the_partition_was_not_watched_is_not_its_baseline() -> None:
    """A scrape for other topics saw this partition's acknowledgement; a marker then waits on it: the first scrape
    after it is watched must read its cursors, not take that acknowledgement as 'nothing moved' (issue 33)."""
    watch = AckWatch(interval_s=1.0)
    watch.watch("other")
    watch.scraped(100.0, {"other": {"app": 1}, T0: {"app": 5}})  # T0 acknowledged while not watched
    watch.watch(T0)  # a marker now waits on T0 past its fast poll
    assert watch.scraped(101.0, {"other": {"app": 1}, T0: {"app": 5}}) == [T0]
    assert watch.scraped(102.0, {"other": {"app": 1}, T0: {"app": 5}}) == []  # then only moves count
