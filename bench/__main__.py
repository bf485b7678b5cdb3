"""Placeholder until the first benchmarks land."""

print("no benchmarks yet")
