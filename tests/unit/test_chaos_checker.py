"""The fault-injection suite's checks and plans: each check finds what it is for, and only that."""

from __future__ import annotations

from tests.chaos.checker import (
    Delivery,
    InstanceLog,
    WatermarkSeen,
    WatermarkWithdrawn,
    check_across_instances,
    check_final,
    check_monotonic,
    check_nothing_lost,
    check_premature,
    check_stale,
    check_subscription,
    check_withdrawn,
)
from tests.chaos.crashes import forgive_lost_acknowledgements
from tests.chaos.plan import CLUSTER_KINDS, CUT_S, SUBSCRIPTION_FAULTS, FaultKind, plan_scenario

Event = Delivery | WatermarkSeen | WatermarkWithdrawn


def instance(name: str, events: list[Event], started: float = 0.0, epoch: int = 0) -> InstanceLog:
    log = InstanceLog("sub", name, started, epoch, list(events))
    log.acknowledged = {e.payload for e in events if isinstance(e, Delivery)}
    return log


def test_a_message_below_an_earlier_watermark_is_premature_only_for_honest_producers() -> None:
    log = instance("c1", [WatermarkSeen(100, 1.0), Delivery("a", "p0", 99, 2.0), Delivery("b", "liar", 50, 3.0)])
    found = check_premature(log, honest={"p0"})
    assert [v.check for v in found] == ["premature-watermark"]
    assert "a (event time 99) after watermark 100" in found[0].detail


def test_messages_at_or_above_the_watermark_and_before_it_are_fine() -> None:
    log = instance("c1", [Delivery("a", "p0", 5, 0.5), WatermarkSeen(100, 1.0), Delivery("b", "p0", 100, 2.0)])
    assert check_premature(log, honest={"p0"}) == []


def test_a_watermark_that_goes_back_within_an_instance_is_found() -> None:
    log = instance("c1", [WatermarkSeen(100, 1.0), WatermarkSeen(90, 2.0), WatermarkSeen(120, 3.0)])
    assert [v.detail for v in check_monotonic(log)] == ["c1: 100 -> 90"]
    assert check_monotonic(instance("c2", [WatermarkSeen(1, 1.0), WatermarkSeen(1, 2.0)])) == []


def test_a_restarted_instance_may_not_start_below_what_an_earlier_one_saw_unless_a_seek_lies_between() -> None:
    earlier = instance("c1", [WatermarkSeen(100, 1.0)], started=0.0)
    later_same_epoch = instance("c2", [WatermarkSeen(80, 5.0)], started=4.0)
    later_after_seek = instance("c3", [WatermarkSeen(80, 5.0)], started=4.0, epoch=1)
    assert len(check_across_instances([earlier, later_same_epoch])) == 1
    assert check_across_instances([earlier, later_after_seek]) == []


def test_what_no_instance_acknowledged_is_lost() -> None:
    logs = [instance("c1", [Delivery("a", "p0", 1, 1.0)]), instance("c2", [Delivery("b", "p0", 1, 1.0)])]
    assert check_nothing_lost("sub", ["a", "b"], logs) == []
    lost = check_nothing_lost("sub", ["a", "b", "c"], logs)
    assert len(lost) == 1 and "1 never acknowledged" in lost[0].detail


def test_the_final_watermark_must_arrive_within_the_bound() -> None:
    found = check_final("sub", 10, {"fast": 0.5, "slow": 70.0, "never": None}, bound_s=60)
    assert sorted(v.detail.split()[0] for v in found) == ["never", "slow"]


def test_a_clean_subscription_passes_every_check() -> None:
    logs = [instance("c1", [WatermarkSeen(1, 0.1), Delivery("a", "p0", 5, 0.2), WatermarkSeen(5, 0.3)])]
    assert check_subscription("sub", logs, ["a"], {"p0"}) == []


def test_a_plan_is_a_function_of_its_seed_and_has_enough_faults() -> None:
    assert plan_scenario(7) == plan_scenario(7)
    assert plan_scenario(7) != plan_scenario(8)
    plans = [plan_scenario(seed) for seed in range(200)]
    assert all(6 <= len(p.faults) <= 8 for p in plans)
    assert all(p.faults == tuple(sorted(p.faults, key=lambda f: f.at_s)) for p in plans)
    kinds = {f.kind for p in plans for f in p.faults}
    assert kinds == set(FaultKind) - CLUSTER_KINDS  # a run on several brokers adds those
    assert not any(f.kind is FaultKind.RESTART_BROKER for f in plan_scenario(3, broker_restarts=False).faults)


def test_a_restart_share_of_one_restarts_the_broker_in_every_scenario_with_the_same_workload() -> None:
    stressed = [plan_scenario(seed, restart_share=1.0) for seed in range(50)]
    assert all(sum(f.kind is FaultKind.RESTART_BROKER for f in plan.faults) == 1 for plan in stressed)
    for seed, plan in enumerate(stressed):
        usual = plan_scenario(seed)
        assert (plan.producers, plan.subscriptions) == (usual.producers, usual.subscriptions)
    assert sum(any(f.kind is FaultKind.RESTART_BROKER for f in plan_scenario(s).faults) for s in range(200)) < 20


