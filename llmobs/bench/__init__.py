"""``llmobs bench``: what a relay in front of an LLM engine costs, against direct and nginx.

A load generator (``stamped_load``) drives N streaming clients against targets started as
processes of their own (``targets``: the simulated engine direct, nginx, llmobs with and
without instrumentation, LiteLLM), round after round, recording each chunk's arrival against
the send stamp the simulated engine wrote into it; ``figures`` turns those into added delays,
and ``report`` into a table, JSON and a plot. ``runner`` holds the plan, ``cli`` the command
line. Not a test: see docs/benchmarks.md for the method and the figures.
"""

from llmobs.bench.cli import add_bench_arguments, run_bench_cli
from llmobs.bench.runner import BenchOptions, BenchResult, run_bench

__all__ = ["BenchOptions", "BenchResult", "add_bench_arguments", "run_bench", "run_bench_cli"]
