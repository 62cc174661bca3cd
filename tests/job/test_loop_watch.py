"""A section caught in a repetition loop is stopped as it streams and asked again at once (book/checks.LoopWatch,
BackendClient.chat's stop_when, SectionCheck.watcher), rather than left to loop on to its token cap.

The server is tests/fake_openai.FakeServer in mode "loops": every section asked at temperature 0 (the reference
profile's first answer) streams one line over and over to its max_tokens; the loop re-ask (temperature 0.7) gets
prose. It records how many chunks of each looping answer it wrote before the client went away."""

from __future__ import annotations

import json

import pytest
from cli_run import handbook
from fake_openai import FakeServer

from orchestrator.book.checks import LoopWatch, loop_reason
from orchestrator.core.reply import STOPPED, Reply
from orchestrator.job.section_check import SectionCheck

# --context none: the fake server would loop the book's brief too (a request at temperature 0 that is no title list)
# --no-distinct-titles: the fake server names the sections of both chapters alike, and the re-ask for distinct titles
# would be one more refused reply
ARGS = ["--parts", "1", "--chapters", "2", "--sections", "3", "--max-tokens", "400", "--format", "md",
        "--context", "none", "--no-distinct-titles"]


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
    stopped = Reply(text="The river.\n" * 3, finish_reason=STOPPED, prompt_tokens=1, completion_tokens=9, backend="b",
                    t_start=0.0, t_first=0.1, t_end=0.2, attempt=1)
    with pytest.raises(ValueError, match="caught while streaming"):
        check(stopped)
    assert check.loop is not None and check.watcher() is None  # the re-ask runs to its end, and is kept
    fine = Reply(text=PROSE, finish_reason="stop", prompt_tokens=1, completion_tokens=60, backend="b", t_start=0.0,
                 t_first=0.1, t_end=0.2, attempt=2)
    assert check(fine) == {"repaired_from": check.loop, "loop": None}


@pytest.mark.parametrize("stream", ["always", "never"])
def test_a_looping_section_is_asked_again_without_waiting_for_its_cap(tmp_path, stream):
    """Streamed, the loop is dropped a few lines in; read whole (``never``), it is judged after, as before."""
    out = tmp_path / "book"
    with FakeServer("loops", section_chunk_delay=0.01) as srv:
        proc = handbook("A handbook of rivers", *ARGS, "--backend", srv.url, "--out", str(out),
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
    assert stats["warnings"] == []  # a stopped answer has no usage, and is no server that sends none
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


def test_a_server_that_refuses_continuous_usage_is_asked_again_without_it():
    """A watched stream asks for stream_options.continuous_usage_stats; a server that refuses the field (a 400
    naming it) is asked again at once without it, and never asked for it again: both replies come back."""
    import anyio

    from orchestrator import Backend
    from orchestrator.wire.client import BackendClient

    async def main(url: str) -> tuple[list[Reply], list[Reply], bool | None]:
        async with BackendClient(Backend(url), "fake-model") as client:
            body = client.body([{"role": "user", "content": "Write the section"}], max_tokens=400, temperature=0.0)
            first = await client.send(lambda: body, stop_when=LoopWatch())
            second = await client.send(lambda: body, stop_when=LoopWatch())
            return first, second, client.continuous_usage_ok

    with FakeServer("loops", section_chunk_delay=0.01, strict_stream_options=True) as srv:
        first, second, ok = anyio.run(main, srv.url)
    refused, answer = first
    assert refused.status == 400 and "continuous_usage_stats" in (refused.error or "")
    assert answer.ok and answer.finish_reason == STOPPED and ok is False
    assert len(second) == 1 and second[0].finish_reason == STOPPED
    assert [b.get("stream_options") for b in srv.bodies] == [
        {"include_usage": True, "continuous_usage_stats": True}, {"include_usage": True}, {"include_usage": True}]
