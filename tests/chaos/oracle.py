"""The oracle in the fault suite: every watermark a scenario's generator published, against the log.

`tests/oracle.py` does the judging; this module runs it at the end of a scenario, turns what the
contract forbids (premature and stuck watermarks) into the suite's violations, and totals the
reports of a run for `docs/chaos.json`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import pulsar

from pulsar_access.admin import AdminError, BrokerUnreachable, PulsarAdmin
from pulsar_access.readers import NotAnswered
from tests.chaos.checker import Violation
from tests.oracle import OracleReport, TopicOracle, percentile
from watermark_core.state import WatermarkConfig

SETTLE_S = 30.0
"""How long the generator may still take, after the final watermark arrived, to publish the fold at
every subscription's final position before the subscription counts as stuck."""
BROKER_BACK_S = 90.0
"""How long the oracle waits for the admin API to answer for the topic again: after another scenario's `kill -9` of
a broker, the dead broker still owns its bundles until its metadata session expires and the broker restarts, and
admin calls about those topics are redirected to it (session 19, seed 476538)."""


def judge_scenario(
    client: pulsar.Client, admin: PulsarAdmin, topic: str, config: WatermarkConfig
) -> tuple[OracleReport, list[Violation]]:
    """The oracle's report on `topic` (its namespace keeps every message), and its violations."""
    give_up_at = time.monotonic() + BROKER_BACK_S
    while True:
        try:
            report = TopicOracle(client, admin, topic, config).check(SETTLE_S)
            break
        except (BrokerUnreachable, NotAnswered, AdminError) as exc:  # an admin call, a reader's question for more
            if time.monotonic() > give_up_at or not _transient(exc):
                raise
            time.sleep(2.0)  # the check only reads: asked again whole once the topic's broker answers
    violations = [Violation(f"oracle-{f.kind}", f.subscription, str(f)) for f in report.premature + report.stuck]
    return report, violations


def _transient(exc: Exception) -> bool:
    """Whether the oracle may ask again: the topic's broker does not answer, or is not its owner yet (a 412 "Can't
    find owner for topic" from a standalone just started again after a `kill -9`, session 20, seed 643656)."""
    return not isinstance(exc, AdminError) or isinstance(exc, BrokerUnreachable) or exc.status == 412


def describe(report: OracleReport | None) -> str:
    """One line for the suite's progress output."""
    if report is None:
        return "oracle off"
    late = report.late_ms()
    return (
        f"oracle: {report.checked} checked, {len(report.premature)} premature, {len(report.late)} late"
        + (f" (max {max(late)} ms)" if late else "")
        + f", {len(report.stuck)} stuck"
    )


def totals(reports: Iterable[OracleReport | None]) -> dict[str, int | None]:
    """The run's oracle numbers: events checked, premature, late (with how late, in event-time ms), stuck."""
    judged = [r for r in reports if r is not None]
    late = [ms for report in judged for ms in report.late_ms()]
    return {
        "oracle_scenarios": len(judged),
        "oracle_checked": sum(r.checked for r in judged),
        "oracle_premature": sum(len(r.premature) for r in judged),
        "oracle_late": sum(len(r.late) for r in judged),
        "oracle_late_p50_ms": percentile(late, 50),
        "oracle_late_p99_ms": percentile(late, 99),
        "oracle_late_max_ms": max(late) if late else None,
        "oracle_stuck": sum(len(r.stuck) for r in judged),
    }