def test_hard_faults_replace_one_fault_each_and_change_nothing_else() -> None:
    for seed in range(50):
        plain = plan_scenario(seed, kill_share=0.0, cut_share=0.0)
        hard = plan_scenario(seed, kill_share=1.0, cut_share=1.0)
        assert not {f.kind for f in plain.faults} & {FaultKind.KILL_BROKER, FaultKind.CUT_GENERATOR}
        assert (hard.producers, hard.subscriptions) == (plain.producers, plain.subscriptions)
        assert [f.at_s for f in hard.faults] == [f.at_s for f in plain.faults]
        changed = [(a, b) for a, b in zip(plain.faults, hard.faults, strict=True) if a != b]
        assert {b.kind for _, b in changed} <= {FaultKind.KILL_BROKER, FaultKind.CUT_GENERATOR}
        assert sum(f.kind is FaultKind.KILL_BROKER for f in hard.faults) == 1
        assert sum(f.kind is FaultKind.CUT_GENERATOR for f in hard.faults) == 1
        assert all(a.kind is not FaultKind.RESTART_BROKER for a, _ in changed)
        for cut in (f for f in hard.faults if f.kind is FaultKind.CUT_GENERATOR):
            assert CUT_S[0] <= cut.down_s <= CUT_S[1] and cut.target in (0, 1)
    assert all(sum(f.kind is FaultKind.CUT_GENERATOR for f in plan_scenario(s, cut_share=1.0).faults) == 1
               for s in range(50))  # fmt: skip
    no_cuts = plan_scenario(3, cut_share=1.0, generator_cuts=False)
    assert not any(f.kind is FaultKind.CUT_GENERATOR for f in no_cuts.faults)
    no_kills = plan_scenario(3, kill_share=1.0, broker_restarts=False)
    assert not any(f.kind is FaultKind.KILL_BROKER for f in no_kills.faults)


# -- after a broker kill -9 (tests/chaos/crashes.py) ------------------------------------------------------


def test_after_a_broker_kill_duplicates_of_acknowledged_messages_and_the_way_back_are_forgiven() -> None:
    """Seed 7019: the broker forgot acknowledgements, redelivered p1:41 after watermark 64 and recomputed 18."""
    before = instance("c1", [WatermarkSeen(10, 0.1), Delivery("p1:41", "p1", 50, 1.0), WatermarkSeen(64, 1.2)])
    before.acknowledged = {"p1:41"}
    survivor = instance("c2", [
        WatermarkSeen(64, 1.3), Delivery("p1:41", "p1", 50, 37.0),  # a duplicate, after the kill at 5.0
        WatermarkSeen(18, 38.0), WatermarkSeen(60, 38.5), Delivery("p1:70", "p1", 70, 38.6), WatermarkSeen(64, 39.0),
        WatermarkSeen(90, 40.0),
    ])  # fmt: skip
    survivor.acknowledged = {"p1:41", "p1:70"}
    later = instance("c3", [WatermarkSeen(18, 39.5), WatermarkSeen(90, 40.0)], started=39.4)
    logs = [before, survivor, later]
    assert check_subscription("sub", logs, ["p1:41", "p1:70"], {"p1"})  # as it was: violations
    forgiven = forgive_lost_acknowledgements(logs, [5.0])
    assert check_subscription("sub", forgiven.logs, ["p1:41", "p1:70"], {"p1"}) == []
    assert (forgiven.duplicates, forgiven.lowered_watermarks) == (1, 3)
    assert forgive_lost_acknowledgements(logs, []).logs == logs


def test_after_a_broker_kill_an_unacknowledged_message_below_the_watermark_is_still_premature() -> None:
    log = instance("c1", [
        WatermarkSeen(64, 1.0), Delivery("p1:1", "p1", 70, 1.1),
        Delivery("p1:2", "p1", 50, 37.0),  # never acknowledged before the kill: a real premature watermark
        WatermarkSeen(18, 38.0), WatermarkSeen(100, 39.0), WatermarkSeen(80, 40.0),  # back up, then down again
    ])  # fmt: skip
    log.acknowledged = {"p1:1", "p1:2"}
    found = check_subscription("sub", forgive_lost_acknowledgements([log], [5.0]).logs, ["p1:1", "p1:2"], {"p1"})
    assert sorted(v.check for v in found) == ["premature-watermark", "watermark-went-back"]


def test_a_message_is_checked_against_the_watermark_held_then_which_may_have_gone_back() -> None:
    """Seeks with consumers attached: after a move back, the lower watermark is the one that counts."""
    log = instance("c1", [
        WatermarkSeen(100, 1.0, ((-1, 5, 10),)), WatermarkSeen(40, 2.0, ((-1, 5, 3),)), Delivery("a", "p0", 50, 3.0),
    ])  # fmt: skip
    assert check_premature(log, honest={"p0"}) == []
    assert check_monotonic(log) == [], "computed at an earlier position: a move back"
    stale = instance("c2", [WatermarkSeen(100, 1.0, ((-1, 5, 10),)), Delivery("b", "p0", 50, 2.0)])
    assert [v.check for v in check_premature(stale, honest={"p0"})] == ["premature-watermark"]


