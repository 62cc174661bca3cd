"""The parallel PDF path: chunks laid out in worker processes, then one merge with global page numbers.

Why this shape (measured on the 2-core machine, see benchmarks/typeset.py): one WeasyPrint pass over a 1,500-page
book costs ~100 s and >2 GB; the cost is CPU-bound Python, so the way to 30 s is to lay out independent pieces on
every core. A part's page count does not depend on the number of its first page, so

1. each part (a chunk) and the front matter (title page and contents) are laid out as separate documents by
   long-lived worker processes, biggest first, one per core;
2. each worker reports where every heading landed (page and position) and writes its chunk's PDF;
3. the parent reads each chunk's PDF as soon as it is written (overlapping the layout of the others), then
   prints the global page number in every footer and beside every contents entry (a tiny embedded subset of
   DejaVu Sans digits), links each contents entry to its heading, adds bookmarks, and writes the book.

So neither the contents nor the footers need a second layout pass, and no worker ever holds more than a part.
"""

from __future__ import annotations

import os
import pickle
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from typing import Any

from ..errors import HandbookError
from .html import Node, plain_text, render_inline
from .ipc import frame, read_frame

PX_TO_PT = 0.75  # WeasyPrint's CSS px -> PDF pt

# Footer number: centred, this far above the bottom edge (pt), this size (pt), this grey.
FOOTER_BASELINE_PT = 8.5 * 72 / 25.4
FOOTER_SIZE_PT = 7.0
FOOTER_GREY = 0.35
MAX_CHUNK_CHARS = 600_000  # a part above this (the reference book's are ~400k) is cut between chapters
WORKER_SILENCE_S = 900  # a chunk of the reference book takes ~6 s: this only catches a hung worker


class TypesetError(HandbookError):
    """A worker failed to lay out or draw its chunk."""

    exit_code = 1


@dataclass
class ChunkPlan:
    index: int
    kind: str  # "front" or "body"
    nodes: list[Node] = field(default_factory=list)
    cost: int = 0


@dataclass
class PdfRun:
    pages: int
    chunks: int
    seconds: float
    worker_peak_rss_mb: list[float]
    chunk_seconds: list[dict[str, float]]
    fragments: dict[str, tuple[str, str]]
    refused: list[str]


# ---------------------------------------------------------------------------------------------------------------
# Worker processes


def default_workers() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        n = os.cpu_count() or 1
    return max(1, n)


# The worker imports this package's typeset modules without running orchestrator/__init__.py (which pulls in the
# whole job machinery: ~0.5 s per worker for nothing): a bare package object stands in for it.
_BOOTSTRAP = (
    "import sys, types\n"
    "pkg = types.ModuleType('orchestrator')\n"
    "pkg.__path__ = [sys.argv[1]]\n"
    "sys.modules['orchestrator'] = pkg\n"
    "from orchestrator.typeset.worker import main\n"
    "main()\n"
)


class _Worker:
    """A layout process: imports WeasyPrint once, then runs the jobs it is sent, one at a time.

    A plain subprocess rather than multiprocessing: nothing re-imports the caller's ``__main__`` (a script without
    an ``if __name__ == "__main__"`` guard stays safe), nothing is forked from a parent that may run threads, and
    each worker's memory is its own (its peak RSS is honest).
    """

    def __init__(self, wid: int, events: queue.Queue):
        self.wid = wid
        self.job: int | None = None
        self.stderr_tail = b""
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _BOOTSTRAP, str(Path(__file__).resolve().parent.parent)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
        )
        self._events = events
        threading.Thread(target=self._read, daemon=True, name=f"typeset-worker-{wid}").start()
        threading.Thread(target=self._drain_stderr, daemon=True).start()

    def send(self, job: dict[str, Any]) -> None:
        self.job = job["index"]
        data = pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)
        self.proc.stdin.write(frame(data))
        self.proc.stdin.flush()

    def _read(self) -> None:
        out = self.proc.stdout
        try:
            while (body := read_frame(out)) is not None:
                self._events.put((self.wid, pickle.loads(body)))
        finally:
            self._events.put((self.wid, None))  # the worker is gone

    def _drain_stderr(self) -> None:
        for chunk in iter(lambda: self.proc.stderr.read(4096), b""):
            self.stderr_tail = (self.stderr_tail + chunk)[-4000:]

    def close(self, kill: bool = False) -> None:
        try:
            if kill:
                self.proc.kill()
            else:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


