"""The engine's latency histograms: plain counts on the hot path, vLLM's buckets, read by ``/metrics`` at scrape
time (:mod:`.metrics`)."""

from __future__ import annotations

import bisect

__all__ = ["E2E_BUCKETS", "ITL_BUCKETS", "TTFT_BUCKETS", "Hist"]

# vLLM's buckets (vllm/v1/metrics/loggers.py) for vllm:time_to_first_token_seconds, ...
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
# ... vllm:inter_token_latency_seconds (one observation per running stream per step, the step's wall time) ...
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
# ... and vllm:e2e_request_latency_seconds (arrival to the last token, of requests that finished).
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)


class Hist:
    """One histogram's plain counts (per bucket, not cumulative; the last is +Inf), read at scrape time."""

    __slots__ = ("bounds", "counts", "n", "total")

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, seconds: float, times: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += times  # first bucket with seconds <= bound
        self.total += seconds * times
        self.n += times

    def cumulative(self) -> list[tuple[str, float]]:
        """Prometheus' buckets: (le, cumulative count), +Inf last."""
        out, acc = [], 0
        for b, k in zip(self.bounds, self.counts, strict=False):
            acc += k
            out.append((repr(float(b)), float(acc)))
        out.append(("+Inf", float(self.n)))
        return out
