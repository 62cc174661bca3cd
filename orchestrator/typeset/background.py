"""Typesetting while the book is still being written: each section is laid out as soon as it is in.

The reader waits for the PDF, not for book.md. The body is laid out in galleys (typeset/galley.py): a section's
lines depend only on its own text, never on where its pages break, so each section can be laid out the moment it
lands, while the fleet writes the others, by the same workers and the same galley jobs the final layout uses
(typeset/pdf.py), at a lower priority than the client (``nice``). The front matter, the parts' title pages, the
chapters' headings and their running heads need only the outline, so they go first.

Nothing here decides what the PDF holds. At the end :func:`orchestrator.typeset.pdf.render_pdf` cuts the finished
book.md into items as it always does, and takes an item from here only when its key (its content and the templates
on disk) is one it needs; any other item (a section that changed after it was laid out, a layout that failed) is
laid out then. The pages are cut from the items' lines afterwards, so the PDF is the one a layout after the job
would make.

The work runs on one thread of its own (the feeder) that owns the pool until :meth:`BackgroundTypesetter.handover`;
the event loop only puts messages on its queue.

    bg = BackgroundTypesetter(template_dirs, workers=2, want_fragments=False)
    bus.consumers.append(bg)              # OutlineReady: the front matter, the parts and the chapters
    writer.on_section = bg.section_landed   # every section stored (written, failed or resumed)
    ...
    render_pdf(root, out, dirs, prepared=bg.handover())
    bg.close()
"""

from __future__ import annotations

import logging
import queue
import shutil
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pypdf import PdfWriter

from ..book.assemble import section_markdown
from ..core.events import OutlineReady
from ..core.resources import template_dirs
from .compose import Composer
from .galley import Item, item_for_node, templates_digest
from .html import parse_book, render_inline
from .pdf import Prepared, front_job, galley_job, item_layouts, job_key
from .pool import Pool, default_workers

if TYPE_CHECKING:
    from ..book.assemble import SectionText
    from ..core.config import Settings
    from ..core.events import Event
    from ..core.outline import Outline

__all__ = ["BACKGROUND_BATCH", "BACKGROUND_NICE", "MAX_WORKERS", "BackgroundTypesetter", "for_job", "layout_split"]

log = logging.getLogger("handbook")

BACKGROUND_NICE = 10  # the client's event loop must never wait for a layout
MAX_WORKERS = 8  # beside the job's streams (osutil.FD_RESERVE holds their pipes); the final layout adds more
_FIRST_INDEX = 1_000_000  # background jobs are numbered apart from the final layout's (0 .. batches)
# Items per layout document while writing: a batch is sent once this many are waiting (what is still waiting when
# the last section lands goes to the final layout). Each document costs ~50 ms of fixed layout work and its own font
# subsets in the PDF, and the final layout reads each one, so fewer is better; the final layout also waits for a
# document still running when the last section lands, so smaller is better: 24 items are ~0.6 s of one core.
BACKGROUND_BATCH = 24


def for_job(settings: Settings) -> BackgroundTypesetter | None:
    """A typesetter for a job that makes a PDF, has not turned this off (--typeset-after-writing), and runs on a
    machine with a core to spare; else None (the whole PDF is laid out after the last section)."""
    import importlib.util

    if not settings.typeset_while_writing or "pdf" not in settings.formats:
        return None
    if importlib.util.find_spec("weasyprint") is None:
        return None  # the final layout says so, once book.md is safe
    workers = default_workers()
    if workers < 2:
        return None
    return BackgroundTypesetter([str(d) for d in template_dirs(settings.templates)], workers=min(workers, MAX_WORKERS),
                                want_fragments="html" in settings.formats)


