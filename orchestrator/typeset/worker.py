"""One WeasyPrint layout, in its own process: a chunk of the book (a part, or the title page and contents) -> PDF.

Started by typeset/pdf.py as ``python -P -m orchestrator.typeset.worker``: each worker imports WeasyPrint once and
lays out the chunks it is sent, one at a time. The parent never imports this module (it only merges).
"""

from __future__ import annotations

import gc
import logging
import mimetypes
import os
import pickle
import signal
import sys
import time
import traceback
from array import array
from pathlib import Path
from typing import IO, Any
from urllib.parse import unquote

from markupsafe import Markup
from weasyprint import HTML
from weasyprint.urls import URLFetcher, URLFetcherResponse

from .compat import (
    anchor_boxes,
    cap_pdf_compression,
    galley_units,
    page_contents,
    page_geometry,
    text_runs,
    toc_lines,
)
from .galley import GALLEY_HEIGHT_PX
from .html import KIND, Node, document_html, read_css, render_inline, render_markdown, render_nodes
from .ipc import NICE_ENV, frame, read_frame

# pydyf (WeasyPrint's PDF writer) deflates every stream at zlib level 9. Measured on a 171-page part's content
# streams: level 9 takes 0.46 s of CPU, level 6 (zlib's default) 0.07 s for 14% more bytes. Level 6 it is.
ZLIB_LEVEL = 6

# Relative URLs in a template resolve against this; the fetcher maps it onto the template directories and
# refuses everything else (file:, http(s) anywhere, data:, 127.0.0.1 ...). ".invalid" never resolves.
ASSET_BASE = "https://handbook.invalid/assets/"
# WeasyPrint applies HTML's presentational attributes only when asked: without them a list that markdown-it renders as
# <ol start="4"> (steps resumed after a code block, "4." in book.md) printed from 1 again.
RENDER = {"presentational_hints": True}


class AssetFetcher(URLFetcher):
    """Serves only our own bundled (or --templates) assets; every other URL is refused without any I/O."""

    def __init__(self, asset_dirs: list[str]):
        super().__init__(timeout=1, allowed_protocols=(), allow_redirects=False)
        self.asset_dirs = [Path(d).resolve() for d in asset_dirs]
        self.refused: list[str] = []

    def fetch(self, url: str, headers: Any = None) -> URLFetcherResponse:
        if url.startswith(ASSET_BASE):
            rel = unquote(url[len(ASSET_BASE):].split("?", 1)[0].split("#", 1)[0])
            for base in self.asset_dirs:
                path = (base / rel).resolve()
                if path.is_relative_to(base) and path.is_file():
                    ctype = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
                    return URLFetcherResponse(url, path.read_bytes(), {"Content-Type": ctype})
        self.refused.append(url[:200])
        raise ValueError(f"handbook fetches nothing but its own assets; refused {url[:80]!r}")


def _peak_rss_mb() -> float:
    try:
        import resource
    except ImportError:  # pragma: no cover  (Windows)
        return 0.0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024.0 * 1024.0) if sys.platform == "darwin" else rss / 1024.0


def layout_chunk(job: dict[str, Any]) -> dict[str, Any]:
    """Lay out one chunk, write its PDF, and say where its headings (and contents entries) landed."""
    t0 = time.perf_counter()
    c0 = time.process_time()
    dirs = job["template_dirs"]
    fragments: dict[str, tuple[str, str]] = {}
    if job["kind"] == "front":
        html = document_html(
            dirs, mode="pdf", front=True, title_html=Markup(job["title_html"]), title_text=job["title_text"],
            toc=[{**e, "title_html": Markup(e["title_html"])} for e in job["toc"]],
            preface_html=Markup(job.get("preface_html", "")), nodes=[],
        )
    else:
        nodes = [Node.from_dict(d) for d in job["nodes"]]
        render_nodes(nodes)
        if job.get("want_fragments"):
            for top in nodes:
                for n in top.walk():
                    fragments[n.id] = (str(n.title_html), str(n.body_html))
        html = document_html(
            dirs, mode="pdf", front=False, title_html=Markup(job["title_html"]), title_text=job["title_text"],
            toc=[], preface_html=Markup(""), nodes=nodes,
        )
    t_html = time.perf_counter()
    fetcher = AssetFetcher(dirs)
    doc = HTML(string=html, base_url=ASSET_BASE, url_fetcher=fetcher).render(**RENDER)
    del html
    t_layout = time.perf_counter()
    pages = len(doc.pages)
    anchors = anchor_boxes(doc)
    size = (doc.pages[0].width, doc.pages[0].height) if pages else (0.0, 0.0)
    lines = toc_lines(doc) if job["kind"] == "front" else {}
    doc.write_pdf(job["out"])
    return _report(job, job["kind"], fetcher, (t0, t_html, t_layout, c0), pages=pages, size_px=size,
                   anchors=anchors, toc_lines=lines, fragments=fragments)


