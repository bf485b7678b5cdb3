"""The chaos plans (pure): a run on several brokers gets a cluster's faults, a standalone run never does."""

from __future__ import annotations

import pytest

from tests.chaos.plan import CLUSTER_KINDS, HARD_FAULTS, FaultKind, plan_scenario

pytestmark = pytest.mark.unit


def test_a_run_on_several_brokers_moves_splits_and_kills_the_owner_never_the_standalones_faults() -> None:
    plans = [
        plan_scenario(seed, broker_restarts=False, generator_cuts=False, several_brokers=True) for seed in range(200)
    ]
    kinds = {fault.kind for plan in plans for fault in plan.faults}
    assert kinds >= CLUSTER_KINDS
    assert not kinds & HARD_FAULTS
    assert all(any(f.kind in CLUSTER_KINDS for f in plan.faults) for plan in plans)
    kills = sum(any(f.kind is FaultKind.KILL_OWNER_BROKER for f in plan.faults) for plan in plans)
    assert 20 <= kills <= 60, f"{kills} of 200 scenarios kill the owning broker"


def test_a_standalone_plan_is_what_the_seed_always_gave() -> None:
    for seed in range(200):
        plan = plan_scenario(seed)
        assert not {fault.kind for fault in plan.faults} & CLUSTER_KINDS
        assert plan == plan_scenario(seed, several_brokers=False)
        several = plan_scenario(seed, several_brokers=True)
        assert (several.producers, several.subscriptions) == (plan.producers, plan.subscriptions)
        assert [f.at_s for f in several.faults] == [f.at_s for f in plan.faults]


def test_some_plans_kill_the_owning_generator_while_a_standby_waits_and_draw_nothing_else_differently() -> None:
    """Issue 47's chaos: a standby taking over. It replaces one `kill -9 generator` of a plan, drawn apart, so a
    plan without it is the plan the seed always gave."""
    with_standby = [plan_scenario(seed) for seed in range(200)]
    hit = [p for p in with_standby if any(f.kind is FaultKind.KILL_OWNER_WITH_STANDBY for f in p.faults)]
    assert 8 <= len(hit) <= 40, f"{len(hit)} of 200"
    for plan in hit:
        without = plan_scenario(plan.seed, standby_share=0.0)
        changed = [(a, b) for a, b in zip(plan.faults, without.faults, strict=True) if a != b]
        assert len(changed) == 1
        ((standby, kill),) = changed
        assert kill.kind is FaultKind.KILL_GENERATOR and (standby.at_s, standby.down_s) == (kill.at_s, kill.down_s)