class _Pool:
    def __init__(self, n: int):
        self.events: queue.Queue = queue.Queue()
        self.workers = [_Worker(i, self.events) for i in range(n)]
        self.peak_rss: dict[int, float] = {}

    def idle(self) -> list[_Worker]:
        return [w for w in self.workers if w.job is None]

    def busy(self) -> bool:
        return any(w.job is not None for w in self.workers)

    def messages(self) -> list[tuple[str, int, Any]]:
        """Block until at least one message; a worker that died mid-job becomes an "error" message."""
        try:
            items = [self.events.get(timeout=WORKER_SILENCE_S)]
        except queue.Empty:
            raise TypesetError(f"a layout worker said nothing for {WORKER_SILENCE_S} s; gave up") from None
        while True:
            try:
                items.append(self.events.get_nowait())
            except queue.Empty:
                break
        out = []
        for wid, msg in items:
            w = self.workers[wid]
            if msg is None:
                if w.job is not None:
                    w.proc.wait(5)
                    tail = w.stderr_tail.decode("utf-8", "replace").strip().splitlines()
                    out.append(("error", w.job, (f"worker exited with code {w.proc.returncode}: "
                                               f"{tail[-1] if tail else 'no message'}")))
                    w.job = None
                continue
            if msg[0] in ("done", "error"):
                w.job = None
                if msg[0] == "done":
                    self.peak_rss[wid] = max(self.peak_rss.get(wid, 0.0), msg[2]["peak_rss_mb"])
            out.append(msg)
        return out

    def close(self, kill: bool = False) -> None:
        for w in self.workers:
            w.close(kill=kill)


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


# ---------------------------------------------------------------------------------------------------------------
# The run


def _toc_jobs(root: Node, numbers: dict[str, str] | None) -> list[dict[str, str]]:
    from .html import render_inline, toc_entries

    out = []
    for n in toc_entries(root):
        out.append({"kind": n.kind, "id": n.id, "title_html": render_inline(n.title),
                    "page": (numbers or {}).get(n.id, "8888")})
    return out


def render_pdf(
    root: Node,
    out_pdf: Path,
    template_dirs: list[str],
    *,
    workers: int | None = None,
    want_fragments: bool = False,
    max_chunk_chars: int = MAX_CHUNK_CHARS,
) -> PdfRun:
    from .html import render_inline, render_markdown

    t0 = time.perf_counter()
    workers = workers or default_workers()
    chunks = plan_chunks(root, max_chunk_chars)
    title_html = render_inline(root.title)
    title_text = plain_text(title_html)
    preface_html = render_markdown(root.body)
    tmp = Path(tempfile.mkdtemp(prefix="handbook-typeset-"))
    common = {"template_dirs": template_dirs, "title_html": title_html, "title_text": title_text}

    body_jobs = []
    for i, nodes in enumerate(chunks, start=1):
        body_jobs.append({
            **common, "kind": "body", "index": i, "nodes": [n.to_dict() for n in nodes],
            "out": str(tmp / f"chunk{i:03d}.pdf"), "want_fragments": want_fragments,
            "cost": sum(n.size() for n in nodes),
        })
    toc = _toc_entries(root)
    front = {
        **common, "kind": "front", "index": 0, "toc": toc, "preface_html": preface_html,
        "out": str(tmp / "front.pdf"), "cost": sum(len(e["title_html"]) for e in toc) * 2 + len(root.body),
    }
    pending = sorted([front, *body_jobs], key=lambda j: j["cost"], reverse=True)  # biggest first
    pool = _Pool(min(workers, len(pending)))
    merger = Merger()
    results: dict[int, dict[str, Any]] = {}
    ok = False
    try:
        while pending or pool.busy():
            for w in pool.idle():
                if pending:
                    w.send(pending.pop(0))
            for kind, idx, payload in pool.messages():
                if kind == "error":
                    raise TypesetError(f"typesetting chunk {idx} failed: {payload.strip().splitlines()[0]}")
                if kind == "done":
                    results[idx] = payload
                    for w in pool.idle():  # keep the workers busy first, then read the finished chunk
                        if pending:
                            w.send(pending.pop(0))
                    merger.add(idx, payload["out"])
        bodies = [results[j["index"]] for j in body_jobs]
        # WeasyPrint has been seen to stop silently mid-flow on very long documents: every heading must have landed.
        placed = set().union(*(b["anchors"] for b in bodies))
        missing = [n.id for n in root.walk() if n.level > 1 and n.id not in placed]
        if missing:
            raise TypesetError(f"{len(missing)} headings are missing from the laid-out PDF (first: {missing[0]})")
        pages = merger.finish(results[0], bodies, out_pdf, root, title_text)
        ok = True
    finally:
        pool.close(kill=not ok)
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
        fragments=fragments,
        refused=[u for r in results.values() for u in r["refused"]],
    )


