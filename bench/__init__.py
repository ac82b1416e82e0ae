"""Benchmarks of batchserve against its ceiling (the model in-process) and floors (echo servers).

Run from the repository root as modules, e.g. ``python -m bench.run``.
"""
