"""orchestrator.metrics: parsing vLLM's /metrics, the interpolation and sum math, and a live sampler."""

from __future__ import annotations

import math
import time

import aiohttp
import anyio
import pytest
from aiohttp import web

from orchestrator.events import MetricsSample
from orchestrator.metrics import (
    Counters,
    MetricsSampler,
    counter_increase,
    metrics_url,
    parse_metrics,
    server_counted,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


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


# ------------------------------------------------------------------------------------------------ parsing


def test_parse_vllm_text_sums_label_sets():
    c = parse_metrics(VLLM_TEXT)
    assert c == Counters(generation_tokens=630000.0, prompt_tokens=74728.0, running=256.0, waiting=3.0)


def test_parse_absent_metrics_are_none():
    text = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 2\n"
    assert parse_metrics(text) == Counters(running=2.0)
    assert parse_metrics("") == Counters()
    # a server that is not vLLM at all
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


def test_one_backend_without_counter_is_ignored():
    s = {"a": linear(100.0, 0.0, 10.0), "b": [(t, None, 3.0, 0.0) for t in range(11)]}
    assert server_counted(s, 1.0, 9.0, metric="x")["sustained_tok_s"] == pytest.approx(100.0)
    assert server_counted(s, 1.0, 9.0, metric="x")["metric"] == "x"


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
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/v1"


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
