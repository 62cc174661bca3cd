"""Never silently wrong: resume integrity, finish reasons, messy replies, one backend per server, the out-dir lock,
corrupt journals, credentials. Jobs run as the real CLI against a scripted OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from local_http import env, job_cmd
from scripted_openai import Answer, Request, ScriptedServer, prose, titles


def sections_of(md: str) -> dict[str, str]:
    """heading -> body of every #### section of book.md."""
    parts = re.split(r"^#### (.+)$", md, flags=re.MULTILINE)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def assert_each_section_under_its_own_heading(md: str, n: int) -> None:
    got = sections_of(md)
    assert len(got) == n, list(got)
    for heading, body in got.items():
        m = re.search(r"This section is about (.+?)\. ", body)
        assert m, f"section {heading!r} has no text: {body[:80]!r}"
        assert m.group(1) == heading, f"#### {heading} holds the text written for {m.group(1)!r}"


def journal_rows(out: Path, sql: str) -> list[tuple]:
    try:
        db = sqlite3.connect(out / "journal.sqlite", timeout=5)
        try:
            return db.execute(sql).fetchall()
        finally:
            db.close()
    except sqlite3.Error:
        return []


def wait_until(cond, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        assert proc.poll() is None, f"the job ended early: {proc.stderr.read() if proc.stderr else ''}"
        time.sleep(0.05)
    raise AssertionError("timed out waiting")


SHAPE = ["--parts", "1", "--chapters", "2", "--sections", "4", "--attempts", "3"]


def book_answer(req: Request) -> Answer:
    """A well-behaved model for the SHAPE book: one part, chapters "Basics" and "Practice", four sections each
    ("Basics 1"...), prose naming its section. Tests answer their special cases first and hand the rest here."""
    if req.kind == "book":
        return Answer(titles(["Foundations"], "The Test Book"))
    if req.kind == "part":
        return Answer(titles(["Basics", "Practice"]))
    if req.kind == "chapter":
        return Answer(titles([f"{req.title} {i}" for i in range(1, 5)]))
    if req.kind == "section":
        return Answer(prose(req.title))
    raise AssertionError(f"unexpected request: {req.prompt[:200]!r}")


# -- 1. resume integrity ----------------------------------------------------------------------------------------


def test_resume_after_a_reasked_chapter_keeps_every_text_under_its_own_heading(tmp_path):
    """The issue's repro: chapter "Basics" first answers A, B, A, C (A and B commit, their sections start; the
    repeat makes the reply unusable), then X, Y, Z, W, so its final list is A, B, X, Y. The job is killed while
    the other chapter is still planning. The rerun must not re-derive "Basics" from its last reply (X, Y, Z, W)
    and put A's text under X."""
    out = tmp_path / "o"
    state = {"run": 1}

    def answer(req: Request) -> Answer:
        if req.kind == "chapter" and req.title == "Basics":
            if state["run"] == 2:
                return Answer(titles(["Q", "R", "S", "T"]))  # would be a different outline: must not be asked
            return Answer(titles(["A", "B", "A", "C"] if req.nth == 1 else ["X", "Y", "Z", "W"]))
        if req.kind == "chapter" and req.title == "Practice":
            if state["run"] == 1:
                return Answer(titles(["P1", "P2", "P3", "P4"]), delay_s=120)  # still planning at the kill
            return Answer(titles(["P1", "P2", "P3", "P4"]))
        return book_answer(req)

    with ScriptedServer(answer) as srv:
        cmd = job_cmd("A test book", [srv.url], out, *SHAPE)
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env())
        wait_until(lambda: len(journal_rows(out, "SELECT path FROM nodes WHERE path LIKE '1.1.%'")) == 4
                   and journal_rows(out, "SELECT path FROM nodes WHERE path = '1.1'"), proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        written = dict(journal_rows(out, "SELECT path, title FROM nodes WHERE kind = 'section'"))
        assert written == {"1.1.1": "A", "1.1.2": "B", "1.1.3": "X", "1.1.4": "Y"}
        # A and B started while the list streamed, before X and Y (in either order: they start together)
        assert sorted(r.title for r in srv.of("section")[:2]) == ["A", "B"]

        state["run"] = 2
        before = len(srv.requests)
        again = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env())
        assert again.returncode == 0, again.stderr
        rerun = srv.requests[before:]
    md = (out / "book.md").read_text()
    assert_each_section_under_its_own_heading(md, 8)
    assert list(sections_of(md))[:4] == ["A", "B", "X", "Y"]
    assert not [r for r in rerun if r.kind == "chapter" and r.title == "Basics"]  # restored, not re-planned
    assert sorted(r.title for r in rerun if r.kind == "section") == ["P1", "P2", "P3", "P4"]
    stats = json.loads((out / "stats.json").read_text())
    assert stats["resumed_sections"] == 4 and stats["failed_sections"] == 0


