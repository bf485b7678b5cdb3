"""The shell's pure parts: consumer names that spread ownership, reading stats, the event loop's timers."""

from __future__ import annotations

import itertools
import threading
import time
from types import SimpleNamespace
from typing import Any, cast

import pytest

from broker_ext.intake.admin_polling import FULL_SWEEP_PERIODS, Sweeper, cursors_polled, detected, summed_fingerprint
from broker_ext.loop import EventLoop
from broker_ext.ownership import consumer_name, instance_of

pytestmark = pytest.mark.unit

INSTANCES = ("gen-a", "gen-b", "gen-c")


def test_instances_are_ordered_differently_on_different_topics() -> None:
    """Partition i of a topic goes to the i-th (mod n) consumer in name order: that order must vary by topic."""
    orders = set()
    for t in range(60):
        topic = f"persistent://public/default/t{t}"
        names = sorted(consumer_name(topic, instance) for instance in INSTANCES)
        orders.add(tuple(instance_of(name) for name in names))
    assert len(orders) == len(list(itertools.permutations(INSTANCES)))  # every order occurs


def test_partition_zero_of_many_topics_is_spread_over_the_instances() -> None:
    firsts = [
        instance_of(min(consumer_name(f"persistent://public/default/t{t}", i) for i in INSTANCES)) for t in range(300)
    ]
    shares = [firsts.count(instance) / len(firsts) for instance in INSTANCES]
    assert max(shares) <= 0.45, shares


def test_a_consumer_name_is_stable_and_names_its_instance() -> None:
    name = consumer_name("persistent://public/default/x", "gen-a.1")
    assert name == consumer_name("persistent://public/default/x", "gen-a.1")
    assert instance_of(name) == "gen-a.1"
    assert instance_of("gen-a") == "gen-a"  # a name without our prefix (an older generator)


STATS = {
    "msgInCounter": 12,
    "subscriptions": {
        "__wm_generator": {"msgBacklog": 0, "activeConsumerName": "0000abcd.gen-a", "isDurable": True},
        "app": {"msgBacklog": 3, "lastMarkDeleteAdvancedTimestamp": 1700, "isDurable": True},
        "reader-1f": {"msgBacklog": 9, "isDurable": False},
        "__compaction": {"msgBacklog": 0, "isDurable": True},
    },
}


def test_the_sweep_reads_durable_subscriptions_the_owner_and_a_fingerprint() -> None:
    seen = detected(STATS)
    assert seen.durable == {"app"}
    assert seen.active == "0000abcd.gen-a"
    acked = {
        **STATS,
        "subscriptions": {
            **STATS["subscriptions"],
            "app": {
                "msgBacklog": 1,  # type: ignore[dict-item]
                "lastMarkDeleteAdvancedTimestamp": 1800,
            },
        },
    }
    sought = {
        **STATS,
        "subscriptions": {
            **STATS["subscriptions"],
            "app": {
                "msgBacklog": 7,  # type: ignore[dict-item]
                "lastMarkDeleteAdvancedTimestamp": 1700,
            },
        },
    }
    published = {**STATS, "msgInCounter": 13}
    fingerprints = {detected(s).fingerprint for s in (STATS, acked, sought, published)}
    assert len(fingerprints) == 4, "an ack, a seek (backlog only) and a publish each change it"
    assert detected(dict(STATS)).fingerprint == seen.fingerprint


def test_cursors_come_from_internal_stats_for_durable_subscriptions_only() -> None:
    internal = {
        "lastConfirmedEntry": "12:4",
        "ledgers": [{"ledgerId": 10, "entries": 5}, {"ledgerId": 12, "entries": 0}],
        "cursors": {
            "__wm_generator": {"markDeletePosition": "12:-1"},
            "app": {"markDeletePosition": "10:3"},
            "reader-1f": {"markDeletePosition": "12:2"},
        },
    }
    polled = cursors_polled(internal, frozenset({"app"}))
    assert polled.subscriptions == {"app": (10, 3)}
    assert polled.generator_cursor == (12, -1)
    assert polled.last_confirmed == (12, 4)
    assert polled.ledgers == ((10, 5), (12, 0))


