"""What one ``/metrics`` page says: the counter names of four kinds of server, and the parser that reads them.

Names checked against each server's source (:data:`FAMILIES`):

* vLLM: counter ``vllm:generation_tokens_total`` (advanced every engine step); also read: the KV cache's fill
  ``vllm:kv_cache_usage_perc`` (0..1; ``vllm:gpu_cache_usage_perc`` before vLLM 0.10) and the prefix cache's
  ``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total`` (counters of tokens);
* SGLang: counter ``sglang:generation_tokens_total`` (advanced when a request finishes);
* llama.cpp's ``llama-server --metrics``: counter ``llamacpp:tokens_predicted_total`` (advanced when a slot finishes
  its request; printed with six significant digits, so above a million tokens it moves in steps of 10 or more);
* HF TGI: histogram ``tgi_request_generated_tokens``, whose ``_sum`` is the tokens of every successful request
  (observed when the request finishes).

The sums of servers that count at completion are exact over a window long against one request, and lumpy within
it: their best second is a figure of finished requests, not of decoding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

GENERATION_METRIC = "vllm:generation_tokens_total"
PROMPT_METRIC = "vllm:prompt_tokens_total"
RUNNING_METRIC = "vllm:num_requests_running"
WAITING_METRIC = "vllm:num_requests_waiting"
KV_USAGE_METRIC = "vllm:kv_cache_usage_perc"  # 0..1; vLLM before 0.10 called it vllm:gpu_cache_usage_perc
KV_USAGE_LEGACY = "vllm:gpu_cache_usage_perc"
PREFIX_QUERIES_METRIC = "vllm:prefix_cache_queries_total"  # tokens looked up in the prefix cache ...
PREFIX_HITS_METRIC = "vllm:prefix_cache_hits_total"  # ... and those found there


@dataclass(frozen=True)
class ServerFamily:
    """The metric names one kind of server writes on its /metrics page (None: that server has no such metric)."""

    server: str
    generation_tokens: str  # a counter, or a histogram's ``_sum`` of generated tokens per request
    prompt_tokens: str | None = None
    running: str | None = None
    waiting: str | None = None
    kv_usage: str | None = None  # a gauge, 0..1
    prefix_queries: str | None = None  # counters of tokens
    prefix_hits: str | None = None


# Tried in this order; the first family whose generation counter a page carries is the one read. Sources:
# vllm-project/vllm vllm/v1/metrics/loggers.py; sgl-project/sglang python/sglang/srt/metrics/collector.py
# (TokenizerMetricsCollector, SchedulerMetricsCollector); ggml-org/llama.cpp examples/server/server.cpp
# (handle_metrics: "llamacpp:" + name); huggingface/text-generation-inference router/src/server.rs.
FAMILIES: tuple[ServerFamily, ...] = (
    ServerFamily("vLLM", GENERATION_METRIC, PROMPT_METRIC, RUNNING_METRIC, WAITING_METRIC, KV_USAGE_METRIC,
                 PREFIX_QUERIES_METRIC, PREFIX_HITS_METRIC),
    ServerFamily("SGLang", "sglang:generation_tokens_total", "sglang:prompt_tokens_total",
                 "sglang:num_running_reqs", "sglang:num_queue_reqs"),
    ServerFamily("llama.cpp", "llamacpp:tokens_predicted_total", "llamacpp:prompt_tokens_total",
                 "llamacpp:requests_processing", "llamacpp:requests_deferred"),
    ServerFamily("TGI", "tgi_request_generated_tokens_sum", "tgi_request_input_length_sum",
                 "tgi_batch_current_size", "tgi_queue_size"),
)

_FIELDS = ("generation_tokens", "prompt_tokens", "running", "waiting", "kv_usage", "prefix_queries", "prefix_hits")


def _key(name: str) -> str:
    """One spelling for a metric name's variants.

    Exporters differ: prometheus_client appends ``_total`` to a counter declared without it, and relabelling
    proxies (or OpenTelemetry bridges) write colons as underscores. ``vllm:generation_tokens_total``,
    ``vllm:generation_tokens`` and ``vllm_generation_tokens_total`` all map to ``vllm_generation_tokens``.
    """
    return name.replace(":", "_").removesuffix("_total")


# sample key -> (family index, Counters field)
_SAMPLES: dict[str, tuple[int, str]] = {
    _key(name): (i, f)
    for i, fam in enumerate(FAMILIES)
    for f in _FIELDS
    if (name := getattr(fam, f)) is not None
} | {_key(KV_USAGE_LEGACY): (0, "kv_usage_legacy")}
# HELP/TYPE lines to keep: the samples' own names, and the histogram a ``_sum`` belongs to
_DECLARED: frozenset[str] = frozenset(_SAMPLES) | frozenset(k.removesuffix("_sum") for k in _SAMPLES)

GENERATION_NAMES = ", ".join(f.generation_tokens for f in FAMILIES)
"""The generation-token metrics looked for, for messages."""


@dataclass(frozen=True)
class Counters:
    """What one /metrics scrape says, each value summed over its label sets; None where the metric is absent.

    ``metric`` is the name of the generation-token metric the values came from (as the parser reports it), None
    when the page has none.
    """

    generation_tokens: float | None = None
    prompt_tokens: float | None = None
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None  # the mean over label sets (engines), 0..1
    prefix_queries: float | None = None
    prefix_hits: float | None = None
    metric: str | None = None


def _metric_name(line: str) -> str:
    brace = line.find("{")
    space = line.find(" ")
    end = brace if brace != -1 and (space == -1 or brace < space) else space
    return line[:end] if end != -1 else line


def _relevant_lines(text: str) -> str:
    """Keep only the lines of the metrics we read (and their HELP/TYPE lines).

    A vLLM exposition is hundreds of lines, mostly histogram buckets; the pure-Python parser is the costly part
    of a scrape, so it only sees what we use. Names are matched by :func:`_key`, never by prefix; a histogram
    keeps only its ``_sum`` line.
    """
    keep: list[str] = []
    for line in text.splitlines():
        if not line:
            continue
        if line[0] == "#":
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and _key(parts[2]) in _DECLARED:
                keep.append(line)
            continue
        if _key(_metric_name(line)) in _SAMPLES:
            keep.append(line)
    return "\n".join(keep) + "\n"


def parse_metrics(text: str) -> Counters:
    """Parse a Prometheus text exposition (vLLM's, SGLang's, llama.cpp's or TGI's names) into :class:`Counters`.

    Uses ``prometheus_client.parser.text_string_to_metric_families`` on the relevant lines only. Every value is
    the sum over its label sets (several engines or models behind one server add up). When a page carries more
    than one family, the first of :data:`FAMILIES` with a generation counter wins and every field comes from it
    (a server's gauges are never mixed with another server's counter). Raises ``ValueError`` on text the parser
    rejects.
    """
    sums: dict[tuple[int, str], float] = {}
    seen: dict[tuple[int, str], int] = {}
    names: dict[tuple[int, str], str] = {}
    for family in text_string_to_metric_families(_relevant_lines(text)):
        for sample in family.samples:
            hit = _SAMPLES.get(_key(sample.name))
            if hit is None or math.isnan(sample.value):
                continue
            sums[hit] = sums.get(hit, 0.0) + float(sample.value)
            seen[hit] = seen.get(hit, 0) + 1
            names.setdefault(hit, sample.name)
    present = sorted({i for i, _ in sums})
    if not present:
        return Counters()
    chosen = next((i for i in present if (i, "generation_tokens") in sums), present[0])
    fields = {f: v for (i, f), v in sums.items() if i == chosen}
    for f in ("kv_usage", "kv_usage_legacy"):  # a fill is averaged over engines, never summed past 1
        if f in fields:
            fields[f] /= seen[(chosen, f)]
    legacy = fields.pop("kv_usage_legacy", None)
    if legacy is not None and "kv_usage" not in fields:
        fields["kv_usage"] = legacy
    return Counters(**fields, metric=names.get((chosen, "generation_tokens")))


def metrics_url(base_url: str) -> str:
    """``http://h:p/v1`` -> ``http://h:p/metrics`` (the base URL without its trailing /v1, plus /metrics)."""
    u = base_url.rstrip("/")
    u = u.removesuffix("/v1")
    return u + "/metrics"
