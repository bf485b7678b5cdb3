"""The short set of the fault-injection suite (`make chaos` runs the long one): no violation may be found.

Runs last in the session (see conftest): one of its scenarios restarts the session's broker.
"""

from __future__ import annotations

from pathlib import Path

from pulsar_access.admin import PulsarAdmin
from tests.chaos.__main__ import cluster_on, run_many, summary
from tests.chaos.plan import CLUSTER_KINDS, FaultKind, plan_scenario
from tests.chaos.scenario import Cluster, suite_client
from tests.harness import RunningPulsar

HARD_FAULTS = {FaultKind.KILL_BROKER, FaultKind.CUT_GENERATOR}

SHORT_SET = [60559, 2, 3]
"""Seed 60559 draws every kind of fault but the hard ones and the standby's, the seeks and resets with consumers
attached and the broker restart included (the restart last); seeds 2 and 3 each kill the owning generator while a
standby waits."""


def test_short_fault_injection_set_finds_no_violation(
    pulsar_broker: RunningPulsar, admin: PulsarAdmin, tmp_path: Path
) -> None:
    client = suite_client(pulsar_broker.settings, tmp_path)
    try:
        cluster = Cluster(pulsar_broker.settings, client, admin, tmp_path, pulsar_broker.restart)
        results = run_many(cluster, SHORT_SET, parallel=2)  # as `make chaos` runs them
    finally:
        client.close()
    totals = summary(results, 0.0)
    violations = [f"seed {r.seed}: {v}" for r in results for v in r.violations]
    assert violations == []
    assert totals["scenarios"] == len(SHORT_SET)
    # what was injected, not what was planned: a fault that could not be injected is not counted
    injected = {r.seed: set(r.faults) for r in results}
    # every kind but the hard ones (drawn only with kill_share / cut_share: the next test) and a cluster's
    standby = FaultKind.KILL_OWNER_WITH_STANDBY
    expected = {
        k.value for k in set(FaultKind) - HARD_FAULTS - CLUSTER_KINDS - {standby}  # a cluster's: `--cluster multi`
        if k is not FaultKind.RESTART_BROKER or pulsar_broker.restart is not None
    }  # fmt: skip
    assert injected[SHORT_SET[0]] == expected, injected
    assert all(standby.value in injected[seed] for seed in SHORT_SET[1:]), injected
    assert int(str(totals["faults_injected"])) >= 15
    assert int(str(totals["messages"])) > 0
    # the oracle judged every scenario: each published watermark against the log
    assert totals["oracle_scenarios"] == len(SHORT_SET)
    assert int(str(totals["oracle_checked"])) > 0
    assert totals["oracle_premature"] == 0
    assert totals["oracle_stuck"] == 0


def test_a_broker_killed_with_sigkill_and_a_generator_cut_off_lose_nothing_and_publish_nothing_premature(
    pulsar_broker: RunningPulsar, tmp_path: Path
) -> None:
    """One scenario with a `kill -9` of the broker and a cut of the generator's connections (through the
    loopback proxy) past its timeouts, among the usual faults; the checker finds no violation."""
    seed = 5
    assert {f.kind for f in plan_scenario(seed, kill_share=1.0, cut_share=1.0).faults} >= HARD_FAULTS
    with cluster_on(pulsar_broker, tmp_path) as cluster:
        assert cluster.kill_broker is not None and cluster.start_broker is not None
        assert cluster.generator_link is not None
        results = run_many(cluster, [seed], kill_share=1.0, cut_share=1.0)
    violations = [f"seed {r.seed}: {v}" for r in results for v in r.violations]
    assert violations == []
    assert results[0].faults[FaultKind.KILL_BROKER.value] == 1
    assert results[0].faults[FaultKind.CUT_GENERATOR.value] == 1
    assert results[0].messages > 0
