"""Typesetting while writing (orchestrator/typeset/background.py): each section of the PDF is laid out on a galley by
niced workers as soon as it is in, and the book.pdf made that way is the one a layout after the job would make."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pypdf
import pytest

from orchestrator import Settings, generate
from orchestrator.book.assemble import SectionText, assemble
from orchestrator.cli.job import resolve
from orchestrator.cli.main import OneLineParser
from orchestrator.core.config import settings_from
from orchestrator.core.events import OutlineReady
from orchestrator.core.outline import Chapter, Outline, Part
from orchestrator.core.resources import template_dirs
from orchestrator.job.stepwise import WRITE_OVERRIDES, write_settings
from orchestrator.typeset import typeset_to
from orchestrator.typeset.background import BACKGROUND_NICE, BackgroundTypesetter
from orchestrator.typeset.background import for_job as _background
from orchestrator.typeset.galley import book_items, templates_digest
from orchestrator.typeset.html import parse_book

PROMPT = "A handbook of build systems"
# Two cards at cap 4 write the 24 sections in several waves, so parts 1 and 2 are whole well before part 3.
SHAPE: dict[str, Any] = dict(parts=3, chapters=2, sections=4, words=120, max_tokens=240, cap=4,
                             formats=("md", "pdf"))

Facts = tuple[list[str], list[tuple[int, str, int]]]  # per-page text; bookmarks as (depth, title, page)


def _norm(text: str) -> str:
    return " ".join(text.split())


def pdf_facts(path: Path) -> Facts:
    reader = pypdf.PdfReader(str(path))
    texts = [_norm(p.extract_text()) for p in reader.pages]
    marks: list[tuple[int, str, int]] = []

    def walk(items: list[Any], depth: int) -> None:
        for item in items:
            if isinstance(item, list):
                walk(item, depth + 1)
            else:
                marks.append((depth, _norm(item.title), reader.get_destination_page_number(item) + 1))

    walk(reader.outline, 0)
    return texts, marks


def is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def wait_for(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def cards(sim_fleet):
    return sim_fleet(2, time_scale=0.3)


@pytest.fixture(scope="module")
def jobs(cards, tmp_path_factory) -> dict[bool, tuple[Path, Any, Facts]]:
    """The same job twice, typesetting while writing (True) and after writing (False): its folder, its Result and
    what its book.pdf holds (read at once, before any other test touches the folder)."""
    base = tmp_path_factory.mktemp("typeset-background")
    runs = {}
    for flag in (True, False):
        out = base / ("while" if flag else "after")
        result = generate(PROMPT, backends=cards.urls, settings=Settings(**SHAPE, typeset_while_writing=flag),
                          out=out)
        runs[flag] = (out, result, pdf_facts(out / "book.pdf"))
    return runs


def check_timing_stats(stats: dict[str, Any]) -> None:
    assert is_number(stats["pdf_ready_s"]) and is_number(stats["typeset_after_write_s"]), stats
    assert stats["pdf_ready_s"] >= stats["whole_job_s"] - 1e-3  # the PDF comes after the rest of the job
    assert stats["typeset_after_write_s"] >= 0
    cpu = stats["typeset_cpu_s"]
    assert cpu is not None and set(cpu) == {"during_write", "after_write", "chunks_from_background"}


def test_same_pdf_with_and_without_typesetting_while_writing(jobs):
    (out_on, res_on, (texts_on, marks_on)), (out_off, res_off, (texts_off, marks_off)) = jobs[True], jobs[False]
    assert res_on.complete and res_off.complete and res_on.typeset_error is None and res_off.typeset_error is None
    # The sim writes the same book for the same job: the two PDFs are of the same Markdown.
    assert (out_on / "book.md").read_text() == (out_off / "book.md").read_text()
    assert len(texts_on) == len(texts_off) == res_on.stats["pdf_pages"] == res_off.stats["pdf_pages"]
    for i, (a, b) in enumerate(zip(texts_on, texts_off, strict=True), start=1):
        assert a == b, f"page {i} differs"
    assert marks_on == marks_off
    titles = {t for _, t, _ in marks_on}
    outline = res_on.outline
    expected = [p.title for p in outline.parts] + [c.title for p in outline.parts for c in p.chapters] + [
        s for p in outline.parts for c in p.chapters for s in c.sections]
    assert len(expected) == 3 + 6 + 24
    missing = [t for t in expected if _norm(t) not in titles]
    assert not missing, missing
    pages = [n for _, _, n in marks_on]
    assert pages == sorted(pages) and 1 <= pages[0] and pages[-1] <= len(texts_on)

    for res in (res_on, res_off):
        check_timing_stats(res.stats)
    on, off = res_on.stats["typeset_cpu_s"], res_off.stats["typeset_cpu_s"]
    assert off["chunks_from_background"] == 0 and off["during_write"] == 0
    # Items really were laid out while the fleet wrote the others (the front matter and at least one more batch).
    assert on["chunks_from_background"] >= 2, on
    assert on["during_write"] > 0, on


def test_resumed_job_makes_the_same_pdf(cards, jobs):
    out, first, (texts, marks) = jobs[True]
    again = generate(PROMPT, backends=cards.urls, settings=Settings(**SHAPE), out=out)
    assert again.complete and again.typeset_error is None
    assert again.stats["resumed_sections"] == 24  # every section came from the journal
    assert again.markdown == first.markdown
    texts2, marks2 = pdf_facts(out / "book.pdf")
    assert len(texts2) == len(texts) == again.stats["pdf_pages"]
    for i, (a, b) in enumerate(zip(texts, texts2, strict=True), start=1):
        assert a == b, f"page {i} differs"
    assert marks2 == marks
    check_timing_stats(again.stats)
    assert again.stats["typeset_cpu_s"]["chunks_from_background"] >= 1


# -- the render level: no servers -------------------------------------------------------------------------------

OUTLINE = Outline(
    title="A Small Book of Layout",
    parts=tuple(
        Part(f"Part {name} of the Book", (Chapter(f"Chapter {name} Basics", (f"Section {name} One",
                                                                            f"Section {name} Two")),))
        for name in ("Alpha", "Bravo", "Charlie")
    ),
)
OLD_WORD, NEW_WORD = "Quillfeather", "Zephyrmarker"
CHANGED = "2.1.1"


def section(ref: Any, text: str) -> SectionText:
    return SectionText(ref.path, ref.part, ref.chapter, ref.title, text, finish_reason="stop")


def section_texts() -> dict[str, SectionText]:
    out = {}
    for ref in OUTLINE.sections():
        words = f" The old wording says {OLD_WORD} here." if ref.path == CHANGED else ""
        text = (f"This section covers {ref.title.lower()} in plain words.{words} " +
                "Every build should be reproducible from a clean checkout. " * 12)
        out[ref.path] = section(ref, text.strip())
    return out


def dirs() -> list[str]:
    return [str(d) for d in template_dirs(None)]


def n_layouts(sections: dict[str, SectionText]) -> int:
    """What the final layout of this book needs: the front matter and every galley item."""
    root = parse_book(assemble(OUTLINE, sections).markdown)
    return 1 + len(book_items(root, templates_digest(dirs())))


def n_from_outline() -> int:
    """What the outline alone lets the background lay out: the front matter, each part's title page, each
    chapter's heading and running head."""
    return 1 + len(OUTLINE.parts) + 2 * sum(len(p.chapters) for p in OUTLINE.parts)


