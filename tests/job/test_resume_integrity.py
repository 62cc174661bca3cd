"""Never silently wrong on resume: titles and texts a killed job committed stay under their own headings when it
is run again, a stored section answers only its own title, a typesetting failure loses nothing, a second job on the
same out dir is refused, a corrupt or foreign journal is a one-line error and an older one is migrated. Jobs run
as the real CLI against a scripted OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess

import anyio
import pytest
from local_http import env, job_cmd
from scripted_book import (
    SHAPE,
    assert_each_section_under_its_own_heading,
    book_answer,
    journal_rows,
    sections_of,
    wait_until,
)
from scripted_openai import Answer, Request, ScriptedServer, titles

# -- resume integrity -------------------------------------------------------------------------------------------


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
        # --context none: sections start as their titles stream past (with outline they wait for the whole list)
        cmd = job_cmd("A test book", [srv.url], out, *SHAPE, "--context", "none")
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
        cmd = job_cmd("A test book", [srv.url], out, *SHAPE, "--context", "none")  # sections start as titles stream
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

        async def send(self, make_body, *, attempt=1, on_delta=None, stop_when=None):
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


# -- a typesetting failure loses nothing ------------------------------------------------------------------------


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


# -- the out dir and its journal --------------------------------------------------------------------------------


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
