"""orchestrator.metrics: parsing vLLM's, SGLang's, llama.cpp's and TGI's /metrics, the interpolation and sum math,
coverage (which backends a figure covers), a live sampler; and the report's honest labels and warnings."""

from __future__ import annotations

import math
import time

import aiohttp
import anyio
import pytest
from aiohttp import web

from orchestrator.core.events import MetricsSample
from orchestrator.core.osutil import free_port
from orchestrator.core.reply import Reply
from orchestrator.metrics import (
    Counters,
    MetricsSampler,
    counter_increase,
    metrics_url,
    parse_metrics,
    server_counted,
)

pytestmark = pytest.mark.anyio


# A /metrics page shaped like vLLM's (v1 engine, prometheus_client exposition): HELP/TYPE lines, labels with
# model_name and engine, counters with _total and _created, histograms with many buckets, and look-alike names
# that must not be mistaken for the four we read.
VLLM_TEXT = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12034.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3.8-27B-NVFP4"} 250.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen3.8-27B-NVFP4"} 6.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3.8-27B-NVFP4"} 3.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen3.8-27B-NVFP4"} 0.0
# HELP vllm:num_requests_waiting_by_reason Number of requests waiting, by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="Qwen/Qwen3.8-27B-NVFP4",reason="capacity"} 99.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3.8-27B-NVFP4"} 0.828
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="Qwen/Qwen3.8-27B-NVFP4"} 73728.0
vllm:prompt_tokens_total{engine="1",model_name="Qwen/Qwen3.8-27B-NVFP4"} 1000.0
# HELP vllm:prompt_tokens_created Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_created gauge
vllm:prompt_tokens_created{engine="0",model_name="Qwen/Qwen3.8-27B-NVFP4"} 1.7647e+09
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="Qwen/Qwen3.8-27B-NVFP4"} 629303.0
vllm:generation_tokens_total{engine="1",model_name="Qwen/Qwen3.8-27B-NVFP4"} 697.0
# HELP vllm:generation_tokens_created Number of generation tokens processed.
# TYPE vllm:generation_tokens_created gauge
vllm:generation_tokens_created{engine="0",model_name="Qwen/Qwen3.8-27B-NVFP4"} 1.7647e+09
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="Qwen/Qwen3.8-27B-NVFP4"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.005",model_name="Qwen/Qwen3.8-27B-NVFP4"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.02",model_name="Qwen/Qwen3.8-27B-NVFP4"} 12.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="Qwen/Qwen3.8-27B-NVFP4"} 900.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0",model_name="Qwen/Qwen3.8-27B-NVFP4"} 1600.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3.8-27B-NVFP4"} 1641.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="Qwen/Qwen3.8-27B-NVFP4"} 1641.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="Qwen/Qwen3.8-27B-NVFP4"} 412.5
# HELP vllm:request_generation_tokens Number of generation tokens processed.
# TYPE vllm:request_generation_tokens histogram
vllm:request_generation_tokens_bucket{engine="0",le="1.0",model_name="Qwen/Qwen3.8-27B-NVFP4"} 0.0
vllm:request_generation_tokens_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3.8-27B-NVFP4"} 1641.0
vllm:request_generation_tokens_count{engine="0",model_name="Qwen/Qwen3.8-27B-NVFP4"} 1641.0
vllm:request_generation_tokens_sum{engine="0",model_name="Qwen/Qwen3.8-27B-NVFP4"} 629303.0
"""


# SGLang (python/sglang/srt/metrics/collector.py): prometheus_client metrics named "sglang:..."; the tokenizer
# manager's counters sglang:prompt_tokens_total / sglang:generation_tokens_total (incremented when a request
# finishes), the scheduler's gauges sglang:num_running_reqs / sglang:num_queue_reqs, and look-alikes
# (sglang:gen_throughput, sglang:generation_tokens_histogram, sglang:cached_tokens_total) that must not be read.
SGLANG_TEXT = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="meta-llama/Llama-3.1-8B-Instruct"} 61.0
# HELP sglang:num_used_tokens The number of used tokens.
# TYPE sglang:num_used_tokens gauge
sglang:num_used_tokens{engine_type="unified",model_name="meta-llama/Llama-3.1-8B-Instruct"} 123765.0
# HELP sglang:gen_throughput The generation throughput (token/s).
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{engine_type="unified",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2812.5
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 8.128902e+06
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.557572e+06
# HELP sglang:generation_tokens_histogram Histogram of generation token length.
# TYPE sglang:generation_tokens_histogram histogram
sglang:generation_tokens_histogram_bucket{le="100.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 12.0
sglang:generation_tokens_histogram_bucket{le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 9100.0
sglang:generation_tokens_histogram_count{model_name="meta-llama/Llama-3.1-8B-Instruct"} 9100.0
sglang:generation_tokens_histogram_sum{model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.557572e+06
# HELP sglang:cached_tokens_total Number of cached prompt tokens.
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 5.1e+06
# HELP sglang:num_requests_total Number of requests processed.
# TYPE sglang:num_requests_total counter
sglang:num_requests_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 9100.0
"""

