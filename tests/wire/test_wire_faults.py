"""Whose fault it is: what a server sends wrong is a failed attempt of that server; what our own code raises ends the
job as an internal error and blames no server. And no stream can hold a job: token, byte and time caps cut it.

The servers here are aiohttp apps on 127.0.0.1 that misbehave on purpose; each endless one is still bounded (a
count of events and a time), so that a test that went wrong stops by itself.
"""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import anyio.lowlevel
import orjson
import pytest
from aiohttp import web

from orchestrator import Backend, Settings, agenerate
from orchestrator.core.errors import InternalError, PlanError, internal_error, unwrap
from orchestrator.core.events import BackendState
from orchestrator.wire.client import BackendClient
from orchestrator.wire.sse import SseParser, StreamState, Watch

pytestmark = pytest.mark.anyio

MODEL = "endless"
LIMIT_S = 60.0  # no misbehaving server here streams longer than this, whatever the client does


def _chunk(text: str | None = None, finish: str | None = None, **extra: object) -> bytes:
    delta = {} if text is None else {"content": text}
    obj = {"id": "x", "object": "chat.completion.chunk", "model": MODEL,
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
    return b"data: " + orjson.dumps(obj) + b"\n\n"


Body = Callable[[web.StreamResponse], object]


@asynccontextmanager
async def serve(stream: Callable[[web.StreamResponse], object]) -> AsyncIterator[str]:
    """A server whose /v1/models lists one model and whose chat completions ``stream(resp)`` writes."""

    async def models(_req: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def chat(req: web.Request) -> web.StreamResponse:
        await req.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)
        try:
            with anyio.move_on_after(LIMIT_S):
                await stream(resp)  # type: ignore[misc]
        except (ConnectionError, RuntimeError):  # the client cut it: what every test here wants
            pass
        return resp

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


async def endless_tokens(resp: web.StreamResponse) -> None:
    """Never honours max_tokens: one word an event, for ever (bounded: 10 million events, LIMIT_S)."""
    for i in range(10_000_000):
        await resp.write(_chunk(f" word{i % 10}"))
        if i % 64 == 0:
            await anyio.lowlevel.checkpoint()


async def endless_comments(resp: web.StreamResponse) -> None:
    """Keeps the stream alive with comments and empty deltas, and never says anything (bounded)."""
    for i in range(400_000):
        await resp.write(b": keep-alive\n\n" if i % 2 else _chunk())
        if i % 64 == 0:
            await anyio.lowlevel.checkpoint()


async def dripping(resp: web.StreamResponse) -> None:
    """One token every 0.2 s, just inside any chunk timeout, for ever (bounded by LIMIT_S)."""
    while True:
        await resp.write(_chunk(" drip"))
        await anyio.sleep(0.2)


def malformed(payload: bytes) -> Callable[[web.StreamResponse], object]:
    async def stream(resp: web.StreamResponse) -> None:
        await resp.write(_chunk("Some text."))
        await resp.write(b"data: " + payload + b"\n\n")
        await resp.write(_chunk(finish="stop"))
        await resp.write(b"data: [DONE]\n\n")

    return stream


async def well_behaved(resp: web.StreamResponse) -> None:
    for w in ("Some", " text", " here."):
        await resp.write(_chunk(w))
    await resp.write(_chunk(finish="stop", usage={"prompt_tokens": 5, "completion_tokens": 3}))
    await resp.write(b"data: [DONE]\n\n")


@asynccontextmanager
async def client_for(url: str, path: str, **kw: float) -> AsyncIterator[BackendClient]:
    """A client on ``path``: "ours" (sseproto) or "aiohttp" (the fallback path)."""
    async with BackendClient(Backend(url), MODEL, **kw) as c:  # type: ignore[arg-type]
        if path == "aiohttp":
            c._pool = None
        else:
            assert c._pool is not None, "our reader should serve a plain http:// URL"
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.watchdog)
            yield c
            tg.cancel_scope.cancel()


PATHS = ["ours", "aiohttp"]


@pytest.mark.parametrize("path", PATHS)
async def test_a_stream_past_max_tokens_is_cut_as_the_servers_fault(path):
    async with serve(endless_tokens) as url, client_for(url, path) as c:
        with anyio.fail_after(20):
            reply = await c.chat(c.body([{"role": "user", "content": "hi"}], max_tokens=100, temperature=0))
    assert not reply.ok and reply.health and reply.retryable
    assert "past max_tokens" in (reply.error or "")
    assert len(reply.text) <= (100 * 1.25 + 16) * 64  # what it kept is bounded by the cap too


