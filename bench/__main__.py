"""`make bench`: every benchmark in one run against one real cluster; writes docs/BENCHMARKS.md.

`python -m bench seek` (or any of the GROUPS below) runs only those, merging their figures into
docs/benchmarks.json. `python -m bench snapshot` needs no broker; `multi` starts a cluster of its own.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench import (
    burst,
    client_throughput,
    data_heavy,
    generator,
    generator_bounds,
    generator_scale,
    kill_gap,
    multi_broker,
    plugin_scale,
    reconnect_storm,
    seek,
    spark,
)
from bench.common import bench_cluster, say, write_results
from devtools.local_cluster import PULSAR_VERSION
from pulsar_access.settings import PulsarSettings

Figures = dict[str, float | int | str]


def _generator_scale(settings: PulsarSettings) -> Figures:
    with tempfile.TemporaryDirectory(prefix="wm-bench-scale-") as logs:
        return generator_scale.run(settings, Path(logs))


def _snapshot(_settings: PulsarSettings) -> Figures:
    return generator_bounds.snapshot_figures()


def _plugin(settings: PulsarSettings) -> Figures:
    with tempfile.TemporaryDirectory(prefix="wm-bench-plugin-") as logs:
        return plugin_scale.run(settings, Path(os.environ.get("WM_BENCH_LOGS") or logs))


def _kill(settings: PulsarSettings) -> Figures:
    with tempfile.TemporaryDirectory(prefix="wm-bench-kill-") as logs:
        return kill_gap.run(settings, Path(os.environ.get("WM_BENCH_LOGS") or logs))


def _burst(settings: PulsarSettings) -> Figures:
    with tempfile.TemporaryDirectory(prefix="wm-bench-burst-") as logs:
        return burst.run(settings, Path(os.environ.get("WM_BENCH_LOGS") or logs))


GROUPS: dict[str, tuple[str, Callable[[PulsarSettings], Figures]]] = {
    "client": ("client throughput (issue 3)", client_throughput.run),
    "generator": ("generator (issue 4)", generator.run),
    "scale": ("generator at scale (issue 13)", _generator_scale),
    "spark": ("Spark (issues 5 and 14)", spark.run),
    "seek": ("seeks with consumers attached (issue 16)", seek.run),
    "multi": ("a three-broker cluster (issue 24)", multi_broker.run),
    "sink": ("the Spark sink, exactly once (issue 28)", spark.run_sink),
    "burst": (
        "many topics: markers due together, late acknowledgements, with the plugin and without (issues 27, 33)",
        _burst,
    ),
    "plugin": ("5000 topics and a new topic's first watermark, with the broker plugin (issue 33)", _plugin),
    "storm": (
        "a reconnect storm: producers at once on topics no generator follows, a broker with the plugin and one "
        "without (issue 46)",
        reconnect_storm.run,
    ),
    "heavy": (
        "a data-heavy topic: the generator's and the broker's CPU per 1000 data messages, markers found by the "
        "plugin's intake, by the consumer, and without the plugin (issue 47)",
        data_heavy.run,
    ),
    "kill": ("the watermark gap when the owning generator is killed -9 at 1000 topics (issue 47)", _kill),
    "bounds": ("an abandoned subscription's memory (issue 26)", generator_bounds.abandoned_subscription_figures),
    "snapshot": ("snapshot size with producers coming and going (issue 26)", _snapshot),
}
OWN_CLUSTER = {"multi", "storm"}
"""Groups that start a cluster of their own."""
NO_BROKER = {"snapshot"}
"""Groups measured on the pure side only: run alone, they start no cluster."""


def main(argv: list[str] | None = None) -> None:
    chosen = (sys.argv[1:] if argv is None else argv) or list(GROUPS)
    unknown = [name for name in chosen if name not in GROUPS]
    if unknown:
        raise SystemExit(f"unknown benchmark {unknown}; choose from {', '.join(GROUPS)}")
    figures: Figures = {"pulsar_version": PULSAR_VERSION}
    on_standalone = [name for name in chosen if name not in OWN_CLUSTER | NO_BROKER]
    if on_standalone:
        with bench_cluster() as settings:
            for name in on_standalone:
                title, run = GROUPS[name]
                say(title)
                figures.update(run(settings))
    for name in chosen:
        if name in OWN_CLUSTER | NO_BROKER:
            title, run = GROUPS[name]
            say(title)
            figures.update(run(PulsarSettings.from_env()))
    write_results(figures)
    for key, value in figures.items():
        if not key.endswith("_how"):
            say(f"{key} = {value}")


if __name__ == "__main__":
    main()
