"""The card's ``/metrics``: Prometheus text under vLLM's metric names, read from the card's plain counters."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from .engine import Engine


class _ModelConfig(Protocol):
    @property
    def model(self) -> str: ...


class CardView(Protocol):
    """What the metrics read of a card (server.Card is one): a Protocol, so that this module needs nothing of the
    server's, which serves them (no import cycle)."""

    @property
    def cfg(self) -> _ModelConfig: ...
    @property
    def engine(self) -> Engine: ...
    @property
    def finished(self) -> dict[str, int]: ...

__all__ = ["CardMetrics"]


class _Collector(Collector):
    """Reads the card's plain integers at scrape time: nothing on the hot path touches prometheus_client."""

    def __init__(self, card: CardView):
        self.card = card

    def collect(self) -> Iterator[Metric]:
        c = self.card
        e = c.engine
        labels = ["model_name"]
        val = [c.cfg.model]
        g = CounterMetricFamily("vllm:generation_tokens", "Number of generation tokens processed.", labels=labels)
        g.add_metric(val, float(e.generation_tokens))
        yield g
        p = CounterMetricFamily("vllm:prompt_tokens", "Number of prefill tokens processed.", labels=labels)
        p.add_metric(val, float(e.prompt_tokens))
        yield p
        r = GaugeMetricFamily("vllm:num_requests_running", "Number of requests in model execution batches.",
                              labels=labels)
        r.add_metric(val, float(e.running))
        yield r
        w = GaugeMetricFamily("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                              labels=labels)
        w.add_metric(val, float(e.num_waiting))
        yield w
        kv = GaugeMetricFamily("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                               labels=labels)
        kv.add_metric(val, e.kv_used / e.cfg.kv_tokens if e.cfg.kv_tokens else 0.0)
        yield kv
        q = CounterMetricFamily("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried "
                                "tokens.", labels=labels)
        q.add_metric(val, float(e.prefix_queries))  # every admitted prompt token is looked up ...
        yield q
        hit = CounterMetricFamily("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached "
                                  "tokens.", labels=labels)
        hit.add_metric(val, float(e.prefix_hits))  # ... and these were found (0 with --no-prefix-caching)
        yield hit
        s = CounterMetricFamily("vllm:request_success", "Count of successfully processed requests.",
                                labels=["model_name", "finished_reason"])
        s.add_metric([c.cfg.model, "stop"], float(c.finished["stop"]))
        s.add_metric([c.cfg.model, "length"], float(c.finished["length"]))
        yield s
        for name, about, hist in (
            ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", e.ttft),
            ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", e.itl),
            ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", e.e2e),
        ):
            h = HistogramMetricFamily(name, about, labels=labels)
            h.add_metric(val, hist.cumulative(), hist.total)
            yield h


class CardMetrics:
    """The registry of one card, scraped on demand."""

    def __init__(self, card: CardView):
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(card))

    def text(self) -> bytes:
        return generate_latest(self.registry)
