"""Benchmarks, each run from the repository root as `python -m scripts.bench.<name>` (the
launchers scripts/bench_receiver, bench_fleet and bench_worker do that under .venv)."""
