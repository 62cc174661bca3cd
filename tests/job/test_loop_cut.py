"""A section that loops after saying enough is kept as what it said before the loop, not asked again
(book/loopcut.py, SectionCheck's keep_words, Writer._cut_at_loop).

The server is tests/fake_openai.FakeServer in mode "loops-late": every section asked at temperature 0 writes its
prose (about 160 words), then one line over and over to its max_tokens; a re-ask (temperature 0.7) gets prose."""

from __future__ import annotations

import json
import sqlite3

import pytest
from cli_run import handbook
from fake_openai import BOOK_ARGS, FakeServer, reply

from orchestrator.book.checks import loop_reason
from orchestrator.book.loopcut import kept_before_loop, loop_cut, loop_start
from orchestrator.book.talk import words
from orchestrator.core.reply import STOPPED
from orchestrator.job.section_check import SectionCheck

PROSE = ("A river's basin is the land that drains into it. Rain that falls anywhere in the basin reaches the river in "
         "the end, through streams, soil or groundwater.\n\nThat is why a river carries the history of its whole "
         "basin: the salt of its fields, the silt of its hills and the waste of its towns.\n\n"
         "Gauges measure a river's level several times an hour. A hydrologist turns those readings into discharge "
         "with a rating curve, fitted from occasional measurements of velocity across the channel.\n\n")
LINE = "The cache keeps every record near the server that asked for it.\n"



def test_the_loop_starts_where_its_unit_is_written_the_second_time():
    assert loop_start(PROSE + LINE * 9) == len(PROSE) + len(LINE)
    para = ("The Danube rises in the Black Forest and reaches the Black Sea after crossing ten countries, more than "
            "any other river in the world, and its delta is a maze of channels.\n\n")
    assert loop_start(PROSE + para * 3) == len(PROSE) + len(para)  # a paragraph, twice
    run = "the river carries the silt of its hills down to the sea and "
    text = PROSE + "In the end " + run * 10
    assert loop_start(text) == len(PROSE) + len("In the end ") + len(run)  # a sentence looping in its paragraph
    numbered = "".join(f"- Gauge {i} reads the level at the bridge.\n" for i in range(1, 9))
    assert loop_start(PROSE + numbered) == len(PROSE) + len(numbered.split("\n")[0]) + 1
    code = "```python\ntotal = 0\n" + "total = total + reading\n" * 6 + "```\n"
    assert loop_start(PROSE + code) == len(PROSE) + len("```python\ntotal = 0\ntotal = total + reading\n")


def test_what_repeats_as_prose_may_is_no_loop():
    lead_ins = "For example:\n\nThe gauge reads the level.\n\nFor example:\n\nThe curve turns it into discharge.\n"
    short = "## Summary\n\n" + PROSE + "## Summary\n\n"
    for text in (PROSE, PROSE + lead_ins, short, PROSE + "```python\nx = 1\ny = 2\nx = 1\n```\n"):
        assert loop_start(text) is None, text


def test_a_unit_written_twice_before_the_loop_is_not_where_it_starts():
    """Only a unit written as often as loop_reason needs counts: a list item restated, a title named twice and a
    12-word lead-in used twice are the section's own, and the cut keeps them and what follows."""
    item = "- Faster responses for repeated requests\n"
    lead = "Here is a small example that puts the rating curve into practice:\n\n"
    title = "how a distributed cache keeps data consistent across many servers at once"
    before = (f"This section explains {title}. " + PROSE + "Pros:\n\n" + item + "- Less load on the gauge\n\n" + lead
              + "In short:\n\n" + item + "\n" + lead + f"To sum up, we saw {title}.\n\n")
    for loop in (LINE * 8, "In practice " + "the cache keeps the record near the server that asked for it and " * 8):
        at = loop_start(before + loop)
        assert at is not None and at > len(before), loop
        assert kept_before_loop(before + loop, at).startswith(before.rstrip())


def test_what_is_kept_is_whole_loop_free_and_long_enough():
    text = PROSE + LINE * 9
    at = loop_cut(text, 40)
    assert at is not None
    kept = kept_before_loop(text, at)
    assert kept == (PROSE + LINE).rstrip() and loop_reason(kept) is None and words(kept) >= 40
    assert loop_cut(text, words(kept) + 1) is None  # too little before the loop: asked again
    assert loop_cut(LINE * 12, 12) == len(LINE) and loop_cut(LINE * 12, 13) is None  # 12 words before the loop
    assert loop_cut(PROSE, 1) is None  # nothing loops: nothing to cut
    # a loop inside a code block: the block is kept to its loop and closed, where the code before it stands alone
    code = "```js\nlet total = 0\n" + "total = total + reading(gauge)\n" * 8
    at = loop_cut(PROSE + code, 40)
    assert at is not None and kept_before_loop(PROSE + code, at) == PROSE + "```js\nlet total = 0\ntotal = total + reading(gauge)\n```"
    assert kept_before_loop("no sentence end here at all", 10) == ""