def test_changed_section_is_laid_out_again_and_the_rest_taken_prepared(tmp_path):
    sections = section_texts()
    bg = BackgroundTypesetter(dirs(), workers=2, want_fragments=False, batch=1)
    try:
        bg(OutlineReady(OUTLINE, time.monotonic()))
        for s in sections.values():
            bg.section_landed(s)
        wanted = n_layouts(sections)
        assert wanted == n_from_outline() + 6
        wait_for(lambda: len(bg.done) >= wanted, 60, "the front matter and every item laid out")
        assert bg.failed == 0 and len(bg.done) == wanted

        ref = next(r for r in OUTLINE.sections() if r.path == CHANGED)
        changed = {**sections, CHANGED: section(ref, f"This section now says {NEW_WORD} and nothing older. " * 6)}
        markdown = assemble(OUTLINE, changed).markdown
        t_handover = time.monotonic()
        info = typeset_to(markdown, pdf_path=tmp_path / "book.pdf", html_path=None, workers=2,
                          prepared=bg.handover())
    finally:
        bg.close()
    texts, marks = pdf_facts(tmp_path / "book.pdf")
    whole = " ".join(texts)
    assert NEW_WORD in whole and OLD_WORD not in whole
    assert info.pdf_pages == len(texts)
    # Everything but the changed section was taken as laid out while writing (done before the handover); the
    # changed section was laid out afresh, after it, in one document of its own.
    prepared = [c for c in info.layout if c[3]]
    fresh = [c for c in info.layout if not c[3]]
    assert len(prepared) >= 1 and len(fresh) == 1 and info.chunks == len(info.layout), info.layout
    assert all(done <= t_handover for _, done, _, _ in prepared)
    assert all(sent >= t_handover for sent, _, _, _ in fresh)

    # ... and the PDF is the one a layout from scratch makes of the same Markdown.
    plain = typeset_to(markdown, pdf_path=tmp_path / "plain.pdf", html_path=None, workers=2)
    assert not any(c[3] for c in plain.layout)
    assert pdf_facts(tmp_path / "plain.pdf") == (texts, marks)