def _report(job: dict[str, Any], kind: str, fetcher: AssetFetcher, times: tuple[float, float, float, float],
            **fields: Any) -> dict[str, Any]:
    """A layout's report: what it laid out (``fields``) and what it cost. ``times``: perf_counter at the start,
    after the HTML and after the layout, and process_time at the start; the PDF has just been written."""
    t0, t_html, t_layout, c0 = times
    t_end = time.perf_counter()
    return {
        "index": job["index"], "kind": kind, "out": job["out"], **fields, "refused": fetcher.refused,
        "seconds": {"html": t_html - t0, "layout": t_layout - t_html, "pdf": t_end - t_layout,
                    "total": t_end - t0, "cpu": time.process_time() - c0},
        "peak_rss_mb": _peak_rss_mb(),
        "pid": os.getpid(),
    }


_GEOMETRY: dict[tuple[str, ...], dict[str, float]] = {}


def page_box(dirs: list[str]) -> dict[str, float]:
    """The book's page and its text box (CSS px), as the templates' @page rule makes them: laid out once per
    worker and set of templates."""
    key = (*dirs, read_css(dirs))
    if key not in _GEOMETRY:
        html = document_html(dirs, mode="pdf", front=False, title_html=Markup(""), title_text="", toc=[],
                             preface_html=Markup(""), nodes=[])
        doc = HTML(string=html, base_url=ASSET_BASE, url_fetcher=AssetFetcher(dirs)).render(**RENDER)
        _GEOMETRY[key] = page_geometry(doc)
    return _GEOMETRY[key]


def galley_css(geometry: dict[str, float]) -> str:
    """Each galley item on a page of its own, as wide as the book's text box and tall enough for a long section;
    its padding keeps its first and last margins inside it (they become the space between items)."""
    boxes = " ".join(f"@{v}-{h} {{ content: none; }}" for v in ("top", "bottom") for h in ("left", "center", "right"))
    return (f"@page hb-galley {{ size: {geometry['content_w']:.4f}px {GALLEY_HEIGHT_PX:.0f}px; margin: 0; {boxes} }}\n"
            ".hb-galley { page: hb-galley; break-before: page; break-after: page; margin: 0; padding: 0.01px 0; }\n")


def _flat(runs: list[tuple[int, int, float]] | None) -> array | None:
    """(start, end, y) runs as one flat array of doubles: a section has hundreds, and the parent keeps them all
    until the end of the job."""
    return None if runs is None else array("d", (v for run in runs for v in run))


