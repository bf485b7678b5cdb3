"""`make chaos`: many randomized fault scenarios on a real local cluster; prints what it injected and found.

    python -m tests.chaos [--scenarios 200] [--seed N] [--only SEED [SEED ...]] [--restart-share 0.04]
                          [--kill-share 0.03] [--cut-share 0.04] [--cluster multi [--brokers 3]] [--record]

Uses the cluster named by PULSAR_SERVICE_URL (then without broker restarts, kills or generator cuts),
else starts its own standalone broker on free ports, the generators reaching it through a loopback
proxy that a cut stalls. With `--cluster multi` it starts a cluster of several brokers of its own
(devtools/broker_cluster.py) and adds a cluster's faults: topics unloaded, moved and split, the owning
broker killed. Exit code 1 if any violation was found; each one names the seed that reproduces its
scenario (`--only SEED`).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import logging
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from devtools.broker_cluster import MultiBrokerCluster
from pulsar_access.admin import PulsarAdmin
from tests.chaos import oracle
from tests.chaos.checker import Violation
from tests.chaos.plan import CUT_SHARE, KILL_SHARE, RESTART_SHARE, plan_scenario
from tests.chaos.scenario import FAILURES, Cluster, ScenarioResult, run_scenario, suite_client
from tests.harness import GENERATOR_LISTENER, RunningPulsar, real_pulsar
from tests.loopback_proxy import GeneratorLink
from tests.oracle import keep_watermark_history

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "chaos.json"
MULTI_KEY = "multi_broker"
"""Where docs/chaos.json keeps the record of a run on several brokers, beside the standalone's."""


def say(message: str) -> None:
    print(f"[chaos] {message}", flush=True)


@contextlib.contextmanager
def chaos_cluster(work: Path, keep_history: bool = True) -> Iterator[Cluster]:
    with real_pulsar(work / "pulsar") as running, cluster_on(running, work, keep_history) as cluster:
        yield cluster


@contextlib.contextmanager
def several_brokers_cluster(work: Path, brokers: int, keep_history: bool = True) -> Iterator[Cluster]:
    """A cluster of `brokers` brokers of the run's own, on free ports; every scenario starts its own generator
    (none of the cluster's), and clients and admin calls get every broker's address."""
    several = MultiBrokerCluster.on_free_ports(work / "cluster", brokers, generators=0)
    try:
        several.up()
        settings = several.settings()
        client = suite_client(settings, work)
        admin = PulsarAdmin(settings)
        try:
            yield Cluster(settings, client, admin, work, keep_history=keep_history, several=several)
        finally:
            client.close()
            admin.close()
    finally:
        several.down()


@contextlib.contextmanager
def cluster_on(running: RunningPulsar, work: Path, keep_history: bool = True) -> Iterator[Cluster]:
    """The suite's view of a running broker: clients, and what it may break (restart, kill, the generators' link)."""
    client = suite_client(running.settings, work)
    admin = PulsarAdmin(running.settings)
    link = (
        GeneratorLink.start(running.settings, running.generator_listener_port, GENERATOR_LISTENER)
        if running.generator_listener_port else None
    )  # fmt: skip
    try:
        yield Cluster(
            running.settings, client, admin, work, running.restart, keep_history=keep_history,
            kill_broker=running.kill, start_broker=running.start, generator_link=link,
        )  # fmt: skip
    finally:
        client.close()
        admin.close()
        if link is not None:
            link.close()


def keep_broker_log(cluster: Cluster, seed: int) -> Path:
    """The broker's log lines about scenario `seed`'s topics (its companion topic's too), and the log's last lines,
    to FAILURES/<seed>/broker.log: a scenario that failed to set up has no generator log to explain it."""
    kept = FAILURES / str(seed)
    kept.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    files = (cluster.log_dir / "pulsar").glob("pulsar.log*")
    for log_file in sorted(files, key=lambda f: (f.name == "pulsar.log", f.name)):  # log4j2's rolled (.1 oldest) first
        with log_file.open(errors="replace") as text:
            lines.extend(text)
    about = f"chaos-{seed}-"
    ours = [line for line in lines if about in line]
    (kept / "broker.log").write_text("".join([*ours, "\n... the log's last 2000 lines:\n", *lines[-2000:]]))
    return kept