def test_background_workers_run_at_a_lower_priority():
    own = os.getpriority(os.PRIO_PROCESS, 0)
    bg = BackgroundTypesetter(dirs(), workers=2, want_fragments=False, batch=1)
    try:
        bg(OutlineReady(OUTLINE, time.monotonic()))
        wait_for(lambda: bg.pool is not None, 20, "the outline to start the pool")
        assert bg.pool is not None
        pids = [w.proc.pid for w in bg.pool.workers]
        assert len(pids) == 2
        want = min(19, own + BACKGROUND_NICE)
        assert want > own
        # A worker lowers its own priority first thing after it starts.
        wait_for(lambda: all(os.getpriority(os.PRIO_PROCESS, p) == want for p in pids), 20,
                 "the workers to lower their priority")
        assert all(os.getpriority(os.PRIO_PROCESS, p) > own for p in pids)
    finally:
        bg.close()
    assert os.getpriority(os.PRIO_PROCESS, 0) == own  # the client's own priority is left alone


def test_background_only_with_a_pdf_the_flag_and_a_core_to_spare(monkeypatch):
    import orchestrator.typeset.background as background  # for_job calls the default_workers it imported

    monkeypatch.setattr(background, "default_workers", lambda: 2)
    both = Settings(formats=("md", "pdf"))
    assert _background(Settings(formats=("md",))) is None
    assert _background(Settings(formats=("md", "html"))) is None
    assert _background(Settings(formats=("md", "pdf"), typeset_while_writing=False)) is None
    bg = _background(both)
    try:
        assert isinstance(bg, BackgroundTypesetter)
        assert bg.workers == 2 and not bg.want_fragments
        assert bg.template_dirs == dirs()
    finally:
        if bg is not None:
            bg.close()
    with_html = _background(Settings(formats=("md", "html", "pdf")))
    try:
        assert isinstance(with_html, BackgroundTypesetter) and with_html.want_fragments
    finally:
        if with_html is not None:
            with_html.close()
    monkeypatch.setattr(background, "default_workers", lambda: 1)  # one core: the client keeps it
    assert _background(both) is None


def test_typeset_after_writing_flag(jobs):
    backend = ["--backend", "http://127.0.0.1:9/v1"]
    _, _, settings, _, _ = resolve(["A book", *backend])
    assert settings.typeset_while_writing is True
    _, _, settings, _, _ = resolve(["A book", "--typeset-after-writing", *backend])
    assert settings.typeset_while_writing is False

    from orchestrator.cli import write

    parser = OneLineParser(prog="handbook write")
    write.add_arguments(parser)
    assert parser.parse_args(["somewhere"]).typeset_after_writing is False
    assert parser.parse_args(["somewhere", "--typeset-after-writing"]).typeset_after_writing is True
    # `handbook write` may turn it off for a book planned with it on: the one setting changes, the plan's stay.
    assert "typeset_while_writing" in WRITE_OVERRIDES
    out, _, _ = jobs[True]
    overrides = settings_from({"typeset_while_writing": False})
    _, planned = write_settings(out)
    _, written = write_settings(out, overrides, frozenset({"typeset_while_writing"}))
    assert planned.typeset_while_writing is True and written.typeset_while_writing is False
    assert (written.parts, written.chapters, written.sections, written.words) == (3, 2, 4, 120)


