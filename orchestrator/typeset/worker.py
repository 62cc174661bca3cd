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
from pathlib import Path
from typing import IO, Any
from urllib.parse import unquote

from markupsafe import Markup
from weasyprint import HTML
from weasyprint.urls import URLFetcher, URLFetcherResponse

from .compat import anchor_boxes, cap_pdf_compression, toc_lines
from .html import Node, document_html, render_nodes
from .ipc import NICE_ENV, frame, read_frame

# pydyf (WeasyPrint's PDF writer) deflates every stream at zlib level 9. Measured on a 171-page part's content
# streams: level 9 takes 0.46 s of CPU, level 6 (zlib's default) 0.07 s for 14% more bytes. Level 6 it is.
ZLIB_LEVEL = 6

# Relative URLs in a template resolve against this; the fetcher maps it onto the template directories and
# refuses everything else (file:, http(s) anywhere, data:, 127.0.0.1 ...). ".invalid" never resolves.
ASSET_BASE = "https://handbook.invalid/assets/"


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
    doc = HTML(string=html, base_url=ASSET_BASE, url_fetcher=fetcher).render()
    del html
    t_layout = time.perf_counter()
    pages = len(doc.pages)
    anchors = anchor_boxes(doc)
    size = (doc.pages[0].width, doc.pages[0].height) if pages else (0.0, 0.0)
    lines = toc_lines(doc) if job["kind"] == "front" else {}
    doc.write_pdf(job["out"])
    t_end = time.perf_counter()
    return {
        "index": job["index"],
        "kind": job["kind"],
        "out": job["out"],
        "pages": pages,
        "size_px": size,
        "anchors": anchors,
        "toc_lines": lines,
        "fragments": fragments,
        "refused": fetcher.refused,
        "seconds": {"html": t_html - t0, "layout": t_layout - t_html, "pdf": t_end - t_layout,
                    "total": t_end - t0, "cpu": time.process_time() - c0},
        "peak_rss_mb": _peak_rss_mb(),
        "pid": os.getpid(),
    }


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
            result = layout_chunk(job)
            _send(stdout, ("done", job["index"], result))
        except Exception as e:
            _send(stdout, ("error", job["index"], f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        del job
        gc.collect()


if __name__ == "__main__":
    main()
