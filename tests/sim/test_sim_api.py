"""The simulator's API, on real servers on 127.0.0.1 started with SimFleet and talked to over HTTP: models and
health, the completion and stream shapes, deterministic answers, JSON schemas and numbered lists honoured, the
/metrics counters matching usage; and its text generator (tokens, the reference book's shape, schemas).

A server that cannot start makes the test fail (SimFleet raises), never skip.
"""

from __future__ import annotations

import asyncio
import re

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sim_http import MODEL, chat_body, metric, one, post, run

from orchestrator.sim import text as simtext
from orchestrator.sim.calibrate import simulate_book
from orchestrator.sim.launch import SimFleet

# -- fleets ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fleet(sim_fleet):
    return sim_fleet(2, time_scale=0.05)



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


def test_continuous_usage_stats_on_every_chunk(fleet):
    """vLLM's stream_options.continuous_usage_stats: every content chunk carries the usage so far, the last one the
    whole count; without include_usage it is ignored, as vLLM does."""
    body = chat_body("Write the section \"Caching\" in about 250 words.", max_tokens=37, stream=True,
                     stream_options={"include_usage": True, "continuous_usage_stats": True})
    r = run(one(fleet.urls[0], body))
    assert r["status"] == 200 and r["done"]
    role = r["events"][0]
    assert role["choices"][0]["delta"]["role"] == "assistant" and role["usage"]["completion_tokens"] == 0
    chunks = [e for e in r["events"][1:] if e["choices"]]
    counts = [e["usage"]["completion_tokens"] for e in chunks]
    seen = ""
    for e, c in zip(chunks, counts, strict=True):
        seen += e["choices"][0]["delta"]["content"]
        assert c == len(simtext.tokenize(seen))  # the tokens sent so far, exactly
        assert e["usage"]["total_tokens"] == e["usage"]["prompt_tokens"] + c
    assert counts == sorted(counts) and counts[-1] == 37 and r["events"][-1]["usage"]["completion_tokens"] == 37
    plain = run(one(fleet.urls[0], {**body, "stream_options": {"continuous_usage_stats": True}}))
    assert all("usage" not in e for e in plain["events"]) and plain["text"] == r["text"]


def test_a_stopped_stream_counts_the_servers_tokens(fleet):
    """A watched stream (BackendClient.chat's stop_when) asks for continuous usage: an answer stopped as it streams
    counts the tokens the server reported with the last chunk read, not one a delta (the simulator sends up to
    stream_interval, 4, a delta)."""
    import anyio

    from orchestrator import Backend
    from orchestrator.core.reply import STOPPED
    from orchestrator.wire.client import BackendClient

    seen = []

    def stop_after_six(delta: str) -> str | None:
        seen.append(delta)
        return "enough" if len(seen) == 6 else None

    async def main() -> list:
        async with BackendClient(Backend(fleet.urls[1]), MODEL) as client:
            body = client.body([{"role": "user", "content": "Write the section \"Stops\" in about 250 words."}],
                               max_tokens=400, temperature=0.0)
            return await client.send(lambda: body, stop_when=stop_after_six)

    (reply,) = anyio.run(main)
    assert reply.ok and reply.finish_reason == STOPPED and reply.text == "".join(seen)
    assert reply.completion_tokens == len(simtext.tokenize(reply.text)) > len(seen)  # 1 + 4 * 5 here


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
