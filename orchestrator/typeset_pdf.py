"""The parallel PDF path: chunks laid out in worker processes, then one merge with global page numbers.

Why this shape (measured on the 2-core machine, see benchmarks/typeset.py): one WeasyPrint pass over a 1,500-page
book costs ~100 s and >2 GB; its cost is CPU-bound Python, so the only way to 30 s is to run independent pieces
on both cores. A part's page count does not depend on the number of its first page, so

1. each part (a chunk) is laid out in its own short-lived process, biggest first, ``workers`` at a time;
2. the title page and contents are laid out once early with placeholder numbers, only to count their pages;
3. as soon as every chunk has been *laid out* (a worker reports its page count before it draws its PDF) the
   global numbers are known and the contents are laid out again with them, while the last parts are drawn;
4. the merge (pypdf) concatenates the pages, stamps the footer number on each page (a tiny embedded digits-only
   subset of DejaVu Sans), links every contents entry to where its heading starts, and writes the bookmarks.

Workers come from a fork server that preloads WeasyPrint, so a worker starts in milliseconds with a clean, small
address space (no copy of the parent's memory inflating its RSS), and each one exits after its chunk.
"""

from __future__ import annotations

import os
import pickle
import queue
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from typing import Any

from .errors import HandbookError
from .typeset_html import Node, plain_text, render_inline

PX_TO_PT = 0.75  # WeasyPrint's CSS px -> PDF pt

# Footer number: centred, this far above the bottom edge (pt), this size (pt), this grey.
FOOTER_BASELINE_PT = 8.5 * 72 / 25.4
FOOTER_SIZE_PT = 7.0
FOOTER_GREY = 0.35


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


class _Worker:
    """``python -m orchestrator.typeset_worker``: imports WeasyPrint once, then runs the jobs it is sent.

    A plain subprocess rather than multiprocessing: nothing re-imports the caller's ``__main__`` (a script without
    an ``if __name__ == "__main__"`` guard stays safe), nothing is forked from a parent that may run threads, and
    each worker's memory is its own (its peak RSS is honest).
    """

    def __init__(self, wid: int, events: queue.Queue):
        env = dict(os.environ)
        pkg_parent = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = pkg_parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.wid = wid
        self.job: int | None = None
        self.stderr_tail = b""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.typeset_worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, bufsize=0,
        )
        self._events = events
        threading.Thread(target=self._read, daemon=True, name=f"typeset-worker-{wid}").start()
        threading.Thread(target=self._drain_stderr, daemon=True).start()

    def send(self, job: dict[str, Any]) -> None:
        self.job = job["index"]
        data = pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)
        self.proc.stdin.write(struct.pack("<Q", len(data)) + data)
        self.proc.stdin.flush()

    def _read(self) -> None:
        out = self.proc.stdout
        try:
            while True:
                head = _read_exact(out, 8)
                if head is None:
                    break
                body = _read_exact(out, struct.unpack("<Q", head)[0])
                if body is None:
                    break
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


