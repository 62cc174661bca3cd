"""Server-counted measurement: sample every backend's ``/metrics``, interpolate, sum.

The figures a job or a bench reports come from the servers' own generation-token counters, never from client-side
timing. Pieces:

* counters.py: the counter names of vLLM, SGLang, llama.cpp and TGI (:data:`FAMILIES`); :func:`parse_metrics`
  reads one Prometheus text exposition into :class:`Counters` (summed over label sets), and names the counter
  it found.
* sampler.py: :class:`MetricsSampler` scrapes every backend on one absolute 0.5 s schedule and keeps a time series
  per backend; each round it emits a :class:`~orchestrator.events.MetricsSample`. It remembers which counter each
  backend exposed, and why a backend could not be counted. :meth:`MetricsSampler.counted` gives the
  ``stats.json`` form.
* series.py: :func:`server_counted` / :func:`counter_increase` turn those series into sustained and best-second
  rates, and say which backends the figures cover.
"""

from .counters import (
    FAMILIES,
    GENERATION_METRIC,
    PROMPT_METRIC,
    RUNNING_METRIC,
    WAITING_METRIC,
    Counters,
    ServerFamily,
    metrics_url,
    parse_metrics,
)
from .sampler import MetricsSampler
from .series import Point, counter_increase, server_counted, unavailable

__all__ = [
    "FAMILIES",
    "GENERATION_METRIC",
    "PROMPT_METRIC",
    "RUNNING_METRIC",
    "WAITING_METRIC",
    "Counters",
    "MetricsSampler",
    "Point",
    "ServerFamily",
    "counter_increase",
    "metrics_url",
    "parse_metrics",
    "server_counted",
    "unavailable",
]
