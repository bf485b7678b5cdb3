"""Who asks first for a topic's claim (broker_ext/claims.py `rank`): spread evenly, the same answer everywhere."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any, cast

from broker_ext.claims import Claim, Claims, Follows, rank
from broker_ext.loop import EventLoop


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


def test_what_an_instance_follows_travels_in_its_member_producers_properties() -> None:
    follows = Follows(frozenset({"acme/orders"}), frozenset({"persistent://acme/billing/invoices"}))
    assert Follows.of(follows.properties()) == follows
    assert "persistent://acme/orders/o-1" in follows
    assert "persistent://acme/billing/invoices" in follows
    assert "persistent://acme/billing/refunds" not in follows


def _claims(instance: str, follows: Follows) -> tuple[Claims, list[str]]:
    lost: list[str] = []
    claims = Claims(cast(Any, None), EventLoop("test-claims"), instance, None, gained=lambda t, p: None,
                    lost=lost.append, follows=follows)  # fmt: skip
    return claims, lost


def _held(claims: Claims, topic: str, since: float) -> None:
    producer = SimpleNamespace(_producer=SimpleNamespace(close_async=lambda done: None))
    claims._claims[topic] = Claim(topic, "companion", producer=cast(Any, producer), held_since=since)


def test_an_owner_hands_a_topic_over_to_the_first_in_rank_that_follows_it_once_both_settled() -> None:
    """An instance that joined later gets its share (issue 47): the owner releases a topic whose first in rank is
    that instance, once it has been a member for a while; never to an instance that does not follow the topic."""
    ns = Follows(frozenset({"public/default"}))
    topics = [f"persistent://public/default/t-{i}" for i in range(40)]
    theirs = [t for t in topics if rank(t, "b", {"a", "b"}) == 0]
    assert theirs and len(theirs) < len(topics)
    claims, lost = _claims("a", ns)
    for topic in topics:
        _held(claims, topic, since=0.0)
    claims._members_read({"b": ns, "c": Follows(frozenset({"other/ns"}))})  # c follows none of these
    assert lost == []  # b has only just joined
    claims._joined["b"] = 0.0
    claims._hand_over_where_not_first(100.0)
    assert sorted(lost) == sorted(theirs)  # to b; c is first for none of them, as it does not follow them
    lost.clear()
    claims._hand_over_where_not_first(200.0)
    assert lost == []  # released ones are not held: nothing more to hand over
