"""A section caught in a repetition loop is stopped as it streams and asked again at once (book/checks.LoopWatch,
BackendClient.chat's stop_when, SectionCheck.watcher), rather than left to loop on to its token cap.

The server is tests/fake_openai.FakeServer in mode "loops": every section asked at temperature 0 (the reference
profile's first answer) streams one line over and over to its max_tokens; the loop re-ask (temperature 0.7) gets
prose. It records how many chunks of each looping answer it wrote before the client went away."""

from __future__ import annotations

import json

import pytest
from cli_run import handbook
from fake_openai import BOOK_ARGS, FakeServer, reply

from orchestrator.book.checks import LoopWatch, loop_reason
from orchestrator.core.prompts import list_schema
from orchestrator.core.reply import STOPPED, Reply
from orchestrator.job.section_check import SectionCheck


def _feed(watch: LoopWatch, text: str, size: int = 4) -> int | None:
    """Where (characters fed) the watch fired, or None."""
    for i in range(0, len(text), size):
        if watch(text[i:i + size]) is not None:
            return i + size
    return None


PROSE = ("A river's basin is the land that drains into it. Rain that falls anywhere in the basin reaches the river in "
         "the end, through streams, soil or groundwater. That is why a river carries the history of its whole "
         "basin: the salt of its fields, the silt of its hills and the waste of its towns.\n\n")
MORE = """The Danube rises in the Black Forest and reaches the Black Sea after crossing ten countries, more than any
other river in the world. Its delta is a maze of channels, reed beds and lakes.

The Rhine was a frontier of the Roman empire for four centuries. Forts along its left bank grew into Cologne, Bonn and
Mainz, and barges still carry coal and grain past their walls.

Gauges measure a river's level several times an hour. A hydrologist turns those readings into discharge with a rating
curve, fitted from occasional measurements of velocity across the channel.

Floods are not always disasters. On the lower Loire, spring water spreads over meadows that farmers leave unploughed,
and the silt it leaves behind keeps them fertile.

Dams change a river below them as much as above. Sediment settles in the reservoir, so the clear water released
downstream scours its bed and starves the delta of sand.

"""


def test_the_watch_fires_where_the_check_after_it_would_and_not_before():
    line = "The cache keeps every record near the server that asked for it.\n"
    at = _feed(LoopWatch(), PROSE + line * 20)
    assert at is not None and at <= len(PROSE) + 3 * len(line) + 4  # at the line's third time
    assert loop_reason((PROSE + line * 20)[:at]) is not None
    run = "the river carries the silt of its hills down to the sea and "  # a loop within one paragraph
    at = _feed(LoopWatch(), PROSE + run * 40)
    assert at is not None and at < len(PROSE) + 20 * len(run) and loop_reason((PROSE + run * 40)[:at])
    # prose, a list, code with repeated short lines: never
    code = "```python\n" + "".join(f"def f{i}(x):\n    return x\n\n" for i in range(30)) + "```\n"
    listed = "".join(f"- {verb} the {thing}.\n" for verb in ("Measure", "Chart", "Sample", "Photograph", "Map")
                     for thing in ("depth at the bridge", "width at the ford", "speed of the current", "silt load",
                                   "water temperature", "banks after the flood"))
    for text in (PROSE + MORE, PROSE + code + MORE, PROSE + listed):
        assert _feed(LoopWatch(), text) is None


def test_a_stopped_answer_is_never_accepted_and_its_re_ask_is_not_watched():
    check = SectionCheck("Rivers")
    watch = check.watcher()
    assert isinstance(watch, LoopWatch)
    stopped = reply("The river.\n" * 3, STOPPED)
    with pytest.raises(ValueError, match="caught while streaming"):
        check(stopped)
    assert check.loop is not None and check.watcher() is None  # the re-ask runs to its end, and is kept
    fine = reply(PROSE, "stop", attempt=2)
    assert check(fine) == {"repaired_from": check.loop, "loop": None}


@pytest.mark.parametrize("stream", ["always", "never"])
def test_a_looping_section_is_asked_again_without_waiting_for_its_cap(tmp_path, stream):
    """Streamed, the loop is dropped a few lines in; read whole (``never``), it is judged after, as before."""
    out = tmp_path / "book"
    with FakeServer("loops", section_chunk_delay=0.01) as srv:
        proc = handbook("A handbook of rivers", *BOOK_ARGS, "--backend", srv.url, "--out", str(out),
                        "--stream-sections", stream)
    assert proc.returncode == 0, proc.stderr
    stats = json.loads((out / "stats.json").read_text())
    defects = json.loads((out / "defects.json").read_text())
    sections = stats["sections"]
    assert sections == 6 and stats["failed_sections"] == 0 and stats["empty_sections"] == 0
    # every section's first answer looped, and its re-ask was kept: none loops in the book
    assert defects["looping_sections"]["count"] == 0 and defects["looping_sections"]["repaired"] == sections
    assert len(srv.loop_streams) == sections
    assert stats["requests"] == stats["planning_requests"] + 2 * sections
    assert stats["request_errors"] == sections  # each refused first answer
    assert stats["stopped_answers"] == (sections if stream == "always" else 0)
    assert stats["warnings"] == []  # a stopped answer's tokens are counted (one a delta here): no backend without usage
    if stream == "always":  # each looping stream was dropped a few lines in, not read to its 400-token cap
        assert all(written < total / 4 for written, total in srv.loop_streams), srv.loop_streams
    book = (out / "book.md").read_text()
    assert "The cache keeps every record" not in book