def test_a_background_worker_that_dies_costs_only_itself(tmp_path):
    sections = section_texts()
    markdown = assemble(OUTLINE, sections).markdown
    bg = BackgroundTypesetter(dirs(), workers=2, want_fragments=False, batch=1)
    try:
        bg(OutlineReady(OUTLINE, time.monotonic()))
        wait_for(lambda: len(bg.done) == n_from_outline(), 60, "the outline's items laid out")
        assert bg.pool is not None and not bg.pool.busy()
        victim = bg.pool.workers[0]
        victim.proc.kill()
        victim.proc.wait(10)
        for s in sections.values():
            bg.section_landed(s)
        # the other worker lays out everything: a dead worker is never sent a job
        wait_for(lambda: len(bg.done) == n_layouts(sections), 90, "every item laid out by the live worker")
        info = typeset_to(markdown, pdf_path=tmp_path / "book.pdf", html_path=None, workers=2,
                          prepared=bg.handover())
        assert victim.retired  # replaced in the final layout's pool, not sent anything
    finally:
        bg.close()
    assert all(c[3] for c in info.layout) and len(info.layout) >= 2
    plain = typeset_to(markdown, pdf_path=tmp_path / "plain.pdf", html_path=None, workers=2)
    assert pdf_facts(tmp_path / "book.pdf") == pdf_facts(tmp_path / "plain.pdf")
    assert plain.pdf_pages == info.pdf_pages


def test_the_final_layout_fails_at_once_when_no_worker_can_start(tmp_path, monkeypatch):
    import sys

    import orchestrator.typeset.pool as pool
    from orchestrator.typeset.pool import TypesetError

    # Workers that exit at once (as if killed at start): the layout must say so, not wait for the silence timeout.
    monkeypatch.setattr(pool, "WORKER_COMMAND", (sys.executable, "-c", "pass"))
    monkeypatch.setattr(pool, "WORKER_SILENCE_S", 60)
    markdown = assemble(OUTLINE, section_texts()).markdown
    t0 = time.monotonic()
    with pytest.raises(TypesetError) as err:
        typeset_to(markdown, pdf_path=tmp_path / "book.pdf", html_path=None, workers=2)
    assert "said nothing" not in str(err.value), err.value  # not the 60 s silence timeout
    assert time.monotonic() - t0 < 50


def test_a_layout_whose_worker_died_mid_layout_is_done_again_at_the_end(tmp_path):
    sections = section_texts()
    markdown = assemble(OUTLINE, sections).markdown
    bg = BackgroundTypesetter(dirs(), workers=2, want_fragments=False, batch=1)
    try:
        bg(OutlineReady(OUTLINE, time.monotonic()))
        wait_for(lambda: bg.pool is not None and bg.pool.busy(), 20, "the front matter sent to a worker")
        assert bg.pool is not None
        victim = next(w for w in bg.pool.workers if w.job is not None)
        victim.proc.kill()  # mid-layout (the front matter takes a worker ~1 s)
        for s in sections.values():
            bg.section_landed(s)
        wait_for(lambda: bg.failed >= 1 and not bg.running and not bg.pending, 90, "every layout done or failed")
        info = typeset_to(markdown, pdf_path=tmp_path / "book.pdf", html_path=None, workers=2,
                          prepared=bg.handover())
    finally:
        bg.close()
    assert bg.failed >= 1 and not all(c[3] for c in info.layout)  # what died was laid out again
    plain = typeset_to(markdown, pdf_path=tmp_path / "plain.pdf", html_path=None, workers=2)
    assert pdf_facts(tmp_path / "book.pdf") == pdf_facts(tmp_path / "plain.pdf")
    assert plain.pdf_pages == info.pdf_pages