@pytest.mark.parametrize("rerun", [[], ["--no-pipeline"]])
def test_titles_committed_before_a_kill_are_kept_when_the_node_is_asked_again(tmp_path, rerun):
    """Killed while chapter "Basics" is still streaming its list: A and B are committed and their sections
    written. The rerun asks for the chapter again (telling it to keep A and B); whatever it answers, A and B stay
    first and their sections are not asked for again."""
    out = tmp_path / "o"
    state = {"run": 1}

    def answer(req: Request) -> Answer:
        if req.kind == "chapter" and req.title == "Basics":
            if state["run"] == 1:
                return Answer(titles(["A", "B", "C", "D"]), hang_after=len('{"items": ["A", "B", "C'))
            return Answer(titles(["X", "Y", "Z", "W"]))
        if req.kind == "chapter" and req.title == "Practice":
            return Answer(titles(["P1", "P2", "P3", "P4"]))
        return book_answer(req)

    with ScriptedServer(answer) as srv:
        cmd = job_cmd("A test book", [srv.url], out, *SHAPE)
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env())
        wait_until(lambda: {"A", "B"} <= {t for (t,) in journal_rows(out, "SELECT title FROM nodes")}, proc)
        assert journal_rows(out, "SELECT items FROM committed WHERE path = '1.1'") == [('["A","B"]',)]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        state["run"] = 2
        before = len(srv.requests)
        again = subprocess.run(cmd + rerun, capture_output=True, text=True, timeout=120, env=env())
        assert again.returncode == 0, again.stderr
        rerun = srv.requests[before:]
    md = (out / "book.md").read_text()
    assert_each_section_under_its_own_heading(md, 8)
    assert list(sections_of(md))[:4] == ["A", "B", "X", "Y"]
    asked = [r for r in rerun if r.kind == "chapter" and r.title == "Basics"]
    assert len(asked) == 1 and "Keep these first 2 titles unchanged" in asked[0].prompt
    assert not {"A", "B"} & {r.title for r in rerun if r.kind == "section"}
    assert journal_rows(out, "SELECT count(*) FROM committed") == [(0,)]  # finished nodes leave no partial row