def test_the_loop_runs_posted_work_in_order_and_keyed_timers_once() -> None:
    loop = EventLoop("test-loop")
    loop.start()
    seen: list[object] = []
    done = threading.Event()
    try:
        for i in range(5):
            loop.post(lambda i=i: seen.append(i))  # type: ignore[misc]

        def timers() -> None:
            now = time.time()
            loop.call_at(now + 0.05, "k", lambda: seen.append("first"))
            loop.call_at(now + 0.10, "k", lambda: seen.append("moved"))  # replaces the first
            loop.call_at(now + 0.01, "other", lambda: seen.append("other"))
            loop.call_at(now + 0.02, "gone", lambda: seen.append("cancelled"))
            loop.cancel("gone")
            loop.call_at(now + 0.2, "end", done.set)

        loop.post(timers)
        assert done.wait(5)
    finally:
        loop.stop()
    assert seen == [0, 1, 2, 3, 4, "other", "moved"]


def test_a_failing_callable_does_not_stop_the_loop() -> None:
    loop = EventLoop("test-loop")
    loop.start()
    done = threading.Event()
    try:
        loop.post(lambda: 1 / 0)  # type: ignore[func-returns-value]
        loop.post(done.set)
        assert done.wait(5)
    finally:
        loop.stop()


SUMMED = {
    "msgInCounter": 1200,
    "subscriptions": {
        "__wm_generator": {"msgBacklog": 4, "msgOutCounter": 1196},
        "app": {"msgBacklog": 30, "msgOutCounter": 1170},
    },
}


def test_the_summed_fingerprint_follows_application_subscriptions_only() -> None:
    base = summed_fingerprint(SUMMED)
    ours_moved = {**SUMMED, "subscriptions": {**SUMMED["subscriptions"], "__wm_generator": {"msgBacklog": 0}}}
    assert summed_fingerprint(ours_moved) == base  # the generator's own acknowledgements are not a change
    for changed in (
        {**SUMMED, "msgInCounter": 1201},
        {**SUMMED, "subscriptions": {"app": {"msgBacklog": 31, "msgOutCounter": 1170}}},  # a reset back
        {**SUMMED, "subscriptions": {"app": {"msgBacklog": 30, "msgOutCounter": 1175}}},  # redelivered
        {**SUMMED, "subscriptions": {**SUMMED["subscriptions"], "other": {}}},  # a new subscription
    ):
        assert summed_fingerprint(changed) != base, changed


def _sweeper_with(seen: list[str]) -> Sweeper:
    sweeper = Sweeper(
        cast(Any, None),
        cast(Any, None),
        count=lambda call: None,
        changed=lambda changes: None,
        failed=lambda exc: None,
        swept=lambda partition: True,
        idle_poll_interval_s=1.0,
        stats_rate=10.0,
    )
    for topic in seen:
        sweeper.seen(topic, (0, ()))
    return sweeper


def test_partitions_are_read_when_the_sums_change_and_at_the_backstop() -> None:
    owned = [cast(Any, SimpleNamespace(topic=f"t-partition-{i}")) for i in range(3)]
    sweeper = _sweeper_with([p.topic for p in owned])
    quiet = summed_fingerprint(SUMMED)
    assert sweeper._partitions_wanted("t", quiet, owned)  # the first sweep reads them
    wanted = [sweeper._partitions_wanted("t", quiet, owned) for _ in range(3 * FULL_SWEEP_PERIODS)]
    # nothing changed: only the backstop, every FULL_SWEEP_PERIODS sweeps
    assert [i for i, w in enumerate(wanted) if w] == [FULL_SWEEP_PERIODS - 1 + k * FULL_SWEEP_PERIODS for k in range(3)]
    assert sweeper._partitions_wanted("t", summed_fingerprint({**SUMMED, "msgInCounter": 1}), owned)
    assert not sweeper._partitions_wanted("t", summed_fingerprint({**SUMMED, "msgInCounter": 1}), owned)


def test_a_partition_never_read_is_read_whatever_the_sums_say() -> None:
    owned = [cast(Any, SimpleNamespace(topic=f"t-partition-{i}")) for i in range(2)]
    sweeper = _sweeper_with([owned[0].topic])
    quiet = summed_fingerprint(SUMMED)
    sweeper._partitions_wanted("t", quiet, owned[:1])
    assert not sweeper._partitions_wanted("t", quiet, owned[:1])
    assert sweeper._partitions_wanted("t", quiet, owned)  # partition 1 was just taken over
