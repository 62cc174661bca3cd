"""The parallel PDF path: chunks laid out in worker processes, then one merge with global page numbers.

Why this shape (measured on the 2-core machine, see benchmarks/typeset.py): one WeasyPrint pass over a 1,500-page
book costs ~100 s and >2 GB; the cost is CPU-bound Python, so the way to 30 s is to lay out independent pieces on
every core. A part's page count does not depend on the number of its first page, so

1. each part (a chunk) and the front matter (title page and contents) are laid out as separate documents by
   long-lived worker processes (typeset/worker.py), biggest first, one per core;
2. each worker reports where every heading landed (page and position) and writes its chunk's PDF;
3. the parent reads each chunk's PDF as soon as it is written (overlapping the layout of the others), then
   prints the global page number in every footer and beside every contents entry, links each contents entry to
   its heading, adds bookmarks, and writes the book (typeset/merge.py).

So neither the contents nor the footers need a second layout pass, and no worker ever holds more than a part.
"""

from __future__ import annotations

import hashlib
import pickle
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .html import Node, plain_text, render_inline, render_markdown, toc_entries
from .merge import Merger
from .pool import WORKER_COMMAND, TypesetError, _Pool, default_workers, worker_env

__all__ = [
    "MAX_CHUNK_CHARS", "WORKER_COMMAND", "PdfRun", "Prepared", "TypesetError", "default_workers", "job_key",
    "plan_chunks", "render_pdf", "worker_env",
]

MAX_CHUNK_CHARS = 600_000  # a part above this (the reference book's are ~400k) is cut between chapters


@dataclass(frozen=True)
class PdfRun:
    pages: int
    chunks: int
    seconds: float
    worker_peak_rss_mb: list[float]
    chunk_seconds: list[dict[str, float]]
    fragments: dict[str, tuple[str, str]]
    refused: list[str]
    t_written: float = 0.0  # time.monotonic() when book.pdf was on disk
    # each chunk's layout: (sent, done) in time.monotonic(), its worker's CPU seconds, and whether it was laid out
    # while the book was still being written (typeset/background.py)
    layout: list[tuple[float, float, float, bool]] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------------------------
# Planning


