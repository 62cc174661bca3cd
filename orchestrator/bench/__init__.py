"""The throughput ladder: load the servers at rising stream counts and read what they deliver from their counters."""

from .ladder import BenchSettings, compare, load_ladder, run_ladder

__all__ = ["BenchSettings", "compare", "load_ladder", "run_ladder"]