# llama.cpp's llama-server --metrics (examples/server/server.cpp, handle_metrics): every metric is written as
# "# HELP llamacpp:<name>", "# TYPE llamacpp:<name> <type>", "llamacpp:<name> <value>", no labels, the value
# streamed as a C++ double: six significant digits, so large counters come out as 1.23457e+06. Look-alikes:
# llamacpp:prompt_tokens_seconds, llamacpp:tokens_predicted_seconds_total, llamacpp:predicted_tokens_seconds.
LLAMACPP_TEXT = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 1.10591e+06
# HELP llamacpp:prompt_seconds_total Prompt process time
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 301.417
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 1.23457e+06
# HELP llamacpp:tokens_predicted_seconds_total Predict process time
# TYPE llamacpp:tokens_predicted_seconds_total counter
llamacpp:tokens_predicted_seconds_total 9876.54
# HELP llamacpp:n_decode_total Total number of llama_decode() calls
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total 48211
# HELP llamacpp:n_busy_slots_per_decode Average number of busy slots per llama_decode() call
# TYPE llamacpp:n_busy_slots_per_decode counter
llamacpp:n_busy_slots_per_decode 3.51
# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s.
# TYPE llamacpp:prompt_tokens_seconds gauge
llamacpp:prompt_tokens_seconds 3669.05
# HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s.
# TYPE llamacpp:predicted_tokens_seconds gauge
llamacpp:predicted_tokens_seconds 124.995
# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.41
# HELP llamacpp:kv_cache_tokens KV-cache tokens.
# TYPE llamacpp:kv_cache_tokens gauge
llamacpp:kv_cache_tokens 13421
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 4
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 2
"""

# HF TGI (router/src/server.rs, rendered by metrics-exporter-prometheus): no token counter, but the histogram
# tgi_request_generated_tokens observed once per successful request; its _sum is the tokens generated. Gauges
# tgi_batch_current_size (running) and tgi_queue_size (waiting); look-alikes tgi_request_max_new_tokens and
# tgi_request_generated_tokens_count / _bucket.
TGI_TEXT = """\
# HELP tgi_request_count Total number of requests
# TYPE tgi_request_count counter
tgi_request_count 1523
# HELP tgi_request_success Number of successful requests
# TYPE tgi_request_success counter
tgi_request_success 1519
# HELP tgi_batch_current_size Current batch size
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 32
# HELP tgi_queue_size Current queue size
# TYPE tgi_queue_size gauge
tgi_queue_size 3
# HELP tgi_request_generated_tokens Generated tokens per request
# TYPE tgi_request_generated_tokens histogram
tgi_request_generated_tokens_bucket{le="40.96"} 12
tgi_request_generated_tokens_bucket{le="81.92"} 230
tgi_request_generated_tokens_bucket{le="+Inf"} 1519
tgi_request_generated_tokens_sum 602311
tgi_request_generated_tokens_count 1519
# HELP tgi_request_input_length Input prompt length
# TYPE tgi_request_input_length histogram
tgi_request_input_length_bucket{le="40.96"} 0
tgi_request_input_length_bucket{le="+Inf"} 1523
tgi_request_input_length_sum 91380
tgi_request_input_length_count 1523
# HELP tgi_request_max_new_tokens Maximum new tokens per request
# TYPE tgi_request_max_new_tokens histogram
tgi_request_max_new_tokens_bucket{le="+Inf"} 1523
tgi_request_max_new_tokens_sum 779776
tgi_request_max_new_tokens_count 1523
"""


# ------------------------------------------------------------------------------------------------ parsing


def test_parse_vllm_text_sums_label_sets():
    c = parse_metrics(VLLM_TEXT)
    assert c == Counters(generation_tokens=630000.0, prompt_tokens=74728.0, running=256.0, waiting=3.0,
                         metric="vllm:generation_tokens_total")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (SGLANG_TEXT, Counters(generation_tokens=7557572.0, prompt_tokens=8128902.0, running=61.0, waiting=4.0,
                               metric="sglang:generation_tokens_total")),
        (LLAMACPP_TEXT, Counters(generation_tokens=1234570.0, prompt_tokens=1105910.0, running=4.0, waiting=2.0,
                                 metric="llamacpp:tokens_predicted_total")),
        (TGI_TEXT, Counters(generation_tokens=602311.0, prompt_tokens=91380.0, running=32.0, waiting=3.0,
                            metric="tgi_request_generated_tokens_sum")),
    ],
    ids=["sglang", "llama.cpp", "tgi"],
)
def test_parse_other_servers(text, expected):
    assert parse_metrics(text) == expected


def test_parse_name_variants():
    # a counter declared without _total (prometheus_client's parser appends it to the samples)
    text = '# TYPE vllm:generation_tokens counter\nvllm:generation_tokens{engine="0"} 40\n'
    assert parse_metrics(text).generation_tokens == 40.0
    # colons written as underscores (a relabelling proxy), with and without HELP/TYPE lines
    text = "# TYPE llamacpp_tokens_predicted_total counter\nllamacpp_tokens_predicted_total 12\n"
    c = parse_metrics(text)
    assert c.generation_tokens == 12.0 and c.metric == "llamacpp_tokens_predicted_total"
    assert parse_metrics('sglang_generation_tokens_total{model_name="m"} 7\n').generation_tokens == 7.0
    # a histogram is read by its _sum alone; its _count and buckets are not tokens
    text = "tgi_request_generated_tokens_count 3\ntgi_request_generated_tokens_sum 300\n"
    assert parse_metrics(text).generation_tokens == 300.0


def test_one_family_per_page_and_never_mixed():
    # a page with a vLLM counter and another server's gauges reads vLLM's counter and vLLM's gauges only
    text = VLLM_TEXT + "tgi_queue_size 99\nsglang:num_running_reqs 77\n"
    c = parse_metrics(text)
    assert (c.metric, c.running, c.waiting) == ("vllm:generation_tokens_total", 256.0, 3.0)
    # a page with only gauges has no counter and names none
    c = parse_metrics("llamacpp:requests_processing 2\nllamacpp:requests_deferred 1\n")
    assert c == Counters(running=2.0, waiting=1.0)


def test_parse_absent_metrics_are_none():
    text = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 2\n"
    assert parse_metrics(text) == Counters(running=2.0)
    assert parse_metrics("") == Counters()
    # a server that is none of the four
    assert parse_metrics("# TYPE http_requests_total counter\nhttp_requests_total 5\n") == Counters()


def test_parse_without_help_and_type_lines():
    text = 'vllm:generation_tokens_total{model_name="m"} 10\nvllm:generation_tokens_total{model_name="n"} 5\n'
    assert parse_metrics(text).generation_tokens == 15.0


def test_parse_rejects_garbage():
    with pytest.raises(ValueError):
        parse_metrics("vllm:generation_tokens_total{model_name=\"m\" 10 oops\n")


def test_metrics_url():
    assert metrics_url("http://gpu1:8000/v1") == "http://gpu1:8000/metrics"
    assert metrics_url("http://gpu1:8000/v1/") == "http://gpu1:8000/metrics"
    assert metrics_url("https://h/proxy/v1") == "https://h/proxy/metrics"


# ------------------------------------------------------------------------------------------ series math


def linear(rate: float, t_start: float, t_end: float, step: float = 0.5, phase: float = 0.0, v0: float = 0.0):
    pts = []
    t = t_start + phase
    while t <= t_end + 1e-9:
        pts.append((t, v0 + rate * (t - t_start), 1.0, 0.0))
        t += step
    return pts


def test_constant_rate_one_backend():
    s = {"a": linear(100.0, 0.0, 10.0)}
    r = server_counted(s, 1.0, 9.0)
    assert r is not None
    assert r["sustained_tok_s"] == pytest.approx(100.0)
    assert r["best_second_tok_s"] == pytest.approx(100.0)
    assert r["metric"] == "vllm:generation_tokens_total"
    assert counter_increase(s, 1.0, 9.0) == pytest.approx(800.0)


def test_two_backends_offset_sample_times_sum():
    # same absolute schedule in principle, but each server answers a little later: sample times differ
    s = {"a": linear(100.0, 0.0, 10.0, phase=0.013), "b": linear(250.0, 0.0, 10.0, phase=0.071)}
    r = server_counted(s, 2.0, 8.0)
    assert r["sustained_tok_s"] == pytest.approx(350.0)
    assert r["best_second_tok_s"] == pytest.approx(350.0)


def bursty(burst_at: float, base: float, burst: float, t_end: float = 10.0):
    """A counter rising at ``base`` tok/s with an extra ``burst`` tokens spread over [burst_at, burst_at + 1]."""
    pts = []
    for i in range(int(t_end / 0.5) + 1):
        t = i * 0.5
        v = base * t + burst * min(1.0, max(0.0, t - burst_at))
        pts.append((t, v, None, None))
    return pts


def test_best_second_is_a_simultaneous_peak_not_a_sum_of_peaks():
    # a peaks in [2, 3], b peaks in [6, 7]: each has a best second of 100 + 50, but never at the same time
    s = {"a": bursty(2.0, 100.0, 50.0), "b": bursty(6.0, 100.0, 50.0)}
    r = server_counted(s, 0.0, 10.0)
    assert r["sustained_tok_s"] == pytest.approx((2000 + 100) / 10)
    assert r["best_second_tok_s"] == pytest.approx(250.0)  # 150 + 100, not 150 + 150
    # aligned peaks do add up
    s = {"a": bursty(4.0, 100.0, 50.0), "b": bursty(4.0, 100.0, 50.0)}
    assert server_counted(s, 0.0, 10.0)["best_second_tok_s"] == pytest.approx(300.0)


def test_best_second_found_between_sample_times():
    # samples at 0.5 s on a; b samples at a different phase: the best 1 s span starts at neither's sample time
    a = [(t * 0.5, 0.0 if t * 0.5 < 3.0 else 100.0 * min(1.0, (t * 0.5 - 3.0) / 0.5), None, None) for t in range(21)]
    b = [(0.25 + t * 0.5, 0.0, None, None) for t in range(20)]
    r = server_counted({"a": a, "b": b}, 0.0, 9.75)
    assert r["best_second_tok_s"] == pytest.approx(100.0)
    assert r["sustained_tok_s"] == pytest.approx(100.0 / 9.75)


def test_best_second_matches_a_brute_force_scan():
    import bisect
    import random

    rng = random.Random(7)
    series = {}
    for name in ("a", "b", "c"):
        t, v, pts = rng.uniform(0, 0.5), 0.0, []
        while t < 12.0:
            pts.append((t, v, None, None))
            t += rng.uniform(0.3, 0.7)  # jittered, different per server
            v += rng.choice([0.0, 10.0, 80.0, 300.0])
        series[name] = pts

    def at(pts, t):
        ts = [p[0] for p in pts]
        if t <= ts[0]:
            return pts[0][1]
        if t >= ts[-1]:
            return pts[-1][1]
        i = bisect.bisect_right(ts, t)
        (ta, va), (tb, vb) = pts[i - 1][:2], pts[i][:2]
        return va + (vb - va) * (t - ta) / (tb - ta)

    t0, t1 = 1.0, 11.0
    total = lambda t: sum(at(p, t) for p in series.values())
    brute = max(total(t0 + k * 0.001 + 1.0) - total(t0 + k * 0.001) for k in range(int((t1 - t0 - 1.0) / 0.001) + 1))
    r = server_counted(series, t0, t1)
    assert r["best_second_tok_s"] == pytest.approx(brute, rel=1e-3)
    assert r["best_second_tok_s"] >= brute - 1e-9
    assert r["sustained_tok_s"] == pytest.approx((total(t1) - total(t0)) / (t1 - t0))


def test_gap_is_bridged_and_reset_is_stitched():
    pts = linear(100.0, 0.0, 10.0)
    pts = [p for p in pts if not 3.0 < p[0] < 5.0]  # failed scrapes: a gap
    assert server_counted({"a": pts}, 1.0, 9.0)["sustained_tok_s"] == pytest.approx(100.0)
    # restart at t=5: the counter starts again from zero and climbs at the same rate
    times = [i * 0.5 for i in range(21)]
    restarted = [(t, (100.0 * t) if t < 5 else 100.0 * (t - 5), None, None) for t in times]
    r = server_counted({"a": restarted}, 0.0, 10.0)
    # the step 4.5 -> 5.0 drops to 0: counted as "0 new tokens" (Prometheus increase semantics)
    assert r["sustained_tok_s"] == pytest.approx((450.0 + 500.0) / 10.0)
    assert r["best_second_tok_s"] == pytest.approx(100.0)


def test_window_shorter_than_one_second():
    s = {"a": linear(100.0, 0.0, 10.0)}
    r = server_counted(s, 2.0, 2.6)
    assert r["sustained_tok_s"] == pytest.approx(100.0)
    assert r["best_second_tok_s"] == r["sustained_tok_s"]


def test_best_second_never_below_sustained():
    # contrived: work only at both ends of a 1.5 s window; no 1 s span holds the average
    pts = [(0.0, 0.0, None, None), (0.25, 50.0, None, None), (1.25, 50.0, None, None),
           (1.5, 100.0, None, None)]
    r = server_counted({"a": pts}, 0.0, 1.5)
    assert r["best_second_tok_s"] >= r["sustained_tok_s"]


def test_no_counter_gives_none():
    assert server_counted({}, 0.0, 10.0) is None
    assert server_counted({"a": []}, 0.0, 10.0) is None
    assert server_counted({"a": [(0.0, None, 1.0, 0.0), (1.0, None, 1.0, 0.0)]}, 0.0, 1.0) is None
    assert server_counted({"a": linear(1.0, 0.0, 5.0)}, 3.0, 3.0) is None
    assert counter_increase({}, 0.0, 1.0) == 0.0


def test_window_clipped_to_observed_span():
    s = {"a": linear(100.0, 2.0, 6.0)}  # the sampler only ran from 2 to 6
    r = server_counted(s, 0.0, 10.0)
    assert r["sustained_tok_s"] == pytest.approx(100.0)


def test_a_backend_without_counter_is_named_not_hidden():
    # b answers /metrics but has no token counter: the figures are a's alone, and say so
    s = {"a": linear(100.0, 0.0, 10.0), "b": [(t, None, 3.0, 0.0) for t in range(11)]}
    r = server_counted(s, 1.0, 9.0, metric="x", reasons={"b": "no counter here"})
    assert r["sustained_tok_s"] == pytest.approx(100.0)  # the covered part only ...
    assert r["covered_backends"] == ["a"]  # ... and which part that is
    assert r["uncovered_backends"] == [{"url": "b", "reason": "no counter here"}]
    assert r["covered_share"] == 0.5
    assert r["metric"] == "x" and r["metric_by_backend"] == {"a": "x"}
    # without a reason given, the uncovered backend is still listed
    r = server_counted(s, 1.0, 9.0)
    assert [b["url"] for b in r["uncovered_backends"]] == ["b"] and r["uncovered_backends"][0]["reason"]
    # every backend counted: nothing uncovered, share 1
    full = server_counted({"a": linear(100.0, 0.0, 10.0), "c": linear(50.0, 0.0, 10.0)}, 1.0, 9.0)
    assert full["covered_backends"] == ["a", "c"] and full["uncovered_backends"] == []
    assert full["covered_share"] == 1.0


def test_a_mixed_fleet_names_each_backends_metric():
    s = {"v": linear(100.0, 0.0, 10.0), "l": linear(20.0, 0.0, 10.0)}
    names = {"v": "vllm:generation_tokens_total", "l": "llamacpp:tokens_predicted_total"}
    r = server_counted(s, 1.0, 9.0, names)
    assert r["sustained_tok_s"] == pytest.approx(120.0)
    assert r["metric_by_backend"] == names
    assert r["metric"] == "vllm:generation_tokens_total + llamacpp:tokens_predicted_total"


def test_many_samples_are_cheap():
    # an hour of 0.5 s samples on six servers
    s = {f"s{i}": linear(3000.0, 0.0, 3600.0, phase=0.01 * i) for i in range(6)}
    t = time.perf_counter()
    r = server_counted(s, 10.0, 3590.0)
    assert time.perf_counter() - t < 5.0
    assert r["sustained_tok_s"] == pytest.approx(18000.0)


# ------------------------------------------------------------------------------------------- live sampler


class RisingServer:
    """A tiny /metrics server on 127.0.0.1 whose generation counter rises at ``rate`` tok/s."""

    def __init__(self, rate: float):
        self.rate = rate
        self.t0 = time.monotonic()
        self.hits = 0
        self.fail = False

    async def metrics(self, request: web.Request) -> web.Response:
        self.hits += 1
        if self.fail:
            return web.Response(status=500, text="boom")
        v = self.rate * (time.monotonic() - self.t0)
        body = (
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.\n"
            "# TYPE vllm:generation_tokens_total counter\n"
            f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {v}\n'
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{engine="0",model_name="m"}} 7\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{engine="0",model_name="m"}} 1\n'
        )
        return web.Response(text=body, content_type="text/plain")


async def start_server(handler) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_get("/metrics", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}/v1"


def closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}/v1"


async def test_live_sampler_measures_a_rising_counter():
    fast, slow = RisingServer(2000.0), RisingServer(500.0)
    r1, u1 = await start_server(fast.metrics)
    r2, u2 = await start_server(slow.metrics)
    dead = closed_port_url()
    samples: list[MetricsSample] = []
    try:
        sampler = MetricsSampler([u1, u2, dead], interval=0.1, on_sample=samples.append)
        t_start = time.monotonic()
        async with anyio.create_task_group() as tg:
            tg.start_soon(sampler.run)
            await anyio.sleep(2.05)
            tg.cancel_scope.cancel()
        elapsed = time.monotonic() - t_start
    finally:
        await r1.cleanup()
        await r2.cleanup()
    # absolute schedule: one round per 0.1 s, no drift
    assert abs(sampler.rounds - (math.floor(elapsed / 0.1) + 1)) <= 2
    assert len(samples) == sampler.rounds
    assert sampler.errors[dead] == sampler.rounds and sampler.series[dead] == []
    assert sampler.last_error[dead]
    last = samples[-1]
    assert set(last.per_backend) == {u1, u2, dead}
    assert last.per_backend[dead] == {"tokens": None, "running": None, "waiting": None}
    assert last.per_backend[u1]["running"] == 7.0 and last.per_backend[u1]["waiting"] == 1.0
    assert last.rate_tok_s == pytest.approx(2500.0, rel=0.1)
    assert last.tokens == pytest.approx(last.per_backend[u1]["tokens"] + last.per_backend[u2]["tokens"])
    ts = [p[0] for p in sampler.series[u1]]
    assert ts == sorted(ts)
    t0, t1 = ts[1], ts[-2]
    r = server_counted(sampler.series, t0, t1)
    assert r["sustained_tok_s"] == pytest.approx(2500.0, rel=0.05)
    assert r["best_second_tok_s"] >= r["sustained_tok_s"]
    assert r["best_second_tok_s"] == pytest.approx(2500.0, rel=0.08)


async def test_a_failing_scrape_is_a_gap():
    srv = RisingServer(1000.0)
    runner, url = await start_server(srv.metrics)
    try:
        sampler = MetricsSampler([url], interval=0.05)
        async with aiohttp.ClientSession() as session:
            sampler_with_session = MetricsSampler([url], interval=0.05, session=session)
            await sampler_with_session.sample_once()
            assert len(sampler_with_session.series[url]) == 1
            assert not session.closed
        await sampler.sample_once()
        srv.fail = True
        s = await sampler.sample_once()
        assert s.tokens is None and s.per_backend[url]["tokens"] is None
        assert sampler.errors[url] == 1 and "500" in (sampler.last_error[url] or "")
        srv.fail = False
        await anyio.sleep(0.3)
        await sampler.sample_once()
    finally:
        await runner.cleanup()
    pts = sampler.series[url]
    assert len(pts) == 2
    r = server_counted(sampler.series, pts[0][0], pts[-1][0])
    assert r["sustained_tok_s"] == pytest.approx(1000.0, rel=0.1)


async def test_unparsable_metrics_are_a_gap():
    async def bad(request: web.Request) -> web.Response:
        return web.Response(text='vllm:generation_tokens_total{a="b" 1 2 3\n')

    runner, url = await start_server(bad)
    try:
        sampler = MetricsSampler([url], interval=0.05)
        s = await sampler.sample_once()
    finally:
        await runner.cleanup()
    assert s.tokens is None and sampler.errors[url] == 1 and sampler.series[url] == []


async def test_next_round_wakes_every_waiter_with_a_later_sample():
    srv = RisingServer(1000.0)
    runner, url = await start_server(srv.metrics)
    got: list[MetricsSample] = []
    try:
        sampler = MetricsSampler([url], interval=0.2)

        async def waiter() -> None:
            got.append(await sampler.next_round())

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            tg.start_soon(waiter)
            await anyio.sleep(0.05)
            assert got == []  # no round has run: nobody is woken
            t_asked = time.monotonic()
            tg.start_soon(sampler.run)
            with anyio.fail_after(5):
                while len(got) < 2:
                    await sampler.next_round()
            later = await sampler.next_round()  # a new wait is for the round after
            tg.cancel_scope.cancel()
    finally:
        await runner.cleanup()
    assert got[0] is got[1] and got[0].t > t_asked and got[0].tokens is not None
    assert later.t > got[0].t and sampler.rounds >= 2


# ------------------------------------------------------------------------------------ coverage, live and named


def family_page(kind: str, v: float) -> str:
    """A /metrics page of one kind of server whose generation counter stands at ``v``."""
    if kind == "sglang":
        return (
            "# TYPE sglang:generation_tokens_total counter\n"
            f'sglang:generation_tokens_total{{model_name="m"}} {v}\n'
            f'sglang:num_running_reqs{{engine_type="unified",model_name="m"}} 5.0\n'
        )
    if kind == "llama.cpp":  # six significant digits, as llama-server streams its doubles
        return (
            "# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.\n"
            "# TYPE llamacpp:tokens_predicted_total counter\n"
            f"llamacpp:tokens_predicted_total {v:.6g}\n"
            "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 2\n"
        )
    if kind == "tgi":
        return (
            "# TYPE tgi_request_generated_tokens histogram\n"
            'tgi_request_generated_tokens_bucket{le="+Inf"} 10\n'
            f"tgi_request_generated_tokens_sum {v}\ntgi_request_generated_tokens_count 10\n"
            "# TYPE tgi_queue_size gauge\ntgi_queue_size 1\n"
        )
    # an exporter that answers, but counts no tokens
    return "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 12.5\n"


def page_server(kind: str, rate: float):
    t0 = time.monotonic()

    async def handler(request: web.Request) -> web.Response:
        return web.Response(text=family_page(kind, rate * (time.monotonic() - t0)), content_type="text/plain")

    return handler


async def status_server(status: int, body: str):
    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=status, text=body)

    return await start_server(handler)


async def test_live_sampler_names_what_it_covers_across_server_kinds():
    runners = []
    try:
        urls = {}
        for kind, rate in (("sglang", 1000.0), ("llama.cpp", 500.0), ("tgi", 250.0), ("none", 0.0)):
            runner, urls[kind] = await start_server(page_server(kind, rate))
            runners.append(runner)
        runner, urls["404"] = await status_server(404, "404: Not Found")
        runners.append(runner)
        # llama-server without --metrics: "This server does not support metrics endpoint", HTTP 501
        runner, urls["501"] = await status_server(501, '{"error":{"code":501,"type":"not_supported_error"}}')
        runners.append(runner)
        urls["dead"] = closed_port_url()
        order = ["sglang", "llama.cpp", "tgi", "none", "404", "501", "dead"]
        sampler = MetricsSampler([urls[k] for k in order], interval=0.1)
        async with anyio.create_task_group() as tg:
            tg.start_soon(sampler.run)
            await anyio.sleep(1.6)
            tg.cancel_scope.cancel()
    finally:
        for runner in runners:
            await runner.cleanup()
    ts = [p[0] for p in sampler.series[urls["sglang"]]]
    r = sampler.counted(ts[1], ts[-2])
    assert r["covered_backends"] == [urls["sglang"], urls["llama.cpp"], urls["tgi"]]
    assert r["covered_share"] == round(3 / 7, 4)
    assert r["metric_by_backend"] == {
        urls["sglang"]: "sglang:generation_tokens_total",
        urls["llama.cpp"]: "llamacpp:tokens_predicted_total",
        urls["tgi"]: "tgi_request_generated_tokens_sum",
    }
    assert r["sustained_tok_s"] == pytest.approx(1750.0, rel=0.1)  # the three covered servers, no more
    why = {b["url"]: b["reason"] for b in r["uncovered_backends"]}
    assert list(why) == [urls[k] for k in ("none", "404", "501", "dead")]
    assert "no generation-token counter" in why[urls["none"]]
    assert "HTTP 404" in why[urls["404"]]
    assert "HTTP 501" in why[urls["501"]] and "--metrics" in why[urls["501"]]
    assert "unreachable" in why[urls["dead"]]
    # the live samples sum the covered servers and leave the others' tokens as unknown (None), not zero
    last = sampler.latest
    assert last.per_backend[urls["none"]]["tokens"] is None and last.per_backend[urls["tgi"]]["tokens"] > 0


async def test_no_counter_anywhere_is_unavailable_with_reasons():
    runner_none, none = await start_server(page_server("none", 0.0))
    runner_404, missing = await status_server(404, "not found")
    dead = closed_port_url()
    try:
        sampler = MetricsSampler([none, missing, dead], interval=0.05)
        await sampler.sample_once()
        await anyio.sleep(0.1)
        await sampler.sample_once()
    finally:
        await runner_none.cleanup()
        await runner_404.cleanup()
    r = sampler.counted(0.0, time.monotonic())
    assert r["available"] is False
    assert "sustained_tok_s" not in r  # no figure at all rather than a zero that reads as a measurement
    for url in (none, missing, dead):
        assert url in r["reason"]
    assert [b["url"] for b in r["uncovered_backends"]] == [none, missing, dead]
    # counters exist, but the window holds no sample of them: unavailable too, and it says why
    srv = MetricsSampler([none])
    srv.series[none] = [(1.0, 10.0, None, None), (2.0, 20.0, None, None)]
    r = srv.counted(5.0, 6.0)
    assert r["available"] is False and "window" in r["reason"]


# ------------------------------------------------------------------------ the report: labels and warnings


def _record(replies, backends=("http://a/v1", "http://b/v1"), server_counted=None):
    from orchestrator.book.assemble import Book
    from orchestrator.core.outline import Outline
    from orchestrator.job.report import JobRecord

    return JobRecord(
        backends=tuple(backends), plan_levels=(1,), book=Book(Outline("T"), (), "# T\n"),
        replies=tuple(replies), t_start=0.0, t_titles_known=1.0, t_write_start=1.0, t_write_end=11.0, t_end=12.0,
        server_counted=server_counted,
    )


def _reply(backend: str, tokens: int, text: str = "Some prose.", error: str | None = None) -> Reply:
    return Reply(text, "stop", 10, tokens, backend, 0.0, 0.1, 0.2, error=error)


def test_build_stats_warns_when_a_backend_sends_no_usage():
    from orchestrator.job.report import build_stats

    a, b = "http://a/v1", "http://b/v1"
    replies = [("section", _reply(a, 100)), ("section", _reply(a, 120)),
               ("section", _reply(b, 0)), ("section", _reply(b, 90)), ("section", _reply(b, 0)),
               ("section", _reply(b, 0, text="")),  # empty text and no tokens: nothing was written, no warning
               ("section", _reply(b, 0, error="HTTP 500"))]  # a failed attempt is no reply without usage
    stats = build_stats(_record(replies))
    assert stats["warnings"] == [f"backend {b} returned no usage in 2 of 4 replies: tokens_written undercounts"]
    assert build_stats(_record([("section", _reply(a, 5))]))["warnings"] == []


def test_printed_figures_say_what_they_are():
    from orchestrator.job.report import ROW_COLUMNS, server_counted_line

    header = next(name for name, key in ROW_COLUMNS if key == "avg_tok_s_writing")
    assert "usage" in header and "write" in header  # the reference run's definition, not a server count
    a, b, c = "http://a/v1", "http://b/v1", "http://c/v1"
    partial = {"sustained_tok_s": 1000.0, "best_second_tok_s": 1200.0, "metric": "vllm:generation_tokens_total",
               "covered_backends": [a, b], "uncovered_backends": [{"url": c, "reason": "HTTP 404"}],
               "covered_share": 0.6667}
    line = server_counted_line({"server_counted": partial})
    assert line.startswith("server-counted (2 of 3 backends)") and c in line and "HTTP 404" in line
    whole = dict(partial, covered_backends=[a, b, c], uncovered_backends=[], covered_share=1.0)
    line = server_counted_line({"server_counted": whole})
    assert line.startswith("server-counted while writing") and "of 3" not in line
    line = server_counted_line({"server_counted": {"available": False, "reason": "no backend exposes a counter"}})
    assert "not available" in line and "no backend exposes a counter" in line
    assert server_counted_line({"server_counted": None}) is None