@pytest.mark.parametrize("aiohttp_only", [False, True])
def test_the_client_stops_a_stream_it_is_told_to_and_never_an_answer_read_whole(aiohttp_only):
    """BackendClient.chat's stop_when, on both stream readers (sseproto, and aiohttp where it does not apply)."""
    import anyio

    from orchestrator import Backend
    from orchestrator.wire.client import BackendClient

    async def main(url: str) -> list[Reply]:
        async with BackendClient(Backend(url), "fake-model") as client:
            if aiohttp_only:
                client._pool = None  # the reader for https, or after a head sseproto could not read
            out = []
            for stream in (True, False):
                body = client.body([{"role": "user", "content": "Write the section"}], max_tokens=400,
                                   temperature=0.0, stream=stream)
                out.append(await client.chat(body, stop_when=LoopWatch()))
            return out

    with FakeServer("loops", section_chunk_delay=0.01) as srv:
        streamed, whole = anyio.run(main, srv.url)
    assert streamed.ok and streamed.finish_reason == STOPPED and loop_reason(streamed.text)
    assert len(streamed.text) < 1600 / 4  # a few lines of the 400-token loop
    # the fake takes continuous_usage_stats but sends usage only in its last event: the stopped answer's tokens
    # are the content deltas read (16 characters a delta)
    assert streamed.completion_tokens == -(-len(streamed.text) // 16) > 0
    assert srv.bodies[0]["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert srv.bodies[1].get("stream_options") is None  # read whole: unwatched
    assert srv.loop_streams[0][0] < srv.loop_streams[0][1] / 4
    assert whole.ok and whole.finish_reason == "length" and len(whole.text) == 1600  # read whole: never stopped


@pytest.mark.parametrize("status", [400, 422])
def test_a_server_that_refuses_continuous_usage_is_asked_again_without_it(status):
    """A watched stream asks for stream_options.continuous_usage_stats; a server that refuses the field (a 400 or
    422 naming it) is asked again at once without it, and never asked for it again: both replies come back. Many
    at once: each request refused is asked again, whenever the refusal of another came back."""
    import anyio

    from orchestrator import Backend
    from orchestrator.wire.client import BackendClient

    async def main(url: str) -> tuple[list[list[Reply]], list[Reply], bool | None]:
        async with BackendClient(Backend(url), "fake-model") as client:
            body = client.body([{"role": "user", "content": "Write the section"}], max_tokens=400, temperature=0.0)
            first: list[list[Reply]] = [[] for _ in range(6)]

            async def one(i: int) -> None:
                first[i] = await client.send(lambda: body, stop_when=LoopWatch())

            async with anyio.create_task_group() as tg:
                for i in range(6):
                    tg.start_soon(one, i)
            later = await client.send(lambda: body, stop_when=LoopWatch())
            return first, later, client.continuous_usage_ok

    with FakeServer("loops", section_chunk_delay=0.01, strict_stream_options=status) as srv:
        first, later, ok = anyio.run(main, srv.url)
    asked = [b for b in srv.bodies if b["stream_options"].get("continuous_usage_stats")]
    refused = [r for replies in first for r in replies if not r.ok]
    assert ok is False and 1 <= len(asked) == len(refused) <= 6
    assert all(r.status == status and "continuous_usage_stats" in (r.error or "") for r in refused)
    assert all(replies[-1].ok and replies[-1].finish_reason == STOPPED for replies in first)
    assert len(later) == 1 and later[0].finish_reason == STOPPED
    plain = [b for b in srv.bodies if b["stream_options"] == {"include_usage": True}]
    assert len(plain) == 6 + 1 and len(srv.bodies) == len(asked) + len(plain)


def test_a_server_that_refuses_both_structured_output_and_continuous_usage_gets_a_plain_request():
    """A watched planning request carries response_format and asks for continuous usage stats: a server that refuses
    the one and then the other is asked a third time with neither, and answers (review of 35e7d07: the text request
    after the structured refusal went out without the continuous-usage fallback, and its 400 failed the book node)."""
    import anyio

    from orchestrator import Backend
    from orchestrator.wire.client import BackendClient

    async def main(url: str) -> list[Reply]:
        async with BackendClient(Backend(url), "fake-model") as client:
            def body() -> dict:
                return client.body([{"role": "user", "content": "List 2 titles"}], max_tokens=64, temperature=0.0,
                                   schema=list_schema(2, False))
            return await client.send(body, stop_when=lambda _d: None)

    with FakeServer("ok", strict_stream_options=400, refuse_schema=True) as srv:
        replies = anyio.run(main, srv.url)
    assert [r.status for r in replies[:-1]] == [400, 400] and replies[-1].ok
    assert "response_format" in srv.bodies[0] and srv.bodies[1]["stream_options"].get("continuous_usage_stats")
    assert "response_format" not in srv.bodies[2] and srv.bodies[2]["stream_options"] == {"include_usage": True}


def test_a_400_about_something_else_keeps_continuous_usage():
    """Only a refusal naming the field turns continuous usage off; a context-length 400 is about the request."""
    from orchestrator.wire.refusal import error_message, rejects_continuous_usage

    assert not rejects_continuous_usage("This model's maximum context length is 2048 tokens. However, you requested "
                                        "2600 tokens (2080 in the messages, 520 in the completion).")
    assert not rejects_continuous_usage(None)
    detail = '{"detail": [{"type": "extra_forbidden", "loc": ["body", "stream_options", "continuous_usage_stats"]}]}'
    assert rejects_continuous_usage(error_message(detail))
    assert rejects_continuous_usage(error_message('{"error": {"message": "stream_options.continuous_usage_stats: '
                                                  'Extra inputs are not permitted"}}'))


def test_what_follows_the_stop_is_not_read():
    """Once the caller stopped a stream, the parser reads nothing more: not the rest of the piece the stop came in
    (its text is not the answer's; a malformed event in it fails nothing), not a later piece past the byte cap."""
    from types import SimpleNamespace

    from orchestrator.wire.sse import SseParser, StreamState, Watch

    st = StreamState(16)
    cancelled = []
    watch = Watch(SimpleNamespace(cancel=lambda: cancelled.append(True)), 0.0)  # a scope: what stop() cancels
    parser = SseParser(st, watch, lambda delta: "loop" if "b" in delta else None)
    ev = b'data: {"choices":[{"index":0,"delta":{"content":"%s"},"finish_reason":null}],"usage":' \
         b'{"prompt_tokens":3,"completion_tokens":%d}}\n\n'
    piece = ev % (b"a", 1) + ev % (b"b", 2) + ev % (b"c", 3) + b"data: {not json\n\n" + b"data: [DONE]\n\n"
    assert parser.feed(piece) is False
    assert watch.stopped == "loop" and cancelled == [True]
    assert st.parts == ["a", "b"] and st.completion_tokens == 2 and not parser.done
    assert parser.feed(b"x" * (st.max_bytes + 1)) is False and parser.close() is False  # no cap trips: not read
    assert st.parts == ["a", "b"] and st.finish is None


def test_a_body_read_whole_before_the_stop_lands_is_still_the_stopped_answer(monkeypatch):
    """A reader that had the whole body at hand returns before the stop's cancellation reaches it (no await after
    the stop): the answer is still the stopped one, never a stream cut."""
    import anyio

    from orchestrator import Backend
    from orchestrator.wire import client as client_mod
    from orchestrator.wire.sse import SseParser

    async def read_at_once(content, st, watch, on_delta) -> bool:
        parser = SseParser(st, watch, on_delta)
        parser.feed(await content.read())  # the whole body, then no await: the cancellation never lands
        return parser.close()

    monkeypatch.setattr(client_mod, "read_events", read_at_once)

    async def main(url: str) -> Reply:
        async with client_mod.BackendClient(Backend(url), "fake-model") as client:
            client._pool = None  # the aiohttp reader, patched above
            body = client.body([{"role": "user", "content": "Write the section"}], max_tokens=400, temperature=0.0)
            return await client.chat(body, stop_when=LoopWatch())

    with FakeServer("loops") as srv:
        reply = anyio.run(main, srv.url)
    assert reply.ok and reply.finish_reason == STOPPED and loop_reason(reply.text), reply
    assert len(reply.text) < 1600 / 2 and reply.completion_tokens == -(-len(reply.text) // 16)


def test_a_cut_the_reader_had_seen_before_the_stop_landed_is_no_failure():
    """aiohttp's reader (read_events) may hold a cut it saw before the stop's cancellation reaches it: once the
    caller stopped the stream, that cut ends the reading, it fails nothing (the answer is the stopped one)."""
    from types import SimpleNamespace

    import aiohttp
    import anyio

    from orchestrator.wire.sse import StreamState, Watch, read_events

    ev = b'data: {"choices":[{"index":0,"delta":{"content":"%s"},"finish_reason":null}]}\n\n'
    pieces = [ev % b"a", ev % b"b"]

    class Content:  # aiohttp.StreamReader's readany, then the cut it had seen
        async def readany(self) -> bytes:
            if pieces:
                return pieces.pop(0)
            raise aiohttp.ClientPayloadError("Response payload is not completed")

    def run(stop_on: str) -> tuple[bool, StreamState]:
        st = StreamState(16)
        watch = Watch(SimpleNamespace(cancel=lambda: None), 0.0)
        pieces[:] = [ev % b"a", ev % b"b"]
        done = anyio.run(read_events, Content(), st, watch, lambda d: "loop" if d == stop_on else None)
        return done, st

    done, st = run("b")
    assert done is False and st.parts == ["a", "b"]
    with pytest.raises(aiohttp.ClientPayloadError):  # not stopped: the cut is a cut
        run("never")