@pytest.mark.parametrize("path", PATHS)
async def test_a_stream_of_nothing_is_cut_by_its_bytes(path):
    async with serve(endless_comments) as url, client_for(url, path) as c:
        with anyio.fail_after(20):
            reply = await c.chat(c.body([{"role": "user", "content": "hi"}], max_tokens=16, temperature=0))
    assert not reply.ok and reply.health
    assert "bytes" in (reply.error or "") and "max_tokens" in (reply.error or "")


@pytest.mark.parametrize("path", PATHS)
async def test_a_request_that_outlasts_its_deadline_is_cut(path):
    kw = {"request_timeout": 1.5, "chunk_timeout": 5.0, "first_token_timeout": 0.5}
    async with serve(dripping) as url, client_for(url, path, **kw) as c:
        t0 = time.monotonic()
        with anyio.fail_after(10):
            # one token allowed: the deadline is the first token's wait and 2 s a token, 2.5 s; the token cap
            # (1.25 + 16 tokens of characters) would take the drip ~40 s
            reply = await c.chat(c.body([{"role": "user", "content": "hi"}], max_tokens=1, temperature=0))
    assert not reply.ok and reply.health
    assert "longer than 2.5 s" in (reply.error or ""), reply.error
    assert time.monotonic() - t0 < 6


BAD_EVENTS = [b"not json", b"[1, 2]", b'{"choices": "x"}', b'{"choices": [{"delta": {"content": 5}}]}',
              b'{"choices": [{"delta": "text"}]}', b'{"usage": {"completion_tokens": "many"}}',
              b'{"choices": [{"delta": {}, "finish_reason": 3}]}', b'{"usage": {"completion_tokens": 2.5}}',
              b'{"usage": {"prompt_tokens": true}}']


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("payload", BAD_EVENTS)
async def test_what_a_server_sends_wrong_is_a_failed_attempt(path, payload):
    async with serve(malformed(payload)) as url, client_for(url, path) as c:
        with anyio.fail_after(10):
            reply = await c.chat(c.body([{"role": "user", "content": "hi"}], max_tokens=50, temperature=0))
    assert not reply.ok and reply.health and reply.retryable
    assert (reply.error or "").startswith("malformed stream"), reply.error


async def float_usage_and_tiny_pieces(resp: web.StreamResponse) -> None:
    """A good answer cut into one-character deltas (as a proxy may cut it) with its usage counted as floats."""
    text = "A long enough answer, cut into the smallest pieces a proxy could make of it. " * 20  # ~1,560 characters
    for ch in text:
        await resp.write(_chunk(ch))
    await resp.write(_chunk(finish="stop", usage={"prompt_tokens": 12.0, "completion_tokens": 400.0}))
    await resp.write(b"data: [DONE]\n\n")


@pytest.mark.parametrize("path", PATHS)
async def test_tiny_deltas_and_whole_float_counts_are_a_good_answer(path):
    async with serve(float_usage_and_tiny_pieces) as url, client_for(url, path) as c:
        with anyio.fail_after(20):
            reply = await c.chat(c.body([{"role": "user", "content": "hi"}], max_tokens=520, temperature=0))
    assert reply.ok, reply.error
    assert reply.completion_tokens == 400 and reply.prompt_tokens == 12 and len(reply.text) > 1500


@pytest.mark.parametrize("path", PATHS)
async def test_a_bug_in_a_delta_consumer_propagates(path):
    def consumer(text: str) -> None:
        raise RuntimeError("a bug of ours")

    async with serve(well_behaved) as url, client_for(url, path) as c:
        body = c.body([{"role": "user", "content": "hi"}], max_tokens=50, temperature=0)
        with anyio.fail_after(10), pytest.raises(RuntimeError, match="a bug of ours"):
            await c.chat(body, on_delta=consumer)
        # the client is still usable: the next request on it is answered
        reply = await c.chat(body)
    assert reply.ok and reply.text == "Some text here."


async def test_a_long_line_cut_into_many_pieces_is_read_whole():
    text = "x" * 300_000
    event = _chunk(text)
    for size in (1, 7, 4096):
        st = StreamState(max_tokens=1 << 16)
        parser = SseParser(st, Watch(anyio.CancelScope(), 0.0), None)
        pieces = [event[i:i + size] for i in range(0, len(event), size)] if size > 1 else [
            event[:10], *[event[i:i + 1] for i in range(10, 200)], event[200:]]
        for p in pieces:
            assert not parser.feed(p)
        assert "".join(st.parts) == text
        assert not parser.pending


# -- the job -----------------------------------------------------------------------------------------------------


