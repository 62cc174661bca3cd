"""The body's pages, drawn from galley slices (typeset/galley.py): no layout happens here.

Each slice of a galley page becomes a PDF form XObject: the galley page's content stream without the text that
lies outside the slice (so that what is clipped out of sight is not in the page's text either), its fonts and
images copied once per galley document. A page of running text draws each slice's XObject moved into place and
clipped to the slice's lines; a part's title page draws its whole
galley page; the chapter's running head is its own small galley item, centred in the top margin. The merge then
numbers the pages, the contents and the bookmarks (typeset/merge.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pypdf import PageObject, PdfReader, PdfWriter
from pypdf.generic import (
    ArrayObject,
    DecodedStreamObject,
    DictionaryObject,
    FloatObject,
    IndirectObject,
    NameObject,
    NumberObject,
    StreamObject,
)

from .compat import add_object, stored_stream_copy
from .galley import OutPage
from .merge import PX_TO_PT, Destination

__all__ = ["Composer"]

ZLIB_LEVEL = 1  # a cut slice's stream: compressed in the reader's wait (level 6 takes ~3x the CPU for ~10% fewer bytes)


@dataclass
class _Drawing:
    """One book page being drawn: its content stream's operations, its form XObjects (name -> reference), its
    links."""

    ops: list[str] = field(default_factory=list)
    xobjects: dict[Any, Any] = field(default_factory=dict)
    annots: list[IndirectObject] = field(default_factory=list)


class Composer:
    """Appends the body's pages to ``writer``; ``geometry``: the book's page and text box (CSS px); ``runs``: for
    each galley page (pdf, page), where its content stream shows text (compat.text_runs flattened: start, end, y,
    start, ...; None: unknown)."""

    def __init__(self, writer: PdfWriter, geometry: dict[str, float],
                 runs: dict[tuple[str, int], Sequence[float] | None] | None = None):
        self.writer = writer
        self.g = geometry
        self.runs = runs if runs is not None else {}
        self._readers: dict[str, list[PageObject]] = {}
        self._pages: dict[tuple[str, int], tuple[Any, ArrayObject, float, Any]] = {}
        self._forms: dict[tuple[str, int], tuple[IndirectObject, float]] = {}  # whole galley pages, as laid out
        self._links: dict[tuple[str, int], list[tuple[tuple[float, ...], Any]]] = {}

    def read(self, pdf: str, pages: Iterable[int] = ()) -> None:
        """Open a galley document ahead of time (while the book is still being written, or other documents are
        still being laid out), and copy the resources of these of its pages into the writer."""
        if pdf not in self._readers:
            self._readers[pdf] = list(PdfReader(pdf).pages)  # pypdf counts the page tree again on every index
        for page in pages:
            self._page(pdf, page)

    def _page(self, pdf: str, page: int) -> tuple[Any, ArrayObject, float, Any]:
        """A galley page's resources (copied into this writer once), box, height in pt and content stream."""
        key = (pdf, page)
        if key not in self._pages:
            self.read(pdf)
            src = self._readers[pdf][page]
            box = src.mediabox
            res = src.get("/Resources")
            if res is None:
                res_ref: Any = DictionaryObject()
            elif isinstance(res, IndirectObject):
                res_ref = res.clone(self.writer)  # shared by every page of its document: copied once
            else:
                res_ref = add_object(self.writer, res.clone(self.writer))
            contents = src.get("/Contents")
            stream = contents.get_object() if contents is not None else None
            if not isinstance(stream, StreamObject):  # none, or several: decoded and joined
                stream = DecodedStreamObject()
                joined = src.get_contents()
                stream.set_data(joined.get_data() if joined is not None else b"")
            bbox = ArrayObject([FloatObject(float(v)) for v in (box.left, box.bottom, box.right, box.top)])
            self._pages[key] = (res_ref, bbox, float(box.top), stream)
            # the links to the web in its text (an internal one points into the galley: not kept)
            links: list[tuple[tuple[float, ...], Any]] = []
            for annot in src.get("/Annots") or ():
                a = annot.get_object()
                action = a.get("/A")
                if a.get("/Subtype") == "/Link" and action is not None and action.get_object().get("/S") == "/URI":
                    x1, y1, x2, y2 = (float(v) for v in a["/Rect"])  # any two corners: normalised
                    links.append(((min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2)),
                                  action.get_object().clone(self.writer)))
            self._links[key] = links
        return self._pages[key]

    def _form(self, pdf: str, page: int, top: float | None = None, bottom: float | None = None,
              ) -> tuple[IndirectObject, float]:
        """Galley page ``page`` of ``pdf`` as a form XObject of this writer, showing only the text whose baseline
        lies within ``top``..``bottom`` (px; None: all of it), and its height in pt."""
        res, bbox, h_pt, stream = self._page(pdf, page)
        runs = self.runs.get((pdf, page))
        drop = [] if runs is None or top is None or bottom is None else [
            i for i in range(0, len(runs), 3) if not top - 0.5 <= runs[i + 2] <= bottom + 0.5]
        if not drop:  # all of its text shows: the page as laid out, once (a running head serves a whole chapter)
            if (pdf, page) in self._forms:
                return self._forms[(pdf, page)]
            encoded = stored_stream_copy(stream)
        else:
            data = stream.get_data()
            pieces, pos = [], 0
            for i in drop:
                pieces.append(data[pos:int(runs[i])])  # type: ignore[index]
                pos = int(runs[i + 1])  # type: ignore[index]
            pieces.append(data[pos:])
            form = DecodedStreamObject()
            form.set_data(b"".join(pieces))
            encoded = form.flate_encode(level=ZLIB_LEVEL)
        encoded[NameObject("/Type")] = NameObject("/XObject")
        encoded[NameObject("/Subtype")] = NameObject("/Form")
        encoded[NameObject("/BBox")] = bbox
        encoded[NameObject("/Resources")] = res
        ref = add_object(self.writer, encoded)
        if not drop:
            self._forms[(pdf, page)] = (ref, h_pt)
        return ref, h_pt

    def add_pages(self, pages: list[OutPage], heads: dict[str, tuple[str, int, float, float]],
                  dest: dict[str, tuple[int, float, float]], first: int) -> dict[str, Destination]:
        """Append ``pages`` (the body; the book's page ``first`` is the first of them) and return where each
        anchor of ``dest`` (page, x, y in the text box, CSS px) is, in the book (page index, pt from the page's
        bottom-left). ``heads``: each chapter's running head as a galley slice (pdf, page, top, bottom)."""
        g = self.g
        width_pt, height_pt = g["width"] * PX_TO_PT, g["height"] * PX_TO_PT
        x0 = g["content_x"] * PX_TO_PT
        text_top = (g["height"] - g["content_y"]) * PX_TO_PT  # the text box's top edge, pt from the bottom
        for p in pages:
            d = _Drawing()
            if p.whole is not None:
                ref, h_pt = self._form(*p.whole)
                d.xobjects[NameObject("/G0")] = ref
                d.ops.append("q /G0 Do Q")
                self._annots(d.annots, p.whole, 0.0, h_pt, 0.0, 0.0)
            for s in p.slices:
                self._place(d, s.pdf, s.page, s.top, s.bottom, text_top - s.dest_top * PX_TO_PT, x0)
            if p.head is not None and p.head in heads:
                pdf, page, top, bottom = heads[p.head]
                mid = (g["height"] - g["content_y"] / 2) * PX_TO_PT  # the middle of the top margin
                self._place(d, pdf, page, top, bottom, mid + (bottom - top) * PX_TO_PT / 2, x0)
            out = self.writer.add_blank_page(width_pt, height_pt)
            content = DecodedStreamObject()
            content.set_data("\n".join(d.ops).encode("ascii"))
            out[NameObject("/Contents")] = add_object(self.writer, content)
            out[NameObject("/Resources")] = DictionaryObject({NameObject("/XObject"): DictionaryObject(d.xobjects)})
            if d.annots:
                out[NameObject("/Annots")] = ArrayObject(d.annots)
        where: dict[str, Destination] = {}
        for name, (page, x, y) in dest.items():
            where[name] = (first + page, (g["content_x"] + x) * PX_TO_PT,
                           (g["height"] - g["content_y"] - y) * PX_TO_PT)
        return where

    def _place(self, d: _Drawing, pdf: str, page: int, top: float, bottom: float, dest_top_pt: float,
               x: float) -> None:
        """Draw lines ``top``..``bottom`` (px) of a galley page onto ``d`` with their top at ``dest_top_pt`` (pt
        from the page's bottom) and their left edge at ``x`` pt, clipped to them; their links come along."""
        ref, h_pt = self._form(pdf, page, top, bottom)
        name = f"/G{len(d.xobjects)}"
        d.xobjects[NameObject(name)] = ref
        h = (bottom - top) * PX_TO_PT
        ty = dest_top_pt - (h_pt - top * PX_TO_PT)
        width = self.g["width"] * PX_TO_PT
        d.ops.append(f"q 0 {dest_top_pt - h:.3f} {width:.3f} {h:.3f} re W n 1 0 0 1 {x:.3f} {ty:.3f} cm {name} Do Q")
        self._annots(d.annots, (pdf, page), h_pt - bottom * PX_TO_PT, h_pt - top * PX_TO_PT, x, ty)

    def _annots(self, annots: list[IndirectObject], key: tuple[str, int], low: float, high: float, dx: float,
                dy: float) -> None:
        """The links of galley page ``key`` whose middle lies between ``low`` and ``high`` (pt, in the galley
        page), moved by (dx, dy) onto the book's page."""
        self._page(*key)
        for (x1, y1, x2, y2), action in self._links.get(key, ()):
            if low <= (y1 + y2) / 2 <= high:
                rect = ArrayObject([FloatObject(round(v, 3)) for v in (x1 + dx, y1 + dy, x2 + dx, y2 + dy)])
                annots.append(add_object(self.writer, DictionaryObject({
                    NameObject("/Type"): NameObject("/Annot"),
                    NameObject("/Subtype"): NameObject("/Link"),
                    NameObject("/Rect"): rect,
                    NameObject("/Border"): ArrayObject([NumberObject(0), NumberObject(0), NumberObject(0)]),
                    NameObject("/A"): action,
                })))
