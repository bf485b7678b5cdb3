"""Who asks first for a topic's claim (broker_ext/claims.py `rank`): spread evenly, the same answer everywhere."""

from __future__ import annotations

from collections import Counter

from broker_ext.claims import rank


def test_three_instances_each_ask_first_for_about_a_third_of_the_topics() -> None:
    members = {"gen-a", "gen-b", "gen-c"}
    topics = [f"persistent://public/default/t-{i}" for i in range(300)]
    first = Counter(next(m for m in members if rank(t, m, members) == 0) for t in topics)
    assert sum(first.values()) == 300 and max(first.values()) / 300 <= 0.40


def test_every_instance_computes_the_same_order_whatever_it_knows_of_itself() -> None:
    members = {"gen-a", "gen-b", "gen-c"}
    topic = "persistent://public/default/t"
    places = sorted(rank(topic, m, members) for m in members)
    assert places == [0, 1, 2]
    # an instance that has not seen itself among the members yet ranks as if it were
    assert rank(topic, "gen-a", members - {"gen-a"}) == rank(topic, "gen-a", members)


def test_alone_an_instance_asks_first_for_everything() -> None:
    assert rank("persistent://public/default/t", "gen-a", set()) == 0
