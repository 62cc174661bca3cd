"""The resume journal on its own: schema, what it keeps (and never keeps), and when it refuses to resume."""

from __future__ import annotations

import sqlite3
import time

import anyio
import pytest

from orchestrator import ConfigError, Settings
from orchestrator.core.outline import Chapter, Outline, Part
from orchestrator.core.reply import Reply
from orchestrator.dispatch.dispatcher import Dispatcher
from orchestrator.dispatch.fleet import Fleet
from orchestrator.dispatch.journal import FILENAME, Journal, section_times
from orchestrator.dispatch.journal_schema import SCHEMA_VERSION

SECRET = "sk-journal-secret-0123456789"


def reply(text: str, backend: str = "http://127.0.0.1:1/v1") -> Reply:
    t = time.monotonic()
    return Reply(text=text, finish_reason="stop", prompt_tokens=12, completion_tokens=34, backend=backend,
                 t_start=t - 1.0, t_first=t - 0.9, t_end=t)


def test_new_journal_schema_and_no_secret(tmp_path):
    s = Settings(parts=1, chapters=1, sections=2, api_key=SECRET)
    j = Journal.open(tmp_path, "A book", s)
    j.check_model("sim-qwen3")
    outline = Outline("T", (Part("P", (Chapter("C", ("S1", "S2")),)),))
    j.store_outline(outline)
    j.record("1.1.1", "section", "S1", reply("Some text."), attempts=2)
    j.end_run("incomplete", 3)
    j.close()
    db = sqlite3.connect(tmp_path / FILENAME)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    meta = dict(db.execute("SELECT key, value FROM meta"))
    assert int(meta["schema_version"]) == SCHEMA_VERSION
    assert meta["prompt"] == "A book" and meta["model"] == "sim-qwen3"
    row = db.execute("SELECT kind, title, text, finish_reason, prompt_tokens, completion_tokens, backend, attempts,"
                     " latency_s, first_token_s FROM nodes").fetchone()
    assert row[:8] == ("section", "S1", "Some text.", "stop", 12, 34, "http://127.0.0.1:1/v1", 2)
    assert row[8] == pytest.approx(1.0, abs=0.01) and row[9] == pytest.approx(0.1, abs=0.01)
    assert db.execute("SELECT status, requests FROM runs").fetchone() == ("incomplete", 3)
    db.close()
    for p in tmp_path.iterdir():
        assert SECRET.encode() not in p.read_bytes()
    # Reopened: the outline and the finished node come back.
    j = Journal.open(tmp_path, "A book", s)
    assert j.outline == outline
    assert j.get("1.1.1", "section", "S1").text == "Some text." and j.get("1.1.1", "chapter", "S1") is None
    assert j.get("1.1.1", "section", "Another title") is None  # a section is only itself under its own title
    assert j.resumed
    j.close()


def test_refuses_other_jobs_and_changed_settings(tmp_path):
    s = Settings(parts=2, chapters=2, sections=2, words=100)
    Journal.open(tmp_path, "A book", s).close()
    with pytest.raises(ConfigError, match="another job's journal"):
        Journal.open(tmp_path, "Another book", s)
    with pytest.raises(ConfigError, match=r"words 100 -> 120.*--fresh"):
        Journal.open(tmp_path, "A book", Settings(parts=2, chapters=2, sections=2, words=120))
    # Settings that change neither the outline nor the text resume fine.
    Journal.open(tmp_path, "A book", Settings(parts=2, chapters=2, sections=2, words=100, cap=4,
                                              attempts=3, formats=("md",))).close()
    # --fresh discards the old journal.
    j = Journal.open(tmp_path, "Another book", s, fresh=True)
    assert not j.resumed and j.outline is None
    j.close()


def test_model_change_is_refused(tmp_path):
    s = Settings()
    j = Journal.open(tmp_path, "A book", s)
    j.check_model("model-a")
    j.close()
    j = Journal.open(tmp_path, "A book", s)
    with pytest.raises(ConfigError, match="'model-a' but this run uses 'model-b'"):
        j.check_model("model-b")
    j.close()


def test_newer_schema_and_foreign_files_are_refused(tmp_path):
    Journal.open(tmp_path, "A book", Settings()).close()
    db = sqlite3.connect(tmp_path / FILENAME)
    with db:
        db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    db.close()
    with pytest.raises(ConfigError, match="schema 99"):
        Journal.open(tmp_path, "A book", Settings())
    other = tmp_path / "other"
    other.mkdir()
    db = sqlite3.connect(other / FILENAME)
    with db:
        db.execute("CREATE TABLE meta (key TEXT, value TEXT)")
        db.execute("INSERT INTO meta VALUES ('app', 'something-else')")
    db.close()
    with pytest.raises(ConfigError, match="not a handbook journal"):
        Journal.open(other, "A book", Settings())


