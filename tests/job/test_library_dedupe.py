"""``handbook library --dedupe reask``: a section that nearly repeats a section of a book finished before is asked
again once, told the other's title and first sentence; the dataset holds the new text; without it nothing is asked
again and defects.json reports the pair across books."""

from __future__ import annotations

import json

from cli_run import handbook
from scripted_book import book_answer
from scripted_openai import Answer, Request, ScriptedServer, prose

SAME = ("A queue decouples the producer from the consumer, so that a slow reader never blocks a fast writer. Its "
        "length is the first thing to watch: a queue that only grows means the readers cannot keep up. Bound it, and "
        "decide in advance what happens when it is full: drop, block, or shed the oldest. Every message needs an id, "
        "so that a retry can be told from a second order.")


def _answer(req: Request) -> Answer:
    """Both books have the same titles (book_answer): every section differs from the other book's (its text is
    drawn by title and by how many times that title was asked) but "Basics 1", the same in both."""
    if req.kind == "section":
        last = req.body["messages"][-1]["content"]
        if "Another section" in last:
            return Answer(prose(req.title + " again"))
        if req.title == "Basics 1":
            return Answer(f"This section is about {req.title}. {SAME}")
        return Answer(prose(req.title) if req.nth == 1 else f"This section is about {req.title}. "
                      + prose(f"{req.title} #{req.nth}").split(". ", 1)[1])
    return book_answer(req)


def _library(tmp_path, url: str, *more: str):
    file = tmp_path / "lib.jsonl"
    file.write_text("".join(json.dumps({"id": f"b{i}", "prompt": f"A test book number {i}", "parts": 1,
                                        "chapters": 2, "sections": 4}) + "\n" for i in range(2)))
    out = tmp_path / "out"
    run = handbook("library", str(file), "--out", str(out), "--backend", url, "--books-in-flight", "1", "--stream-sections", "always", "-q", *more)
    assert run.returncode == 0, run.stderr
    return out


def test_a_section_repeating_a_finished_books_is_asked_again_once(tmp_path):
    import pyarrow.parquet as pq

    with ScriptedServer(_answer) as srv:
        out = _library(tmp_path, srv.url, "--dedupe", "reask")
        again = [r for r in srv.of("section") if "Another section" in r.body["messages"][-1]["content"]]
    assert len(again) == 1, "exactly the later book's section is asked again, once"
    assert '"Basics 1", already says: "This section is about Basics 1."' in again[0].body["messages"][-1]["content"]
    rows = pq.read_table(out / "sections.parquet").to_pylist()
    texts = {(r["book_id"], r["path"]): r["text"] for r in rows}
    assert "A queue decouples" in texts[("b0", "1.1.1")] and "A queue decouples" not in texts[("b1", "1.1.1")]
    assert json.loads((out / "defects.json").read_text())["near_duplicate_sections"]["across_books"] == 0


def test_without_reask_the_pair_is_reported_and_nothing_asked_again(tmp_path):
    with ScriptedServer(_answer) as srv:
        out = _library(tmp_path, srv.url)
        assert not [r for r in srv.of("section") if "Another section" in r.body["messages"][-1]["content"]]
    assert json.loads((out / "defects.json").read_text())["near_duplicate_sections"]["across_books"] == 1


def _still_same(req: Request) -> Answer:
    """As _answer, but the re-ask of "Basics 1" says the same again: the pair stays, the later book's section marked
    as asked."""
    if req.kind == "section" and req.title == "Basics 1":
        return Answer(f"This section is about {req.title}. {SAME}")
    return _answer(req)


def test_a_library_written_again_from_its_journals_is_not_checked_again(tmp_path):
    """A dataset from before a column was added is not carried over: every book is written again from its journal,
    in whatever order, asking nothing; a book finished complete is not checked against the others again (here the
    first book, written again after the second, would nearly repeat it)."""
    import pyarrow.parquet as pq

    with ScriptedServer(_still_same) as srv:
        out = _library(tmp_path, srv.url, "--dedupe", "reask")
        asked = len(srv.requests)
        assert len([r for r in srv.of("section") if "Another section" in r.body["messages"][-1]["content"]]) == 1
        table = pq.read_table(out / "sections.parquet")
        pq.write_table(table.drop_columns(["printed"]), out / "sections.parquet")
        file = tmp_path / "lib.jsonl"
        file.write_text("".join(reversed(file.read_text().splitlines(keepends=True))))  # b1 is written again first
        run = handbook("library", str(file), "--out", str(out), "--backend", srv.url, "--books-in-flight", "1",
                       "--stream-sections", "always", "-q", "--dedupe", "reask")
        assert run.returncode == 0, run.stderr
        assert len(srv.requests) == asked
    rows = {(r["book_id"], r["path"]): r for r in pq.read_table(out / "sections.parquet").to_pylist()}
    assert {k: r["text"] for k, r in rows.items()} == {(r["book_id"], r["path"]): r["text"] for r in table.to_pylist()}
    assert all(r["printed"] for r in rows.values())


def _two_runs(tmp_path, first: list[int], second: list[int], between=None):
    """One library run twice with --dedupe reask, FILE holding the books ``first`` then ``second`` (b0, b1 as
    _library's), ``between(out)`` called between the runs; returns the folder and the re-asks of both runs."""
    file = tmp_path / "lib.jsonl"
    out = tmp_path / "out"
    args = ("library", str(file), "--out", str(out), "--books-in-flight", "1", "--stream-sections", "always", "-q",
            "--dedupe", "reask")
    with ScriptedServer(_answer) as srv:
        for books in (first, second):
            file.write_text("".join(json.dumps({"id": f"b{i}", "prompt": f"A test book number {i}", "parts": 1,
                                                "chapters": 2, "sections": 4}) + "\n" for i in books))
            assert (run := handbook(*args, "--backend", srv.url)).returncode == 0, run.stderr
            if between is not None and books is first:
                between(out)
        again = [r for r in srv.of("section") if "Another section" in r.body["messages"][-1]["content"]]
    return out, again


def test_a_book_added_to_a_finished_library_is_asked_against_the_books_carried_over(tmp_path):
    import pyarrow.parquet as pq

    out, again = _two_runs(tmp_path, [0], [0, 1])  # an appended line: b0 is carried over, b1 written
    assert json.loads((out / "stats.json").read_text())["carried_over"] == 1
    assert len(again) == 1 and '"Basics 1", already says:' in again[0].body["messages"][-1]["content"]
    texts = {(r["book_id"], r["path"]): r["text"] for r in pq.read_table(out / "sections.parquet").to_pylist()}
    assert "A queue decouples" in texts[("b0", "1.1.1")] and "A queue decouples" not in texts[("b1", "1.1.1")]


def test_a_new_book_is_asked_against_the_books_written_again_from_their_journals(tmp_path):
    """The earlier run's books are not carried over (a dataset from before a column): they are written again from
    their journals before the new book, which comes first in the file, so that it is asked against them."""
    import pyarrow.parquet as pq

    def older(out):
        table = pq.read_table(out / "sections.parquet")
        pq.write_table(table.drop_columns(["printed"]), out / "sections.parquet")

    out, again = _two_runs(tmp_path, [0], [1, 0], older)  # the new book first in the file
    st = json.loads((out / "stats.json").read_text())
    assert (st["carried_over"], st["books_written"]) == (0, 2)
    assert len(again) == 1 and '"Basics 1", already says:' in again[0].body["messages"][-1]["content"]
    assert json.loads((out / "defects.json").read_text())["near_duplicate_sections"]["across_books"] == 0