def test_the_check_keeps_a_long_enough_answer_cut_and_asks_a_short_one_again():
    check = SectionCheck("Rivers", keep_words=40)
    assert check(reply(PROSE + LINE * 9, STOPPED)) == {
        "repaired_from": loop_reason(PROSE + LINE * 9), "loop": None, "loop_cut": len(PROSE) + len(LINE)}
    assert check.loop is None  # nothing was asked again
    short = SectionCheck("Rivers", keep_words=words(PROSE) + 20)
    with pytest.raises(ValueError, match="caught while streaming"):
        short(reply(PROSE + LINE * 9, STOPPED))
    # its re-ask loops too, after enough: cut as well, where it was printed looping before
    more = ("Floods are not always disasters. On the lower Loire, spring water spreads over meadows that farmers "
            "leave unploughed, and the silt it leaves behind keeps them fertile.\n\n")
    value = short(reply(PROSE + more + LINE * 9, "length", attempt=2))
    assert value["loop_cut"] == len(PROSE + more + LINE) and value["repaired_from"] == short.loop
    unwatched = SectionCheck("Rivers")  # keep_words None: as before, asked again
    with pytest.raises(ValueError, match="repetition loop"):
        unwatched(reply(PROSE + LINE * 9))


@pytest.mark.parametrize("stream", ["always", "never"])
def test_a_section_that_loops_late_is_kept_cut_and_a_rerun_asks_nothing(tmp_path, stream):
    out = tmp_path / "book"
    args = ["A handbook of rivers", *BOOK_ARGS, "--out", str(out), "--stream-sections", stream]
    with FakeServer("loops-late", section_chunk_delay=0.005) as srv:
        proc = handbook(*args, "--backend", srv.url)
        assert proc.returncode == 0, proc.stderr
        stats = json.loads((out / "stats.json").read_text())
        defects = json.loads((out / "defects.json").read_text())
        book = (out / "book.md").read_text()
        n = stats["sections"]
        assert n == 6 and stats["failed_sections"] == 0 and stats["empty_sections"] == 0
        # no section was asked again: each was kept as its prose and the loop line's first time
        assert stats["requests"] == stats["planning_requests"] + n and stats["request_errors"] == 0
        assert stats["loop_cut_sections"] == n and stats["signed_off_answers"] == 0
        assert stats["stopped_answers"] == (n if stream == "always" else 0)
        assert defects["looping_sections"] == {"count": 0, "repaired": n, "cut": n, "sections": []}
        assert f"0 looping sections ({n} repaired, {n} of them cut before the loop)" in proc.stderr + proc.stdout
        assert book.count(LINE.strip()) == n and book.count("Point 8 of this section") == n
        if stream == "always":  # dropped at the line's third time, not read to the 400-token cap
            assert all(written < total for written, total in srv.loop_streams), srv.loop_streams
        with sqlite3.connect(out / "journal.sqlite") as db:  # the journal keeps the cut text, marked as cut
            rows = db.execute("SELECT text, value FROM nodes WHERE kind = 'section'").fetchall()
        assert len(rows) == n and all(text.count(LINE.strip()) == 1 and json.loads(value)["loop_cut"] is True
                                      for text, value in rows)
        again = handbook(*args, "--backend", srv.url)
        assert again.returncode == 0, again.stderr
    rerun = json.loads((out / "stats.json").read_text())
    assert rerun["resumed_sections"] == n and rerun["requests"] == 0 and rerun["loop_cut_sections"] == n
    assert (out / "book.md").read_text() == book


def test_a_library_counts_its_books_cut_sections_and_its_dataset_holds_the_cut_text(tmp_path):
    """A library's sections are read whole (no feed): each loop is judged after it, and cut all the same."""
    import pyarrow.parquet as pq

    lib = tmp_path / "lib.jsonl"
    lib.write_text("".join(json.dumps({"id": f"b{i}", "prompt": f"A handbook of rivers {i}", "parts": 1,
                                       "chapters": 1, "sections": 2 + i}) + "\n" for i in range(2)))
    out = tmp_path / "lib"
    with FakeServer("loops-late") as srv:
        proc = handbook("library", str(lib), "--out", str(out), "--backend", srv.url, "--max-tokens", "400",
                        "--context", "none", "--no-distinct-titles", "-q")
    assert proc.returncode == 0, proc.stderr
    stats = json.loads((out / "stats.json").read_text())
    rows = pq.read_table(out / "sections.parquet").to_pylist()
    assert stats["sections"] == len(rows) == 5 and stats["loop_cut_sections"] == 5
    assert stats["requests"] == stats["planning_requests"] + 5  # none asked again
    assert all(r["text"].count(LINE.strip()) == 1 and "Point 8 of this section" in r["text"] for r in rows)