def layout_galley(job: dict[str, Any]) -> dict[str, Any]:
    """Lay out a batch of galley items (typeset/galley.py) in one document, write its PDF, and report each item's
    galley pages, its units (lines and table rows) and its heading's place."""
    t0 = time.perf_counter()
    c0 = time.process_time()
    dirs = job["template_dirs"]
    geometry = page_box(dirs)
    items = job["items"]
    blocks: list[str] = []
    fragments: dict[str, tuple[str, str]] = {}
    for n, it in enumerate(items):
        title_html = render_inline(it["title"]) if it["title"] else ""
        if it["kind"] == "page":
            blocks.append(f'<div id="hb-g{n}"><h2 class="part" id="{it["id"]}">{title_html}</h2></div>')
        elif it["kind"] == "head":
            blocks.append(f'<div class="hb-galley" id="hb-g{n}"><div class="running-head">{title_html}</div></div>')
        else:
            body_html = render_markdown(it["body"])
            lvl = it["level"]
            heading = (f'<h{lvl} class="{KIND[lvl]}" id="{it["id"]}">{title_html}</h{lvl}>\n'
                       if it["heading"] else "")
            blocks.append(f'<div class="hb-galley" id="hb-g{n}">{heading}{body_html}</div>')
            if it["heading"] and job.get("want_fragments"):
                fragments[it["id"]] = (title_html, body_html)
    css = Markup(read_css(dirs) + "\n" + galley_css(geometry))
    html = document_html(dirs, mode="pdf", front=False, title_html=Markup(job["title_html"]),
                         title_text=job["title_text"], toc=[], preface_html=Markup(""), nodes=[], css=css)
    body = "\n".join(blocks) + "\n"
    html = html.replace("</body>", body + "</body>", 1) if "</body>" in html else html + body  # a template may omit it
    t_html = time.perf_counter()
    fetcher = AssetFetcher(dirs)
    doc = HTML(string=html, base_url=ASSET_BASE, url_fetcher=fetcher).render(**RENDER)
    del html
    t_layout = time.perf_counter()
    anchors = anchor_boxes(doc)
    starts = [anchors[f"hb-g{n}"][0] for n in range(len(items))]
    ends = [*starts[1:], len(doc.pages)]
    out_items: dict[str, dict[str, Any]] = {}
    for n, it in enumerate(items):
        own = list(range(starts[n], max(ends[n], starts[n] + 1)))
        units = [(g, top, bottom, flags) for g in own
                 for top, bottom, flags in galley_units(doc.pages[g], geometry["content_h"])]
        box = anchors[f"hb-g{n}"]
        lead = units[0][1] - box[2] if units else 0.0
        trail = box[4] - units[-1][2] if units and len(own) == 1 else 0.0
        out_items[it["key"]] = {
            "out": job["out"], "pages": own, "units": units, "lead": max(0.0, lead), "trail": max(0.0, trail),
            "anchors": {it["id"]: anchors[it["id"]]} if it["heading"] and it["id"] in anchors else {},
            "fragments": {it["id"]: fragments[it["id"]]} if it["id"] in fragments else {},
        }
    contents: list[bytes] = []
    doc.write_pdf(job["out"], finisher=lambda _doc, pdf: contents.extend(page_contents(pdf)))
    for lay in out_items.values():  # where each galley page shows text (the composer drops what a page clips off)
        lay["runs"] = {g: _flat(text_runs(contents[g])) for g in lay["pages"]}
    return _report(job, "galley", fetcher, (t0, t_html, t_layout, c0), pages=len(doc.pages),
                   size_px=(geometry["width"], geometry["height"]), geometry=geometry, items=out_items)


def _send(out: IO[bytes], msg: tuple[str, int, Any]) -> None:
    data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    out.write(frame(data))
    out.flush()


def main() -> None:
    """Serve jobs from stdin (8-byte length + pickle) until EOF; answer each on stdout the same way:
    ("done", index, result) or ("error", index, text)."""
    # The cyclic collector only costs time during a layout (WeasyPrint makes few reference cycles; measured
    # ~13% less CPU at the same peak memory); one collection between jobs keeps a long-lived worker tidy.
    gc.disable()
    # Ctrl-C in the terminal reaches the whole process group: the parent decides (it closes our stdin, or kills us)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    nice = int(os.environ.get(NICE_ENV, "0") or 0)
    if nice > 0 and hasattr(os, "nice"):  # typesetting while the job writes: the client's core comes first
        os.nice(nice)
    cap_pdf_compression(ZLIB_LEVEL)
    logging.getLogger("weasyprint").setLevel(logging.ERROR)
    logging.getLogger("fontTools").setLevel(logging.ERROR)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing may print into the message stream
    while (body := read_frame(stdin)) is not None:
        job = pickle.loads(body)
        try:
            result = layout_galley(job) if job["kind"] == "galley" else layout_chunk(job)
            _send(stdout, ("done", job["index"], result))
        except Exception as e:
            _send(stdout, ("error", job["index"], f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        del job
        gc.collect()


if __name__ == "__main__":
    main()
