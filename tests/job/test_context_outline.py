"""Sections that see the plan (issue 28 §1), through the real CLI against a scripted server: with the default
``--context outline`` the planner asks for the book's brief once, beside the book node; every section request
carries the brief, its part's chapter titles and its chapter's section titles, with the chapter's requests sharing
one prompt prefix up to the section's own line; outline.md shows the brief where a person edits it, and an edited
brief redoes every section (a rerun without an edit asks nothing). A brief that cannot be had is no brief: the
book is written without one. ``--context none`` asks what the reference asked."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from local_http import env, job_cmd
from scripted_book import BRIEF, SHAPE, book_answer, journal_rows
from scripted_openai import Answer, Request, ScriptedServer

from orchestrator.core.outline_md import read_outline_md

CHAPTERS = {"Basics": [f"Basics {i}" for i in range(1, 5)], "Practice": [f"Practice {i}" for i in range(1, 5)]}


def _user(req: Request) -> str:
    return req.body["messages"][-1]["content"]


def _run(cmd: list[str], srv: ScriptedServer) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*cmd, "--backend", srv.url], capture_output=True, text=True, timeout=120, env=env())


def test_every_section_request_carries_the_brief_and_the_plan_with_a_shared_prefix(tmp_path):
    out = tmp_path / "o"
    with ScriptedServer(book_answer) as srv:
        run = _run(job_cmd("A test book", [], out, *SHAPE), srv)
        assert run.returncode == 0, run.stderr
        briefs, sections = srv.of("brief"), srv.of("section")
    assert len(briefs) == 1 and briefs[0].title == "A test book"
    assert len(sections) == 8 and all(r.nth == 1 for r in sections)
    by_title = {r.title: _user(r) for r in sections}
    for titles in CHAPTERS.values():
        texts = [by_title[t] for t in titles]
        for i, (title, text) in enumerate(zip(titles, texts), 1):
            assert BRIEF in text, text
            assert "Basics" in text and "Practice" in text  # the part's chapter titles
            assert all(t in text for t in titles)  # the chapter's section titles, this one's included
            assert f'Write the section "{title}" (section {i} of the chapter)' in text
            # everything before the section's own line is the chapter's shared prefix
            assert text.index(f'Write the section "{title}"') > text.index(titles[-1])
        prefix = os.path.commonprefix(texts)  # noqa: RUF071 - the characters the requests share, as a cache sees
        assert prefix.endswith(titles[-1] + "\n") or all(t in prefix for t in titles), prefix[-200:]
        assert len(prefix) >= len(texts[0]) - 120
    stats = json.loads((out / "stats.json").read_text())
    assert stats["planning_requests"] == 1 + 1 + 1 + 2  # the brief, the book, one part, two chapters
    assert stats["requests"] == stats["planning_requests"] + 8
    outline = json.loads((out / "outline.json").read_text())
    assert outline["brief"] == BRIEF


def test_a_chapters_sections_start_while_another_chapter_is_planned(tmp_path):
    # The "Practice" chapter's list comes 3 s late; "Basics"'s sections need only their own chapter's list, the
    # part's and the brief, so they are asked while "Practice" is still being planned.
    def answer(req: Request) -> Answer:
        if req.kind == "chapter" and req.title == "Practice":
            return Answer(book_answer(req).text, delay_s=3.0)
        return book_answer(req)

    with ScriptedServer(answer) as srv:
        run = _run(job_cmd("A test book", [], tmp_path / "o", *SHAPE), srv)
        assert run.returncode == 0, run.stderr
        (practice,) = [r for r in srv.of("chapter") if r.title == "Practice"]
        basics = [r for r in srv.of("section") if r.title.startswith("Basics")]
    assert len(basics) == 4 and max(r.t for r in basics) < practice.t + 3.0


def test_context_none_asks_no_brief_and_sends_the_references_request(tmp_path):
    out = tmp_path / "o"
    with ScriptedServer(book_answer) as srv:
        run = _run(job_cmd("A test book", [], out, *SHAPE, "--context", "none"), srv)
        assert run.returncode == 0, run.stderr
        assert not srv.of("brief")
        for r in srv.of("section"):
            assert _user(r) == (f'Book: "The Test Book"\nPart: "Foundations"\nChapter: "{r.title.split()[0]}"\n'
                                f'Write the section "{r.title}" in about 250 words of Markdown.')
    assert "brief" not in json.loads((out / "outline.json").read_text())


def test_a_brief_that_fails_is_no_brief_and_the_book_is_still_written(tmp_path):
    def answer(req: Request) -> Answer:
        if req.kind == "brief":
            return Answer(status=500, error="the brief's server is broken")
        return book_answer(req)

    out = tmp_path / "o"
    with ScriptedServer(answer) as srv:
        run = _run(job_cmd("A test book", [], out, *SHAPE), srv)
        assert run.returncode == 0, run.stderr
        assert 1 <= len(srv.of("brief")) <= 2  # one retry at most: sections wait for it
        assert len(srv.of("section")) == 8
        assert all(BRIEF not in _user(r) and "About the book" not in _user(r) for r in srv.of("section"))
    assert "the book brief could not be made" in run.stderr


def test_an_edited_brief_redoes_the_sections_and_an_unedited_rerun_asks_nothing(tmp_path):
    out = tmp_path / "o"
    plan = [a for a in job_cmd("A test book", [], out, *SHAPE) if a != "-q"]
    plan[plan.index("-m") + 2:plan.index("-m") + 2] = ["plan"]  # python -m orchestrator plan PROMPT ...
    with ScriptedServer(book_answer) as srv:
        run = _run(plan, srv)
        assert run.returncode == 0, run.stderr
        md = (out / "outline.md").read_text()
        assert "> This book is for testers" in md and md.index("> This book") < md.index("## Foundations")
        assert read_outline_md(out / "outline.md").brief == BRIEF
        write = ["-m", "orchestrator", "write", str(out), "-q", "--format", "md"]
        first = subprocess.run([plan[0], *write, "--backend", srv.url], capture_output=True, text=True,
                               timeout=120, env=env())
        assert first.returncode == 0, first.stderr
        assert len(srv.of("section")) == 8 and all(BRIEF in _user(r) for r in srv.of("section"))
        before = len(srv.requests)
        again = subprocess.run([plan[0], *write, "--backend", srv.url], capture_output=True, text=True,
                               timeout=120, env=env())
        assert again.returncode == 0, again.stderr
        assert len(srv.requests) == before, "a rerun with nothing edited asked again"
        (out / "outline.md").write_text(md.replace("> This book is for testers", "> This book is for auditors"))
        edited = subprocess.run([plan[0], *write, "--backend", srv.url], capture_output=True, text=True,
                                timeout=120, env=env())
        assert edited.returncode == 0, edited.stderr
        redone = srv.requests[before:]
        assert sorted(r.title for r in redone) == sorted(t for ts in CHAPTERS.values() for t in ts)
        assert all("This book is for auditors" in _user(r) for r in redone)


def test_the_small_profile_asks_no_brief_and_sends_the_chapters_titles(tmp_path):
    # A 135M model copies a brief into its sections instead of following it (core/profiles.py): no brief is asked,
    # and its section requests name the chapter's sections, the section's own line last.
    out = tmp_path / "o"
    with ScriptedServer(book_answer) as srv:
        run = _run(job_cmd("A test book", [], out, *SHAPE, "--profile", "small", "--planning", "json"), srv)
        assert run.returncode == 0, run.stderr
        assert not srv.of("brief")
        sections = srv.of("section")
    assert len(sections) == 8
    for r in sections:
        text = _user(r)
        assert text.startswith(('Topics of "Basics", each written separately: Basics 1; Basics 2; Basics 3; '
                                'Basics 4.\n', 'Topics of "Practice", each written separately: Practice 1; '
                                'Practice 2; Practice 3; Practice 4.\n')), text
        # the book is named in the section's own line: a first line "This is a <book>." made the model describe
        # "the document" (templates/prompts/section_small_outline.j2)
        assert text.rstrip().endswith(f'Explain "{r.title}" in about 250 words for the test book. Use short paragraphs '
                                      "and one example. Keep to this one topic.")
    assert "brief" not in json.loads((out / "outline.json").read_text())


@pytest.mark.parametrize("context", ["outline", "none"])
def test_a_chapter_list_that_runs_on_is_stopped_once_its_titles_are_in(tmp_path, context):
    # "Practice"'s reply lists its four titles as text, then repeats the last one and falls silent with the stream
    # open (as a small model looping to its token cap, only slower). The list is complete at the fourth line: the
    # reply is read no further, the node is not asked again, and its sections are written (outline: they start from
    # the whole list, which is now known).
    listed = "".join(f"{i}. Practice {i}\n" for i in range(1, 5))

    def answer(req: Request) -> Answer:
        if req.kind == "chapter" and req.title == "Practice":
            looping = listed + "4. Practice 4\n" * 40
            return Answer(looping, hang_after=len(listed) + 20)
        return book_answer(req)

    out = tmp_path / "o"
    with ScriptedServer(answer) as srv:
        run = _run(job_cmd("A test book", [], out, *SHAPE, "--context", context, "--chunk-timeout", "30"), srv)
        assert run.returncode == 0, run.stderr
        practice = [r for r in srv.of("chapter") if r.title == "Practice"]
    assert len(practice) == 1  # read until complete, not until the chunk timeout cut it and it was asked again
    stats = json.loads((out / "stats.json").read_text())
    assert stats["planning_stopped"] == 1 and stats["request_errors"] == 0 and stats["stopped_answers"] == 0
    assert stats["sections"] == 8 and stats["failed_sections"] == 0
    outline = json.loads((out / "outline.json").read_text())
    (chapter,) = [c for p in outline["parts"] for c in p["chapters"] if c["title"] == "Practice"]
    assert chapter["sections"] == [f"Practice {i}" for i in range(1, 5)]
    (row,) = journal_rows(out, "SELECT finish_reason, text FROM nodes WHERE kind = 'chapter' AND title = 'Practice'")
    # the text read: the list and what came in the same chunk (8 characters), no more
    assert row[0] == "stopped" and row[1].startswith(listed.rstrip()) and len(row[1]) <= len(listed) + 8, row


def test_a_title_another_chapter_took_while_this_ones_list_streamed_is_not_kept(tmp_path):
    # review of 2310bcd: a chapter followed only to stop it (context outline) streamed "Shared Topic" before the
    # other chapter, which offered it too, was accepted with it; the stopped list kept it, and the book had it twice
    def answer(req: Request) -> Answer:
        if req.kind == "chapter":
            text = "1. Shared Topic\n" + "".join(f"{i}. {req.title} {i}\n" for i in range(2, 8))
            if req.title == "Basics":  # accepted first, about 1 s in
                return Answer(text, delay_s=1.0)
            return Answer(text, pause_at=len("1. Shared Topic\n") + 1, pause_s=3.0)  # waits after its first title
        return book_answer(req)

    out = tmp_path / "o"
    with ScriptedServer(answer) as srv:
        run = _run(job_cmd("A test book", [], out, *SHAPE), srv)
        assert run.returncode == 0, run.stderr
        chapters = {r.title: r for r in srv.of("chapter") if r.nth == 1}
        practice = [r for r in srv.of("chapter") if r.title == "Practice"]
    # the scenario: Practice had streamed "Shared Topic" (at once) before Basics' list was accepted (after 1 s)
    assert chapters["Practice"].t < chapters["Basics"].t + 1.0
    outline = json.loads((out / "outline.json").read_text())
    sections = [t for p in outline["parts"] for c in p["chapters"] for t in c["sections"]]
    assert len(sections) == 8 and sections.count("Shared Topic") == 1, sections
    stats = json.loads((out / "stats.json").read_text())
    assert stats["failed_sections"] == 0 and stats["planning_stopped"] >= 1
    # review of 8aae3c3: the taken title gives its place to the reply's next line, read before the stream is
    # stopped; the list is not asked for again (a stopped reply one title short was a re-ask at temperature 0.7)
    assert len(practice) == 1 and stats["request_errors"] == 0, (len(practice), stats["request_errors"])