async def test_an_endless_server_cannot_hold_a_job(sim_fleet, tmp_path):
    sim = sim_fleet(1)
    events: list[object] = []
    settings = Settings(parts=1, chapters=2, sections=3, words=40, max_tokens=80, formats=("md",), cap=4,
                        all_down_timeout_s=60.0)
    async with serve(endless_tokens) as bad:
        # well inside LIMIT_S: a job that waited for the endless stream to end by itself would not make it
        with anyio.fail_after(LIMIT_S * 0.75):
            result = await agenerate("A handbook of tide pools", [bad, sim.urls[0]], settings, tmp_path / "o",
                                     on_event=events.append)
    assert result.complete, result.failed_sections
    assert len(list(result.outline.sections())) == 6
    by_url = {b["url"]: b for b in result.stats["per_backend"]}
    assert by_url[Backend(bad).url]["sections"] == 0 and by_url[Backend(bad).url]["errors"] >= 1
    assert any(isinstance(e, BackendState) and not e.healthy and e.url == Backend(bad).url for e in events)


async def test_a_bug_in_the_planners_stream_callback_is_ours_not_the_servers(sim_fleet, tmp_path, monkeypatch):
    from orchestrator.planning import stream

    sim = sim_fleet(1)
    before = sim.stats(0)["requests"]

    def broken(self: object, text: str) -> None:
        raise RuntimeError("planner bug")

    monkeypatch.setattr(stream.Expansion, "_advance", broken)
    events: list[object] = []
    out = tmp_path / "o"
    # --context none: no brief request beside the book node's, so the card's count is the book node's alone
    settings = Settings(parts=2, chapters=2, sections=2, formats=("md",), context="none")
    with anyio.fail_after(60), pytest.raises(InternalError) as caught:
        await agenerate("A handbook of tide pools", sim.urls, settings, out, on_event=events.append)
    message = str(caught.value)
    assert message.startswith("internal error: RuntimeError: planner bug; the traceback is in ")
    assert "\n" not in message
    log = (out / "handbook.log").read_text()
    assert "Traceback" in log and "planner bug" in log and "_advance" in log
    assert sim.stats(0)["requests"] - before == 1  # not retried
    assert not [e for e in events if isinstance(e, BackendState)]  # and no backend blamed


def test_the_cli_says_an_internal_error_in_one_line(sim_fleet, tmp_path):
    import subprocess

    from local_http import env, job_cmd

    sim = sim_fleet(1)
    out = tmp_path / "o"
    # a consumer of ours that breaks: orchestrator.planning.stream made to raise, through python -c
    code = ("import sys; from orchestrator.planning import stream; "
            "stream.Expansion._advance = lambda self, text: 1 / 0; "
            "from orchestrator.cli.main import main; sys.exit(main(sys.argv[1:]))")
    cmd = job_cmd("A handbook of tide pools", sim.urls, out, "--parts", "2", "--chapters", "2", "--sections", "2")
    r = subprocess.run([sys.executable, "-c", code, *cmd[3:]], capture_output=True, text=True, timeout=60,
                       env=env())
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0] == f"handbook: internal error: ZeroDivisionError: division by zero; the traceback is in " \
                       f"{out / 'handbook.log'}"
    assert "ZeroDivisionError" in (out / "handbook.log").read_text()


# -- which error a task group stands for -------------------------------------------------------------------------


def test_a_group_is_ours_only_when_every_error_in_it_is():
    plan = PlanError("no outline")
    bug = RuntimeError("bug")
    assert unwrap(ExceptionGroup("g", [plan, ExceptionGroup("h", [PlanError("again")])])) is plan
    assert unwrap(ExceptionGroup("g", [ExceptionGroup("h", [bug])])) is bug
    mixed = ExceptionGroup("g", [plan, bug])
    assert unwrap(mixed) is mixed  # the bug is not hidden behind the PlanError
    err = internal_error(mixed, None)
    assert str(err).startswith("internal error: RuntimeError: bug; the traceback is in ")
    assert err.exit_code == 1


async def test_a_plan_error_beside_a_bug_ends_the_job_as_the_bug(sim_fleet, tmp_path, monkeypatch):
    """Two planning nodes fail at once: one with a PlanError (ours, expected), one with a bug."""
    from orchestrator.planning import planner

    sim = sim_fleet(1)
    real = planner.Planner.node
    calls = {"n": 0}

    async def node(self, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise PlanError("a part could not be planned")
        if calls["n"] == 3:
            raise KeyError("a bug beside it")
        return await real(self, *a, **kw)

    monkeypatch.setattr(planner.Planner, "node", node)
    settings = Settings(parts=3, chapters=2, sections=2, formats=("md",), pipeline=False)
    with anyio.fail_after(60), pytest.raises(InternalError, match="KeyError"):
        await agenerate("A handbook of tide pools", sim.urls, settings, tmp_path / "o")
