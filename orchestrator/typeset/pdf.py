"""The PDF: the front matter and the body's galleys laid out in worker processes, the body paginated and composed
here, then one merge with global page numbers.

Why this shape (measured on the 2-core machine, see benchmarks/typeset.py and benchmarks/pdf_ready.py): one
WeasyPrint pass over a 1,500-page book costs ~100 s and >2 GB; the cost is CPU-bound Python, so the way to speed
is to lay out independent pieces on every core, and while the book is still being written. So

1. the front matter (title page and contents) is one document, laid out on the book's pages;
2. the body is cut into items (typeset/galley.py: a section, a chapter's heading, a part's title page, a running
   head), each laid out on a galley of its own, in batches, by long-lived worker processes (typeset/worker.py);
   an item already laid out for exactly this content (typesetting while writing, typeset/background.py) is taken;
3. the parent cuts the running text into pages (galley.paginate), draws them from the galleys
   (typeset/compose.py), prints the global page number in every footer and beside every contents entry, links
   each contents entry to its heading, adds bookmarks, and writes the book (typeset/merge.py).

So neither the contents nor the footers need a second layout pass, and no worker ever holds more than a batch.
"""

from __future__ import annotations

import hashlib
import logging
import pickle
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pypdf import PdfWriter

from .compose import Composer
from .galley import Item, batches, book_items, paginate, templates_digest
from .html import Node, plain_text, render_inline, render_markdown, toc_entries
from .merge import Merger
from .pool import WORKER_COMMAND, Pool, TypesetError, default_workers, worker_env

log = logging.getLogger("handbook")

__all__ = [
    "WORKER_COMMAND", "PdfRun", "Prepared", "TypesetError", "default_workers", "front_job", "item_layouts", "job_key",
    "render_pdf", "worker_env",
]


@dataclass(frozen=True)
class PdfRun:
    pages: int
    chunks: int  # layout documents the PDF's pages come from (the front matter's and the galley batches)
    seconds: float
    worker_peak_rss_mb: list[float]
    chunk_seconds: list[dict[str, float]]
    fragments: dict[str, tuple[str, str]]
    refused: list[str]
    t_written: float = 0.0  # time.monotonic() when book.pdf was on disk
    # each layout document's: (sent, done) in time.monotonic(), its worker's CPU seconds, and whether it was laid
    # out while the book was still being written (typeset/background.py)
    layout: list[tuple[float, float, float, bool]] = field(default_factory=list)


def front_job(root: Node, template_dirs: list[str], out: Path) -> dict[str, Any]:
    """The title page and the contents: one document on the book's own pages (titles only: the outline is enough)."""
    title_html = render_inline(root.title)
    toc = [{"kind": n.kind, "id": n.id, "title_html": render_inline(n.title)} for n in toc_entries(root)]
    return {
        "template_dirs": template_dirs, "title_html": title_html, "title_text": plain_text(title_html),
        "kind": "front", "index": 0, "toc": toc, "preface_html": render_markdown(root.body), "out": str(out),
        "cost": sum(len(e["title_html"]) for e in toc) * 2 + len(root.body),
    }


def galley_job(root_title_html: str, template_dirs: list[str], items: list[Item], index: int, out: Path,
               want_fragments: bool) -> dict[str, Any]:
    return {
        "template_dirs": template_dirs, "title_html": root_title_html, "title_text": plain_text(root_title_html),
        "kind": "galley", "index": index, "items": [it.job() for it in items], "out": str(out),
        "want_fragments": want_fragments, "cost": sum(it.cost for it in items),
    }


# ---------------------------------------------------------------------------------------------------------------
# The run


def job_key(job: dict[str, Any]) -> bytes:
    """What a chunk's layout depends on: the job without its number, output path and cost estimate, and the
    template files as they are on disk now. Equal keys give the same pages, so a chunk laid out while the book was
    still being written (typeset/background.py) is taken only if the finished book asks for exactly this chunk."""
    same = {k: v for k, v in job.items() if k not in ("index", "out", "cost")}
    h = hashlib.blake2b(pickle.dumps(same, protocol=pickle.HIGHEST_PROTOCOL), digest_size=20)
    h.update(templates_digest(job["template_dirs"]))
    return h.digest()


