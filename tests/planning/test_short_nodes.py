"""A part or chapter whose replies hold fewer usable titles than asked still gets the size asked: the places the
model left empty are filled with titles made from the node's own title (planning/made.filler_titles), never left
short (a 2 x 2 x 3 book on SmolLM2-135M came back with a chapter of one section: its reply, on both attempts, was
"I'm glad you're excited about these new Python features! ..."). The book node keeps what it got: it has no title
of its own to make parts from."""

from __future__ import annotations

import logging

import pytest
from scripted_openai import Answer, Request, ScriptedServer, prose, titles

from orchestrator import Settings, generate
from orchestrator.book.checks import MAX_TITLE_WORDS, title_debris
from orchestrator.book.checks import norm_title as norm
from orchestrator.planning import parse_titles
from orchestrator.planning.made import filler_titles, shorten
from orchestrator.planning.titles import weak_title

CHATTER = "I'm glad you're excited about these new Python features! Let me know if you would like anything else."


def test_a_last_attempt_with_one_usable_title_is_filled_from_the_nodes_own_title():
    own = "Python Features"
    avoid = frozenset({norm(own), norm("A Python Handbook")})
    got = parse_titles(f"{CHATTER}\n\n1. Scrangle: A Parser Library", 3, False, avoid=avoid, strict=False, own=own)
    assert len(got.items) == 3 and got.filled == 2
    assert got.items[0] == "Scrangle: A Parser Library"  # the model's own title first, the fillers after it
    assert len({norm(t) for t in got.items}) == 3 and not {norm(t) for t in got.items} & avoid
    assert all(own in t for t in got.items[1:])


def test_a_filler_another_node_took_is_skipped_and_a_node_no_reply_named_a_title_for_still_fails():
    own = "Testing"
    taken = frozenset({norm("Core Ideas of Testing")})  # as if another node had it already
    got = parse_titles(f"{CHATTER}\n1. Unit Tests", 4, False, strict=False, taken=taken, own=own)
    assert got.filled == 3 and len({norm(t) for t in got.items}) == 4
    assert norm("Core Ideas of Testing") not in {norm(t) for t in got.items}
    # an earlier reply's title (the pool) is the model's too: the node is filled around it
    pooled = parse_titles(CHATTER, 4, False, strict=False, own=own, pool=("Unit Tests",))
    assert pooled.items[0] == "Unit Tests" and pooled.filled == 3
    # prose alone, on every attempt: the model is not following, and a book of fillers would hide it
    with pytest.raises(ValueError, match="got none"):
        parse_titles(CHATTER, 4, False, strict=False, taken=taken, own=own)
    # strict attempts are never filled: a reply short of titles is asked again
    with pytest.raises(ValueError):
        parse_titles(f"{CHATTER}\n1. Unit Tests", 4, False, strict=True, own=own)


def test_fillers_are_distinct_pass_the_title_gate_and_cover_a_sixteen_section_chapter():
    own = "Continuous Integration"
    made = filler_titles(own)
    assert len(made) >= 256 and len({norm(t) for t in made}) == len(made)
    for t in made:  # no near copy of the parent, and no debris by the planner's gate or the quality checker's
        assert weak_title(t, frozenset({norm(own)})) is None and title_debris(t, [own]) is None, t
    # a long parent title: the angles that stay within the checker's word limit come first, and the node is still
    # filled (the longer ones, shortened, pass the gate)
    long = "Designing Reliable Message Queues for Very Large Distributed Payment Systems"
    assert all(len(t.split()) <= MAX_TITLE_WORDS for t in filler_titles(long)[:3])
    got = parse_titles("1. Delivery Guarantees", 6, False, avoid=frozenset({norm(long)}), strict=False, own=long)
    assert len(got.items) == 6 and got.filled == 5
    assert all(len(t.split()) <= MAX_TITLE_WORDS for t in got.items[:4])
    got = parse_titles("1. Pipelines", 16, False, strict=False, own=own)
    assert len(got.items) == 16 and got.filled == 15


def test_a_filler_that_nearly_repeats_a_parent_is_skipped():
    # chapter "Testing" under part "Testing Tools": "Tools for Testing" only rewords the part's title
    avoid = frozenset({norm("Testing Tools"), norm("Testing")})
    got = parse_titles("1. Unit Tests", 8, False, avoid=avoid, strict=False, own="Testing")
    assert "Tools for Testing" in filler_titles("Testing") and "Tools for Testing" not in got.items
    assert len(got.items) == 8 and all(weak_title(t, avoid) is None for t in got.items)


def test_the_book_node_keeps_a_short_list_rather_than_invent_parts():
    got = parse_titles("1. Foundations\n2. Practice", 4, False, strict=False)
    assert list(got.items) == ["Foundations", "Practice"] and got.filled == 0