def test_a_stored_section_answers_only_its_own_title(tmp_path):
    from orchestrator.core.config import Settings
    from orchestrator.core.reply import Reply
    from orchestrator.dispatch.dispatcher import Dispatcher
    from orchestrator.dispatch.fleet import Fleet
    from orchestrator.dispatch.journal import Journal

    s = Settings(parts=1, chapters=1, sections=2)
    j = Journal.open(tmp_path, "A book", s)
    j.record("1.1.1", "section", "Old title", Reply("Old text.", "stop", 1, 2, "u", 0.0, 0.0, 1.0), 1)
    j.close()
    j = Journal.open(tmp_path, "A book", s)
    asked: list[str] = []

    class Client:
        url = "u"

        async def send(self, make_body, *, attempt=1, on_delta=None):
            title = make_body()["title"]
            asked.append(title)
            return [Reply(f"New text for {title}.", "stop", 1, 2, "u", 0.0, 0.0, 1.0)]

    def run(journal):
        d = Dispatcher(Fleet([Client()], [1], lambda e: None), lambda e: None, 1, False, journal=journal)
        return anyio.run(lambda: d.run("1.1.1", "section", "New title", lambda c, n: {"title": "New title"}))

    out = run(j)
    assert asked == ["New title"] and out.reply.text == "New text for New title."
    j.close()
    j = Journal.open(tmp_path, "A book", s)  # the next run finds it journaled under the new title
    out = run(j)
    assert asked == ["New title"] and out.attempts == 0 and out.reply.text == "New text for New title."
    j.close()


# -- 2. finish reasons -------------------------------------------------------------------------------------------


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


# -- 3. replies real models give ---------------------------------------------------------------------------------


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
    assert stats["planning_requests"] == 4  # no re-ask for the missing book title, the prose or the fences


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


# -- 5. a typesetting failure loses nothing ------------------------------------------------------------------------


def test_a_typesetting_failure_keeps_the_book_stats_defects_and_journal(tmp_path):
    out = tmp_path / "o"
    broken = tmp_path / "templates"
    broken.mkdir()
    (broken / "book.html.j2").write_text("{% for x in %}broken{% endfor %}")  # a template that cannot compile

    with ScriptedServer(book_answer) as srv:
        cmd = job_cmd("A test book", [srv.url], out, *SHAPE)
        cmd[cmd.index("--format") + 1] = "md,pdf"
        run = subprocess.run([*cmd, "--templates", str(broken)], capture_output=True, text=True, timeout=180,
                             env=env())
    assert run.returncode == 4, run.stderr
    assert "Traceback" not in run.stderr and "typesetting failed" in run.stderr
    assert_each_section_under_its_own_heading((out / "book.md").read_text(), 8)
    stats = json.loads((out / "stats.json").read_text())
    assert stats["sections"] == 8 and stats["failed_sections"] == 0 and "typesetting failed" in stats["typeset_error"]
    assert json.loads((out / "defects.json").read_text())["words"]["total"] > 0
    assert not (out / "book.pdf").exists()
    assert journal_rows(out, "SELECT status FROM runs") == [("complete",)]
    assert journal_rows(out, "SELECT count(*) FROM nodes WHERE kind = 'section'") == [(8,)]


# -- 6. safety and hygiene ----------------------------------------------------------------------------------------


def test_the_same_server_twice_is_one_backend_with_one_cap(tmp_path):
    out = tmp_path / "o"

    with ScriptedServer(book_answer) as srv:
        urls = [srv.url, f"http://localhost:{srv.port}/v1", srv.url + "/"]
        run = subprocess.run(job_cmd("A test book", urls, out, *SHAPE, "--cap", "3"), capture_output=True,
                             text=True, timeout=120, env=env())
    assert run.returncode == 0, run.stderr
    assert run.stderr.count("is the same server as") == 2
    stats = json.loads((out / "stats.json").read_text())
    assert stats["cards"] == 1 and [b["cap"] for b in stats["per_backend"]] == [3]
    assert stats["per_backend"][0]["max_in_flight"] <= 3


def test_a_second_job_on_the_same_out_dir_is_refused(tmp_path):
    out = tmp_path / "o"

    def answer(req: Request) -> Answer:
        if req.kind == "chapter":
            return Answer(titles([f"{req.title} {i}" for i in range(1, 5)]), delay_s=30)
        return book_answer(req)

    with ScriptedServer(answer) as srv:
        cmd = job_cmd("A test book", [srv.url], out, *SHAPE)
        first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env())
        try:
            wait_until(lambda: bool(srv.of("chapter")), first)
            second = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env())
        finally:
            first.kill()
            first.wait(10)
    assert second.returncode == 2
    assert second.stderr.count("\n") == 1 and "another handbook job" in second.stderr and str(first.pid) in second.stderr