def test_a_journal_is_created_whole_or_not_at_all(tmp_path, monkeypatch):
    """The tables and the meta that says whose they are come in one transaction: a process stopped between them
    (here: writing the meta fails) leaves no half-made journal that the next run would refuse as a file of something
    else (CI's kill -9 test once met one)."""
    from orchestrator.dispatch import journal_schema

    def dies(_value):
        raise KeyboardInterrupt  # what a process stopped there leaves behind, as far as the file can tell

    monkeypatch.setattr(journal_schema, "dumps", dies)
    with pytest.raises(KeyboardInterrupt):
        Journal.open(tmp_path, "A book", Settings())
    db = sqlite3.connect(tmp_path / FILENAME)
    assert db.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall() == []
    db.close()
    monkeypatch.undo()
    j = Journal.open(tmp_path, "A book", Settings())  # the next run makes it anew
    assert not j.resumed
    j.close()


class FakeClient:
    """A backend that answers every request with the text its body asks for."""

    url = "http://127.0.0.1:1/v1"

    def __init__(self):
        self.calls: list[str] = []

    async def send(self, make_body, *, attempt=1, on_delta=None, stop_when=None):
        body = make_body()
        self.calls.append(body["path"])
        return [reply(body["answer"])]


def dispatcher(client: FakeClient, journal: Journal) -> Dispatcher:
    return Dispatcher(Fleet([client], [4], lambda e: None), lambda e: None, attempts=1, wants_deltas=False,
                      journal=journal)


def test_the_dispatcher_answers_finished_nodes_from_the_journal(tmp_path):
    s = Settings()
    j = Journal.open(tmp_path, "A book", s)
    fake = FakeClient()
    d = dispatcher(fake, j)

    def validate(r: Reply) -> list[str]:
        lines = r.text.splitlines()
        if len(lines) != 2:
            raise ValueError("two lines")
        return lines

    def build(p: str):
        return lambda c, n: {"path": p, "answer": f"1. P{p} one\n2. P{p} two"}

    async def go(paths):
        return [await d.run(p, "part", f"P{p}", build(p), validate) for p in paths]

    first = anyio.run(go, ("1", "2"))
    assert fake.calls == ["1", "2"] and all(o.attempts == 1 for o in first)
    assert d.resumed == {} and d.requests == 2
    j.close()

    j = Journal.open(tmp_path, "A book", s)
    fake = FakeClient()
    d = dispatcher(fake, j)
    second = anyio.run(go, ("1", "2", "3"))
    assert fake.calls == ["3"]  # only the node the first run never finished
    assert [o.attempts for o in second] == [0, 0, 1]
    assert second[0].value == first[0].value
    assert d.resumed == {"part": 2} and d.resumed_levels == [0, 2, 0, 0]
    assert d.requests == 1  # a node answered from the journal is no request
    # what the journal answers goes through validate again: a stored reply it now rejects is asked again
    def three_lines(r: Reply) -> list[str]:
        raise ValueError("three lines")

    again = anyio.run(lambda: d.run("1", "part", "P1", build("1"), three_lines))
    assert fake.calls == ["3", "1"] and again.attempts == 1 and again.value is None
    j.close()


def test_section_times_are_read_back_as_the_journal_holds_them(tmp_path):
    assert section_times(tmp_path) == {}  # no journal
    s = Settings(parts=1, chapters=1, sections=2)
    j = Journal.open(tmp_path, "A book", s)
    before = time.time()
    j.record("1", "part", "P", reply('["C"]'), attempts=1)  # a planning node has none
    j.record("1.1.1", "section", "S1", reply("Some text."), attempts=1)
    j.close()
    j = Journal.open(tmp_path, "A book", s)  # an edited outline moves S1: a move keeps no latency
    j.move(j.get("1.1.1", "section", "S1"), "1.1.2")
    j.record("1.1.1", "section", "S0", reply("Other text."), attempts=1)
    j.close()
    times = section_times(tmp_path)
    assert set(times) == {"1.1.1"}
    title, start, end = times["1.1.1"]
    assert title == "S0" and before <= end <= time.time() and end - start == pytest.approx(1.0, abs=0.01)
    assert sorted(p.name for p in tmp_path.iterdir()) == [FILENAME, FILENAME + ".lock"]  # no -wal, -shm left
    (tmp_path / FILENAME).write_bytes(b"not a journal")
    assert section_times(tmp_path) == {}
