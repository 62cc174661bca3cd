"""Outline first (issue 14): `handbook plan` leaves outline.md and forecast.json; a person edits the outline;
`handbook write` asks only for what changed. Against simulated cards, through the real CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from local_http import env

from orchestrator.core.outline import Chapter, Outline, Part
from orchestrator.core.outline_md import OutlineFileError, read_outline_md, render_outline_md
from orchestrator.views.recording import find_recording, read_recording

PROMPT = "Write me a field guide to the rivers of Europe"


@pytest.fixture(scope="module")
def cards(sim_fleet):
    return sim_fleet(2, time_scale=0.5)


def handbook(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True,
                          timeout=timeout, env=env())


def backend_flags(urls: list[str]) -> list[str]:
    return [x for u in urls for x in ("--backend", u)]


def served(urls: list[str]) -> float:
    """Chat completions the cards finished, by their own counter: what the client cannot misreport."""
    total = 0.0
    for u in urls:
        with urllib.request.urlopen(f"{u.removesuffix('/v1')}/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("vllm:request_success_total"):
                    total += float(line.rsplit(" ", 1)[1])
    return total


def section_headings(md: str) -> list[str]:
    return re.findall(r"^#### (.+)$", md, re.M)


# -- outline.md, the file a person edits --------------------------------------------------------------------------


def test_outline_md_round_trips_with_lengths(tmp_path):
    outline = Outline("Rivers of C#", (
        Part("Western Europe", (Chapter("The Rhine", ("Source", "Delta"), (None, 400)),
                                Chapter("The Seine", ("Paris",)))),
        Part("Part: F#", (Chapter("Intro to C#", ("Vienna", "Budapest", "Black Sea #1")),)),
    ))
    path = tmp_path / "outline.md"
    path.write_text(render_outline_md(outline, tmp_path))
    assert read_outline_md(path) == outline
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())  # an editor's byte-order mark
    assert read_outline_md(path) == outline
    refs = list(read_outline_md(path).sections())
    assert [r.words for r in refs] == [None, 400, None, None, None, None]
    path.write_text("# Rivers ##\n## West #\n### Rhine\n- Source\n")  # closing #s, as Markdown allows
    assert read_outline_md(path).title == "Rivers" and read_outline_md(path).parts[0].title == "West"


@pytest.mark.parametrize(("text", "line", "what"), [
    ("## Part\n### Chapter\n- Section\n", 1, "before the book title"),
    ("# Book\n## Part\n- Section\n", 3, "outside a chapter"),
    ("# Book\n- Section\n", 2, "outside a chapter"),
    ("# Book\n## Part\n### Chapter\n- \n", 4, "empty title"),
    ("# Book\n## \n", 2, "empty title"),
    ("", 1, "no book title"),
    ("# Book\n## Part\n### Chapter\n- A\n  words: many\n", 5, "whole number"),
    ("# Book\n## Part\n### Chapter\n- A\nsome prose\n", 5, "not an outline line"),
    ("# Book\n## Part\n### Chapter\n", 3, "has no section"),
])
def test_a_bad_outline_names_its_line(tmp_path, text, line, what):
    path = tmp_path / "outline.md"
    path.write_text(text)
    with pytest.raises(OutlineFileError) as e:
        read_outline_md(path)
    assert f"outline.md:{line}:" in str(e.value) and what in str(e.value)


def test_write_refuses_a_bad_or_missing_outline_in_one_line(tmp_path):
    (tmp_path / "outline.md").write_text("# Book\n## Part\n- Orphan section\n")
    proc = handbook("write", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "outline.md:3:" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    (tmp_path / "outline.md").write_bytes(b"\xff\xfe# not text")
    proc = handbook("write", str(tmp_path))
    assert proc.returncode == 2 and "not UTF-8" in proc.stderr and "Traceback" not in proc.stderr
    proc = handbook("write", str(tmp_path / "nowhere"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


# -- plan, edit, write --------------------------------------------------------------------------------------------


# What an edit changes (a section renamed in chapter 1.1, chapter 2.1 deleted): with --context none the renamed
# section's own request alone; with outline, every request that names what was edited: chapter 1.1's sections (their
# requests list their siblings) and chapter 2.2's (their requests list part 2's chapters).
EDITED = {"none": 1, "outline": 6}


@pytest.mark.parametrize("context", sorted(EDITED))
def test_plan_then_edit_then_write_asks_only_for_what_changed(cards, tmp_path, context):
    out = tmp_path / "book"
    # the other shows its progress, the probe's note among it, and records the run (`handbook plan --record`)
    quiet = ("-q",) if context == "outline" else ("--record",)
    proc = handbook("plan", PROMPT, *backend_flags(cards.urls), "--parts", "2", "--chapters", "2", "--sections",
                    "3", "--out", str(out), *quiet, "--context", context)
    assert proc.returncode == 0, proc.stderr
    if not quiet:  # the probe is announced (ProbeStarted) before the job starts, not left at "[0s] planning"
        shown = proc.stdout + proc.stderr
        assert "forecast: measuring the step time of 2 backends at 3 then 12 streams at once" in shown, shown
        events = list(read_recording(find_recording(out), base=0.0))
        assert type(events[0]).__name__ == "ProbeStarted" and type(events[1]).__name__ == "JobStarted"
        assert "replay it with: handbook replay" in proc.stderr
    assert {"outline.md", "outline.json", "forecast.json"} <= {p.name for p in out.iterdir()}
    assert not (out / "book.md").exists()  # planning only
    fc = json.loads((out / "forecast.json").read_text())
    assert {"sections", "tokens", "pages", "whole_job_s", "per_backend", "inputs"} <= set(fc)
    assert fc["sections"] == 12 and fc["tokens"] > 0 and fc["pages"] > 0 and fc["whole_job_s"] > 0
    assert sum(b["sections"] for b in fc["per_backend"]) == 12
    # the forecast's probe loaded no backend past the 12 streams this book can run at once (the cap is 256)
    levels = [int(n) for f in fc["inputs"]["fits"] for n in re.findall(r"\d+", f["source"].split("(", 1)[1])]
    assert levels and max(levels) == 12
    assert {f["streams"] for f in fc["inputs"]["fits"]} == {12}  # a bigger job in this folder probes again
    outline = read_outline_md(out / "outline.md")
    assert outline.shape == (2, 4, 12)

    # First write: every section, no planning.
    before = served(cards.urls)
    proc = handbook("write", str(out), *backend_flags(cards.urls), "--format", "md", "-q")
    assert proc.returncode == 0, proc.stderr
    stats = json.loads((out / "stats.json").read_text())
    assert stats["planning_requests"] == 0 and stats["sections"] == 12 and stats["failed_sections"] == 0
    assert served(cards.urls) - before == 12
    assert stats["forecast"]["sections"] == 12 and stats["forecast"]["error"]["whole_job_s"] is not None

    # A person renames one section (to a title the planner's gate would never pass) and deletes a chapter.
    text = original = (out / "outline.md").read_text()
    first = outline.parts[0].chapters[0].sections[1]
    renamed = "Part 2: My OWN title, as written #1"
    text = text.replace(f"- {first}\n", f"- {renamed}\n", 1)
    dropped = outline.parts[1].chapters[0]
    block = re.search(rf"^### {re.escape(dropped.title)}\n.*?(?=^##)", text, re.M | re.S)
    assert block is not None
    text = text.replace(block.group(0), "")
    (out / "outline.md").write_text(text)

    before = served(cards.urls)
    proc = handbook("write", str(out), *backend_flags(cards.urls), "--format", "md", "-q")
    assert proc.returncode == 0, proc.stderr
    stats = json.loads((out / "stats.json").read_text())
    asked = EDITED[context]
    assert served(cards.urls) - before == asked, "exactly the sections whose requests changed are asked for"
    assert stats["requests"] == asked and stats["planning_requests"] == 0
    assert stats["sections"] == 9 and stats["resumed_sections"] == 9 - asked
    md = (out / "book.md").read_text()
    headings = section_headings(md)
    assert renamed in headings and first not in headings
    assert f"### {dropped.title}" not in md and not set(dropped.sections) & set(headings)
    # the forecast's book is the whole book; its requests, what is left to write
    assert stats["forecast"]["sections"] == 9
    assert sum(b["sections"] for b in stats["forecast"]["per_backend"]) == asked

    # Nothing changed: nothing is asked.
    before = served(cards.urls)
    proc = handbook("write", str(out), *backend_flags(cards.urls), "--format", "md", "-q")
    assert proc.returncode == 0, proc.stderr
    assert served(cards.urls) - before == 0
    assert json.loads((out / "stats.json").read_text())["requests"] == 0

    # Undoing both edits loses nothing: the renamed section's and the deleted chapter's texts are still journaled.
    (out / "outline.md").write_text(original)
    before = served(cards.urls)
    proc = handbook("write", str(out), *backend_flags(cards.urls), "--format", "md", "-q")
    assert proc.returncode == 0, proc.stderr
    assert served(cards.urls) - before == 0
    stats = json.loads((out / "stats.json").read_text())
    assert stats["requests"] == 0 and stats["sections"] == 12 and stats["resumed_sections"] == 12


def test_a_length_set_in_the_outline_is_asked_for(cards, tmp_path):
    out = tmp_path / "book"
    assert handbook("plan", PROMPT, *backend_flags(cards.urls), "--parts", "1", "--chapters", "1", "--sections",
                    "2", "--words", "100", "--out", str(out), "-q").returncode == 0
    assert handbook("write", str(out), *backend_flags(cards.urls), "--format", "md", "-q").returncode == 0
    text = (out / "outline.md").read_text()
    title = read_outline_md(out / "outline.md").parts[0].chapters[0].sections[0]
    (out / "outline.md").write_text(text.replace(f"- {title}\n", f"- {title}\n  words: 600\n", 1))
    before = served(cards.urls)
    proc = handbook("write", str(out), *backend_flags(cards.urls), "--format", "md", "-q")
    assert proc.returncode == 0, proc.stderr
    assert served(cards.urls) - before == 1, "only the section whose length changed"
    md = (out / "book.md").read_text()
    long, short = (len(b.split()) for b in re.split(r"^#### .+$", md, flags=re.M)[1:3])
    assert long > 2 * short, (long, short)


def test_write_cannot_change_what_the_sections_are_asked(cards, tmp_path):
    out = tmp_path / "book"
    assert handbook("plan", PROMPT, *backend_flags(cards.urls), "--parts", "1", "--chapters", "1", "--sections",
                    "2", "--out", str(out), "-q").returncode == 0
    proc = handbook("write", str(out), *backend_flags(cards.urls), "--model", "other")
    assert proc.returncode == 2 and "--model" in proc.stderr and "Traceback" not in proc.stderr


def test_write_has_a_flag_for_every_setting_it_may_change_and_no_flag_it_ignores():
    # One rule, one place: the settings `write` may change are stepwise.WRITE_OVERRIDES; its flags follow them.
    from orchestrator.cli import write
    from orchestrator.cli.common import OneLineParser
    from orchestrator.job.stepwise import WRITE_OVERRIDES

    parser = OneLineParser(prog="handbook write")
    write.add_arguments(parser)
    dests = {a.dest for a in parser._actions}
    assert set(write._FLAG_OF) <= WRITE_OVERRIDES, "the flag table names a setting `write` may not change"
    flags = write._flags()
    flagless = {s for s, flag in write._FLAG_OF.items() if flag is None}
    assert set(flags.values()) | flagless == WRITE_OVERRIDES
    missing = {setting: flag for flag, setting in flags.items() if flag not in dests}
    assert not missing, f"settings `write` may change but has no flag for (or the table must say None): {missing}"
    not_settings = {"help", "dir", "backend", "model", "feed", "feed_linger", "quiet", "record", "power"}  # record: a view; power: paired with --backend  # model: refused, one line
    ignored = dests - set(flags) - not_settings
    assert not ignored, f"`handbook write` flags that change no setting: {ignored}"


# -- budgets ------------------------------------------------------------------------------------------------------


def test_a_page_budget_gives_a_book_of_about_that_many_a5_pages(cards, tmp_path):
    out = tmp_path / "book"
    proc = handbook(PROMPT, *backend_flags(cards.urls), "--pages", "40", "--out", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "budget:" in proc.stderr  # it says what it chose
    # and, before, that it measures the servers to choose it (ProbeStarted), not "[0s] planning" for the probe
    assert "forecast: measuring the step time of 2 backends at" in proc.stdout + proc.stderr
    stats = json.loads((out / "stats.json").read_text())
    assert 36 <= stats["pdf_pages"] <= 44, stats["pdf_pages"]
    assert stats["forecast"]["error"]["pages"] is not None and abs(stats["forecast"]["error"]["pages"]) <= 0.1
    # Rerunning the same command resumes the same book: the shape it chose is kept, nothing is asked again.
    before = served(cards.urls)
    proc = handbook(PROMPT, *backend_flags(cards.urls), "--pages", "40", "--out", str(out), "-q", timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert served(cards.urls) - before == 0


def test_library_plan_write_forecast(cards, tmp_path):
    import orchestrator as hb

    settings = hb.Settings(parts=1, chapters=2, sections=2, cap=32)  # cap 32: a light probe
    fc = hb.forecast(None, cards.urls, settings)
    assert fc.sections == 4 and fc.whole_job_s > fc.plan_s >= 0
    events: list[object] = []
    outline = hb.plan(PROMPT, cards.urls, settings, out=tmp_path / "b", on_event=events.append)
    assert isinstance(outline, hb.Outline) and outline.shape == (1, 2, 4)
    result = hb.write(tmp_path / "b", cards.urls, on_event=events.append)
    assert result.complete and len(result.outline.parts[0].chapters) == 2
    assert any(isinstance(e, hb.ForecastReady) for e in events)
    assert Path(result.paths["md"]).exists()


def test_plan_again_keeps_a_persons_edits_and_a_plan_needs_no_counters(cards, tmp_path):
    out = tmp_path / "book"
    args = ("plan", PROMPT, *backend_flags(cards.urls), "--parts", "1", "--chapters", "2", "--sections", "2",
            "--out", str(out), "-q")
    assert handbook(*args).returncode == 0
    text = (out / "outline.md").read_text().replace("\n- ", "\n- MY EDIT ", 1)
    (out / "outline.md").write_text(text)
    proc = handbook(*args)
    assert proc.returncode == 0, proc.stderr
    assert "MY EDIT" in (out / "outline.md").read_text() and "holds your edits" in proc.stderr


def test_a_plan_on_a_server_without_metrics_still_writes_the_outline(tmp_path):
    from fake_openai import FakeServer

    with FakeServer("ok") as server:
        proc = handbook("plan", "A book about tea", "--backend", server.url, "--parts", "1", "--chapters", "1",
                        "--sections", "2", "--out", str(tmp_path / "b"), "-q")
    assert proc.returncode == 0, proc.stderr
    assert "no forecast:" in proc.stderr
    assert json.loads((tmp_path / "b" / "forecast.json").read_text())["available"] is False
    assert read_outline_md(tmp_path / "b" / "outline.md").shape == (1, 1, 2)


def test_write_without_backends_uses_the_plans_at_the_cap_asked(cards, tmp_path):
    """No --backend: write runs on the backends the plan ran on, each at the cap it had then, unless --cap says
    otherwise (the timeline shows what each card actually carried)."""
    for cap in (None, 2):
        out = tmp_path / f"book-{cap}"
        assert handbook("plan", PROMPT, *backend_flags(cards.urls), "--cap", "4", "--parts", "1", "--chapters",
                        "2", "--sections", "6", "--out", str(out), "-q").returncode == 0
        extra = [] if cap is None else ["--cap", str(cap)]
        proc = handbook("write", str(out), "--format", "md", "--timeline", "-q", *extra)
        assert proc.returncode == 0, proc.stderr
        line = json.loads((out / "timeline.json").read_text())
        assert set(line["backends"]) <= set(cards.urls)
        assert set(line["caps"].values()) == {cap or 4}
        assert 1 <= max(line["max_in_flight"].values()) <= (cap or 4)
        assert sum(r["kind"] == "section" for r in line["requests"]) == 12