def test_a_book_smaller_than_asked_is_said(tmp_path, caplog):
    # stop 42, context_quality.py: SmolLM2-135M's book node gave two parts of three on both attempts, and the book
    # came out 2 x 3 x 4 with no word of it
    def answer(req: Request) -> Answer:
        if req.kind == "book":
            return Answer(titles(["Foundations", "Practice"], "The Test Book"))
        if req.kind in ("part", "chapter"):
            return Answer(titles([f"{req.title} {w}" for w in ("Origins", "Methods")]))
        return Answer(prose(req.title))

    settings = Settings(parts=3, chapters=2, sections=2, words=40, max_tokens=80, formats=("md",), attempts=2,
                        context="none")
    with caplog.at_level(logging.WARNING, logger="handbook"), ScriptedServer(answer) as srv:
        result = generate("A test book", [srv.url], settings, out=tmp_path / "o", on_event=lambda e: None)
    assert result.complete and result.outline.shape == (2, 4, 8)
    said = [r.getMessage() for r in caplog.records if "the book node" in r.getMessage()]
    assert said == ["the book node: its replies gave 2 distinct usable title(s) of the 3 asked; the book has 2"]


@pytest.mark.parametrize("pipeline", [True, False])
def test_a_chapter_answered_with_one_title_then_chatter_still_has_every_section(tmp_path, caplog, pipeline):
    parts, chapters = ["Foundations", "Practice"], {"Foundations": ["Basics", "Habits"],
                                                    "Practice": ["Reviews", "Releases"]}

    def answer(req: Request) -> Answer:
        if req.kind == "book":
            return Answer(titles(parts, "The Test Book"))
        if req.kind == "part":
            return Answer(titles(chapters[req.title]))
        if req.kind == "chapter":
            if req.title == "Habits":  # one title on the first attempt, none on the others
                return Answer(titles(["Habits of Mind"]) if req.nth == 1 else CHATTER)
            return Answer(titles([f"{req.title} {w}" for w in ("Origins", "Methods", "Limits")]))
        if req.kind == "section":
            return Answer(prose(req.title))
        raise AssertionError(f"unexpected request: {req.prompt[:200]!r}")

    settings = Settings(parts=2, chapters=2, sections=3, words=40, max_tokens=80, formats=("md",), attempts=3,
                        context="none", pipeline=pipeline)
    with caplog.at_level(logging.WARNING, logger="handbook"), ScriptedServer(answer) as srv:
        result = generate("A test book", [srv.url], settings, out=tmp_path / "o", on_event=lambda e: None)
        habits = [r for r in srv.of("chapter") if r.title == "Habits"]
    assert result.complete
    assert result.outline.shape == (2, 4, 12)
    assert len(habits) == 3  # asked as often as any unusable reply is, then filled
    got = result.outline.parts[0].chapters[1]
    assert got.title == "Habits" and list(got.sections) == ["Habits of Mind", *filler_titles("Habits")[:2]]
    everything = [result.outline.title, *parts, *(c for cs in chapters.values() for c in cs),
                  *(s for p in result.outline.parts for c in p.chapters for s in c.sections)]
    assert len({norm(t) for t in everything}) == len(everything)  # the fillers repeat no title of the book
    assert result.stats["sections"] == 12 and result.stats["empty_sections"] == 0
    assert any("chapter 'Habits'" in r.getMessage() and "1 usable title(s) of the 3 it needs; the other 2 are made" in r.getMessage()
               for r in caplog.records)


def test_with_a_title_of_its_own_a_node_takes_fillers_rather_than_debris_or_a_copy():
    own = "Version Control"
    avoid = frozenset({norm(own)})
    got = parse_titles('1. Version Control\n2. {"items": [\n3. Section 3', 3, False, avoid=avoid, strict=False,
                       own=own)
    assert got.filled == 3 and list(got.items) == filler_titles(own)[:3]


def test_a_rambling_title_is_cut_where_its_description_starts():
    # cut at the first separator within the word limit that keeps three words: the model's description after it goes
    long = "Design Patterns: No Entry (DnN) - A book that provides information on every pattern there is"
    assert shorten(long) == "Design Patterns: No Entry"
    assert shorten("Testing Web Apps: A Guide to Fast, Reliable, Repeatable Tests for Teams That Ship Daily") == (
        "Testing Web Apps")
    # no separator keeping three words: cut at the limit, without the function words it would end on
    assert shorten("Chapter 3: Understanding how data flows through a pipeline when the input is large and "
                   "unbounded") == "Chapter 3: Understanding how data flows through a pipeline when the input"
    cut = shorten(" ".join(f"w{i}" for i in range(30)))
    assert cut.split() == [f"w{i}" for i in range(MAX_TITLE_WORDS)]
    # within the limit: as it is, spaces made single, trailing punctuation kept
    assert shorten("Testing  Web Apps:") == "Testing Web Apps:"
    # a cut back to the parent's title is a copy of it: the title gate refuses it
    assert weak_title(shorten(long), frozenset({norm("Design Patterns: No Entry (DnN)")})) is not None
    assert weak_title(shorten(long), frozenset({norm("Design Patterns: No Entry")})) is not None


