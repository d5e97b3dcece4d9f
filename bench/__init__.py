"""Mujou's benchmarks: ``python bench/run.py`` (see bench/RESULTS.md)."""
