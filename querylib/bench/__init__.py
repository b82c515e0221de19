"""Benchmarks behind `scripts/bench NAME`: each suite measures tq and its baseline in the same run
and prints one JSON object per measurement: {"name", "figures", "baseline", "ratio", ...}."""