def test_a_watermark_that_goes_back_without_moving_back_is_found_and_withdrawals_are_findings() -> None:
    log = instance("c1", [WatermarkSeen(100, 1.0, ((-1, 5, 10),)), WatermarkSeen(90, 2.0, ((-1, 5, 12),))])
    assert [v.detail for v in check_monotonic(log)] == ["c1: 100 -> 90"]
    withdrawn = instance("c2", [WatermarkSeen(100, 1.0), WatermarkWithdrawn(2.0), Delivery("a", "p0", 5, 3.0)])
    assert check_premature(withdrawn, honest={"p0"}) == [], "no watermark held"
    assert [v.check for v in check_withdrawn(withdrawn)] == ["watermark-withdrawn"]
    # an inactive Failover consumer that sought by publish time hears nothing for the whole wait: it
    # cannot tell where its seek landed, and withdrawing is right (seed 26000)
    unheard = instance("c3", [WatermarkSeen(100, 1.0), WatermarkWithdrawn(32.0)])
    assert check_withdrawn(unheard) == []
    heard = instance("c4", [WatermarkSeen(100, 1.0), Delivery("a", "p0", 5, 20.0), WatermarkWithdrawn(32.0)])
    assert [v.check for v in check_withdrawn(heard)] == ["watermark-withdrawn"]


def test_a_withdrawal_when_the_broker_starts_the_subscription_again_from_its_first_message_is_no_finding() -> None:
    """A `kill -9` of a broker within the second before it stored a subscription's position starts it again
    before the topic's first entry, where no watermark holds: the generator says so and consumers withdraw
    (seeds 15840 and 1416). Every message comes again from the first one, which tells it from a give-up."""
    first, later = (-1, 5, 2), (-1, 5, 30)
    before = instance("c0", [Delivery("a", "p0", 5, 1.0, first), Delivery("b", "p0", 9, 2.0, later)])
    withdrew = instance("c1", [WatermarkSeen(100, 3.0), WatermarkWithdrawn(4.0), Delivery("a", "p0", 5, 5.0, first)])
    assert check_withdrawn(withdrew, [before, withdrew]) == []
    gave_up = instance("c2", [WatermarkSeen(100, 3.0), WatermarkWithdrawn(4.0), Delivery("b", "p0", 9, 5.0, later)])
    assert [v.check for v in check_withdrawn(gave_up, [before, gave_up])] == ["watermark-withdrawn"]
    # the consumers reconnect to the restarted broker and get the first message again before the generator's
    # "none" reaches them (seed 146734: all three consumers of a Shared subscription withdrew at one moment)
    early = instance("c3", [WatermarkSeen(100, 3.0), Delivery("a", "p0", 5, 3.5, first), WatermarkWithdrawn(4.0)])
    assert check_withdrawn(early, [before, early]) == []
    # but the message's first delivery is not its coming again
    once = instance("c4", [WatermarkSeen(100, 0.5), Delivery("a", "p0", 5, 1.0, first), WatermarkWithdrawn(4.0)])
    assert [v.check for v in check_withdrawn(once, [once])] == ["watermark-withdrawn"]
    # nor is a delivery the consumer waited on for the whole wait before giving up
    waited = instance("c5", [WatermarkSeen(100, 3.0), Delivery("a", "p0", 5, 3.5, first),
                             Delivery("b", "p0", 9, 20.0, later), WatermarkWithdrawn(33.5)])  # fmt: skip
    assert [v.check for v in check_withdrawn(waited, [before, waited])] == ["watermark-withdrawn"]


def test_a_message_at_or_before_the_held_watermarks_position_is_stale() -> None:
    log = instance("c1", [
        WatermarkSeen(100, 1.0, ((-1, 5, 10),)), Delivery("a", "p0", 500, 2.0, (-1, 5, 11)),
        Delivery("b", "p0", 500, 3.0, (-1, 5, 10)), Delivery("c", "p0", 500, 4.0, (0, 5, 3)),
    ])  # fmt: skip
    assert [v.detail.split()[2] for v in check_stale(log)] == ["b"]


def test_an_instance_started_after_a_move_back_may_start_lower() -> None:
    earlier = instance("c1", [WatermarkSeen(100, 1.0, ((-1, 5, 10),))], started=0.0)
    later = instance("c2", [WatermarkSeen(80, 5.0, ((-1, 5, 4),))], started=4.0)
    assert check_across_instances([earlier, later]) == []


def test_seeks_and_resets_with_consumers_attached_target_a_subscription() -> None:
    faults = [f for seed in range(300) for f in plan_scenario(seed).faults if f.kind in SUBSCRIPTION_FAULTS]
    assert {f.kind for f in faults} == SUBSCRIPTION_FAULTS
    assert all(f.target in (0, 1) for f in faults)
