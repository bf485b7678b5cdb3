"""A real Spark standalone cluster on loopback (the installed PySpark's Master and Worker), and a query job
run against it in a process of its own (one SparkContext per process: the session's is local[2]).

`python -m tests.integration.spark_cluster MASTER TOPIC SUBSCRIPTION CHECKPOINT WINDOWS` runs the job:
10 s windowed counts per key on the broker watermark, printed as JSON once WINDOWS windows closed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import requests

from devtools.local_cluster import free_port

ROOT = Path(__file__).resolve().parents[2]


class SparkStandalone:
    """`spark-class ...master.Master` and one `...worker.Worker` (2 cores, 1 GB), stopped by their pids."""

    def __init__(self, work_dir: Path) -> None:
        import pyspark

        self.home = Path(pyspark.__file__).parent
        self.work_dir = work_dir
        self.port, self.web_port, self.worker_web_port = free_port(), free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self._processes: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []

    def _start(self, name: str, *args: str) -> None:
        env = {**os.environ, "SPARK_HOME": str(self.home), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}
        log = (self.work_dir / f"{name}.log").open("wb")
        self._logs.append(log)
        command = [str(self.home / "bin" / "spark-class"), *args]
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self._processes.append(process)

    def start(self, timeout_s: float = 120) -> SparkStandalone:
        self._start(
            "master", "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.web_port),
        )  # fmt: skip
        self._start(
            "worker", "org.apache.spark.deploy.worker.Worker", self.url,
            "--host", "127.0.0.1", "--cores", "2", "--memory", "1g", "--webui-port", str(self.worker_web_port),
            "--work-dir", str(self.work_dir / "work"),
        )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.alive_workers() >= 1:
                return self
            if any(process.poll() is not None for process in self._processes):
                break
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"the Spark standalone cluster did not come up; see {self.work_dir}/*.log")

    def alive_workers(self) -> int:
        try:
            state = requests.get(f"http://127.0.0.1:{self.web_port}/json/", timeout=2).json()
        except (requests.RequestException, ValueError):
            return 0
        return int(state.get("aliveworkers", 0))

    def stop(self) -> None:
        for process in reversed(self._processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self._processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        for log in self._logs:
            log.close()


def run_job(master: str, topic: str, subscription: str, checkpoint: Path, windows: int, env: dict[str, str]) -> Any:
    """Run the job in a process of its own; its JSON result ([[window start, key, count], ...])."""
    result = subprocess.run(
        [sys.executable, "-m", "tests.integration.spark_cluster", master, topic, subscription, str(checkpoint),
         str(windows)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **env}, capture_output=True, timeout=600,
    )  # fmt: skip
    lines = result.stdout.decode().strip().splitlines()
    if result.returncode != 0 or not lines:
        raise AssertionError(f"the Spark job failed ({result.returncode}):\n{result.stderr.decode()[-4000:]}")
    return json.loads(lines[-1])


def main(master: str, topic: str, subscription: str, checkpoint: str, windows: int) -> None:
    """The job: executors are the standalone worker's; they run this interpreter with this checkout on
    their path (a real cluster ships the package instead: README, "Spark on a cluster")."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import spark_sink

    spark = (
        SparkSession.builder.master(master)
        .config("spark.pyspark.python", sys.executable)
        .config("spark.executorEnv.PYTHONPATH", str(ROOT))
        .config("spark.executor.memory", "768m")
        .config("spark.cores.max", "2")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    found: list[tuple[int, str, int]] = []

    def collect(df: Any, _batch: int) -> None:
        for row in df.collect():
            found.append((int(row["window"]["start"].timestamp() * 1000), row["key"], int(row["count"])))

    query = (
        spark_sink.read_stream(spark, topic=topic, subscription=subscription)
        .groupBy(F.window("event_time", "10 seconds"), "key").count()
        .writeStream.outputMode("append").foreachBatch(collect)
        .option("checkpointLocation", checkpoint).trigger(processingTime="1 second").start()
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while len(found) < windows and time.monotonic() < deadline and query.exception() is None:
        time.sleep(0.5)
    time.sleep(2)  # a window emitted twice would show now
    query.stop()
    spark.stop()
    print(json.dumps(sorted(found)))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