def test_a_line_cut_to_a_titles_length_comes_after_the_fillers_and_letters_that_make_no_word_are_no_title():
    # SmolLM2-135M's last replies for a part "Design Patterns" (a software handbook, stop 41): sentences the gate
    # had cut to twelve words became chapter titles, and a run of letters a section title
    reply = ("1. Design Patterns: I have designed 50 different design pattern varieties using Javadoc and many more\n"
             "2. Understanding the basics of the observer pattern.\n"
             "3. abcdmccgjhx8lqwz700eakriwfpliksbzdxcpfaaliyafognircprrrsnof\n"
             "4. Factory Methods\n")
    got = parse_titles(reply, 4, False, strict=False, own="Design Patterns")
    assert got.items == ("Understanding the basics of the observer pattern.", "Factory Methods",
                         *filler_titles("Design Patterns")[:2]) and got.filled == 2
    # the book node has no fillers: the cut sentence is kept rather than a smaller book, the run of letters is not
    book = parse_titles(reply, 4, False, strict=False)
    assert book.items == ("Understanding the basics of the observer pattern.", "Factory Methods",
                          "Design Patterns: I have designed 50 different design pattern varieties using Javadoc")
    # fillers the book already holds: a cut line fills the place, and the made ones still come last (the warning
    # names the last ``filled`` titles)
    taken = frozenset(norm(t) for t in filler_titles("Design Patterns")[1:])
    short = parse_titles(reply, 4, False, strict=False, own="Design Patterns", taken=taken)
    assert short.items[2].startswith("Design Patterns: I have designed") and short.filled == 1
    assert short.items[3] == filler_titles("Design Patterns")[0]
    # a cut that ends on a lone sign loses it, as it loses a dangling "and" (the gate refuses a title ending on one)
    cut = shorten("Input/Output Streams Buffers Readers Writers Encoders Decoders Sockets Pipes Files Links & More")
    assert cut == "Input/Output Streams Buffers Readers Writers Encoders Decoders Sockets Pipes Files Links"
    assert title_debris(cut) is None
    for junk in ("abcdmccgjhx8lqwz700eakriwfpliksbzdxcpfaaliyafognircprrrsnof",
                 "AbcdMCCGJHQRYZDRIDDULFFTNHRXUKZEYIFREBDEHEQLEMRED"):
        assert title_debris(junk) is not None
    # long words of real titles pass: an identifier in camel case, a script written without spaces
    for ok in ("Internationalization and Localization", "Handling ConcurrentModificationException in Loops",
               "AbstractSingletonProxyFactoryBean in Spring", "日本の川と湖についての非常に長いタイトルの例です日本の川と湖についての"):
        assert title_debris(ok) is None and weak_title(ok, frozenset()) is None


@pytest.mark.parametrize("pipeline", [True, False])
def test_a_list_cut_at_the_token_cap_loses_its_cut_line_not_a_title_to_it(tmp_path, pipeline):
    # make demo at stop 42: a part's reply ran to its cap on "... 1. Test and", and "Test and" became a chapter
    def answer(req: Request) -> Answer:
        if req.kind == "book":
            return Answer(titles(["Foundations", "Practice"], "The Test Book"))
        if req.kind == "part" and req.title == "Practice":
            return Answer("1. Reviews\n2. Releases\n3. Integration Tes", finish_reason="length")
        if req.kind in ("part", "chapter"):
            return Answer(titles([f"{req.title} {w}" for w in ("Origins", "Methods", "Limits")]))
        return Answer(prose(req.title))

    settings = Settings(parts=2, chapters=3, sections=2, words=40, max_tokens=80, formats=("md",), attempts=2,
                        context="none", pipeline=pipeline)
    with ScriptedServer(answer) as srv:
        result = generate("A test book", [srv.url], settings, out=tmp_path / "o", on_event=lambda e: None)
    assert result.complete and result.outline.shape == (2, 6, 12)
    practice = [c.title for c in result.outline.parts[1].chapters]
    assert practice[:2] == ["Reviews", "Releases"] and practice[2] in filler_titles("Practice"), practice