@pytest.mark.parametrize("damage", ["garbage", "foreign", "bad-key", "bad-outline", "no-nodes"])
def test_a_corrupt_or_foreign_journal_is_a_one_line_error(tmp_path, damage):
    out = tmp_path / "o"
    out.mkdir()
    path = out / "journal.sqlite"
    if damage == "garbage":
        path.write_bytes(b"this is not a database at all" * 100)
    elif damage == "foreign":
        db = sqlite3.connect(path)
        db.execute("CREATE TABLE photos (id INTEGER, name TEXT)")
        db.commit()
        db.close()
    else:
        from orchestrator.core.config import Settings
        from orchestrator.dispatch.journal import Journal

        s = Settings(parts=1, chapters=2, sections=4, attempts=3)
        Journal.open(out, "A test book", s).close()
        db = sqlite3.connect(path)
        if damage == "bad-key":
            db.execute("UPDATE meta SET value = '[not json' WHERE key = 'key'")
        elif damage == "bad-outline":
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('outline', '{\"parts\": 3}')")
        else:
            db.execute("DROP TABLE nodes")
        db.commit()
        db.close()
    run = subprocess.run(job_cmd("A test book", ["http://127.0.0.1:9/v1"], out, *SHAPE), capture_output=True,
                         text=True, timeout=60, env=env())
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr and run.stderr.count("\n") == 1, run.stderr
    assert "journal" in run.stderr and "--fresh" in run.stderr


def test_credentials_in_a_backend_url_are_sent_but_never_written(tmp_path):
    out = tmp_path / "o"
    secret = "s3cr3t-Pa55"

    with ScriptedServer(book_answer) as srv:
        url = f"http://reader:{secret}@127.0.0.1:{srv.port}/v1"
        run = subprocess.run(job_cmd("A test book", [url], out, *SHAPE), capture_output=True, text=True,
                             timeout=120, env=env())
        seen = {r.headers.get("Authorization") for r in srv.requests}
    assert run.returncode == 0, run.stderr
    import base64

    assert seen == {"Basic " + base64.b64encode(f"reader:{secret}".encode()).decode()}
    assert secret not in run.stdout + run.stderr
    for p in out.iterdir():
        assert secret.encode() not in p.read_bytes(), p.name
    assert json.loads((out / "stats.json").read_text())["per_backend"][0]["url"] == srv.url


async def _trip_and_probe(url: str, serving: dict) -> list[bool]:
    from orchestrator.core.config import Backend
    from orchestrator.core.events import BackendState
    from orchestrator.dispatch.fleet import Fleet
    from orchestrator.wire.client import BackendClient

    back = anyio.Event()  # the fleet says when the backend rejoins the rotation

    def on_event(ev) -> None:
        if isinstance(ev, BackendState) and ev.healthy:
            back.set()

    async with BackendClient(Backend(url), "scripted-model") as client:
        fleet = Fleet([client], [4], on_event, probe_interval=0.1)
        async with anyio.create_task_group() as tg:
            await tg.start(fleet.run)
            for _ in range(3):  # three failures in a row take it out of rotation
                fleet.report(client, await client.chat(client.body([{"role": "user", "content": "x"}],
                                                                   max_tokens=8, temperature=0)))
            states = [fleet.loads[0].healthy]
            await anyio.sleep(1.0)  # /models answers all along, completions do not
            states.append(fleet.loads[0].healthy)
            serving["ok"] = True
            with anyio.move_on_after(5):
                await back.wait()
            states.append(fleet.loads[0].healthy)
            tg.cancel_scope.cancel()
    return states


