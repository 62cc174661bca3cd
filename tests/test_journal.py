"""The resume journal on its own: schema, what it keeps (and never keeps), and when it refuses to resume."""

from __future__ import annotations

import sqlite3
import time

import anyio
import pytest

from orchestrator import ConfigError, Settings
from orchestrator.client import Reply
from orchestrator.dispatch import Outcome
from orchestrator.journal import FILENAME, SCHEMA_VERSION, Journal, Resuming
from orchestrator.outline import Chapter, Outline, Part

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


class FakeDispatcher:
    def __init__(self):
        self.calls: list[str] = []
        self.requests = 0

    async def run(self, path, kind, title, build, validate=None, priority=(1, 0), **kw):
        self.calls.append(path)
        self.requests += 1
        r = reply(f"1. {title} one\n2. {title} two")
        return Outcome(r, validate(r) if validate else None, 1)


def test_resuming_answers_finished_nodes_from_the_journal(tmp_path):
    s = Settings()
    j = Journal.open(tmp_path, "A book", s)
    fake = FakeDispatcher()
    res = Resuming(fake, j)

    def validate(r: Reply) -> list[str]:
        lines = r.text.splitlines()
        if len(lines) != 2:
            raise ValueError("two lines")
        return lines

    async def go():
        return [await res.run(p, "part", f"P{p}", lambda c, n: {}, validate) for p in ("1", "2")]

    first = anyio.run(go)
    assert fake.calls == ["1", "2"] and all(o.attempts == 1 for o in first)
    j.close()

    j = Journal.open(tmp_path, "A book", s)
    fake2 = FakeDispatcher()
    res2 = Resuming(fake2, j)

    async def go2():
        return [await res2.run(p, "part", f"P{p}", lambda c, n: {}, validate) for p in ("1", "2", "3")]

    second = anyio.run(go2)
    assert fake2.calls == ["3"]  # only the node the first run never finished
    assert [o.attempts for o in second] == [0, 0, 1]
    assert second[0].value == first[0].value
    assert res2.resumed == {"part": 2} and res2.resumed_levels == [0, 2, 0, 0]
    assert res2.requests == 1  # everything else is the dispatcher's
    j.close()
