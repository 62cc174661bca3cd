"""orchestrator.metrics' parser: vLLM's, SGLang's, llama.cpp's and TGI's /metrics pages read into Counters (label
sets summed, name variants, one family per page, look-alike names ignored), and the /metrics address."""

from __future__ import annotations

import pytest

from orchestrator.metrics import Counters, metrics_url, parse_metrics

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
                         kv_usage=0.828, metric="vllm:generation_tokens_total")


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