def _read_exact(stream, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = stream.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


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
        items = [self.events.get()]
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

    A part is a chunk. A part bigger than ``max_chunk_chars`` is cut between chapters into roughly equal runs
    (each run then starts on a new page); chapters or sections outside any part are grouped the same way.
    """
    chunks: list[list[Node]] = []
    loose: list[Node] = []

    def split(nodes: list[Node]) -> None:
        total = sum(n.size() for n in nodes)
        pieces = max(1, -(-total // max_chunk_chars))
        target = total / pieces
        cur: list[Node] = []
        acc = 0
        for n in nodes:
            if cur and acc + n.size() / 2 > target * (len(chunks_local) + 1):
                chunks_local.append(cur)
                cur = []
            cur.append(n)
            acc += n.size()
        if cur:
            chunks_local.append(cur)

    for n in root.children:
        if n.level == 2:
            if loose:
                chunks_local: list[list[Node]] = []
                split(loose)
                chunks.extend(chunks_local)
                loose = []
            if n.size() <= max_chunk_chars or len(n.children) < 2:
                chunks.append([n])
            else:
                head = Node(n.level, n.title, n.id, n.body, [])
                chunks_local = []
                split(n.children)
                chunks_local[0] = [head, *chunks_local[0]]
                # The part heading and its first run stay together; later runs continue the part.
                chunks.extend(chunks_local)
        else:
            loose.append(n)
    if loose:
        chunks_local = []
        split(loose)
        chunks.extend(chunks_local)
    return chunks


# ---------------------------------------------------------------------------------------------------------------
# The run


def _toc_jobs(root: Node, numbers: dict[str, str] | None) -> list[dict[str, str]]:
    from .typeset_html import render_inline, toc_entries

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
    max_chunk_chars: int = 600_000,
) -> PdfRun:
    from .typeset_html import render_inline, render_markdown

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
        bodies = [results[j["index"]] for j in body_jobs]
        # WeasyPrint has been seen to stop silently mid-flow on very long documents: every heading must have landed.
        placed = set().union(*(b["anchors"] for b in bodies))
        missing = [n.id for n in root.walk() if n.level > 1 and n.id not in placed]
        if missing:
            raise TypesetError(f"{len(missing)} headings are missing from the laid-out PDF (first: {missing[0]})")
        pages = merge_pdf(results[0], bodies, out_pdf, root, title_text)
        ok = True
    finally:
        pool.close(kill=not ok)
        shutil.rmtree(tmp, ignore_errors=True)
    fragments: dict[str, tuple[str, str]] = {}
    for b in results.values():
        fragments.update(b.get("fragments") or {})
    return PdfRun(
        pages=pages,
        seconds=time.perf_counter() - t0,
        worker_peak_rss_mb=list(pool.peak_rss.values()),
        chunk_seconds=[{"index": r["index"], "pages": r["pages"], **r["seconds"]} for r in results.values()],
        fragments=fragments,
        refused=[u for r in results.values() for u in r["refused"]],
    )


def _toc_entries(root: Node) -> list[dict[str, str]]:
    from .typeset_html import render_inline, toc_entries

    return [{"kind": n.kind, "id": n.id, "title_html": render_inline(n.title)} for n in toc_entries(root)]


# ---------------------------------------------------------------------------------------------------------------
# Merge


def _font_file(pattern: str) -> Path | None:
    """The font file fontconfig picks for ``pattern`` (what WeasyPrint uses too), or a DejaVu file we can find."""
    exe = shutil.which("fc-match")
    if exe:
        try:
            p = subprocess.run([exe, "-f", "%{file}", pattern], capture_output=True, text=True, timeout=5, check=False).stdout
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


def _digit_font(writer, pattern: str, tag: str) -> _DigitFont:
    """An embedded TrueType subset holding only the digits of ``pattern`` (DejaVu Sans), or Helvetica."""
    import logging

    from pypdf.generic import (
        ArrayObject,
        DecodedStreamObject,
        DictionaryObject,
        FloatObject,
        NameObject,
        NumberObject,
    )

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
            upem = font["head"].unitsPerEm
            scale = 1000 / upem
            cmap = font.getBestCmap()
            widths = [font["hmtx"][cmap[ord(c)]][0] * scale for c in "0123456789"]
            head, hhea = font["head"], font["hhea"]
            buf = BytesIO()
            font.save(buf)
            data = buf.getvalue()
            ff = DecodedStreamObject()
            ff.set_data(data)
            ff[NameObject("/Length1")] = NumberObject(len(data))
            ff = ff.flate_encode()
            base = NameObject(f"/{tag}+{path.stem.replace('-', '')}")
            descriptor = DictionaryObject({
                NameObject("/Type"): NameObject("/FontDescriptor"),
                NameObject("/FontName"): base,
                NameObject("/Flags"): NumberObject(32),
                NameObject("/FontBBox"): ArrayObject([FloatObject(round(v * scale, 1)) for v in
                                                      (head.xMin, head.yMin, head.xMax, head.yMax)]),
                NameObject("/ItalicAngle"): NumberObject(0),
                NameObject("/Ascent"): FloatObject(round(hhea.ascent * scale, 1)),
                NameObject("/Descent"): FloatObject(round(hhea.descent * scale, 1)),
                NameObject("/CapHeight"): FloatObject(round(hhea.ascent * scale, 1)),
                NameObject("/StemV"): NumberObject(80),
                NameObject("/FontFile2"): writer._add_object(ff),
            })
            fontdict = DictionaryObject({
                NameObject("/Type"): NameObject("/Font"),
                NameObject("/Subtype"): NameObject("/TrueType"),
                NameObject("/BaseFont"): base,
                NameObject("/FirstChar"): NumberObject(48),
                NameObject("/LastChar"): NumberObject(57),
                NameObject("/Widths"): ArrayObject([FloatObject(round(w, 2)) for w in widths]),
                NameObject("/Encoding"): NameObject("/WinAnsiEncoding"),
                NameObject("/FontDescriptor"): writer._add_object(descriptor),
            })
            return _DigitFont(writer._add_object(fontdict), widths, hhea.ascent * scale)
        except Exception as e:  # noqa: BLE001  (fall back to a standard font below)
            logging.getLogger(__name__).debug("digits font from %s failed: %s", path, e)
    fontdict = DictionaryObject({
        NameObject("/Type"): NameObject("/Font"),
        NameObject("/Subtype"): NameObject("/Type1"),
        NameObject("/BaseFont"): NameObject("/Helvetica-Bold" if "bold" in pattern.lower() else "/Helvetica"),
        NameObject("/Encoding"): NameObject("/WinAnsiEncoding"),
    })
    return _DigitFont(writer._add_object(fontdict), [556.0] * 10, 718.0)


def merge_pdf(front: dict[str, Any], bodies: list[dict[str, Any]], out_pdf: Path, root: Node, title: str) -> int:
    """Concatenate the chunks; stamp footer and contents numbers; link the contents; write the bookmarks."""
    from pypdf import PdfReader, PdfWriter
    from pypdf.annotations import Link
    from pypdf.generic import ArrayObject, DecodedStreamObject, DictionaryObject, Fit, NameObject

    writer = PdfWriter()
    starts: list[int] = []
    chunks = [front, *bodies]
    for r in chunks:
        starts.append(len(writer.pages))
        for page in PdfReader(r["out"]).pages:
            writer.add_page(page)
    total = len(writer.pages)

    # Where every heading starts: global page index, (x, y) in pt. A chunk's pages all have its first page's size.
    dest: dict[str, tuple[int, float, float]] = {}
    for r, start in zip(bodies, starts[1:]):
        h_px = r["size_px"][1]
        for name, (page, x1, y1, _x2, _y2) in r["anchors"].items():
            dest[name] = (start + page, x1 * PX_TO_PT, (h_px - y1) * PX_TO_PT)

    fonts = {"R": _digit_font(writer, "DejaVu Sans", "HBDGTR"), "B": _digit_font(writer, "DejaVu Sans:bold", "HBDGTB")}
    stamps: dict[int, list[str]] = {}

    def stamp(page: int, font: str, size: float, x: float, y: float, text: str, grey: float) -> None:
        stamps.setdefault(page, []).append(
            f"BT {grey} g /HBNum{font} {size:.2f} Tf {x:.2f} {y:.2f} Td ({text}) Tj ET"
        )

    # footers: every page but the title page
    for i in range(1, total):
        box = writer.pages[i].mediabox
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
        page = writer.pages[i]
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