def item_layouts(idx: int, result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A galley document's report as each of its items' layout (item key -> layout): the item's own figures, the
    document's number, the page geometry and the URLs its layout refused."""
    return {key: {**layout, "job": idx, "geometry": result["geometry"], "refused": result["refused"]}
            for key, layout in result["items"].items()}


@dataclass
class Prepared:
    """What typesetting while writing (typeset/background.py) hands the final layout: its worker pool (render_pdf
    owns and closes it from then on), what it laid out (item key, or the front matter's :func:`job_key`, -> its
    layout), the documents still being laid out (background job index -> the keys in it), each finished
    document's (sent, done, cpu), and the composer that has read the galley documents done so far."""

    pool: Pool
    done: dict[str, dict[str, Any]]
    running: dict[int, list[str]]
    documents: dict[int, tuple[float, float, float]] = field(default_factory=dict)
    composer: Composer | None = None  # the galley documents done, already read into its writer


def render_pdf(
    root: Node,
    out_pdf: Path,
    template_dirs: list[str],
    *,
    workers: int | None = None,
    want_fragments: bool = False,
    prepared: Prepared | None = None,
) -> PdfRun:
    """Lay out the book in ``workers`` processes and write ``out_pdf``. With ``want_fragments``, the HTML of every
    heading and body comes back too (book.html reuses it instead of rendering the Markdown again). With
    ``prepared``, an item (or the front matter) already laid out (or being laid out) for exactly this content is
    taken, not redone."""
    t0 = time.perf_counter()
    run = _Layout(root, template_dirs, workers or default_workers(), want_fragments, prepared)
    try:
        run.lay_out()
        pages_total = run.write(out_pdf)
        t_written = time.monotonic()
    finally:
        run.pool.close(kill=True)  # only a worker still busy (a document nobody needs, or a failure) is killed
        shutil.rmtree(run.tmp, ignore_errors=True)
    return run.result(pages_total, time.perf_counter() - t0, t_written)


class _Layout:
    """One :func:`render_pdf` run: the layout documents still to send, the layouts taken so far, and the pool's
    messages handled as they arrive; then the body paginated, composed and merged into the book."""

    def __init__(self, root: Node, template_dirs: list[str], workers: int, want_fragments: bool,
                 prepared: Prepared | None) -> None:
        self.root, self.template_dirs, self.workers = root, template_dirs, workers
        self.want_fragments = want_fragments
        self.items = book_items(root, templates_digest(template_dirs))
        self.tmp = Path(tempfile.mkdtemp(prefix="handbook-typeset-"))
        self.title_html = render_inline(root.title)
        self.front = front_job(root, template_dirs, self.tmp / "front.pdf")
        self.front_key = job_key(self.front).hex()
        self.composer = prepared.composer if prepared is not None and prepared.composer is not None else \
            Composer(PdfWriter(), {})
        self.merger = Merger(self.composer.writer)
        self.lay: dict[str, dict[str, Any]] = {}  # item key (or front_key) -> its layout
        self.docs: dict[int, tuple[float, float, float, bool]] = {}  # layout document -> sent, done, cpu, prepared
        self.awaited: dict[int, list[str]] = {}  # a background document still being laid out -> the keys we need
        self.wanted = {it.key for it in self.items} | {self.front_key}
        self.jobs: dict[int, dict[str, Any]] = {}
        if prepared is None:
            self.pool = Pool(min(workers, 1 + len(self.items)))
        else:
            self.pool = prepared.pool
            self._adopt(prepared)
        covered = set(self.lay) | {k for keys in self.awaited.values() for k in keys}
        self.pending: list[dict[str, Any]] = [] if self.front_key in covered else [self.front]
        todo = list({it.key: it for it in self.items if it.key not in covered}.values())
        for n, batch in enumerate(batches(todo, workers), start=1):
            self.pending.append(self._galley(batch, n))
        self.jobs.update({j["index"]: j for j in self.pending})
        if prepared is not None:
            self._staff()
        self.next_index = len(self.pending) + 1

    # -- the layout documents

    def _galley(self, batch: list[Item], index: int) -> dict[str, Any]:
        return galley_job(self.title_html, self.template_dirs, batch, index, self.tmp / f"galley{index:04d}.pdf",
                          self.want_fragments)

    def take(self, key: str, layout: dict[str, Any]) -> None:
        self.lay[key] = layout
        if key == self.front_key:
            self.merger.add(0, layout["out"])
        else:
            self.composer.read(layout["out"], layout["pages"])  # while the workers lay out the rest

    def _adopt(self, prepared: Prepared) -> None:
        """Take what typesetting while writing laid out for exactly this content, and await what it still lays
        out that we need."""
        for key in self.wanted:
            if key in prepared.done:
                self.take(key, prepared.done[key])
        for idx, keys in prepared.running.items():
            ours = [k for k in keys if k in self.wanted and k not in self.lay]
            if ours:
                self.awaited[idx] = ours
        for idx, (sent, done, cpu) in prepared.documents.items():
            self.docs[idx] = (sent, done, cpu, True)

    def _staff(self) -> None:
        """The background's pool, made this run's: a worker that died while writing, or lays out what nobody
        needs now, is replaced; workers are added (at full priority: the writing is over) up to what is left."""
        for w in self.pool.workers:
            if w.proc.poll() is not None or (w.job is not None and w.job not in self.awaited):
                self.pool.retire(w)
        short = min(self.workers, len(self.pending) + len(self.awaited)) - len(self.pool.current())
        if short > 0:
            self.pool.add(short)

    def requeue(self, keys: list[str]) -> None:
        """Lay out again here what a background document failed to (a second failure is the book's)."""
        by_key = {it.key: it for it in self.items}
        if self.front_key in keys:
            self.pending.append(self.front)
            self.jobs[0] = self.front
        rest = [by_key[k] for k in keys if k in by_key]
        if rest:
            j = self._galley(rest, self.next_index)
            self.pending.append(j)
            self.jobs[self.next_index] = j
            self.next_index += 1

    # -- the message loop

    def _feed(self) -> None:
        for w in self.pool.idle():
            if self.pending:
                self.pool.send(w, self.pending.pop(0))

    def lay_out(self) -> None:
        """Send the documents and take their layouts until every piece of the book is laid out."""
        while self.pending or self.awaited or any(w.job in self.jobs for w in self.pool.workers):
            self._feed()
            if self.pending and not self.pool.current():
                raise TypesetError("every layout worker exited before the book was laid out")
            for kind, idx, payload in self.pool.messages():
                self.on_message(kind, idx, payload)
        missing_items = [it for it in self.items if it.key not in self.lay]
        if missing_items or self.front_key not in self.lay:
            raise TypesetError(f"{len(missing_items)} pieces of the book were never laid out")

    def on_message(self, kind: str, idx: int, payload: Any) -> None:
        mine: list[str] | None = self.awaited.pop(idx) if idx in self.awaited else None
        if mine is None and idx not in self.jobs:  # laid out while writing for content that changed since
            return
        if kind == "error":
            if mine is not None:  # laid out again here, and a second failure is the book's
                self.requeue(mine)
                return
            raise TypesetError(f"typesetting {'the front matter' if idx == 0 else f'batch {idx}'} failed: "
                               f"{payload.strip().splitlines()[0]}")
        if kind != "done":
            return
        self.docs[idx] = (payload.get("t_sent", 0.0), payload.get("t_done", 0.0), payload["seconds"]["cpu"],
                          mine is not None)
        self._feed()  # keep the workers busy first, then read the finished document
        if payload["kind"] == "front":
            self.take(self.front_key, {**payload, "job": idx})
        else:
            for key, layout in item_layouts(idx, payload).items():
                if key in self.wanted:
                    self.take(key, layout)

    # -- the book

    def _geometry(self) -> dict[str, Any]:
        lay = self.lay
        geometry = next((lay[it.key]["geometry"] for it in self.items), lay[self.front_key].get("geometry"))
        if geometry is None:  # a book with no body: the front matter's pages are the book's
            geometry = {"width": lay[self.front_key]["size_px"][0], "height": lay[self.front_key]["size_px"][1],
                        "content_x": 0.0, "content_y": 0.0, "content_w": 0.0, "content_h": 0.0}
        return geometry

    def write(self, out_pdf: Path) -> int:
        """Paginate the body, compose its pages, merge them after the front matter into ``out_pdf``; its pages."""
        lay, composer = self.lay, self.composer
        geometry = self._geometry()
        composer.g = geometry
        composer.runs = {(lay[it.key]["out"], g): r
                         for it in self.items for g, r in lay[it.key].get("runs", {}).items()}
        seq = [(it, lay[it.key]) for it in self.items]
        pages, where = paginate(seq, geometry["content_h"], (geometry["content_x"], geometry["content_y"]))
        _warn_tall(seq, geometry["content_h"])
        # WeasyPrint has been seen to stop silently mid-flow on very long documents: every heading must have landed.
        missing = [n.id for n in self.root.walk() if n.level > 1 and n.id not in where]
        if missing:
            raise TypesetError(f"{len(missing)} headings are missing from the laid-out PDF (first: {missing[0]})")
        heads = _heads(seq)
        front_pages = self.merger.pages
        dest = composer.add_pages(pages, heads, where, front_pages)
        pages_total = self.merger.finish(lay[self.front_key], dest, out_pdf, self.root, plain_text(self.title_html))
        if pages_total != front_pages + len(pages):
            raise TypesetError(f"the merged PDF has {pages_total} pages where the layout made "
                               f"{front_pages + len(pages)}")
        return pages_total

    def result(self, pages_total: int, seconds: float, t_written: float) -> PdfRun:
        lay, docs = self.lay, self.docs
        used = {lay[self.front_key]["job"]} | {lay[it.key]["job"] for it in self.items}
        fragments: dict[str, tuple[str, str]] = {}
        for it in self.items:
            fragments.update(lay[it.key].get("fragments") or {})
        return PdfRun(
            pages=pages_total,
            chunks=len(used),
            seconds=seconds,
            worker_peak_rss_mb=list(self.pool.peak_rss.values()),
            chunk_seconds=[{"index": i, "cpu": docs[i][2]} for i in sorted(used) if i in docs],
            layout=[docs[i] for i in sorted(used) if i in docs],
            fragments=fragments,
            refused=list(dict.fromkeys(u for layout in lay.values() for u in layout.get("refused", ()))),
            t_written=t_written,
        )


def _warn_tall(seq: list[tuple[Item, dict[str, Any]]], content_h: float) -> None:
    tall = [it.id or it.kind for it, layout in seq if it.kind == "flow"
            and any(u[2] - u[1] > content_h + 0.5 for u in layout["units"])]
    if tall:  # a single line (not a table row: those are cut between their cells' lines) taller than a page
        log.warning("%d pieces of the book hold a line taller than a page, cut off at the page's edge (first: "
                    "%s)", len(tall), tall[0])


def _heads(seq: list[tuple[Item, dict[str, Any]]]) -> dict[str, tuple[str, int, float, float]]:
    """Each chapter's running head (its "head" item) as a galley slice, by the chapter's id: (pdf, galley page of
    its first line, its first line's top, its last line's bottom)."""
    heads = {}
    for it, layout in seq:
        if it.kind == "head" and layout["units"]:
            u0, u1 = layout["units"][0], layout["units"][-1]
            heads[it.id] = (layout["out"], u0[0], u0[1], u1[2])
    return heads