def run_many(
    cluster: Cluster,
    seeds: list[int],
    *,
    parallel: int = 1,
    deadline_s: float | None = None,
    verbose: bool = False,
    restart_share: float = RESTART_SHARE,
    kill_share: float = KILL_SHARE,
    cut_share: float = CUT_SHARE,
) -> list[ScenarioResult]:
    """Run the scenarios of `seeds` (`parallel` at a time) in one namespace, printing a line for each.

    Scenarios that run side by side each have their own topic and generator; a broker restart in one
    is an extra, uncounted fault for the others.
    """
    namespace = f"public/chaos-{uuid.uuid4().hex[:8]}"
    cluster.admin.create_namespace(namespace)
    if cluster.keep_history:  # the oracle reads every scenario's whole log
        cluster.admin.set_namespace_retention(namespace)
        keep_watermark_history(cluster.admin)
    results: list[ScenarioResult] = []
    started = time.monotonic()
    lock = threading.Lock()

    def one(seed: int) -> ScenarioResult | None:
        if deadline_s is not None and time.monotonic() - started > deadline_s:
            return None
        plan = plan_scenario(
            seed, broker_restarts=cluster.restart_broker is not None, restart_share=restart_share,
            kill_share=kill_share if cluster.kill_broker is not None else 0.0, cut_share=cut_share,
            generator_cuts=cluster.generator_link is not None, several_brokers=cluster.several is not None,
        )  # fmt: skip
        try:
            result = run_scenario(cluster, plan, namespace)
        except Exception as exc:  # the suite itself failing is a finding too; go on with the others
            logging.getLogger("chaos").exception("scenario %d failed", seed)
            result = ScenarioResult(seed, Counter(), [Violation("scenario-error", "-", repr(exc))], 0, 0.0, 0.0)
            result.notes.append(f"evidence kept in {keep_broker_log(cluster, seed)}")
        with lock:
            results.append(result)
            kinds = ", ".join(f"{n} {k}" for k, n in sorted(result.faults.items()))
            say(
                f"{len(results)}/{len(seeds)} seed {seed}: {sum(result.faults.values())} faults ({kinds}), "
                f"{result.messages} messages, final watermark after {result.recovery_s:.1f} s, "
                f"{oracle.describe(result.oracle)}, {len(result.violations)} violations ({result.duration_s:.1f} s)"
            )
            for violation in result.violations:
                say(f"  VIOLATION {violation}  (reproduce: python -m tests.chaos --only {seed})")
            shown = [n for n in result.notes if "kept" in n or "timed out" in n]
            for note in result.notes if verbose or result.violations else shown:
                say(f"  note: {note}")
        return result

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="scenario")
    try:
        for future in [pool.submit(one, seed) for seed in seeds]:
            future.result()
    finally:  # on SIGTERM or Ctrl-C: finish the running scenarios, start no more
        pool.shutdown(wait=True, cancel_futures=True)
    if len(results) < len(seeds):
        say(f"time budget of {deadline_s:.0f} s spent; ran {len(results)} of {len(seeds)} scenarios")
    return sorted(results, key=lambda r: r.seed)


def summary(results: list[ScenarioResult], elapsed_s: float) -> dict[str, object]:
    faults: Counter[str] = Counter()
    for result in results:
        faults.update(result.faults)
    recoveries = [r.recovery_s for r in results]
    return {
        "scenarios": len(results),
        "faults_injected": sum(faults.values()),
        "faults_by_kind": dict(sorted(faults.items())),
        "violations": sum(len(r.violations) for r in results),
        "messages": sum(r.messages for r in results),
        "final_watermark_after_faults_p50_s": round(statistics.median(recoveries), 2) if recoveries else None,
        "final_watermark_after_faults_max_s": round(max(recoveries), 2) if recoveries else None,
        **oracle.totals(r.oracle for r in results),
        "producer_sends_timed_out": sum("send timed out" in n for r in results for n in r.notes),
        "elapsed_s": round(elapsed_s, 1),
        "seeds": [r.seed for r in results],
    }


