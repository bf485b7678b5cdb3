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
    claims._holding_changed()
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


def _of_group(companion: str, avoid: set[str], *, same: bool = True) -> str:
    """A topic of acme/orders in (or, `same` False, not in) the group of `companion`."""
    return next(
        name for i in range(1000)
        if (watermark_topic_for(name := f"persistent://acme/orders/t-{i}") == companion) is same and name not in avoid
    )  # fmt: skip


T1 = "persistent://acme/orders/t-1"
GROUP = watermark_topic_for(T1)
T2 = _of_group(GROUP, {T1})
"""Another topic of T1's group."""
ELSEWHERE = _of_group(GROUP, {T1}, same=False)
"""A topic of acme/orders in another group."""


def _topics(*names: str) -> Follows:
    return Follows(frozenset(), frozenset(names))


def test_generators_following_different_topics_of_one_group_rank_alike_for_its_claim() -> None:
    """Found by chaos (session 32): a claim is a group's, so every generator following any topic of the group is in
    its rank, in the same order whichever it follows; one following another group only is not."""
    orders: list[list[str]] = []
    for me, mine, others in (("a", T1, {"b": _topics(T2), "c": _topics(ELSEWHERE)}),
                             ("b", T2, {"a": _topics(T1), "c": _topics(ELSEWHERE)})):  # fmt: skip
        claims, _ = _claims(me, _topics(mine))
        claims._members = others
        orders.append(claims._rank(Claim(GROUP, {mine})))
    assert orders[0] == orders[1] and sorted(orders[0]) == ["a", "b"]


def test_the_holder_of_a_groups_claim_follows_the_topics_of_its_group_other_generators_follow() -> None:
    """The holder publishes them all, as no other generator can write the group's companion topic meanwhile: a topic
    named by another member, and the group's topics of a namespace another member follows. Not a topic of another
    group, not its own, and nothing once the claim is lost."""
    claims, _ = _claims("a", _topics(T1))
    claims._members = {"b": _topics(T2), "c": _topics(ELSEWHERE), "d": Follows(frozenset({"acme/orders"})),
                       "e": Follows(frozenset({"other/ns"}))}  # fmt: skip
    assert claims.adoptions() == Follows() and not claims.adopts(T2)  # not held: none
    _held(claims, GROUP, since=0.0, topics={T1})
    assert claims.adoptions() == Follows(frozenset({"acme/orders"}), frozenset({T2}))
    assert claims.adopts(T2) and claims.adopts(_of_group(GROUP, {T1, T2}))  # named by b; of d's namespace
    assert not claims.adopts(ELSEWHERE) and not claims.adopts(T1)  # another group's; our own
    claims.fenced(GROUP)
    assert claims.adoptions() == Follows() and not claims.adopts(T2)


def test_a_claim_that_waits_long_while_no_member_follows_its_group_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every member following a topic of the group publishes ours once it holds the claim, so waiting for it is a
    standby's normal state; with no such member, the holder is a generator that is not one (its member producer
    failed, or an older version): said once, with the fix."""
    asked: list[str] = []
    client = SimpleNamespace(_client=SimpleNamespace(create_producer_async=lambda name, conf, done: asked.append(name)))
    for others, warned in (({"b": _topics(ELSEWHERE)}, True), ({"b": _topics(T2)}, False),
                           ({"b": Follows(frozenset({"acme/orders"}))}, False)):  # fmt: skip
        loop = EventLoop("test-claims")
        claims = Claims(cast(Any, client), loop, "a", None, gained=lambda c, t, p: None, lost=lambda c, t: None,
                        follows=_topics(T1))  # fmt: skip
        claims._ready_at = 0.0
        claims._members = others
        claims.want(T1)
        claim = claims._claims[GROUP]
        claims._ask(claim)  # a standby asks after its hold-off
        assert asked[-1] == GROUP
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="broker_ext.claims"):
            _, _, still_waiting = loop._due[("claim-wait", GROUP)]
            still_waiting()  # `STARVED_S` later, no answer yet
        assert ("is not a member" in caplog.text) is warned, caplog.text
