"""Streaming outline expansion: the incremental parser, the commit rule, and the planner against simulated cards."""

from __future__ import annotations

import time

import anyio
import orjson
import pytest

from orchestrator import Settings, generate
from orchestrator.core.config import Backend
from orchestrator.core.events import LevelPlanned, NodeFinished, NodeStarted
from orchestrator.dispatch.dispatcher import Dispatcher
from orchestrator.dispatch.fleet import Fleet
from orchestrator.planning import Planner, TitleStream, extract_titles, parse_titles
from orchestrator.planning.stream import Expansion
from orchestrator.sim.launch import SimFleet
from orchestrator.wire.client import BackendClient


def feed_in(text: str, k: int) -> TitleStream:
    ts = TitleStream()
    for i in range(0, len(text), k):
        ts.feed(text[i:i + k])
    return ts


# -- the incremental parser ------------------------------------------------------------------------------------

JSON_REPLY = orjson.dumps(
    {"title": 'The "Complete" Handbook', "items": ["Design, and Architecture", "Testing \\ Quality", "Ops: Day 2",
                                                   "Data ✓ Storage"]}
).decode()


@pytest.mark.parametrize("k", [1, 2, 3, 4, 7, 1000])
def test_json_titles_in_any_chunking(k):
    ts = feed_in(JSON_REPLY, k)
    title, items = extract_titles(JSON_REPLY)
    assert ts.title == title
    assert ts.items == items  # the whole array closed: every item counts


def test_json_item_counts_only_once_its_closing_quote_arrived():
    ts = TitleStream()
    ts.feed('{"title": "Book", "items": ["Alpha", "Be')
    assert ts.title == "Book" and ts.items == ["Alpha"]
    ts.feed('ta"')
    assert ts.items == ["Alpha", "Beta"]
    ts.feed(', "Gam\\"ma"]}')
    assert ts.items == ["Alpha", "Beta", 'Gam"ma']


def test_json_keys_in_other_order_and_other_keys_skipped():
    text = '```json\n{"notes": {"x": [1, 2]}, "items": ["A", "B"], "title": "T", "n": 2}\n```'
    ts = feed_in(text, 3)
    assert ts.items == ["A", "B"] and ts.title == "T"
    assert extract_titles(text) == ("T", ["A", "B"])


def test_bare_array_and_non_string_items_stop_streaming():
    assert feed_in('["a", "b"]', 2).items == ["a", "b"]
    ts = feed_in('["a", 7, "b"]', 1)
    assert ts.items == ["a"] and ts.stalled


def test_text_lines_count_once_their_newline_arrived():
    ts = TitleStream()
    ts.feed("Title: **My Book**\n1. Part One\n2. Part")
    assert ts.title == "My Book" and ts.items == ["Part One"]
    ts.feed(" Two\n3. Part Three")
    assert ts.items == ["Part One", "Part Two"]  # the last line only counts with the whole reply
    assert parse_titles("Title: **My Book**\n1. Part One\n2. Part Two\n3. Part Three", 3, True).items == (
        "Part One", "Part Two", "Part Three")


def test_text_prefix_agrees_with_the_final_parse():
    text = "Sure.\n\n1. Chapter 1: Basics\n2) `Advanced`\n- \"Extras\"\n(4) Part IV - End\n"
    ts = feed_in(text, 5)
    final = extract_titles(text)[1]
    assert final == ["Basics", "Advanced", "Extras", "End"]  # the bullet fills the gap in the numbering
    # A bullet among numbers may be a note or a title: the stream stops committing there; what it committed is
    # a prefix of the final list.
    assert ts.items == final[: len(ts.items)] and len(ts.items) >= 2


# -- the commit rule -------------------------------------------------------------------------------------------

