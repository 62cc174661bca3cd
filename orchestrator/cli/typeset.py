"""`handbook typeset BOOK.md [--out BOOK.pdf] [--format pdf,html] [--templates DIR] [--workers N]`: typeset existing
Markdown (a finished job's book.md, or one written by hand) into an A5 PDF and/or a self-contained HTML file."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..core.errors import ConfigError
from ..typeset.book import parse_formats, typeset_to


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("book", metavar="BOOK.md", help="the Markdown book to typeset")
    parser.add_argument("--out", metavar="BOOK.pdf",
                        help="the PDF to write (default: BOOK.pdf next to BOOK.md); book.html goes beside it; "
                             "a directory means DIR/book.pdf")
    parser.add_argument("--format", default="pdf", metavar="LIST",
                        help="comma-separated: html, pdf (md is accepted and ignored; default: pdf)")
    parser.add_argument("--templates", metavar="DIR", help="a directory with book.html.j2 and/or book.css overrides")
    parser.add_argument("--workers", type=int, default=None, metavar="N",
                        help="layout processes (default: one per CPU core)")


def _pdf_path(src: Path, out: str | None) -> Path:
    """--out as given: a .pdf file, or a directory (existing, or written with a trailing slash) for DIR/book.pdf."""
    if not out:
        return src.with_suffix(".pdf")
    path = Path(out).expanduser()
    if path.is_dir() or out.endswith(("/", "\\")):
        return path / "book.pdf"
    if path.suffix.lower() == ".pdf":
        return path
    raise ConfigError(f"--out {path}: give a .pdf file name or a directory")


def run(args: argparse.Namespace) -> int:
    src = Path(args.book).expanduser()
    if not src.is_file():
        raise ConfigError(f"{src}: no such file")
    try:
        markdown = src.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{src}: cannot read it as UTF-8 text ({e})") from e
    if not markdown.strip():
        raise ConfigError(f"{src}: the file is empty")
    fmts = parse_formats(str(args.format).split(","))
    if not fmts & {"html", "pdf"}:
        raise ConfigError("--format: nothing to typeset (choose html and/or pdf)")
    if args.workers is not None and args.workers < 1:
        raise ConfigError("--workers must be at least 1")
    pdf = _pdf_path(src, args.out)
    info = typeset_to(
        markdown,
        pdf_path=pdf if "pdf" in fmts else None,
        html_path=pdf.with_suffix(".html") if "html" in fmts else None,
        templates=args.templates,
        workers=args.workers,
        default_title=src.stem.replace("_", " ").replace("-", " ").strip() or "Handbook",
    )
    wrote = [str(p) for p in (info.pdf_path, info.html_path) if p is not None]
    pages = f", {info.pdf_pages} pages" if info.pdf_pages is not None else ""
    print(f"wrote {' and '.join(wrote)} ({info.sections} sections{pages}) in {info.seconds:.1f} s")
    return 0
