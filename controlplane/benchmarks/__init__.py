"""Benchmarks behind `canary bench NAME`: each module has `run(*, quick, progress) -> dict`."""
