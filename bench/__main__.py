"""`make bench`: every benchmark in one run against one real cluster; writes docs/BENCHMARKS.md.

`python -m bench spark` (or `client`, `generator`, `scale`) runs only those; the other figures in
docs/benchmarks.json stay as they were.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench import client_throughput, generator, generator_scale, spark
from bench.common import bench_cluster, say, write_results
from devtools.local_cluster import PULSAR_VERSION
from pulsar_access.settings import PulsarSettings

Figures = dict[str, float | int | str]


def _generator_scale(settings: PulsarSettings) -> Figures:
    with tempfile.TemporaryDirectory(prefix="wm-bench-scale-") as logs:
        return generator_scale.run(settings, Path(logs))


PARTS: dict[str, tuple[str, Callable[[PulsarSettings], Figures]]] = {
    "client": ("client throughput (issue 3)", client_throughput.run),
    "generator": ("generator (issue 4)", generator.run),
    "scale": ("generator at scale (issue 13)", _generator_scale),
    "spark": ("Spark (issues 5 and 14)", spark.run),
}


def main() -> None:
    wanted = sys.argv[1:] or list(PARTS)
    unknown = [name for name in wanted if name not in PARTS]
    if unknown:
        sys.exit(f"unknown benchmark {unknown[0]!r}; choose from {', '.join(PARTS)}")
    with bench_cluster() as settings:
        figures: dict[str, float | int | str] = {"pulsar_version": PULSAR_VERSION}
        for name in wanted:
            title, run = PARTS[name]
            say(title)
            figures.update(run(settings))
        write_results(figures)
    for key, value in figures.items():
        if not key.endswith("_how"):
            say(f"{key} = {value}")


if __name__ == "__main__":
    main()
