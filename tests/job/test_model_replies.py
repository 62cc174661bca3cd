"""Never silently wrong about what a model sent: only stop and length are answers (partial, heading-only and
filtered replies are retried, never journaled), titles are parsed out of the messy replies real models give,
structured output is learnt only from JSON, and model profiles shape the requests (a small model's few-shot lists
and loop repair, the published-take preset). Jobs run as the real CLI against a scripted server on 127.0.0.1."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import anyio
import pytest
from local_http import env, job_cmd
from scripted_book import SHAPE, assert_each_section_under_its_own_heading, book_answer, sections_of
from scripted_openai import Answer, Request, ScriptedServer, prose, titles

# -- finish reasons ---------------------------------------------------------------------------------------------


async def _chat(url: str, answer_kw: dict | None = None):
    from orchestrator.core.config import Backend
    from orchestrator.wire.client import BackendClient

    async with BackendClient(Backend(url), "scripted-model") as c:
        return await c.chat(c.body([{"role": "user", "content": 'Write the section "S" in about 9 words.'}],
                                   max_tokens=50, temperature=0))


@pytest.mark.parametrize("reason", ["abort", "error", "content_filter", "tool_calls"])
def test_only_stop_and_length_are_answers(reason):
    with ScriptedServer(lambda req: Answer(prose("S"), finish_reason=reason)) as srv:
        r = anyio.run(_chat, srv.url)
    assert not r.ok and r.retryable and reason in (r.error or "")


@pytest.mark.parametrize("reason", ["stop", "length", "eos_token"])
def test_stop_and_length_are_answers(reason):
    with ScriptedServer(lambda req: Answer(prose("S"), finish_reason=reason)) as srv:
        r = anyio.run(_chat, srv.url)
    assert r.ok and r.finish_reason in ("stop", "length")


def test_a_stream_without_a_finish_reason_is_cut():
    with ScriptedServer(lambda req: Answer(prose("S"), finish_reason=None)) as srv:
        r = anyio.run(_chat, srv.url)
    assert not r.ok and r.retryable and "cut" in (r.error or "")


def test_partial_and_heading_only_replies_are_retried_never_journaled(tmp_path):
    """A section aborted mid-way, one that only repeats its heading, and one filtered: each is retried; the
    book holds the full answers and the journal never held the partial ones."""
    out = tmp_path / "o"

    def answer(req: Request) -> Answer:
        if req.kind == "section" and req.nth == 1:
            if req.title == "Basics 1":
                return Answer(prose(req.title)[:30], finish_reason="abort")
            if req.title == "Basics 2":
                return Answer(f"## {req.title}\n\n", finish_reason="stop")
            if req.title == "Basics 3":
                return Answer("", finish_reason="content_filter")
        return book_answer(req)

    with ScriptedServer(answer) as srv:
        run = subprocess.run(job_cmd("A test book", [srv.url], out, *SHAPE), capture_output=True, text=True,
                             timeout=120, env=env())
        assert run.returncode == 0, run.stderr
        retried = {r.title for r in srv.of("section") if r.nth == 2}
    assert retried == {"Basics 1", "Basics 2", "Basics 3"}
    assert_each_section_under_its_own_heading((out / "book.md").read_text(), 8)
    stats = json.loads((out / "stats.json").read_text())
    assert stats["request_errors"] == 3 and stats["failed_sections"] == 0 and stats["empty_sections"] == 0
    # the heading-only answer was the server's answer, refused by our check: not the server's error; the aborted and
    # the filtered ones were the server's
    assert stats["unusable_replies"] == 1
    (backend,) = stats["per_backend"]
    assert backend["errors"] == 2 and backend["unusable"] == 1


# -- replies real models give -----------------------------------------------------------------------------------


MESSY = [
    ('Here is the outline:\n```json\n{"title": "My Book", "items": ["Alpha", "Beta", "Gamma"]}\n```\n'
     "Let me know if you want changes!", "My Book", ["Alpha", "Beta", "Gamma"]),
    ('Sure! {"items": ["Alpha", "Beta", "Gamma"]} Hope this helps.', None, ["Alpha", "Beta", "Gamma"]),
    ("1. **Alpha**: the basics of it\n2. **Beta** - going further\n3. **Gamma**", None, ["Alpha", "Beta", "Gamma"]),
    ("Part I: Alpha\nPart II: Beta\nPart III: Gamma", None, ["Alpha", "Beta", "Gamma"]),
    ("Part One - Alpha\nPart Two - Beta\nPart Three - Gamma", None, ["Alpha", "Beta", "Gamma"]),
    ("Here are the sections:\n\n1. Alpha\n   - what it is\n   - why it matters\n2. Beta\n   * details\n3. Gamma\n\n"
     "I hope this outline works for you.", None, ["Alpha", "Beta", "Gamma"]),
    ("1. Alpha\n- a note\n2. Beta\n- another note\n3. Gamma", None, ["Alpha", "Beta", "Gamma"]),
    ("Here are three titles for your chapter:\nAlpha\nBeta\nGamma\nFeel free to adjust them as you see fit.",
     None, ["Alpha", "Beta", "Gamma"]),
    ('[{"title": "Alpha"}, {"title": "Beta"}, {"title": "Gamma"}]', None, ["Alpha", "Beta", "Gamma"]),
    ("Title: My Book\n1. Alpha\n2. Beta\n3. Gamma\n4. Delta", "My Book", ["Alpha", "Beta", "Gamma", "Delta"]),
    ("Notes:\n- Keep Titles Short\n1. Alpha\n2. Beta\n3. Gamma", None, ["Alpha", "Beta", "Gamma"]),
    ("1. Alpha\n2. Beta\n3. Gamma\n- a final note", None, ["Alpha", "Beta", "Gamma"]),
]


@pytest.mark.parametrize(("text", "title", "items"), MESSY)
def test_titles_are_parsed_out_of_what_models_really_send(text, title, items):
    from orchestrator.planning import extract_titles, parse_titles

    assert extract_titles(text) == (title, items)
    got = parse_titles(text, 3, want_title=True)  # more than asked: trimmed; no book title: not a failure
    assert got.items == tuple(items[:3]) and got.title == title


def test_the_stream_never_commits_what_the_final_parse_rejects():
    from orchestrator.planning import TitleStream, extract_titles

    for text, _, _ in MESSY:
        ts = TitleStream()
        for i in range(0, len(text), 3):
            ts.feed(text[i:i + 3])
        final = extract_titles(text)[1]
        assert ts.items == final[: len(ts.items)], text


def test_brackets_nested_past_the_parsers_depth_are_an_unusable_reply_not_a_crash():
    # review of ffb843b: a model in a loop writes "[[[[..." (a planning reply may run to 1,024 tokens); json's
    # RecursionError is no ValueError, so it ended the job instead of asking again
    from orchestrator.planning import parse_titles

    with pytest.raises(ValueError, match="expected 3 titles"):
        parse_titles("[" * 5000, 3, False)
    assert parse_titles("[" * 5000 + "\n1. Alpha\n2. Beta\n3. Gamma", 3, False).items == ("Alpha", "Beta", "Gamma")


def test_too_few_titles_is_asked_again_not_padded_with_prose():
    from orchestrator.planning import parse_titles

    with pytest.raises(ValueError, match="expected 3 titles"):
        parse_titles("Here are the titles:\n1. Alpha\n2. Beta\nI hope these help.", 3, False)


def test_book_title_falls_back_to_one_made_from_the_prompt():
    from orchestrator.planning import book_title_from_prompt

    assert book_title_from_prompt("Write me a complete software engineering handbook. Every topic, with "
                                  "examples.") == "Software Engineering Handbook"
    assert book_title_from_prompt("A field guide to the birds of Europe") == "A Field Guide to the Birds of Europe"


def test_a_job_whose_model_gives_prose_fences_and_no_book_title_still_makes_its_book(tmp_path):
    out = tmp_path / "o"

    def answer(req: Request) -> Answer:
        if req.kind == "book":
            return Answer("Certainly! Here is a plan.\n\n1. **Foundations**: where it starts\n\nEnjoy writing it.")
        if req.kind == "part":
            return Answer('Here is the outline:\n```json\n{"items": ["Basics", "Practice"]}\n```\nLet me know!')
        if req.kind == "chapter":
            return Answer(f"Sections:\n1. {req.title} one\n   - detail\n2. {req.title} two\n3. {req.title} three\n"
                          f"4. {req.title} four\n5. {req.title} five\n\nI hope this helps.")
        return Answer(prose(req.title))

    with ScriptedServer(answer) as srv:
        run = subprocess.run(job_cmd("Write me a complete guide to beekeeping", [srv.url], out, *SHAPE),
                             capture_output=True, text=True, timeout=120, env=env())
    assert run.returncode == 0, run.stderr
    md = (out / "book.md").read_text()
    assert md.startswith("# Guide to Beekeeping\n")
    assert "## Foundations" in md and "### Basics" in md and "### Practice" in md
    assert list(sections_of(md)) == [f"{c} {n}" for c in ("Basics", "Practice")
                                     for n in ("one", "two", "three", "four")]
    assert_each_section_under_its_own_heading(md, 8)
    stats = json.loads((out / "stats.json").read_text())
    # the book, its part, two chapters and the brief (--context outline): no re-ask for the missing book title, the
    # prose or the fences
    assert stats["planning_requests"] == 5


async def _plan_requests(url: str, replies: list[Answer]):
    """Planning requests through the Dispatcher; returns the client's json_schema_ok after each, and the
    dispatcher's request count and replies."""
    from orchestrator.core.config import Backend
    from orchestrator.core.prompts import list_schema
    from orchestrator.dispatch.dispatcher import Dispatcher
    from orchestrator.dispatch.fleet import Fleet
    from orchestrator.wire.client import BackendClient

    seen = []
    async with BackendClient(Backend(url), "scripted-model") as client:
        fleet = Fleet([client], [4], lambda e: None)
        d = Dispatcher(fleet, lambda e: None, attempts=1, wants_deltas=False)
        async with anyio.create_task_group() as tg:
            await tg.start(fleet.run)
            for _ in replies:
                await d.run("1", "part", "P", lambda c, n: c.body(
                    [{"role": "user", "content": 'List 3 chapter titles for part "P".'}], max_tokens=50,
                    temperature=0, schema=list_schema(3, False)))  # the client decides whether to send it
                seen.append(client.json_schema_ok)
            tg.cancel_scope.cancel()
    return seen, d.requests, [r for _, r in d.replies]


