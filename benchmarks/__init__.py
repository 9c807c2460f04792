"""Benchmarks of the training core, run as modules from the repository root:
``python -m benchmarks.bench_overhead`` (see README.md here). Not part of the installed package."""