class BackgroundTypesetter:
    """Lays out the front matter and every item of the body as soon as it is known; see the module docstring."""

    def __init__(self, template_dirs: list[str], *, workers: int, want_fragments: bool,
                 nice: int = BACKGROUND_NICE, batch: int = BACKGROUND_BATCH):
        self.template_dirs = template_dirs
        self.workers = workers
        self.want_fragments = want_fragments
        self.nice = nice
        self.batch = batch
        self.events: queue.Queue[tuple[int, Any]] = queue.Queue()
        self.tmp = Path(tempfile.mkdtemp(prefix="handbook-background-"))
        self.pool: Pool | None = None
        self.outline: Outline | None = None
        self.digest = b""
        self.title_html = ""
        self.pending: list[Item] = []
        self.front: dict[str, Any] | None = None  # the front matter's job, until sent
        self.queued: set[str] = set()  # keys pending, running or done
        self.running: dict[int, list[str]] = {}
        self.done: dict[str, dict[str, Any]] = {}
        self.documents: dict[int, tuple[float, float, float]] = {}
        self.early: list[SectionText] = []  # sections in before the outline was known
        # Reads each galley document as it is laid out, into the writer the final layout will finish (the parent's
        # share of the work, done while the fleet writes: ~20 ms a document)
        self.composer = Composer(PdfWriter(), {})
        self.failed = 0
        self._next = _FIRST_INDEX
        self._thread = threading.Thread(target=self._feed, daemon=True, name="typeset-background")
        self._thread.start()

    # -- the event loop's side: only puts messages on the queue ------------------------------------------------

    def __call__(self, event: Event) -> None:
        """A bus consumer: the outline, once known."""
        if isinstance(event, OutlineReady):
            self.events.put((-1, ("outline", event.outline)))

    def section_landed(self, section: SectionText) -> None:
        self.events.put((-1, ("section", section)))

    def handover(self) -> Prepared | None:
        """Stop laying out; the pool, the items done and the documents still running go to the final layout
        (which closes the pool). None when nothing was ever started."""
        self._stop()
        if self.pool is None:
            return None
        return Prepared(self.pool, dict(self.done), {i: list(k) for i, k in self.running.items()},
                        dict(self.documents), self.composer)

    def close(self) -> None:
        """Stop the workers (the final layout has closed them already when it ran) and remove the galleys' files.
        Safe to call twice."""
        self._stop()
        if self.pool is not None:
            self.pool.close(kill=True)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _stop(self) -> None:
        if self._thread.is_alive():
            self.events.put((-1, ("stop", None)))
            self._thread.join()

    # -- the feeder thread -------------------------------------------------------------------------------------

    def _feed(self) -> None:
        try:
            while True:
                wid, msg = self.events.get()
                if wid < 0:
                    kind, payload = msg
                    if kind == "stop":
                        return
                    self._control(kind, payload)
                elif self.pool is not None:
                    for kind, idx, result in self.pool.handle(wid, msg):
                        self._finished(kind, idx, result)
                self._dispatch()
        except Exception as e:  # a bug here must cost only the head start, never the job: the final layout does all
            log.warning("typesetting while writing stopped (%s: %s); the PDF is laid out after the last section",
                        type(e).__name__, e)

    def _control(self, kind: str, payload: Any) -> None:
        if kind == "outline":
            self._outline(payload)
            for s in self.early:
                self._section(s)
            self.early = []
        elif kind == "section":
            if self.outline is None:
                self.early.append(payload)
            else:
                self._section(payload)

    def _outline(self, outline: Outline) -> None:
        """The title page and contents, the parts' title pages, the chapters' headings and running heads: the
        outline is all they need."""
        from ..book.assemble import assemble

        self.outline = outline
        if self.pool is None:
            self.pool = Pool(self.workers, nice=self.nice, events=self.events)
        self.digest = templates_digest(self.template_dirs)
        root = parse_book(assemble(outline, {}).markdown)
        self.title_html = render_inline(root.title)
        front = front_job(root, self.template_dirs, self.tmp / "front.pdf")
        key = job_key(front).hex()
        if key not in self.queued:
            self.queued.add(key)
            self.front = {**front, "key": key}
        self._queue([it for n in root.walk() if n.level in (2, 3) for it in item_for_node(n, self.digest)])

    def _section(self, s: SectionText) -> None:
        """A section's items, with the ids the whole book gives it (a rewrite makes its key new)."""
        assert self.outline is not None
        try:
            pi, ci, si = (int(x) for x in s.path.split("."))
            title = self.outline.parts[pi - 1].chapters[ci - 1].sections[si - 1]
        except (ValueError, IndexError):
            return
        root = parse_book(section_markdown(title, s), before=(pi, ci, si - 1))
        self._queue([it for n in root.walk() if n.level > 1 for it in item_for_node(n, self.digest)])

    def _queue(self, items: list[Item]) -> None:
        for it in items:
            if it.key not in self.queued:
                self.queued.add(it.key)
                self.pending.append(it)

    def _dispatch(self) -> None:
        if self.pool is None:
            return
        for w in self.pool.idle():
            idx = self._next
            if self.front is not None:
                job = self.front
                self.front = None
                keys = [job.pop("key")]
                job = {**job, "index": idx, "out": str(self.tmp / f"front{idx}.pdf")}
            elif len(self.pending) >= self.batch:  # fewer, fuller documents: what is left goes to the final layout
                batch, self.pending = self.pending[:self.batch], self.pending[self.batch:]
                keys = [it.key for it in batch]
                job = galley_job(self.title_html, self.template_dirs, batch, idx, self.tmp / f"bg{idx}.pdf",
                                 self.want_fragments)
            else:
                break
            self._next += 1
            self.running[idx] = keys
            self.pool.send(w, job)

    def _finished(self, kind: str, idx: int, result: Any) -> None:
        keys = self.running.pop(idx, None)
        if keys is None:
            return
        if kind != "done":  # laid out again at the end; a second failure is reported there
            self.queued.difference_update(keys)
            self.failed += 1
            log.debug("a layout while writing failed: %s", str(result).strip().splitlines()[:1])
            return
        self.documents[idx] = (result.get("t_sent", 0.0), result.get("t_done", 0.0), result["seconds"]["cpu"])
        if result["kind"] == "front":
            self.done[keys[0]] = {**result, "job": idx}
            return
        self.done.update(item_layouts(idx, result))
        self.composer.read(result["out"], range(result["pages"]))


def layout_split(layout: list[tuple[float, float, float, bool]], t_write_end: float | None,
                 ) -> dict[str, float | int]:
    """The layout CPU seconds of the chunks in the PDF, spent before and after the last section finished (a
    chunk's CPU is split in proportion to its wall time on either side; a background layout the PDF did not use
    is not counted), and how many chunks the final layout took from typesetting while writing."""
    during = after = 0.0
    for sent, done, cpu, _prepared in layout:
        if t_write_end is None or done <= sent:
            after += cpu
            continue
        share = min(1.0, max(0.0, (t_write_end - sent) / (done - sent)))
        during += cpu * share
        after += cpu * (1 - share)
    return {"during_write": round(during, 2), "after_write": round(after, 2),
            "chunks_from_background": sum(1 for *_, p in layout if p)}
