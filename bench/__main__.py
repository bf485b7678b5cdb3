"""`make bench`: every benchmark in one run against one real cluster; writes docs/BENCHMARKS.md."""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench import client_throughput, generator, generator_scale, spark
from bench.common import bench_cluster, say, write_results
from devtools.local_cluster import PULSAR_VERSION


def main() -> None:
    with bench_cluster() as settings:
        figures: dict[str, float | int | str] = {"pulsar_version": PULSAR_VERSION}
        say("client throughput (issue 3)")
        figures.update(client_throughput.run(settings))
        say("generator (issue 4)")
        figures.update(generator.run(settings))
        say("generator at scale (issue 13)")
        with tempfile.TemporaryDirectory(prefix="wm-bench-scale-") as logs:
            figures.update(generator_scale.run(settings, Path(logs)))
        say("Spark (issue 5)")
        figures.update(spark.run(settings))
        write_results(figures)
    for key, value in figures.items():
        if not key.endswith("_how"):
            say(f"{key} = {value}")


if __name__ == "__main__":
    main()