def plan_chunks(root: Node, max_chunk_chars: int) -> list[list[Node]]:
    """Group the book's top-level nodes into chunks, each laid out as its own document (so each starts a page).

    A part is a chunk. A part bigger than ``max_chunk_chars`` is cut between chapters into runs of about equal
    size (each run then starts on a new page; the part heading leads the first); chapters or sections outside
    any part are grouped the same way.
    """

    def split(nodes: list[Node]) -> list[list[Node]]:
        total = sum(n.size() for n in nodes)
        target = total / max(1, -(-total // max_chunk_chars))
        runs: list[list[Node]] = [[]]
        acc = 0
        for n in nodes:
            if runs[-1] and acc + n.size() / 2 > target * len(runs):
                runs.append([])
            runs[-1].append(n)
            acc += n.size()
        return runs

    chunks: list[list[Node]] = []
    loose: list[Node] = []
    for n in root.children:
        if n.level != 2:
            loose.append(n)
            continue
        if loose:
            chunks += split(loose)
            loose = []
        if n.size() <= max_chunk_chars or len(n.children) < 2:
            chunks.append([n])
        else:
            runs = split(n.children)
            runs[0].insert(0, Node(n.level, n.title, n.id, n.body, []))
            chunks += runs
    if loose:
        chunks += split(loose)
    return chunks


def _jobs(root: Node, chunks: list[list[Node]], template_dirs: list[str], tmp: Path,
          want_fragments: bool) -> list[dict[str, Any]]:
    """The front matter (index 0) and one job per chunk (from 1), each with its cost estimate."""
    title_html = render_inline(root.title)
    common = {"template_dirs": template_dirs, "title_html": title_html, "title_text": plain_text(title_html)}
    toc = [{"kind": n.kind, "id": n.id, "title_html": render_inline(n.title)} for n in toc_entries(root)]
    front = {
        **common, "kind": "front", "index": 0, "toc": toc, "preface_html": render_markdown(root.body),
        "out": str(tmp / "front.pdf"), "cost": sum(len(e["title_html"]) for e in toc) * 2 + len(root.body),
    }
    bodies = [
        {
            **common, "kind": "body", "index": i, "nodes": [n.to_dict() for n in nodes],
            "out": str(tmp / f"chunk{i:03d}.pdf"), "want_fragments": want_fragments,
            "cost": sum(n.size() for n in nodes),
        }
        for i, nodes in enumerate(chunks, start=1)
    ]
    return [front, *bodies]


# ---------------------------------------------------------------------------------------------------------------
# The run


def job_key(job: dict[str, Any]) -> bytes:
    """What a chunk's layout depends on: the job without its number, output path and cost estimate, and the
    template files as they are on disk now. Equal keys give the same pages, so a chunk laid out while the book was
    still being written (typeset/background.py) is taken only if the finished book asks for exactly this chunk."""
    same = {k: v for k, v in job.items() if k not in ("index", "out", "cost")}
    h = hashlib.blake2b(pickle.dumps(same, protocol=pickle.HIGHEST_PROTOCOL), digest_size=20)
    for d in job["template_dirs"]:
        for f in sorted(Path(d).glob("*")):
            if f.is_file():
                st = f.stat()
                h.update(f"{f}\0{st.st_mtime_ns}\0{st.st_size}\0".encode())
    return h.digest()


@dataclass
class Prepared:
    """What typesetting while writing (typeset/background.py) hands the final layout: its worker pool (render_pdf
    owns and closes it from then on), the chunks it laid out (by :func:`job_key`) and those still being laid out
    (background job index -> key)."""

    pool: _Pool
    done: dict[bytes, dict[str, Any]]
    running: dict[int, bytes]


def render_pdf(
    root: Node,
    out_pdf: Path,
    template_dirs: list[str],
    *,
    workers: int | None = None,
    want_fragments: bool = False,
    max_chunk_chars: int = MAX_CHUNK_CHARS,
    prepared: Prepared | None = None,
) -> PdfRun:
    """Lay out the book in ``workers`` processes and write ``out_pdf``. With ``want_fragments``, the HTML of every
    heading and body comes back too (book.html reuses it instead of rendering the Markdown again). With
    ``prepared``, a chunk already laid out (or being laid out) for exactly this content is taken, not redone."""
    t0 = time.perf_counter()
    workers = workers or default_workers()
    chunks = plan_chunks(root, max_chunk_chars)
    tmp = Path(tempfile.mkdtemp(prefix="handbook-typeset-"))
    jobs = _jobs(root, chunks, template_dirs, tmp, want_fragments)
    merger = Merger()
    results: dict[int, dict[str, Any]] = {}
    awaited: dict[int, list[int]] = {}  # a background job still running -> the chunks waiting for it
    if prepared is None:
        pending = jobs
        pool = _Pool(min(workers, len(pending)))
    else:
        pool, pending = prepared.pool, []
        running = {key: idx for idx, key in prepared.running.items()}
        for j in jobs:
            key = job_key(j)
            if key in prepared.done:
                results[j["index"]] = {**prepared.done[key], "index": j["index"], "prepared": True}
                merger.add(j["index"], results[j["index"]]["out"])
            elif key in running:
                awaited.setdefault(running[key], []).append(j["index"])
            else:
                pending.append(j)
        for w in pool.workers:  # a worker that died while writing, or lays out what nobody needs now: replaced
            if w.proc.poll() is not None or (w.job is not None and w.job not in awaited):
                pool.retire(w)
        short = min(workers, len(pending) + len(awaited)) - len(pool.current())
        if short > 0:
            pool.add(short)  # at full priority: the writing is over
    pending = sorted(pending, key=lambda j: j["cost"], reverse=True)  # biggest first
    by_index = {j["index"]: j for j in jobs}
    try:
        while pending or awaited or any(w.job in by_index for w in pool.workers):
            for w in pool.idle():
                if pending:
                    pool.send(w, pending.pop(0))
            if pending and not pool.current():
                raise TypesetError("every layout worker exited before the book was laid out")
            for kind, idx, payload in pool.messages():
                if idx in awaited:  # a chunk laid out while writing, for this very content
                    mine = awaited.pop(idx)
                    if kind == "error":  # it is laid out again here, and a second failure is the book's
                        pending += [by_index[i] for i in mine]
                        continue
                    for i in mine:
                        results[i] = {**payload, "index": i, "prepared": True}
                        merger.add(i, payload["out"])
                    continue
                if idx not in by_index:  # laid out while writing for content that changed since: not used
                    continue
                if kind == "error":
                    raise TypesetError(f"typesetting chunk {idx} failed: {payload.strip().splitlines()[0]}")
                if kind == "done":
                    results[idx] = payload
                    for w in pool.idle():  # keep the workers busy first, then read the finished chunk
                        if pending:
                            pool.send(w, pending.pop(0))
                    merger.add(idx, payload["out"])
        bodies = [results[j["index"]] for j in jobs[1:]]
        # WeasyPrint has been seen to stop silently mid-flow on very long documents: every heading must have landed.
        placed = set().union(*(b["anchors"] for b in bodies))
        missing = [n.id for n in root.walk() if n.level > 1 and n.id not in placed]
        if missing:
            raise TypesetError(f"{len(missing)} headings are missing from the laid-out PDF (first: {missing[0]})")
        reported = sum(r["pages"] for r in results.values())
        if merger.pages != reported:
            raise TypesetError(f"the merged PDF has {merger.pages} pages where the chunks had {reported}")
        pages = merger.finish(results[0], bodies, out_pdf, root, plain_text(render_inline(root.title)))
        t_written = time.monotonic()
    finally:
        pool.close(kill=True)  # only a worker still busy (a chunk nobody needs, or a failure) is killed
        shutil.rmtree(tmp, ignore_errors=True)
    fragments: dict[str, tuple[str, str]] = {}
    for b in results.values():
        fragments.update(b.get("fragments") or {})
    return PdfRun(
        pages=pages,
        chunks=len(chunks),
        seconds=time.perf_counter() - t0,
        worker_peak_rss_mb=list(pool.peak_rss.values()),
        chunk_seconds=[{"index": r["index"], "pages": r["pages"], **r["seconds"]} for r in results.values()],
        layout=[(r.get("t_sent", 0.0), r.get("t_done", 0.0), r["seconds"]["cpu"], bool(r.get("prepared")))
                for r in results.values()],
        fragments=fragments,
        refused=[u for r in results.values() for u in r["refused"]],
        t_written=t_written,
    )