def test_expansion_starts_children_in_order_and_stops_at_a_duplicate():
    started = []
    exp = Expansion(4, True, lambda i, t, b: started.append((i, t, b)))
    exp.new_attempt()
    for piece in ['{"title":"B', 'ook","items":["A",', '"B","a","C"]}']:
        exp.on_delta(piece)
    # "a" repeats "A": this reply will be re-asked, so nothing after it starts early
    assert started == [(0, "A", "Book"), (1, "B", "Book")]
    with pytest.raises(ValueError):
        parse_titles('{"title":"Book","items":["A","B","a","C"]}', 4, True, tuple(exp.committed), exp.title)
    # the retry changes its mind: committed titles stay first, the retry fills the rest
    exp.new_attempt()
    for piece in ['{"title":"Other","items":["X","A"', ',"D","E","F"]}']:
        exp.on_delta(piece)
    assert started == [(0, "A", "Book"), (1, "B", "Book")]  # "X" is not where "A" was: no early start
    got = parse_titles('{"title":"Other","items":["X","A","D","E","F"]}', 4, True, tuple(exp.committed), exp.title)
    assert got.title == "Book" and got.items == ("A", "B", "X", "D")


def test_expansion_retry_that_repeats_the_committed_prefix_continues():
    started = []
    exp = Expansion(3, False, lambda i, t, b: started.append(t))
    exp.new_attempt()
    exp.on_delta('{"items":["A","B"')  # then the stream is cut
    exp.new_attempt()
    exp.on_delta('{"items":["A","B","C","D"]}')
    assert started == ["A", "B", "C"]  # D is past N: trimmed, never started
    assert parse_titles('{"items":["A","B","C","D"]}', 3, False, tuple(exp.committed)).items == ("A", "B", "C")


def test_a_text_list_is_stopped_once_all_its_titles_are_committed_and_a_json_one_is_left_to_end():
    exp = Expansion(3, False, lambda i, t, b: None)
    stop = exp.watch()
    assert stop is not None
    exp.new_attempt()
    for piece in ["1. A\n2. B", "\n3. C", "\n", "3. C\n3. C\n"]:
        exp.on_delta(piece)
        if stop(piece):
            break
    # stopped at the newline that completed the third title, before the repeats were read
    assert piece == "\n" and exp.committed == ["A", "B", "C"]
    assert parse_titles("1. A\n2. B\n3. C\n", 3, False, tuple(exp.committed)).items == ("A", "B", "C")
    # a re-asked reply that repeats a committed title is not yet complete: only n committed titles stop it
    exp = Expansion(3, False, lambda i, t, b: None)
    stop = exp.watch()
    exp.new_attempt()
    for piece in ["1. A\n", "2. A\n", "3. B\n"]:
        exp.on_delta(piece)
        assert stop(piece) is None
    # JSON ends with its list (a schema bounds it): read whole
    exp = Expansion(2, False, lambda i, t, b: None)
    stop = exp.watch()
    exp.new_attempt()
    exp.on_delta('{"items":["A","B"')
    assert exp.committed == ["A", "B"] and stop('"B"') is None
    assert Expansion(3, False, None).watch() is None  # strict mode follows no stream, so stops none


def test_a_watch_only_reply_is_stopped_when_complete_but_binds_nothing_beyond_its_attempt():
    # review of 35e7d07: a chapter followed only to stop it (--context outline) had its titles committed, so a re-ask
    # after an unusable first reply kept that reply's first titles and mixed two lists
    taken: set[str] = set()
    exp = Expansion(4, False, None, taken=taken, watch_only=True)
    stop = exp.watch()
    assert stop is not None
    exp.new_attempt(1)
    exp.new_attempt(1)  # the same attempt's body built again (a server refused a field): still attempt 1
    assert exp.attempts == 1
    first = "1. Intro to Rivers\n2. River Basins\n3. River Basins\n4. Floods\n"
    exp.on_delta(first)
    assert stop(first) is None and exp.committed == ["Intro to Rivers", "River Basins"]
    assert not taken and exp.retry_note() == ""  # nothing taken for the book, nothing to keep
    exp.new_attempt(2)
    again = "1. How Rivers Begin\n2. Drainage Basins\n3. Flooding\n4. Deltas\n5. Deltas\n"
    exp.on_delta(again)
    assert stop(again) == "the list is complete" and not taken
    got = parse_titles(again, 4, False, tuple(exp.committed))
    assert got.items == ("How Rivers Begin", "Drainage Basins", "Flooding", "Deltas")
    # titles an earlier run committed (its sections exist) are final: no attempt starts afresh without them
    exp = Expansion(4, False, None, watch_only=True)
    exp.restore(None, ("A", "B"))
    exp.new_attempt(1)
    assert exp.committed == ["A", "B"] and exp.watch() is None


