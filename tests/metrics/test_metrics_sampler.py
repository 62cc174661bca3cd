"""orchestrator.metrics' live sampler against small local /metrics servers: a rising counter measured on an absolute
schedule, failed or unparsable scrapes as gaps, waiters woken by a round; and coverage across server kinds, each
backend that counts nothing named with the reason."""

from __future__ import annotations

import math
import time

import aiohttp
import anyio
import pytest
from aiohttp import web

from orchestrator.core.events import MetricsSample
from orchestrator.core.osutil import free_port
from orchestrator.metrics import MetricsSampler, server_counted

pytestmark = pytest.mark.anyio


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