def record(totals: dict[str, object], *, several: bool) -> None:
    """Write a run's summary to docs/chaos.json, keeping the other kind of run's record."""
    kept: dict[str, object] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    if several:
        written = {**kept, MULTI_KEY: totals}
    else:
        written = {**totals, **({MULTI_KEY: kept[MULTI_KEY]} if MULTI_KEY in kept else {})}
    RESULTS.write_text(json.dumps(written, indent=2) + "\n")
    say(f"wrote {RESULTS.relative_to(REPO)}" + (f" (under {MULTI_KEY!r})" if several else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", type=int, default=200)
    parser.add_argument("--seed", type=int, default=None, help="first seed (default: random, printed)")
    parser.add_argument("--only", type=int, nargs="+", default=None, help="run just the scenarios of these seeds")
    parser.add_argument("--parallel", type=int, default=2, help="scenarios running side by side (default 2)")
    parser.add_argument("--verbose", action="store_true", help="print each scenario's notes (phase timings)")
    parser.add_argument(
        "--restart-share", type=float, default=RESTART_SHARE,
        help=f"share of scenarios that restart the broker (default {RESTART_SHARE}; 1 stresses restarts)",
    )  # fmt: skip
    parser.add_argument(
        "--kill-share", type=float, default=KILL_SHARE,
        help=f"share of scenarios that kill -9 the broker (default {KILL_SHARE})",
    )  # fmt: skip
    parser.add_argument(
        "--cut-share", type=float, default=CUT_SHARE,
        help=f"share of scenarios that cut the generator off from the broker (default {CUT_SHARE})",
    )  # fmt: skip
    parser.add_argument("--budget-s", type=float, default=None, help="stop starting scenarios after this long")
    parser.add_argument(
        "--no-retention", action="store_true",
        help="no retention on the suite's namespace: Pulsar deletes acknowledged ledgers (as in production "
        "without retention), and the oracle, which needs the whole log, is off",
    )  # fmt: skip
    parser.add_argument(
        "--cluster", choices=["standalone", "multi"], default="standalone",
        help="multi: a cluster of several brokers of the run's own, with a cluster's faults",
    )  # fmt: skip
    parser.add_argument("--brokers", type=int, default=3, help="brokers of a `--cluster multi` run (default 3)")
    parser.add_argument(
        "--record", action="store_true",
        help=f"write the summary to {RESULTS.relative_to(REPO)} (a multi run: under its key {MULTI_KEY!r})",
    )  # fmt: skip
    args = parser.parse_args(argv)
    # `timeout`, `kill`: leave like Ctrl-C does, through the clean-up that stops the suite's broker
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.only is not None:
        seeds = list(args.only)
    else:
        first = args.seed if args.seed is not None else random.randrange(1_000_000)
        seeds = list(range(first, first + args.scenarios))
    say(f"{len(seeds)} scenarios from seed {seeds[0]}")
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="chaos-") as work,
        (
            several_brokers_cluster(Path(work), args.brokers, keep_history=not args.no_retention)
            if args.cluster == "multi"
            else chaos_cluster(Path(work), keep_history=not args.no_retention)
        ) as cluster,
    ):
        if cluster.several is not None:
            say(f"{len(cluster.several.ports)} brokers: topics unloaded, moved and split, the owning broker killed")
        elif cluster.restart_broker is None:
            say("broker restarts off: the cluster is not one this run started")
        results = run_many(
            cluster, seeds, parallel=args.parallel, deadline_s=args.budget_s, verbose=args.verbose,
            restart_share=args.restart_share, kill_share=args.kill_share, cut_share=args.cut_share,
        )  # fmt: skip
    totals = summary(results, time.monotonic() - started)
    say(
        f"scenarios run: {totals['scenarios']}, faults injected: {totals['faults_injected']} "
        f"{totals['faults_by_kind']}, violations found: {totals['violations']}, "
        f"messages: {totals['messages']}, final watermark after the faults: p50 "
        f"{totals['final_watermark_after_faults_p50_s']} s, max {totals['final_watermark_after_faults_max_s']} s, "
        f"in {totals['elapsed_s']:.0f} s"
    )
    say(
        f"oracle: {totals['oracle_checked']} published watermarks checked in {totals['oracle_scenarios']} scenarios: "
        f"{totals['oracle_premature']} premature, {totals['oracle_stuck']} stuck, {totals['oracle_late']} late "
        f"(p50 {totals['oracle_late_p50_ms']} ms, p99 {totals['oracle_late_p99_ms']} ms, "
        f"max {totals['oracle_late_max_ms']} ms below the log's watermark)"
    )
    if args.record:
        record(totals, several=args.cluster == "multi")
    return 1 if totals["violations"] else 0


if __name__ == "__main__":
    code = main()
    # Leave without the interpreter's shutdown: there the client library's threads abort the process
    # ("terminate called without an active exception", exit 134) after the record is written, and `make chaos`
    # reported a failure for a run without violations. Everything of the run is closed and written by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
