"""Benchmarks: `make bench` measures ratios in one run and writes docs/BENCHMARKS.md."""
