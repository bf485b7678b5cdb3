"""`make bench`: every benchmark in one run against one real cluster; writes docs/BENCHMARKS.md.

`python -m bench spark` (or `client`, `generator`) runs only those; the other figures in
docs/benchmarks.json stay as they were.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from bench import client_throughput, generator, spark
from bench.common import bench_cluster, say, write_results
from devtools.local_cluster import PULSAR_VERSION
from pulsar_access.settings import PulsarSettings

PARTS: dict[str, tuple[str, Callable[[PulsarSettings], dict[str, float | int | str]]]] = {
    "client": ("client throughput (issue 3)", client_throughput.run),
    "generator": ("generator (issue 4)", generator.run),
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