def test_structured_output_is_learnt_only_from_json_and_only_a_format_400_turns_it_off():
    replies = [
        Answer("1. Alpha\n2. Beta\n3. Gamma"),  # accepted the field, ignored it: not proof
        Answer(status=400, error="This model's maximum context length is 2048 tokens. However, you requested "
                                 "4096 tokens"),  # about the context, not the format
        Answer(titles(["Alpha", "Beta", "Gamma"])),  # JSON: the schema is honoured
    ]
    it = iter(replies)
    with ScriptedServer(lambda req: next(it)) as srv:
        seen, requests, _ = anyio.run(_plan_requests, srv.url, replies)
    assert seen == [None, None, True] and requests == 3
    it2 = iter([Answer(status=400, error="response_format json_schema is not supported"), Answer("1. A\n2. B\n3. C"),
                Answer("1. D\n2. E\n3. F")])
    with ScriptedServer(lambda req: next(it2)) as srv:
        seen, requests, got = anyio.run(_plan_requests, srv.url, [Answer(), Answer()])
        assert "response_format" in srv.requests[0].body
        # asked again in text at once, and every later request of this client is text
        assert len(srv.requests) == 3 and not any("response_format" in r.body for r in srv.requests[1:])
    assert seen == [False, False]
    # the refused request is a request too: counted and recorded (as an error), before the answer it led to
    assert requests == 3 and [r.status for r in got][:1] == [400] and [r.ok for r in got] == [False, True, True]


