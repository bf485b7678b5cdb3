"""Who asks first for a topic's claim (broker_ext/claims.py `rank`): spread evenly, the same answer everywhere."""

from __future__ import annotations

import logging
from collections import Counter
from types import SimpleNamespace
from typing import Any, cast

import pytest

from broker_ext.claims import Claim, Claims, Follows, rank
from broker_ext.loop import EventLoop
from pulsar_access.topics import watermark_topic_for


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
    """Claims of `instance`; the companion topics it loses, in order."""
    lost: list[str] = []
    claims = Claims(cast(Any, None), EventLoop("test-claims"), instance, None, gained=lambda c, t, p: None,
                    lost=lambda companion, _topics: lost.append(companion), follows=follows)  # fmt: skip
    return claims, lost


def _held(claims: Claims, companion: str, since: float, topics: set[str] | None = None) -> Claim:
    producer = SimpleNamespace(_producer=SimpleNamespace(close_async=lambda done: None))
    claim = Claim(companion, topics or {companion}, producer=cast(Any, producer), held_since=since)
    claims._claims[companion] = claim
    for topic in claim.topics:
        claims._of_topic[topic] = claim
    return claim


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


def test_a_claim_is_its_companion_topics_and_its_topics_are_owned_and_let_go_together() -> None:
    """Issue 47: a companion topic may carry the tables of several topics; its claim owns them all."""
    a, b, c = (f"persistent://public/default/{name}" for name in "abc")
    companion = watermark_topic_for(c)  # a and b joined it before (as topics of one group would)
    gained: list[tuple[str, frozenset[str]]] = []
    lost: list[tuple[str, frozenset[str]]] = []
    claims = Claims(cast(Any, None), EventLoop("test-claims"), "gen-a", None,
                    gained=lambda comp, topics, _p: gained.append((comp, topics)),
                    lost=lambda comp, topics: lost.append((comp, topics)))  # fmt: skip
    claim = _held(claims, companion, since=0.0, topics={a, b})
    claims.want(c)  # joins the held claim: owned at once, no request of its own
    assert gained == [(companion, frozenset({c}))] and claim.topics == {a, b, c} and claim.asking == 0
    assert claims.held(a) is claims.held(c) is claim.producer
    claims.drop(a)
    claims.drop(c)
    assert lost == [] and claims.held(b) is claim.producer  # b still follows it
    claims.fenced(companion)  # another instance holds it now: every topic of it is lost together
    assert lost == [(companion, frozenset({b}))] and claims.held(b) is None
    claims.drop(b)
    assert companion not in claims._claims and claims.held(b) is None


def test_a_claim_nobody_else_here_follows_that_waits_long_says_who_may_hold_it_and_the_fix(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Found by chaos (session 32): a companion topic is a group's, so a generator following other topics of the
    group may hold its claim and publish only those; ours then waits without end. A standby (another member follows
    our topics) waits by design and is not warned about."""
    topic = "persistent://acme/orders/t-1"
    asked: list[str] = []
    client = SimpleNamespace(_client=SimpleNamespace(create_producer_async=lambda name, conf, done: asked.append(name)))
    for others, warned in (({"b": Follows(frozenset(), frozenset({"persistent://acme/orders/t-2"}))}, True),
                           ({"b": Follows(frozenset({"acme/orders"}))}, False)):  # fmt: skip
        loop = EventLoop("test-claims")
        claims = Claims(cast(Any, client), loop, "a", None, gained=lambda c, t, p: None, lost=lambda c, t: None,
                        follows=Follows(frozenset(), frozenset({topic})))  # fmt: skip
        claims._ready_at = 0.0
        claims._members = others
        claims.want(topic)
        assert asked[-1] == watermark_topic_for(topic)  # asked at once: the first in rank for it
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="broker_ext.claims"):
            _, _, still_waiting = loop._due[("claim-wait", watermark_topic_for(topic))]
            still_waiting()  # `STARVED_S` later, no answer yet
        assert ("follow the same" in caplog.text) is warned, caplog.text
