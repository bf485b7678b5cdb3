"""The short set of the fault-injection suite (`make chaos` runs the long one): no violation may be found.

Runs last in the session (see conftest): one of its scenarios restarts the session's broker.
"""

from __future__ import annotations

from pathlib import Path

from pulsar_access.admin import PulsarAdmin
from tests.chaos.__main__ import run_many, summary
from tests.chaos.plan import FaultKind, plan_scenario
from tests.chaos.scenario import Cluster, suite_client
from tests.harness import RunningPulsar

SHORT_SET = [60559, 2, 3]
"""Seed 60559 draws every kind of fault, the seeks and resets with consumers attached and the broker
restart included (the restart last)."""


def test_short_fault_injection_set_finds_no_violation(
    pulsar_broker: RunningPulsar, admin: PulsarAdmin, tmp_path: Path
) -> None:
    assert {f.kind for f in plan_scenario(SHORT_SET[0]).faults} == set(FaultKind)
    client = suite_client(pulsar_broker.settings, tmp_path)
    try:
        cluster = Cluster(pulsar_broker.settings, client, admin, tmp_path, pulsar_broker.restart)
        results = run_many(cluster, SHORT_SET, parallel=1)
    finally:
        client.close()
    totals = summary(results, 0.0)
    violations = [f"seed {r.seed}: {v}" for r in results for v in r.violations]
    assert violations == []
    assert totals["scenarios"] == len(SHORT_SET)
    assert int(str(totals["faults_injected"])) >= 15
    assert int(str(totals["messages"])) > 0