def test_a_watch_only_title_taken_elsewhere_while_streaming_gives_its_place_to_a_spare():
    # review of 8aae3c3: another chapter was accepted with "Shared Topic" after this reply streamed it; counted among
    # this reply's four, it stopped the stream before the spare, and the stopped reply was one title short (a re-ask)
    taken: set[str] = set()
    exp = Expansion(4, False, None, taken=taken, spares=True, watch_only=True)
    stop = exp.watch()
    assert stop is not None
    exp.new_attempt(1)
    head = "1. Shared Topic\n2. Sources\n"
    exp.on_delta(head)
    assert exp.committed == ["Shared Topic", "Sources"] and not taken
    taken.add("shared topic")  # another node's list accepted with it
    rest = "3. Mouths\n4. Deltas\n"
    exp.on_delta(rest)
    assert stop(rest) is None and exp.committed == ["Sources", "Mouths", "Deltas"]
    assert exp.collided == ["Shared Topic"]
    exp.on_delta("5. Floods\n")
    assert stop("5. Floods\n") == "the list is complete"
    assert exp.committed == ["Sources", "Mouths", "Deltas", "Floods"] and taken == {"shared topic"}


def test_strict_expansion_starts_nothing():
    exp = Expansion(3, False, None)
    exp.new_attempt()
    exp.on_delta('{"items":["A","B","C"]}')
    assert exp.committed == []


# -- against simulated cards -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cards(sim_fleet):
    return sim_fleet(2, time_scale=0.5)


def test_pipelined_and_strict_make_the_same_outline(cards, tmp_path):
    kw = {"parts": 2, "chapters": 3, "sections": 4, "words": 40, "max_tokens": 80, "formats": ("md",)}
    seen: list = []
    a = generate("Write me a complete software engineering handbook", cards.urls,
                 Settings(pipeline=True, **kw), out=tmp_path / "p", on_event=seen.append)
    b = generate("Write me a complete software engineering handbook", cards.urls,
                 Settings(pipeline=False, **kw), out=tmp_path / "s")
    assert a.complete and b.complete
    assert a.outline == b.outline
    assert a.outline.shape == (2, 6, 24)
    assert a.markdown == b.markdown
    # through the whole job (journal wrapper included): part 1 started while the book's reply still streamed
    order = [(type(ev).__name__, getattr(ev, "path", None), getattr(ev, "level", None)) for ev in seen]
    assert order.index(("NodeStarted", "1", None)) < order.index(("LevelPlanned", None, 1))


@pytest.mark.parametrize("json_schema", [True, False])
def test_children_start_while_the_parent_reply_still_streams(json_schema):
    """Drive the Planner with the real Dispatcher: a part starts before the book reply ends, a section before
    its chapter's reply ends."""
    events: list = []
    started_sections: list[tuple[float, str]] = []

    async def main() -> None:
        with SimFleet(cards=1, time_scale=1.0, no_json_schema=not json_schema) as fleet:
            backend = Backend(fleet.urls[0], cap=64)
            async with BackendClient(backend, "sim-qwen3") as client:
                fleet_ = Fleet([client], [64], events.append)
                d = Dispatcher(fleet_, events.append, attempts=3, wants_deltas=False)
                # --context none: a section's request names its titles alone, so it may start as its title streams
                # past (with outline it waits for its chapter's whole list: test_outline_context_waits_for_the_lists)
                planner = Planner(d, "Write me a complete software engineering handbook",
                                  Settings(parts=3, chapters=3, sections=6, context="none"), events.append)

                def on_section(book, part, cpath, chapter, si, title):
                    started_sections.append((time.monotonic(), f"{cpath}.{si}"))

                async with anyio.create_task_group() as tg:
                    await tg.start(fleet_.run)
                    outline = await planner.plan(on_section=on_section)
                    tg.cancel_scope.cancel()
                by_path = {}
                for ev in events:
                    if isinstance(ev, NodeStarted):
                        by_path.setdefault(ev.path, ev.t)
                assert outline.shape == (3, 9, 54)
                assert sorted(p for _, p in started_sections) == sorted(r.path for r in outline.sections())
                # the book's reply ends when level 1 is planned; part 1 started before that
                level1 = next(ev.t for ev in events if isinstance(ev, LevelPlanned) and ev.level == 1)
                assert by_path["1"] < level1
                # the first section started before the last chapter list was complete
                level3 = next(ev.t for ev in events if isinstance(ev, LevelPlanned) and ev.level == 3)
                first_section = min(t for t, _ in started_sections)
                assert first_section < level3
                # ...and before its own chapter's reply was complete (chapter 1.1's reply)
                ch = [r for k, r in d.replies if k == "chapter"]
                assert ch and first_section < max(r.t_end for r in ch)
                assert planner.t_first_section is not None and planner.t_first_section < min(
                    r.t_end for r in ch)

    anyio.run(main)