# -- issue 12: model profiles, list planning, loop repair -------------------------------------------------------


def _small_model_answer(req: Request) -> Answer:
    """A small model's habits: numbered lists with a repeat and the parent's own title among them; one section
    loops on its first try."""
    if req.kind == "other" and "main topics" in req.prompt:
        return Answer("1. Foundations\n2. Foundations\n3. Practice\n4. Test Book\n5. Tools")
    if req.kind == "other" and "subtopics of" in req.prompt:
        parent = re.findall(r'subtopics of "(.*?)"', req.prompt)[-1]
        return Answer("\n".join(f"{i}. {t}" for i, t in enumerate(
            [parent, f"{parent} Basics", f"{parent} in Depth", f"{parent} Pitfalls", f"{parent} Tools",
             f"{parent} Cases"], 1)))
    if req.kind == "section" and req.prompt.startswith("You are"):  # the small profile's 'Explain "X"' request
        title = re.search(r'Explain "(.*?)"', req.prompt).group(1)
        if title.endswith("Pitfalls") and req.body.get("temperature", 0) < 0.5:
            return Answer(f"## {title}\n" + f"{title} is hard. It is very hard indeed.\n" * 30, finish_reason="length")
        return Answer(prose(title))
    raise AssertionError(f"unexpected request: {req.prompt[:200]!r}")


