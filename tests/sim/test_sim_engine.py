"""The simulator's engine and faults, on real servers on 127.0.0.1 started with SimFleet: the step model's rates
measured in wall time, the KV cache and max_seqs limits, each fault knob observed, and a card going down and back.

A server that cannot start makes the test fail (SimFleet raises), never skip.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from sim_http import chat_body, post, run

from orchestrator.sim.engine import Engine, EngineConfig, Stream
from orchestrator.sim.launch import SimFleet

# -- fleets ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def realtime(sim_fleet):
    return sim_fleet(2, time_scale=1.0)



# -- engine model ----------------------------------------------------------------------------------------------


def test_engine_model_rates_at_1_and_64_streams(realtime):
    """Measured in wall time at time-scale 1, the servers' counters match the step model within a few %."""
    body = chat_body("Write the chapter in about 4000 words.", max_tokens=2000, stream=True)  # 64 x 2000 fit the KV

    async def go():
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
            tasks = [asyncio.create_task(post(s, realtime.urls[0], body, limit_s=120))]
            tasks += [asyncio.create_task(post(s, realtime.urls[1], {**body, "messages": [
                {"role": "user", "content": f"Write chapter {i} in about 4000 words."}]}, limit_s=120))
                for i in range(64)]
            loop = asyncio.get_running_loop()
            deadline = time.monotonic() + 20
            while True:
                st = await loop.run_in_executor(None, realtime.all_stats)
                if st[0]["running"] == 1 and st[1]["running"] == 64:
                    break
                assert time.monotonic() < deadline, st
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)
            a0 = await loop.run_in_executor(None, realtime.all_stats)
            t0 = time.monotonic()
            await asyncio.sleep(3.0)
            a1 = await loop.run_in_executor(None, realtime.all_stats)
            t1 = time.monotonic()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            return a0, a1, t1 - t0

    a0, a1, dt = run(go())
    cfg = EngineConfig()
    for i, streams in ((0, 1), (1, 64)):
        rate = (a1[i]["generation_tokens"] - a0[i]["generation_tokens"]) / dt
        want = cfg.model_tok_s(streams)
        assert abs(rate / want - 1) < 0.06, (streams, rate, want)
    assert round(cfg.model_tok_s(1)) == 76 and round(cfg.model_tok_s(256)) == 3382


def test_engine_kv_limit_and_max_seqs():
    """512 requested streams of ~560 tokens: the KV cache admits ~309 (the reference's running count)."""

    async def go():
        eng = Engine(EngineConfig(time_scale=0.001))
        eng.start()
        streams = [Stream(48, 512) for _ in range(512)]
        for s in streams:
            eng.submit(s)
        for _ in range(200):
            await asyncio.sleep(0.001)
            if eng.steps > 2:
                break
        running, waiting = eng.running, eng.num_waiting
        await eng.close()
        eng2 = Engine(EngineConfig(time_scale=0.001, max_seqs=100, kv_tokens=10**9))
        eng2.start()
        for _ in range(300):
            eng2.submit(Stream(10, 5000))
        await asyncio.sleep(0.01)
        r2 = eng2.running
        await eng2.close()
        return running, waiting, r2

    running, waiting, r2 = run(go())
    assert 300 <= running <= 312 and running + waiting == 512
    assert r2 == 100


# -- faults ----------------------------------------------------------------------------------------------------


def test_fault_knobs_each_observed():
    rates = {"fail_rate": 0.15, "rate_limit_rate": 0.15, "empty_rate": 0.15, "drop_rate": 0.15, "hang_rate": 0.1}
    with SimFleet(1, time_scale=0.02, fault_seed=7, retry_after=2, **rates) as f:
        async def go():
            async with aiohttp.ClientSession() as s:
                bodies = [chat_body(f'Write the section "F{i}" in about 60 words.', max_tokens=200,
                                    stream=i % 2 == 0, stream_options={"include_usage": True}) for i in range(60)]

                async def attempt(b):
                    try:
                        return await post(s, f.urls[0], b, limit_s=3.0)
                    except TimeoutError:
                        return "timeout"
                    except aiohttp.ClientError as e:
                        return f"cut:{type(e).__name__}"
                return await asyncio.gather(*(attempt(b) for b in bodies))

        results = run(go())
        seen = {"fail": 0, "rate_limit": 0, "empty": 0, "drop": 0, "hang": 0, "ok": 0}
        for r in results:
            if r == "timeout":
                seen["hang"] += 1
            elif isinstance(r, str):
                seen["drop"] += 1
            elif r["status"] == 500:
                seen["fail"] += 1
            elif r["status"] == 429:
                assert r["headers"]["Retry-After"] == "2"
                seen["rate_limit"] += 1
            elif "events" in r and not r["done"]:
                seen["drop"] += 1  # cut after the headers: the body ended early
            else:
                text = r["text"] if "events" in r else r["json"]["choices"][0]["message"]["content"]
                if text == "":
                    u = r["events"][-1]["usage"] if "events" in r else r["json"]["usage"]
                    assert u["completion_tokens"] == 0
                    seen["empty"] += 1
                else:
                    seen["ok"] += 1
        st = f.stats(0)
        assert st["faults"] == {k: seen[k] for k in st["faults"]}, (st["faults"], seen)
        assert all(seen[k] > 0 for k in seen), seen
        assert st["in_flight"] == 0  # hung requests were released when the client went away


def test_down_after_and_back(tmp_path):
    with SimFleet(2, time_scale=0.2, down_after=1.0, down_for=1.5, down_cards=[0]) as f:
        async def go():
            async with aiohttp.ClientSession() as s:
                long = chat_body("Write about 2000 words.", max_tokens=3000, stream=True)
                cut = post(s, f.urls[0], long, limit_s=10)
                ok = post(s, f.urls[1], chat_body("hi", max_tokens=20), limit_s=10)
                res = await asyncio.gather(cut, ok, return_exceptions=True)
                await asyncio.sleep(0.2)
                try:
                    await post(s, f.urls[0], chat_body("hi", max_tokens=5), limit_s=2)
                    refused = False
                except aiohttp.ClientError:
                    refused = True
                alive = await post(s, f.urls[1], chat_body("hi", max_tokens=5), limit_s=5)
                await asyncio.sleep(1.8)
                back = await post(s, f.urls[0], chat_body("hi", max_tokens=5), limit_s=5)
                return res, refused, alive, back

        (cut, ok), refused, alive, back = run(go())
        assert isinstance(cut, aiohttp.ClientError) or not cut["done"], cut
        assert ok["status"] == 200
        assert refused
        assert alive["status"] == 200
        assert back["status"] == 200
        st = f.stats(0)
        assert st["down_count"] == 1 and st["down"] is False
        assert f.stats(1)["down_count"] == 0
