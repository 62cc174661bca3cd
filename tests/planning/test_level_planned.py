"""LevelPlanned: each planning level is announced once, after every node of the level above it has returned, with
the number of nodes that level really has (issue 24, item 6).

A rerun after a kill during the book's streamed reply used to announce level 2 twice: first when the parts the
earlier run had committed (and finished) were answered from the journal, counted as parts-so-far x --chapters
(``LevelPlanned(2, 36)`` for 3 of 8 parts at 12 chapters), then again once every part was in (``96``).

Jobs run in-process (``generate``, events through ``on_event``) against a scripted OpenAI-compatible server.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest
from scripted_openai import Answer, Request, ScriptedServer, prose, titles

from orchestrator import Settings, generate
from orchestrator.core.errors import PlanError
from orchestrator.core.events import LevelPlanned, NodeFinished, OutlineReady
from orchestrator.core.outline import Outline

PROMPT = "A test book about running software"
BOOK = "The Test Book"
PARTS = ["Foundations", "Practice", "Tooling", "Operations", "Security", "Reliability", "Delivery", "Teamwork"]
WORDS = ["Origins", "Methods", "Habits", "Limits", "Examples", "Pitfalls", "Metrics", "Reviews", "Costs", "Futures",
         "Patterns", "Stories"]
CHAPTERS = 12
# In the tests that want it, the book's every reply repeats a part's title, so the book keeps 7 parts. (A part or a
# chapter left short is topped up from its own title, planning/made.filler_titles: only the book can be short.)
SHORT_PARTS = [*PARTS[:7], PARTS[0]]


def chapters_of(part: str, n: int = CHAPTERS) -> list[str]:
    return [f"{part} {w}" for w in WORDS[:n]]


def settings(**kw) -> Settings:
    base = {"parts": len(PARTS), "chapters": CHAPTERS, "sections": 1, "words": 40, "max_tokens": 80,
            "formats": ("md",), "attempts": 3, "cap": 4}  # a few streams at once: the test server's backlog is small
    return Settings(**{**base, **kw})


def answer(req: Request, *, short: bool = False, book: Answer | None = None) -> Answer:
    if req.kind == "book":
        return book or Answer(titles(SHORT_PARTS if short else PARTS, BOOK))
    if req.kind == "part":
        return Answer(titles(chapters_of(req.title)))
    if req.kind == "chapter":
        return Answer(titles([f"{req.title} Basics"]))
    if req.kind == "section":
        return Answer(prose(req.title))
    if req.kind == "other" and "Say OK." in req.prompt:  # a probe: never expected, but say OK rather than hang
        return Answer("OK")
    raise AssertionError(f"unexpected request: {req.prompt[:200]!r}")


def assert_each_level_announced_once(events: list, outline: Outline, planned: bool = True) -> None:
    """Levels 1, 2, 3 announced once each, in order, each after every node of the level above finished, each
    with the outline's real count. ``planned=False``: the job took its outline from the journal and ran no
    planner: each level is announced once all the same, with its real count, before the outline is ready (no
    planning node finishes in such a run)."""
    levels = [(i, e) for i, e in enumerate(events) if isinstance(e, LevelPlanned)]
    assert [(e.level, e.nodes) for _, e in levels] == [(1, outline.shape[0]), (2, outline.shape[1]),
                                                        (3, outline.shape[2])]
    if not planned:
        ready = next(i for i, e in enumerate(events) if isinstance(e, OutlineReady))
        assert all(i < ready for i, _ in levels)
        return
    finished: dict[str, int] = {}  # path -> index of its planning node's (last) NodeFinished
    for i, e in enumerate(events):
        if isinstance(e, NodeFinished) and e.kind in ("book", "part", "chapter"):
            finished[e.path] = i
    parents = {
        1: [""],
        2: [f"{pi}" for pi in range(1, len(outline.parts) + 1)],
        3: [f"{pi}.{ci}" for pi, p in enumerate(outline.parts, 1) for ci in range(1, len(p.chapters) + 1)],
    }
    for i, e in levels:
        missing = [p for p in parents[e.level] if p not in finished]
        assert not missing, f"level {e.level}: no NodeFinished for {missing}"
        late = [p for p in parents[e.level] if finished[p] > i]
        assert not late, f"LevelPlanned({e.level}) came before {late} finished"
    ts = [e.t for _, e in levels]
    assert ts == sorted(ts)


def journal_rows(out: Path, sql: str) -> list[tuple]:
    db = sqlite3.connect(out / "journal.sqlite")
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


def _cut_after(text: str, k: int) -> int:
    """How many characters of a titles() reply take it through the closing quote of its k-th item."""
    title = PARTS[k - 1]
    return text.index(f'"{title}"') + len(title) + 2


@pytest.mark.parametrize("pipeline", [True, False])
def test_a_rerun_after_a_kill_during_the_book_reply_announces_each_level_once(tmp_path, pipeline):
    """Run 1: the book's reply stops after its third part title (parts 1-3 committed, planned and journaled),
    and the run ends there (one attempt, a short stall limit: the book node is lost). The rerun restores those
    three parts from the journal while the book is asked again, slowly: level 2 must wait for all eight."""
    out = tmp_path / "o"
    state = {"run": 1}
    full = titles(PARTS, BOOK)

    def reply(req: Request) -> Answer:
        if req.kind == "book":
            if state["run"] == 1:
                return Answer(full, hang_after=_cut_after(full, 3))
            # the restored parts are answered from the journal well before this reply ends
            return Answer(full, delay_s=0.5)
        return answer(req)

    with ScriptedServer(reply) as srv:
        with pytest.raises(PlanError):
            generate(PROMPT, [srv.url], settings(attempts=1, chunk_timeout_s=1.5), out=out,
                     on_event=lambda e: None)
        assert journal_rows(out, "SELECT path, items FROM committed WHERE path = ''") == [
            ("", '["Foundations","Practice","Tooling"]')]
        assert [p for (p,) in journal_rows(out, "SELECT path FROM nodes WHERE kind = 'part' ORDER BY path")] == [
            "1", "2", "3"]

        state["run"] = 2
        before = len(srv.requests)
        events: list = []
        result = generate(PROMPT, [srv.url], settings(pipeline=pipeline), out=out, on_event=events.append)
        rerun = srv.requests[before:]
    assert result.complete
    assert result.outline.shape == (8, 96, 96)
    assert "Keep these first 3 titles unchanged" in next(r for r in rerun if r.kind == "book").prompt
    assert not {"Foundations", "Practice", "Tooling"} & {r.title for r in rerun if r.kind == "part"}  # restored
    assert_each_level_announced_once(events, result.outline)


@pytest.mark.parametrize("pipeline", [True, False])
def test_a_fresh_run_and_fully_resumed_ones_announce_each_level_once_with_real_counts(tmp_path, pipeline):
    """The book keeps 7 of its 8 parts (every reply repeats one): level 1 has 7 parts and level 2 has 84 chapters,
    not 8 x 12. The same job again finds everything in the journal, first with the outline it stored (no planner
    runs), then without it (the planner runs and every node is answered from the journal): the same three
    announcements, and nothing asked again."""
    out = tmp_path / "o"
    with ScriptedServer(lambda req: answer(req, short=True)) as srv:
        fresh: list = []
        first = generate(PROMPT, [srv.url], settings(pipeline=pipeline), out=out, on_event=fresh.append)
        asked = len(srv.requests)
        again: list = []
        second = generate(PROMPT, [srv.url], settings(pipeline=pipeline), out=out, on_event=again.append)
        # every planning node journaled, the outline not yet stored (as after a kill just before it is)
        db = sqlite3.connect(out / "journal.sqlite")
        with db:
            assert db.execute("DELETE FROM meta WHERE key = 'outline'").rowcount == 1
        db.close()
        replanned: list = []
        third = generate(PROMPT, [srv.url], settings(pipeline=pipeline), out=out, on_event=replanned.append)
        assert len(srv.requests) == asked  # nothing asked again: every node answered from the journal
    assert first.outline.shape == (7, 84, 84)
    assert second.outline == first.outline == third.outline
    assert_each_level_announced_once(fresh, first.outline)
    assert_each_level_announced_once(again, second.outline, planned=False)
    assert_each_level_announced_once(replanned, third.outline)
    assert sum(isinstance(e, NodeFinished) and e.kind == "part" for e in replanned) == 7


class SlowBookServer(ScriptedServer):
    """Streams the book's reply one small chunk every ``pause`` seconds (every other reply at full speed)."""

    def __init__(self, answer, pause: float):
        super().__init__(answer)
        self.pause = pause
        self._here = threading.local()

    def _post(self, h) -> None:
        self._here.book = False
        super()._post(h)

    def _event(self, h, obj: dict) -> None:
        if self._here.book:
            time.sleep(self.pause)
        super()._event(h, obj)


def test_parts_finishing_while_the_book_reply_still_streams_do_not_announce_level_2(tmp_path):
    """A fresh run whose book reply streams slowly while parts answer at once: the first parts are planned
    before the later part titles have arrived; level 2 waits for the book and every part."""
    full = titles(SHORT_PARTS, BOOK)  # every attempt streams slowly, and the book keeps 7 parts

    def reply(req: Request) -> Answer:
        if req.kind == "book":
            srv._here.book = True
            return Answer(full, chunk=4)
        return answer(req, short=True)

    with SlowBookServer(reply, pause=0.02) as srv:
        events: list = []
        result = generate(PROMPT, [srv.url], settings(), out=tmp_path / "o", on_event=events.append)
    assert result.outline.shape == (7, 84, 84)
    parts_done = [i for i, e in enumerate(events) if isinstance(e, NodeFinished) and e.kind == "part"]
    book_done = next(i for i, e in enumerate(events) if isinstance(e, NodeFinished) and e.kind == "book")
    assert parts_done[0] < book_done  # the case in question: a part was planned before the book's reply ended
    assert_each_level_announced_once(events, result.outline)
