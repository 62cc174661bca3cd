"""The simulator: real servers on 127.0.0.1 started with SimFleet, talked to over HTTP.

A server that cannot start makes the test fail (SimFleet raises), never skip.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.sim import text as simtext
from orchestrator.sim.calibrate import simulate_book
from orchestrator.sim.engine import Engine, EngineConfig, Stream
from orchestrator.sim.launch import SimFleet

MODEL = "sim-qwen3"
REPO = Path(__file__).resolve().parents[1]


# -- helpers ---------------------------------------------------------------------------------------------------


def chat_body(content: str, **kw) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **kw}


async def post(session: aiohttp.ClientSession, url: str, body: dict, limit_s: float = 30.0) -> dict:
    """One chat request; returns status, headers, JSON (non-stream) or parsed SSE events (stream)."""
    async with session.post(url + "/chat/completions", data=orjson.dumps(body),
                            headers={"Content-Type": "application/json"},
                            timeout=aiohttp.ClientTimeout(total=limit_s)) as r:
        raw = await r.read()
        out = {"status": r.status, "headers": dict(r.headers), "raw": raw}
        if r.status != 200 or not body.get("stream"):
            out["json"] = orjson.loads(raw) if raw else None
            return out
        events = []
        done = False
        for block in raw.decode().split("\n\n"):
            if not block.strip():
                continue
            assert block.startswith("data: "), block
            payload = block[len("data: "):]
            if payload == "[DONE]":
                done = True
                continue
            assert not done, "data after [DONE]"
            events.append(orjson.loads(payload))
        out["events"] = events
        out["done"] = done
        out["text"] = "".join((e["choices"][0]["delta"].get("content") or "") for e in events if e["choices"])
        return out


def run(coro):
    return asyncio.run(coro)


async def one(url: str, body: dict, limit_s: float = 30.0) -> dict:
    async with aiohttp.ClientSession() as s:
        return await post(s, url, body, limit_s)


def metric(fleet: SimFleet, i: int, name: str) -> float:
    for fam in text_string_to_metric_families(fleet.metrics_text(i)):
        for sample in fam.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"{name} not in /metrics")


# -- fleets ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fleet(sim_fleet):
    return sim_fleet(2, time_scale=0.05)


@pytest.fixture(scope="module")
def realtime(sim_fleet):
    return sim_fleet(2, time_scale=1.0)


# -- API shape -------------------------------------------------------------------------------------------------


def test_models_health_and_unknown_model(fleet):
    for i in range(2):
        models = orjson.loads(fleet._get(i, "/v1/models"))
        assert models["object"] == "list"
        assert [m["id"] for m in models["data"]] == [MODEL]
        assert fleet._get(i, "/health") == b""
    r = run(one(fleet.urls[0], {**chat_body("hello"), "model": "other"}))
    assert r["status"] == 404
    assert "does not exist" in r["json"]["error"]["message"]
    r = run(one(fleet.urls[0], {"model": MODEL, "messages": []}))
    assert r["status"] == 400


def test_non_stream_completion_shape(fleet):
    r = run(one(fleet.urls[0], chat_body("Write the section \"Naming\" in about 60 words.", max_tokens=400,
                                         temperature=0, chat_template_kwargs={"enable_thinking": False})))
    assert r["status"] == 200
    j = r["json"]
    assert j["object"] == "chat.completion" and j["model"] == MODEL and j["id"].startswith("chatcmpl-")
    (choice,) = j["choices"]
    assert choice["message"]["role"] == "assistant"
    content = choice["message"]["content"]
    assert len(content.split()) > 30
    assert choice["finish_reason"] == "stop"
    u = j["usage"]
    assert u["completion_tokens"] == len(simtext.tokenize(content))
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert u["prompt_tokens"] >= 1


def test_stream_shape_include_usage_and_length(fleet):
    body = chat_body("Write the section \"Caching\" in about 250 words.", max_tokens=37, stream=True,
                     stream_options={"include_usage": True})
    r = run(one(fleet.urls[1], body))
    assert r["status"] == 200 and r["done"]
    assert r["headers"]["Content-Type"].startswith("text/event-stream")
    ev = r["events"]
    assert all(e["object"] == "chat.completion.chunk" for e in ev)
    assert len({e["id"] for e in ev}) == 1
    assert ev[0]["choices"][0]["delta"]["role"] == "assistant"
    finals = [e for e in ev if e["choices"] and e["choices"][0]["finish_reason"]]
    assert len(finals) == 1 and finals[0]["choices"][0]["finish_reason"] == "length"
    usage_chunk = ev[-1]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 37
    assert len(simtext.tokenize(r["text"])) == 37
    # chunks of stream_interval (4) tokens, the first one token alone (first token as soon as it exists)
    contents = [e["choices"][0]["delta"]["content"] for e in ev[1:] if e["choices"]]
    assert len(contents) == 1 + (37 - 1 + 3) // 4
    # without include_usage: no usage chunk
    r2 = run(one(fleet.urls[1], {**body, "stream_options": None}))
    assert all(e["choices"] for e in r2["events"]) and "usage" not in r2["events"][-1]
    assert r2["text"] == r["text"]


def test_deterministic_answers(fleet):
    body = chat_body('Book: "B"\nPart: "P"\nChapter: "Unit Testing"\nWrite the section "Test Fixtures" in about '
                     "80 words of Markdown.", max_tokens=520)

    async def go():
        async with aiohttp.ClientSession() as s:
            a = await post(s, fleet.urls[0], body)
            b = await post(s, fleet.urls[1], body)
            c = await post(s, fleet.urls[0], {**body, "stream": True})
            d = await post(s, fleet.urls[0], {**body, "messages": [{"role": "user", "content": "other"}]})
            return a, b, c, d

    a, b, c, d = run(go())
    ta = a["json"]["choices"][0]["message"]["content"]
    assert ta == b["json"]["choices"][0]["message"]["content"] == c["text"]
    assert ta != d["json"]["choices"][0]["message"]["content"]


def test_json_schema_honoured(fleet):
    schema = {"type": "object", "properties": {
        "title": {"type": "string"},
        "items": {"type": "array", "items": {"type": "string"}, "minItems": 7, "maxItems": 7}},
        "required": ["title", "items"], "additionalProperties": False}
    body = chat_body("Give the book a title, and divide it into exactly 7 parts.", max_tokens=1024,
                     response_format={"type": "json_schema",
                                      "json_schema": {"name": "titles", "schema": schema, "strict": True}})
    r = run(one(fleet.urls[0], body))
    value = orjson.loads(r["json"]["choices"][0]["message"]["content"])
    assert set(value) == {"title", "items"}
    assert isinstance(value["title"], str) and value["title"]
    assert len(value["items"]) == 7 and len(set(value["items"])) == 7
    assert all(isinstance(t, str) and t for t in value["items"])
    # arrays of strings without maxItems follow "exactly N"
    schema2 = {"type": "object", "properties": {"sections": {"type": "array", "items": {"type": "string"},
                                                             "minItems": 3}}}
    body2 = chat_body('List exactly 5 section titles for chapter "Caching".', max_tokens=1024,
                      response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema2}})
    v2 = orjson.loads(run(one(fleet.urls[0], body2))["json"]["choices"][0]["message"]["content"])
    assert len(v2["sections"]) == 5


def test_no_json_schema_rejects_with_400():
    schema = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string"}}}}
    with SimFleet(1, time_scale=0.05, no_json_schema=True) as f:
        body = chat_body("exactly 3 parts", response_format={"type": "json_schema",
                                                              "json_schema": {"name": "x", "schema": schema}})
        r = run(one(f.urls[0], body))
        assert r["status"] == 400
        assert "json_schema" in r["json"]["error"]["message"]
        ok = run(one(f.urls[0], chat_body("List exactly 3 part titles.")))
        assert ok["status"] == 200
        assert f.stats(0)["config"]["json_schema"] is False


def test_numbered_list_with_exactly_n(fleet):
    r = run(one(fleet.urls[0], chat_body('List exactly 16 section titles for chapter "Effective Caching". '
                                         "Reply with a numbered list, one title per line.", max_tokens=1024)))
    lines = r["json"]["choices"][0]["message"]["content"].splitlines()
    assert len(lines) == 16
    titles = []
    for i, line in enumerate(lines, 1):
        m = re.fullmatch(rf"{i}\. (.+)", line)
        assert m, line
        titles.append(m.group(1))
    assert len(set(titles)) == 16
    r = run(one(fleet.urls[1], chat_body('Reply with the book title on the first line, written as "Title: <book '
                                         'title>", then exactly 8 part titles as a numbered list.')))
    lines = r["json"]["choices"][0]["message"]["content"].splitlines()
    assert lines[0].startswith("Title: ") and len(lines) == 9
    assert [ln.split(".")[0] for ln in lines[1:]] == [str(i) for i in range(1, 9)]


def test_counter_increase_equals_usage_and_max_in_flight(fleet):
    url = fleet.urls[1]
    before = metric(fleet, 1, "vllm:generation_tokens_total")
    prompt_before = metric(fleet, 1, "vllm:prompt_tokens_total")
    fleet.reset_max(1)
    assert fleet.stats(1)["max_in_flight"] == 0

    async def go():
        async with aiohttp.ClientSession() as s:
            bodies = [chat_body(f'Write the section "S{i}" in about {40 + i} words.', max_tokens=90,
                                stream=bool(i % 2), stream_options={"include_usage": True})
                      for i in range(24)]
            return await asyncio.gather(*(post(s, url, b) for b in bodies))

    results = run(go())
    usage = 0
    prompt = 0
    for r in results:
        assert r["status"] == 200
        u = r["events"][-1]["usage"] if "events" in r else r["json"]["usage"]
        usage += u["completion_tokens"]
        prompt += u["prompt_tokens"]
    after = metric(fleet, 1, "vllm:generation_tokens_total")
    assert after - before == usage
    assert metric(fleet, 1, "vllm:prompt_tokens_total") - prompt_before == prompt
    st = fleet.stats(1)
    assert st["max_in_flight"] == 24
    assert st["in_flight"] == 0
    assert metric(fleet, 1, "vllm:num_requests_running") == 0
    assert metric(fleet, 1, "vllm:num_requests_waiting") == 0
    assert metric(fleet, 1, "vllm:time_to_first_token_seconds_count") >= 24


def test_metrics_names(fleet):
    families = {f.name: f.type for f in text_string_to_metric_families(fleet.metrics_text(0))}
    assert families["vllm:generation_tokens"] == "counter"
    assert families["vllm:prompt_tokens"] == "counter"
    assert families["vllm:num_requests_running"] == "gauge"
    assert families["vllm:num_requests_waiting"] == "gauge"
    assert families["vllm:time_to_first_token_seconds"] == "histogram"
    assert 'model_name="sim-qwen3"' in fleet.metrics_text(0)


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


# -- CLI and launcher ------------------------------------------------------------------------------------------


def _sim(*args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "orchestrator", "sim", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, check=False)


@pytest.mark.parametrize("args, words", [
    (["--cards", "0"], "--cards"),
    (["--fail-rate", "1.5"], "--fail-rate"),
    (["--fail-rate", "0.6", "--drop-rate", "0.6"], "add up"),
    (["--time-scale", "0"], "--time-scale"),
    (["--down-cards", "3", "--down-after", "1"], "--down-cards"),
    (["--down-for", "1"], "--down-after"),
])
def test_cli_bad_flags_exit_2_with_one_line(args, words):
    p = _sim(*args)
    assert p.returncode == 2, p
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in p.stderr


def test_port_in_use_is_a_clear_error(fleet):
    p = _sim("--port", str(fleet.port), "--procs", "1")
    assert p.returncode == 2
    assert "already in use" in p.stderr


def test_simfleet_start_failure_raises_with_output():
    with pytest.raises(RuntimeError, match="fail-rate"):
        SimFleet(1, fail_rate=3).start()


def test_stop_is_clean_and_prints_urls():
    f = SimFleet(3, procs=2, time_scale=0.1).start()
    try:
        assert len(f.urls) == 3 and len({u for u in f.urls}) == 3
        for i, u in enumerate(f.urls):
            assert f"sim card {i}: {u}" in f.output
        assert "sim ready" in f.output
        proc = f.process
    finally:
        f.stop()
    assert proc.returncode == 0
    assert "sim stopped" in f.output


# -- text ------------------------------------------------------------------------------------------------------


def test_tokenize_round_trip():
    for t in ["", "plain words and punctuation, too.", "héllo\twörld\r\n  x", "```python\nx = {1: 2}\n```",
              "a\u2028b", "12345 numbers 3.14"]:
        assert "".join(simtext.tokenize(t)) == t


def test_book_shape_matches_the_reference():
    """The published-take shape (8 x 12 x 16, 250 words, 520 tokens) against the reference run's figures."""
    r = simulate_book()
    assert r["sections"] == 1536
    assert 1.38 <= r["tokens_per_word"] <= 1.46  # reference 1.42
    assert 275 <= r["mean_words"] <= 300  # reference 288.5
    assert 0.04 <= r["truncated_share"] <= 0.10  # reference ~0.07
    assert 30 <= r["duplicate_section_titles"] <= 65  # reference 46
    assert 0.85 <= r["code_blocks_per_section"] <= 0.98  # reference 1,402 / 1,536 = 0.91
    assert r["python_blocks"] > 800 and r["python_syntax_errors"] == 0
    assert len(r["parts"]) == 8 and len(set(r["parts"])) == 8


def test_text_seed_json_object_and_nested_schema():
    body = chat_body('Write the section "Caching" in about 50 words.', max_tokens=200)
    assert simtext.answer(MODEL, body).text == simtext.answer(MODEL, body).text
    assert simtext.answer(MODEL, body, 1).text != simtext.answer(MODEL, body, 2).text
    obj = simtext.answer(MODEL, {**body, "response_format": {"type": "json_object"}})
    assert isinstance(orjson.loads(obj.text), dict)
    schema = {"type": "object", "properties": {"chapters": {"type": "array", "minItems": 2, "maxItems": 2, "items": {
        "type": "object", "properties": {"title": {"type": "string"},
                                         "sections": {"type": "array", "items": {"type": "string"},
                                                      "maxItems": 3}}}}}}
    v = orjson.loads(simtext.answer(MODEL, {**body, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}).text)
    assert len(v["chapters"]) == 2
    assert all(isinstance(c["title"], str) and len(c["sections"]) == 3 for c in v["chapters"])
