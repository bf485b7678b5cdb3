"""The benchmarks' generator process: one that died is reported at once, not waited for."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.generator import Generator


def _ended(tmp_path: Path, code: int) -> Generator:
    """A `Generator` whose process has ended with `code` (the benchmarks' own class, around a process that exits)."""
    generator = Generator.__new__(Generator)
    generator.metrics_port = 9  # the discard port: nothing answers there, as with a generator that is gone
    generator.log = (tmp_path / "generator.log").open("wb")
    generator.proc = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
    generator.proc.wait()
    return generator


def test_waiting_for_a_generator_that_died_raises_with_its_exit_code_and_log(tmp_path: Path) -> None:
    generator = _ended(tmp_path, 3)
    with pytest.raises(RuntimeError, match=r"exited with 3.*generator\.log"):
        generator.wait_published(1, within_s=600)
    generator.log.close()


def test_the_generators_hot_path_stand_in_publishes_every_topics_last_watermark() -> None:
    """`python -m bench.generator_hot_path` times the real generator with no broker: it must still be doing the work
    (each topic's last `W_SET` published), or its figure means nothing."""
    from bench.generator_hot_path import TOPICS, main

    assert main(["3"]) == TOPICS