def test_outline_context_starts_a_chapters_sections_once_its_lists_and_the_brief_are_known():
    """--context outline (the default): a section's request names its chapter's sections, its part's chapters and the
    brief, so it starts only once all three are known, with what the finished outline says (that chapters still
    pipeline is test_context_outline.py's test_a_chapters_sections_start_while_another_chapter_is_planned)."""
    events: list = []
    started: list[tuple[float, str, object]] = []

    async def main() -> None:
        with SimFleet(cards=1, time_scale=1.0) as fleet:
            backend = Backend(fleet.urls[0], cap=64)
            async with BackendClient(backend, "sim-qwen3") as client:
                fleet_ = Fleet([client], [64], events.append)
                d = Dispatcher(fleet_, events.append, attempts=3, wants_deltas=False)
                planner = Planner(d, "Write me a complete software engineering handbook",
                                  Settings(parts=3, chapters=3, sections=6), events.append)

                def on_section(book, part, cpath, chapter, si, title):
                    ref = planner.section_ref(book, part, cpath, chapter, si, title)
                    started.append((time.monotonic(), ref.path, ref))

                async with anyio.create_task_group() as tg:
                    await tg.start(fleet_.run)
                    outline = await planner.plan(on_section=on_section)
                    tg.cancel_scope.cancel()
        ends = {(e.kind, e.path): e.t for e in events if isinstance(e, NodeFinished)}
        assert outline.brief and ("brief", "brief") in ends
        refs = {r.path: r for r in outline.sections()}
        assert sorted(p for _, p, _ in started) == sorted(refs)
        for t, path, ref in started:
            part, chapter = path.split(".")[0], path.rsplit(".", 1)[0]
            assert t >= ends[("chapter", chapter)] and t >= ends[("part", part)] and t >= ends[("brief", "brief")]
            assert ref == refs[path]  # what the request carries is what the finished outline says

    anyio.run(main)


def test_planning_reasks_above_temperature_zero_after_an_unusable_reply(tmp_path):
    """At temperature 0 a re-ask gets the same reply; a model that repeats titles would fail every attempt."""
    from fake_openai import FakeServer

    from orchestrator import Settings, generate

    seen: list[float] = []
    with FakeServer("repeats") as srv:
        result = generate(
            "A book", backends=[srv.url],
            # the fake model repeats titles across nodes too: distinct titles would ask again for that as well
            settings=Settings(parts=2, chapters=2, sections=2, formats=("md",), temperature=0.0, context="none",
                              distinct_titles=False),
            out=tmp_path / "o", on_event=lambda e: None,
        )
        seen = [n for n in srv.chat_requests]
    assert result.complete and result.outline.shape == (2, 4, 8)
    titles = [p.title for p in result.outline.parts]
    assert len(set(titles)) == 2
    # Every planning node needed one re-ask; sections were asked once each at temperature 0.
    assert result.stats["planning_requests"] == 2 * (1 + 2 + 4)
    assert len(seen) == 2 * 7 + 8


