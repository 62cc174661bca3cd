"""Talking to the simulator's servers over HTTP: a chat body for its model, one request (JSON or parsed SSE
events back), and a value read from a card's /metrics."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.sim.launch import SimFleet

MODEL = "sim-qwen3"


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
