"""Typesetting while the book is still being written: each part is laid out as soon as its last section is in.

The reader waits for the PDF, not for book.md. A part's layout depends on nothing outside it (parts start on a page
of their own; page numbers, the contents and the bookmarks are stamped by the merge: typeset/merge.py), so a
finished part can be laid out while the fleet writes the others, by the same workers and the same chunk jobs the
final layout uses (typeset/pdf.py), at a lower priority than the client (``nice``). The contents (the front
matter) needs only the outline, so it goes first.

Nothing here decides what the PDF holds. At the end :func:`orchestrator.typeset.pdf.render_pdf` plans the chunks
from the finished book.md as it always does, and takes a chunk from here only when its job is exactly the one it
would send (:func:`~orchestrator.typeset.pdf.job_key`); any other chunk (a section that changed after its part was
laid out, a layout that failed) is laid out then. So the PDF is the one a layout after the job would make.

The work runs on one thread of its own (the feeder) that owns the pool until :meth:`BackgroundTypesetter.handover`;
the event loop only puts messages on its queue.

    bg = BackgroundTypesetter(template_dirs, workers=2, want_fragments=False)
    bus.consumers.append(bg)              # OutlineReady: the front matter, and any part already whole
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

from ..assemble import part_markdown
from ..events import OutlineReady
from ..resources import template_dirs
from .html import parse_book
from .pdf import MAX_CHUNK_CHARS, Prepared, _jobs, job_key, plan_chunks
from .pool import _Pool, default_workers

if TYPE_CHECKING:
    from ..assemble import SectionText
    from ..config import Settings
    from ..events import Event
    from ..outline import Outline

__all__ = ["BACKGROUND_NICE", "MAX_WORKERS", "BackgroundTypesetter", "for_job", "layout_split"]

log = logging.getLogger("handbook")

BACKGROUND_NICE = 10  # the client's event loop must never wait for a layout
MAX_WORKERS = 8  # beside the job's streams (osutil.FD_RESERVE holds their pipes); the final layout adds more
_FIRST_INDEX = 1_000_000  # background jobs are numbered apart from the final layout's (0 .. chunks)


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
    """Lays out the front matter and every finished part while the job writes; see the module docstring."""

    def __init__(self, template_dirs: list[str], *, workers: int, want_fragments: bool,
                 nice: int = BACKGROUND_NICE, max_chunk_chars: int = MAX_CHUNK_CHARS):
        self.template_dirs = template_dirs
        self.workers = workers
        self.want_fragments = want_fragments
        self.nice = nice
        self.max_chunk_chars = max_chunk_chars
        self.events: queue.Queue[tuple[int, Any]] = queue.Queue()
        self.tmp = Path(tempfile.mkdtemp(prefix="handbook-background-"))
        self.pool: _Pool | None = None
        self.outline: Outline | None = None
        self.sections: dict[str, SectionText] = {}
        self.landed: dict[int, int] = {}  # part -> sections of it in
        self.pending: list[dict[str, Any]] = []
        self.queued: set[bytes] = set()  # keys pending, running or done
        self.running: dict[int, bytes] = {}
        self.done: dict[bytes, dict[str, Any]] = {}
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
        """Stop laying out new chunks; the pool, the chunks done and those still running go to the final layout
        (which closes the pool). None when nothing was ever started."""
        self._stop()
        if self.pool is None:
            return None
        return Prepared(self.pool, dict(self.done), dict(self.running))

    def close(self) -> None:
        """Stop the workers (the final layout has closed them already when it ran) and remove the chunks' files.
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
            self.outline = payload
            if self.pool is None:  # no more workers than chunks to lay out (the front matter and the parts)
                self.pool = _Pool(min(self.workers, len(payload.parts) + 1), nice=self.nice, events=self.events)
            self._front()
            for pi in range(1, len(payload.parts) + 1):
                self._maybe_part(pi)
        elif kind == "section":
            s: SectionText = payload
            pi = int(s.path.split(".", 1)[0])
            if s.path not in self.sections:
                self.landed[pi] = self.landed.get(pi, 0) + 1
            self.sections[s.path] = s  # a section landing again (a later rewrite) makes its part's key new
            if self.outline is not None:
                self._maybe_part(pi)

    def _front(self) -> None:
        """The title page and contents: titles only, so the outline is enough."""
        assert self.outline is not None
        from ..assemble import assemble

        root = parse_book(assemble(self.outline, {}).markdown)
        self._queue(_jobs(root, [], self.template_dirs, self.tmp, self.want_fragments)[:1])

    def _maybe_part(self, pi: int) -> None:
        assert self.outline is not None
        if pi < 1 or pi > len(self.outline.parts):
            return
        part = self.outline.parts[pi - 1]
        if self.landed.get(pi, 0) < sum(len(c.sections) for c in part.chapters):
            return
        root = parse_book(part_markdown(self.outline, pi, self.sections), parts_before=pi - 1)
        chunks = plan_chunks(root, self.max_chunk_chars)
        self._queue(_jobs(root, chunks, self.template_dirs, self.tmp, self.want_fragments)[1:])

    def _queue(self, jobs: list[dict[str, Any]]) -> None:
        for job in jobs:
            key = job_key(job)
            if key in self.queued:
                continue
            self.queued.add(key)
            job = {**job, "index": self._next, "out": str(self.tmp / f"bg{self._next}.pdf"), "key": key}
            self._next += 1
            self.pending.append(job)
        self.pending.sort(key=lambda j: (j["kind"] != "front", -j["cost"]))

    def _dispatch(self) -> None:
        if self.pool is None:
            return
        for w in self.pool.idle():
            if not self.pending:
                break
            job = self.pending.pop(0)
            self.running[job["index"]] = job.pop("key")
            self.pool.send(w, job)

    def _finished(self, kind: str, idx: int, result: Any) -> None:
        key = self.running.pop(idx, None)
        if key is None:
            return
        if kind == "done":
            self.done[key] = result
        else:  # laid out again at the end; a second failure is reported there
            self.queued.discard(key)
            self.failed += 1
            log.debug("a chunk laid out while writing failed: %s", str(result).strip().splitlines()[:1])


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