def test_a_backend_rejoins_only_after_a_probe_completion_succeeds():
    serving = {"ok": False}

    def answer(req: Request) -> Answer:
        return Answer("OK") if serving["ok"] else Answer(status=503, error="engine dead")

    with ScriptedServer(answer) as srv:
        states = anyio.run(_trip_and_probe, srv.url, serving)
        assert srv.models_gets >= 3  # it was probed, and /models answered each time
    assert states == [False, False, True]


# -- issue 12: model profiles, list planning, loop repair ---------------------------------------------------------


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
    if req.kind == "other" and req.prompt.startswith("You are") and "Explain" in req.prompt:
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
    assert all(r.body["repetition_penalty"] >= 1.25 and r.body["temperature"] >= 0.7 for r in again)
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


async def _slow_probe(url: str, dead: str, serving: dict) -> tuple[bool, bool]:
    from orchestrator.core.config import Backend
    from orchestrator.core.events import BackendState
    from orchestrator.dispatch.fleet import Fleet
    from orchestrator.wire.client import BackendClient

    settled = anyio.Event()  # a rejoined the rotation, or the fleet gave up on every backend

    def on_event(ev) -> None:
        if isinstance(ev, BackendState) and (ev.healthy or ev.url == "*"):
            settled.set()

    async with BackendClient(Backend(url), "scripted-model") as a, BackendClient(Backend(dead), "m") as b:
        fleet = Fleet([a, b], [4, 4], on_event, probe_interval=0.1, all_down_timeout=0.5)
        async with anyio.create_task_group() as tg:
            await tg.start(fleet.run)
            for c in (a, b):
                for _ in range(3):
                    fleet.report(c, await c.chat(c.body([{"role": "user", "content": "x"}], max_tokens=8,
                                                        temperature=0)))
            serving["ok"] = True  # a now answers, but its completions take 3 s (a busy engine); b stays dead
            with anyio.move_on_after(10):
                await settled.wait()
            tg.cancel_scope.cancel()
    return fleet.loads[0].healthy, fleet.all_down_error is None


def test_a_slow_probe_completion_is_alive_not_down():
    serving = {"ok": False}

    def answer(req: Request) -> Answer:
        return Answer("OK", delay_s=3) if serving["ok"] else Answer(status=503, error="busy")

    with ScriptedServer(answer) as srv:
        healthy, not_all_down = anyio.run(_slow_probe, srv.url, "http://127.0.0.1:9/v1", serving)
    assert healthy and not_all_down


def test_a_journal_written_before_this_version_resumes(tmp_path):
    """Schema 1 (no ``value`` column, no ``committed`` table, temperature 0.0 in its key) is migrated and resumed
    with the default settings."""
    from orchestrator.core.config import Settings
    from orchestrator.core.reply import Reply
    from orchestrator.dispatch.journal import Journal
    from orchestrator.dispatch.journal_schema import SCHEMA_VERSION

    j = Journal.open(tmp_path, "A book", Settings(parts=1, chapters=1, sections=2))
    j.record("1.1.1", "section", "S1", Reply("Old text.", "stop", 1, 2, "u", 0.0, 0.0, 1.0), 1)
    j.close()
    db = sqlite3.connect(tmp_path / "journal.sqlite")
    key = json.loads(db.execute("SELECT value FROM meta WHERE key = 'key'").fetchone()[0])
    db.execute("UPDATE meta SET value = ? WHERE key = 'key'", (json.dumps({**key, "temperature": 0.0}),))
    db.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    db.execute("DROP TABLE committed")
    db.execute("ALTER TABLE nodes DROP COLUMN value")
    db.commit()
    db.close()
    j = Journal.open(tmp_path, "A book", Settings(parts=1, chapters=1, sections=2))
    assert j.get("1.1.1", "section", "S1").text == "Old text."
    j.commit_titles("1.1", "C", None, ["S1"])  # the migrated journal has the new table
    j.close()
    db = sqlite3.connect(tmp_path / "journal.sqlite")
    assert db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
    db.close()
