"""An unstreamed chat completion (``"stream": false``) read whole, on both readers (our HTTP/1.1 protocol and
aiohttp's path): against a simulated card it is an answer like a streamed one; what a server sends wrong is a
failed attempt of that server (not JSON, wrong types, over max_tokens, too large); and it is timed by its
deadline alone, since the server says nothing until it is done."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import orjson
import pytest
from aiohttp import web

from orchestrator import Backend
from orchestrator.core.reply import ANSWERS
from orchestrator.sim.launch import SimFleet
from orchestrator.wire.client import BackendClient

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": 'Write the section "Unit tests" of the chapter "Testing", about 80 words.'}]


@asynccontextmanager
async def client_for(url: str, model: str, *, aiohttp_path: bool, **timeouts: float) -> AsyncIterator[BackendClient]:
    async with BackendClient(Backend(url), model, **timeouts) as client:
        if aiohttp_path:
            assert client._pool is not None
            client._pool.retire()  # later requests go through aiohttp, as after an unreadable head
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.watchdog)
            yield client
            tg.cancel_scope.cancel()


@pytest.mark.parametrize("aiohttp_path", [False, True], ids=["sseproto", "aiohttp"])
async def test_an_unstreamed_section_is_an_answer_like_a_streamed_one(aiohttp_path):
    with SimFleet(cards=1) as fleet:
        url = fleet.urls[0]
        async with client_for(url, "sim-qwen3", aiohttp_path=aiohttp_path) as client:
            whole_body = client.body(MESSAGES, max_tokens=160, temperature=0.0, stream=False)
            assert whole_body["stream"] is False and "stream_options" not in whole_body
            seen: list[str] = []
            whole = await client.chat(whole_body, on_delta=seen.append)
            streamed = await client.chat(client.body(MESSAGES, max_tokens=160, temperature=0.0))
            capped = await client.chat(client.body(MESSAGES, max_tokens=12, temperature=0.0, stream=False))
    for reply in (whole, streamed):
        assert reply.ok, reply.error
        assert reply.finish_reason in ANSWERS and reply.text.strip()
        assert 0 < reply.completion_tokens <= 160 and reply.prompt_tokens > 0
        assert reply.t_first is not None and reply.t_start <= reply.t_first <= reply.t_end
    assert seen == [whole.text]  # a delta consumer still sees the text, once
    assert capped.ok and capped.finish_reason == "length" and capped.completion_tokens == 12


def _server(answer: Callable[[], object]):
    """A server whose unstreamed chat completions answer ``answer()`` (bytes, or an awaitable of them)."""

    @asynccontextmanager
    async def serve() -> AsyncIterator[str]:
        async def models(_req: web.Request) -> web.Response:
            return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

        async def chat(req: web.Request) -> web.Response:
            await req.read()
            body = answer()
            if not isinstance(body, bytes):
                body = await body  # type: ignore[misc]
            return web.Response(body=body, content_type="application/json")

        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            await runner.cleanup()

    return serve()


def _completion(content: object = "A fine answer.", finish: object = "stop", completion_tokens: object = 3) -> bytes:
    return orjson.dumps({"id": "x", "object": "chat.completion", "model": "m",
                         "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                      "finish_reason": finish}],
                         "usage": {"prompt_tokens": 5, "completion_tokens": completion_tokens}})


@pytest.mark.parametrize("aiohttp_path", [False, True], ids=["sseproto", "aiohttp"])
@pytest.mark.parametrize(("body", "says"), [
    (b"<html>busy</html>", "not JSON"),
    (b"[1, 2]", "not an object"),
    (_completion(content=7), "message.content is not a string"),
    (_completion(finish=3), "finish_reason is not a string"),
    (_completion(completion_tokens=-1), "token count"),
    (_completion(content="word " * 4000, completion_tokens=4000), "not honouring max_tokens"),
    (_completion(content="x" * (1 << 20)), "not honouring max_tokens"),
], ids=["html", "array", "content-type", "finish-type", "tokens", "past-max-tokens", "too-large"])
async def test_what_a_server_sends_wrong_is_its_failed_attempt(body, says, aiohttp_path):
    async with _server(lambda: body) as url, client_for(url, "m", aiohttp_path=aiohttp_path) as client:
        reply = await client.chat(client.body(MESSAGES, max_tokens=20, temperature=0.0, stream=False))
    assert not reply.ok and reply.health and reply.retryable
    assert reply.error.startswith("malformed stream:") and says in reply.error, reply.error


async def test_an_unstreamed_request_is_timed_by_its_deadline_alone():
    async def slow() -> bytes:
        await anyio.sleep(2.5)  # longer than the first-token timeout below, shorter than the deadline
        return _completion()

    async with _server(slow) as url:
        async with client_for(url, "m", aiohttp_path=False, first_token_timeout=1.0, request_timeout=30.0) as client:
            reply = await client.chat(client.body(MESSAGES, max_tokens=20, temperature=0.0, stream=False))
        assert reply.ok and reply.text == "A fine answer." and reply.t_end - reply.t_start >= 2.5
        async with client_for(url, "m", aiohttp_path=False, first_token_timeout=30.0, request_timeout=1.0) as client:
            client.deadline_for = lambda body: 1.0  # type: ignore[method-assign]
            late = await client.chat(client.body(MESSAGES, max_tokens=20, temperature=0.0, stream=False))
        assert not late.ok and "took longer than 1 s" in late.error