def _toc_entries(root: Node) -> list[dict[str, str]]:
    from .html import render_inline, toc_entries

    return [{"kind": n.kind, "id": n.id, "title_html": render_inline(n.title)} for n in toc_entries(root)]


# ---------------------------------------------------------------------------------------------------------------
# Merge


def _font_file(pattern: str) -> Path | None:
    """The font file fontconfig picks for ``pattern`` (what WeasyPrint uses too), or a DejaVu file we can find."""
    exe = shutil.which("fc-match")
    if exe:
        try:
            p = subprocess.run(
                [exe, "-f", "%{file}", pattern], capture_output=True, text=True, timeout=5, check=False
            ).stdout
            if p and Path(p).is_file() and p.lower().endswith((".ttf", ".otf")):
                return Path(p)
        except (OSError, subprocess.SubprocessError):
            pass
    name = "DejaVuSans-Bold.ttf" if "bold" in pattern.lower() else "DejaVuSans.ttf"
    for d in ("/usr/share/fonts", "/usr/local/share/fonts", "/Library/Fonts", "C:/Windows/Fonts"):
        if Path(d).is_dir():
            for f in Path(d).rglob(name):
                return f
    return None


@dataclass
class _DigitFont:
    ref: Any
    widths: list[float]  # '0'..'9' in 1/1000 em
    ascent: float  # in 1/1000 em

    def width(self, text: str, size: float) -> float:
        return sum(self.widths[ord(c) - 48] for c in text) / 1000 * size


@dataclass(frozen=True)
class _DigitData:
    name: str
    data: bytes | None  # a TrueType subset with the digits, or None for Helvetica
    widths: tuple[float, ...]  # '0'..'9' in 1/1000 em
    bbox: tuple[float, float, float, float] = (0, 0, 0, 0)
    ascent: float = 718.0
    descent: float = -207.0


def _digit_data(pattern: str) -> _DigitData:
    """The digits of the font fontconfig gives for ``pattern`` as a tiny TrueType subset (pure: no PDF objects)."""
    import logging

    bold = "bold" in pattern.lower()
    path = _font_file(pattern)
    if path is not None:
        try:
            from fontTools import subset as ftsubset
            from fontTools.ttLib import TTFont

            logging.getLogger("fontTools").setLevel(logging.ERROR)
            font = TTFont(str(path))
            opts = ftsubset.Options()
            opts.layout_features = []
            opts.name_IDs = []
            opts.hinting = False
            opts.notdef_outline = True
            opts.drop_tables += ["FFTM", "GPOS", "GSUB", "GDEF", "kern"]
            sub = ftsubset.Subsetter(opts)
            sub.populate(text="0123456789")
            sub.subset(font)
            scale = 1000 / font["head"].unitsPerEm
            cmap = font.getBestCmap()
            head, hhea = font["head"], font["hhea"]
            buf = BytesIO()
            font.save(buf)
            return _DigitData(
                name=path.stem.replace("-", ""),
                data=buf.getvalue(),
                widths=tuple(round(font["hmtx"][cmap[ord(c)]][0] * scale, 2) for c in "0123456789"),
                bbox=tuple(round(v * scale, 1) for v in (head.xMin, head.yMin, head.xMax, head.yMax)),
                ascent=round(hhea.ascent * scale, 1),
                descent=round(hhea.descent * scale, 1),
            )
        except Exception as e:
            logging.getLogger(__name__).debug("digits font from %s failed: %s", path, e)
    return _DigitData(name="Helvetica-Bold" if bold else "Helvetica", data=None, widths=(556.0,) * 10)