def test_a_small_model_gets_few_shot_lists_a_system_message_and_loop_repair(tmp_path):
    out = tmp_path / "o"
    with ScriptedServer(_small_model_answer, model="smollm2-135m-instruct") as srv:
        run = subprocess.run(job_cmd("Write me a test book", [srv.url], out, "--parts", "2", "--chapters", "2",
                                     "--sections", "3"), capture_output=True, text=True, timeout=120, env=env())
        reqs = list(srv.requests)
    assert run.returncode == 0, run.stderr
    planning = [r for r in reqs if "topics" in r.prompt]
    sections = [r for r in reqs if "Explain" in r.prompt]
    assert len(planning) == 1 + 2 + 4  # one request per node: spares cover the repeat and the parent's title
    for r in planning:
        roles = [m["role"] for m in r.body["messages"]]
        assert roles == ["system", "user", "assistant", "user"] and "response_format" not in r.body
        assert r.body["temperature"] == 0 and r.body["repetition_penalty"] == 1.1
    for r in sections:
        assert r.body["messages"][0]["role"] == "system"
    first = [r for r in sections if r.body["temperature"] == 0.3]
    again = [r for r in sections if r.body["temperature"] != 0.3]
    assert len(first) == 12 and len(again) == 4  # the four "... Pitfalls" sections looped once each
    # the re-ask differs by its temperature: a heavier repetition penalty makes this model write word salad
    assert all(r.body["repetition_penalty"] == 1.1 and r.body["temperature"] == 0.7 for r in again)
    md = (out / "book.md").read_text()
    assert md.startswith("# Test Book\n")
    outline = json.loads((out / "outline.json").read_text())
    assert [p["title"] for p in outline["parts"]] == ["Foundations", "Practice"]
    for p in outline["parts"]:
        for c in p["chapters"]:
            assert c["title"] not in c["sections"] and len(c["sections"]) == 3
    assert_each_section_under_its_own_heading(md, 12)
    defects = json.loads((out / "defects.json").read_text())
    assert defects["looping_sections"]["count"] == 0 and defects["looping_sections"]["repaired"] == 4


def test_the_published_take_preset_keeps_the_reference_settings_on_any_model(tmp_path):
    out = tmp_path / "o"

    def answer(req: Request) -> Answer:
        if req.kind == "book":
            return Answer(titles(["Alpha", "Beta", "Gamma", "Delta", "Epsilon", "Zeta", "Eta", "Theta"], "Book"))
        if req.kind == "part":
            return Answer(titles([f"{req.title} chapter {i}" for i in range(1, 13)]))
        if req.kind == "chapter":
            return Answer(titles([f"{req.title} section {i}" for i in range(1, 17)]))
        return Answer(prose(req.title))

    with ScriptedServer(answer, model="smollm2-135m-instruct") as srv:
        cmd = [sys.executable, "-m", "orchestrator", "--preset", "published-take", "--backend", srv.url,
               "--out", str(out), "--format", "md", "-q", "--parts", "1", "--chapters", "1", "--sections", "2"]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env())
        reqs = list(srv.requests)
    assert run.returncode == 0, run.stderr
    assert {r.kind for r in reqs} == {"book", "part", "chapter", "section"}
    for r in reqs:
        assert r.body["temperature"] == 0 and "repetition_penalty" not in r.body
        assert [m["role"] for m in r.body["messages"]] == ["user"]
    assert all("response_format" in r.body for r in reqs if r.kind != "section")