def test_titles_that_repeat_a_parent_or_are_placeholders_are_reasked():
    from orchestrator.book.checks import norm_title as norm
    from orchestrator.planning import parse_titles

    avoid = frozenset({norm("Software Engineering Handbook"), norm("Testing")})
    with pytest.raises(ValueError, match="parent"):
        parse_titles('{"items": ["Unit tests", "Testing"]}', 2, False, avoid=avoid)
    with pytest.raises(ValueError, match="placeholder"):
        parse_titles("1. Section 1\n2. Mocks", 2, False, avoid=avoid)
    with pytest.raises(ValueError, match="parent"):  # a part may not repeat the book's own title
        parse_titles('{"title": "Guide", "items": ["Guide", "Design"]}', 2, True)
    near = frozenset({norm("Testing Modern Web Apps Quickly")})  # nor nearly repeat a parent: one word swapped...
    with pytest.raises(ValueError, match="nearly repeats"):
        parse_titles('{"items": ["Mocks", "Testing Modern Web Apps Slowly"]}', 2, False, avoid=near)
    with pytest.raises(ValueError, match="nearly repeats"):  # ... or a part of its title
        parse_titles('{"items": ["Mocks", "Modern Web Apps Quickly"]}', 2, False, avoid=near)
    # A child that adds to its parent's title is a real subtopic.
    assert parse_titles('{"items": ["Mocks", "Testing Modern Web Apps Quickly at Scale"]}', 2, False, avoid=near).items[1]
    # The last attempt keeps the strong titles (a smaller chapter) rather than send debris on...
    got = parse_titles('{"items": ["Unit tests", "Testing"]}', 2, False, avoid=avoid, strict=False)
    assert got.items == ("Unit tests",)
    # ... and takes weak ones only when nothing else is left, rather than lose the node.
    assert parse_titles('{"items": ["Testing"]}', 2, False, avoid=avoid, strict=False).items == ("Testing",)
    assert parse_titles("1. Fakes\n2. Mocks", 2, False, avoid=avoid).items == ("Fakes", "Mocks")


def test_a_rambling_title_is_reasked_not_sent_on():
    from orchestrator.planning import parse_titles

    ramble = "Programming Language Fundamentals, " + ", ".join(f"{i}. Cloud Computing" for i in range(1, 40))
    with pytest.raises(ValueError, match=r"too long|over 12 words"):
        parse_titles(orjson.dumps({"items": ["Basics", ramble]}).decode(), 2, False)
    got = parse_titles(orjson.dumps({"items": ["Basics", ramble]}).decode(), 2, False, strict=False)
    # never sent on as a title, even on the last attempt: cut where its list starts (planning/made.shorten)
    assert got.items == ("Basics", "Programming Language Fundamentals")


def test_the_last_attempt_salvages_distinct_titles_from_earlier_replies():
    from orchestrator.planning import parse_titles

    with pytest.raises(ValueError, match="duplicate"):
        parse_titles("1. Alpha\n2. Alpha\n3. Beta", 3, False)
    got = parse_titles("1. Alpha\n2. Alpha\n3. Beta", 3, False, strict=False, pool=("Alpha", "Gamma", "Delta"))
    assert got.items == ("Alpha", "Beta", "Gamma")
    # Too few distinct titles even with the pool: a smaller chapter rather than a lost book; none at all fails.
    assert parse_titles("1. Alpha\n2. Alpha", 3, False, strict=False, pool=("Alpha",)).items == ("Alpha",)
    with pytest.raises(ValueError, match="got none"):
        parse_titles("Here are some titles:", 3, False, strict=False)
    # Strict: a repeat among more titles than asked is dropped when n distinct strong ones remain.
    assert parse_titles("1. Alpha\n2. Alpha\n3. Beta\n4. Gamma", 3, False).items == ("Alpha", "Beta", "Gamma")


def test_json_debris_and_number_chains_are_not_titles():
    from orchestrator.planning import weak_title

    for junk in ("{", 'items": [', "1.1.1.1.1.1", "42"):
        assert weak_title(junk, frozenset()), junk
    for ok in ("Testing in CI", "C++ Memory Model", "Über-Architekturen", "OOP"):
        assert weak_title(ok, frozenset()) is None, ok