def _embed_digits(writer, d: _DigitData, tag: str) -> _DigitFont:
    from pypdf.generic import (
        ArrayObject,
        DecodedStreamObject,
        DictionaryObject,
        FloatObject,
        NameObject,
        NumberObject,
    )

    if d.data is None:
        fontdict = DictionaryObject({
            NameObject("/Type"): NameObject("/Font"),
            NameObject("/Subtype"): NameObject("/Type1"),
            NameObject("/BaseFont"): NameObject("/" + d.name),
            NameObject("/Encoding"): NameObject("/WinAnsiEncoding"),
        })
        return _DigitFont(writer._add_object(fontdict), list(d.widths), d.ascent)
    ff = DecodedStreamObject()
    ff.set_data(d.data)
    ff[NameObject("/Length1")] = NumberObject(len(d.data))
    ff = ff.flate_encode()
    base = NameObject(f"/{tag}+{d.name}")
    descriptor = DictionaryObject({
        NameObject("/Type"): NameObject("/FontDescriptor"),
        NameObject("/FontName"): base,
        NameObject("/Flags"): NumberObject(32),
        NameObject("/FontBBox"): ArrayObject([FloatObject(v) for v in d.bbox]),
        NameObject("/ItalicAngle"): NumberObject(0),
        NameObject("/Ascent"): FloatObject(d.ascent),
        NameObject("/Descent"): FloatObject(d.descent),
        NameObject("/CapHeight"): FloatObject(d.ascent),
        NameObject("/StemV"): NumberObject(80),
        NameObject("/FontFile2"): writer._add_object(ff),
    })
    fontdict = DictionaryObject({
        NameObject("/Type"): NameObject("/Font"),
        NameObject("/Subtype"): NameObject("/TrueType"),
        NameObject("/BaseFont"): base,
        NameObject("/FirstChar"): NumberObject(48),
        NameObject("/LastChar"): NumberObject(57),
        NameObject("/Widths"): ArrayObject([FloatObject(w) for w in d.widths]),
        NameObject("/Encoding"): NameObject("/WinAnsiEncoding"),
        NameObject("/FontDescriptor"): writer._add_object(descriptor),
    })
    return _DigitFont(writer._add_object(fontdict), list(d.widths), d.ascent)


class Merger:
    """Collects the chunk PDFs as they finish (in any order, while the other chunks are still being laid out),
    then numbers, links and writes the book: the serial tail after the last chunk stays short."""

    def __init__(self) -> None:
        from pypdf import PdfWriter

        self.writer = PdfWriter()
        self.counts: dict[int, int] = {}
        self._digits: dict[str, _DigitData] = {}
        self._fonts_thread = threading.Thread(target=self._prepare_fonts, daemon=True)
        self._fonts_thread.start()

    def _prepare_fonts(self) -> None:
        for key, pattern in (("R", "DejaVu Sans"), ("B", "DejaVu Sans:bold")):
            self._digits[key] = _digit_data(pattern)

    def add(self, index: int, pdf_path: str) -> None:
        from pypdf import PdfReader

        pos = sum(n for i, n in self.counts.items() if i < index)
        reader = PdfReader(pdf_path)
        n = 0
        for n, page in enumerate(reader.pages, start=1):
            self.writer.insert_page(page, pos + n - 1)
        self.counts[index] = n

    def finish(self, front: dict[str, Any], bodies: list[dict[str, Any]], out_pdf: Path, root: Node,
               title: str) -> int:
        self._fonts_thread.join()
        fonts = {k: _embed_digits(self.writer, self._digits[k], f"HBDGT{k}") for k in ("R", "B")}
        return _finish(self.writer, fonts, front, bodies, out_pdf, root, title)


def merge_pdf(front: dict[str, Any], bodies: list[dict[str, Any]], out_pdf: Path, root: Node, title: str) -> int:
    """Concatenate the chunks; stamp footer and contents numbers; link the contents; write the bookmarks."""
    m = Merger()
    for r in [front, *bodies]:
        m.add(r["index"], r["out"])
    return m.finish(front, bodies, out_pdf, root, title)


