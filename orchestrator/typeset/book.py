"""Markdown -> HTML (markdown-it-py + Jinja2) -> A5 PDF (WeasyPrint), fast enough for a 1,500-page book.

    info = typeset(markdown, out_dir, formats=("html", "pdf"))     # writes out_dir/book.html, out_dir/book.pdf

The book has a title page, a table of contents whose numbers are the pages where each part, chapter and section
starts (each entry links there; the PDF has matching bookmarks), page numbers in the footer, the chapter title as
the running head, parts on a page of their own, and highlighted code that wraps instead of running off the page.

Model output is untrusted: raw HTML in it shows as text, images are shown as their alt text and never fetched,
and WeasyPrint's URL fetcher serves only our own template assets and refuses everything else.

How it is fast: see typeset/pdf.py (the body laid out in galleys by parallel processes, paginated and composed in
the parent: typeset/galley.py, typeset/compose.py) and typeset/merge.py (one merge with global page numbers), and
benchmarks/typeset.py and benchmarks/pdf_ready.py (the measurements). ``handbook typeset BOOK.md`` is the command
line (orchestrator/cli/typeset.py).
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from markupsafe import Markup

from ..core.errors import ConfigError
from ..core.osutil import atomic_write
from ..core.resources import template_dirs
from .html import (
    Node,
    document_html,
    parse_book,
    plain_text,
    render_inline,
    render_markdown,
    toc_entries,
)

if TYPE_CHECKING:
    from .pdf import Prepared

__all__ = ["FORMATS", "TypesetInfo", "parse_formats", "typeset", "typeset_to"]

FORMATS = ("md", "html", "pdf")


@dataclass(frozen=True)
class TypesetInfo:
    """What typesetting wrote, and what it cost."""

    html_path: Path | None
    pdf_path: Path | None
    pdf_pages: int | None
    seconds: float
    sections: int = 0
    workers: int = 0
    chunks: int = 0
    worker_peak_rss_mb: float | None = None  # the largest peak RSS of any one layout process
    layout: tuple[tuple[float, float, float, bool], ...] = ()  # per layout document: see PdfRun.layout
    pdf_written_at: float | None = None  # time.monotonic() when book.pdf was on disk (before book.html is written)


def _template_dirs(templates: str | Path | None) -> list[str]:
    return [str(d) for d in template_dirs(templates)]


def parse_formats(formats: Iterable[str]) -> set[str]:
    """The formats asked for, normalised; an unknown one is a :class:`ConfigError`."""
    out = set()
    for f in formats:
        f = f.strip().lower()
        if not f:
            continue
        if f not in FORMATS:
            raise ConfigError(f"unknown format {f!r}: choose from {', '.join(FORMATS)}")
        out.add(f)
    return out


def typeset(
    markdown: str,
    out_dir: Path,
    formats: Iterable[str] = ("pdf",),
    templates: str | None = None,
    *,
    workers: int | None = None,
    prepared: Prepared | None = None,
) -> TypesetInfo:
    """Write ``out_dir/book.html`` and/or ``out_dir/book.pdf`` ("md" in ``formats`` is ignored here)."""
    out_dir = Path(out_dir)
    fmts = parse_formats(formats)
    return typeset_to(
        markdown,
        pdf_path=out_dir / "book.pdf" if "pdf" in fmts else None,
        html_path=out_dir / "book.html" if "html" in fmts else None,
        templates=templates,
        workers=workers,
        prepared=prepared,
    )


def typeset_to(
    markdown: str,
    *,
    pdf_path: Path | None,
    html_path: Path | None,
    templates: str | Path | None = None,
    workers: int | None = None,
    default_title: str = "Handbook",
    prepared: Prepared | None = None,
) -> TypesetInfo:
    """Like :func:`typeset` with explicit output paths (either may be None). ``prepared``: items laid out while
    the book was being written (typeset/background.py); render_pdf takes those whose content is unchanged."""
    t0 = time.perf_counter()
    dirs = _template_dirs(templates)
    root = parse_book(markdown, default_title=default_title)
    sections = sum(1 for n in root.walk() if n.level == 4)
    pdf_pages = None
    peak = None
    n_workers = 0
    n_chunks = 0
    fragments: dict[str, tuple[str, str]] = {}
    layout: list[tuple[float, float, float, bool]] = []
    pdf_written_at = None
    for p in (pdf_path, html_path):
        if p is not None:
            Path(p).parent.mkdir(parents=True, exist_ok=True)
    if pdf_path is not None:
        if importlib.util.find_spec("weasyprint") is None:
            raise ConfigError("PDF output needs WeasyPrint: pip install weasyprint (or ask for --format html)")
        from .pdf import default_workers, render_pdf

        n_workers = workers or default_workers()
        run = render_pdf(root, Path(pdf_path), dirs, workers=n_workers, want_fragments=html_path is not None,
                         prepared=prepared)
        layout = run.layout
        pdf_written_at = run.t_written
        pdf_pages = run.pages
        n_chunks = run.chunks
        peak = max(run.worker_peak_rss_mb, default=None)
        fragments = run.fragments
    if html_path is not None:
        atomic_write(html_path, _book_html(root, dirs, fragments))
    return TypesetInfo(
        html_path=Path(html_path) if html_path is not None else None,
        pdf_path=Path(pdf_path) if pdf_path is not None else None,
        pdf_pages=pdf_pages,
        seconds=time.perf_counter() - t0,
        sections=sections,
        workers=n_workers,
        chunks=n_chunks,
        worker_peak_rss_mb=peak,
        layout=tuple(layout),
        pdf_written_at=pdf_written_at,
    )


def _book_html(root: Node, dirs: list[str], fragments: dict[str, tuple[str, str]]) -> str:
    """book.html: one self-contained document (CSS inlined, nothing to fetch), contents linked, no page numbers."""
    for n in root.walk():
        if n.level == 1:
            continue
        if n.id in fragments:
            title_html, body_html = fragments[n.id]
        else:
            title_html, body_html = render_inline(n.title), render_markdown(n.body)
        n.title_html = Markup(title_html)
        n.body_html = Markup(body_html)
    title_html = render_inline(root.title)
    toc = [{"kind": n.kind, "id": n.id, "title_html": n.title_html, "page": ""} for n in toc_entries(root)]
    return document_html(
        dirs, mode="html", front=True, title_html=Markup(title_html), title_text=plain_text(title_html),
        toc=toc, preface_html=Markup(render_markdown(root.body)), nodes=root.children,
    )