def _finish(writer, fonts: dict[str, _DigitFont], front: dict[str, Any], bodies: list[dict[str, Any]],
            out_pdf: Path, root: Node, title: str) -> int:
    from pypdf.annotations import Link
    from pypdf.generic import ArrayObject, DecodedStreamObject, DictionaryObject, Fit, NameObject

    pages = list(writer.pages)  # indexing writer.pages re-counts the page tree each time
    total = len(pages)
    starts = []
    acc = 0
    for r in [front, *bodies]:
        starts.append(acc)
        acc += r["pages"]
    if acc != total:
        raise TypesetError(f"the merged PDF has {total} pages where the chunks had {acc}")

    # Where every heading starts: global page index, (x, y) in pt. A chunk's pages all have its first page's size.
    dest: dict[str, tuple[int, float, float]] = {}
    for r, start in zip(bodies, starts[1:]):
        h_px = r["size_px"][1]
        for name, (page, x1, y1, _x2, _y2) in r["anchors"].items():
            dest[name] = (start + page, x1 * PX_TO_PT, (h_px - y1) * PX_TO_PT)

    stamps: dict[int, list[str]] = {}

    def stamp(page: int, font: str, size: float, x: float, y: float, text: str, grey: float) -> None:
        stamps.setdefault(page, []).append(
            f"BT {grey} g /HBNum{font} {size:.2f} Tf {x:.2f} {y:.2f} Td ({text}) Tj ET"
        )

    # footers: every page but the title page
    for i in range(1, total):
        box = pages[i].mediabox
        label = str(i + 1)
        x = float(box.left) + (float(box.width) - fonts["R"].width(label, FOOTER_SIZE_PT)) / 2
        stamp(i, "R", FOOTER_SIZE_PT, x, float(box.bottom) + FOOTER_BASELINE_PT, label, FOOTER_GREY)

    # the contents: each entry's number, right-aligned on its first line, and a link over the entry
    h_px = front["size_px"][1]
    lines = front.get("toc_lines") or {}
    for name, (page, x1, y1, x2, y2) in front["anchors"].items():
        if not name.startswith("toc-") or (target := dest.get(name[4:])) is None:
            continue
        label = str(target[0] + 1)
        if name in lines:
            _, baseline_px, size_px, bold = lines[name]
        else:  # no line metrics: assume a 1.3 line height at 8pt
            baseline_px, size_px, bold = y1 + 0.8 * 8 / PX_TO_PT * 1.3, 8 / PX_TO_PT, False
        f = fonts["B" if bold else "R"]
        size = size_px * PX_TO_PT
        stamp(page, "B" if bold else "R", size, x2 * PX_TO_PT - f.width(label, size), (h_px - baseline_px) * PX_TO_PT,
              label, 0)
        rect = (x1 * PX_TO_PT, (h_px - y2) * PX_TO_PT, x2 * PX_TO_PT, (h_px - y1) * PX_TO_PT)
        writer.add_annotation(page_number=page, annotation=Link(
            rect=rect, target_page_index=target[0], fit=Fit.xyz(left=target[1], top=target[2])))

    # The stamps go after each page's own content, wrapped so its graphics state cannot leak into them.
    q = DecodedStreamObject()
    q.set_data(b"q\n")
    q_ref = writer._add_object(q)
    end_q = DecodedStreamObject()
    end_q.set_data(b"\nQ\n")
    end_q_ref = writer._add_object(end_q)
    font_names = {NameObject(f"/HBNum{k}"): f.ref for k, f in fonts.items()}
    for i, ops in stamps.items():
        page = pages[i]
        s = DecodedStreamObject()
        s.set_data(("\n".join(ops) + "\n").encode("ascii"))
        contents = page.get("/Contents")
        if contents is None:
            arr: list = []
        else:
            obj = contents.get_object()
            arr = list(obj) if isinstance(obj, ArrayObject) else [contents]
        page[NameObject("/Contents")] = ArrayObject([q_ref, *arr, end_q_ref, writer._add_object(s)])
        if "/Resources" not in page:
            page[NameObject("/Resources")] = DictionaryObject()
        res = page["/Resources"].get_object()
        if "/Font" not in res:
            res[NameObject("/Font")] = DictionaryObject()
        res["/Font"].get_object().update(font_names)

    # bookmarks: Contents, then parts > chapters > sections
    toc_page = next((v[0] for k, v in front["anchors"].items() if k.startswith("toc-")), None)
    if toc_page is not None:
        writer.add_outline_item(title="Contents", page_number=toc_page)

    def add(nodes: list[Node], parent) -> None:
        for n in nodes:
            d = dest.get(n.id)
            if d is None:
                add(n.children, parent)
                continue
            item = writer.add_outline_item(
                title=plain_text(render_inline(n.title)), page_number=d[0], parent=parent,
                fit=Fit.xyz(left=d[1], top=d[2]), is_open=n.level < 3,
            )
            add(n.children, item)

    add(root.children, None)
    writer.add_metadata({"/Title": title, "/Producer": "handbook (WeasyPrint + pypdf)"})
    writer.page_mode = "/UseOutlines"
    tmp_out = out_pdf.with_name(out_pdf.name + ".part")
    with open(tmp_out, "wb") as fh:
        writer.write(fh)
    os.replace(tmp_out, out_pdf)
    return total
