"""Every use of a private or undocumented part of pypdf, WeasyPrint and pydyf, in one place.

Checked against (each function's library source read, and tests/typeset/test_typeset.py run with each version):

    WeasyPrint 68.0, 69.0, 70.0     pyproject pins weasyprint>=68,<71
    pypdf      7.0.0, 7.1.1         pyproject pins pypdf>=7,<8
    pydyf      0.13.0               WeasyPrint's PDF writer (WeasyPrint 68-70 ask for pydyf>=0.11)

Before widening a pin, re-read the library's source at the new version for each function below. Each one imports
its library when called: the parent process, which only merges, must never import WeasyPrint.
"""

from __future__ import annotations

import re
import zlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pypdf import PdfWriter
    from pypdf.generic import IndirectObject, PdfObject, StreamObject

__all__ = [
    "UNIT_HEAD",
    "UNIT_KEEP",
    "add_object",
    "anchor_boxes",
    "cap_pdf_compression",
    "galley_units",
    "page_contents",
    "page_geometry",
    "stored_stream_copy",
    "text_runs",
    "toc_lines",
]

# ---------------------------------------------------------------------------------------------------------------
# pypdf


def add_object(writer: PdfWriter, obj: PdfObject) -> IndirectObject:
    """Make ``obj`` an indirect object of ``writer`` and return its reference.

    Streams (a font file, a page's extra content) must be indirect objects, and pypdf 7 has no public call that
    adds one: ``PdfWriter._add_object`` is what its own page, outline and metadata code uses.
    """
    return writer._add_object(obj)


def stored_stream_copy(stream: StreamObject) -> StreamObject:
    """A new stream with ``stream``'s bytes as they are stored (an encoded stream's stay encoded: never decoded
    and compressed again), of the same kind (encoded or decoded), with its ``/Filter`` and ``/DecodeParms`` and no
    other entries.

    pypdf 7 has no public call for this: ``EncodedStreamObject.get_data`` decodes and its ``set_data`` encodes
    again; ``StreamObject._data`` (the bytes as stored) is what pypdf's own ``clone`` and ``flate_encode`` copy.
    """
    from pypdf.generic import DecodedStreamObject, EncodedStreamObject, NameObject

    copy: StreamObject = EncodedStreamObject() if isinstance(stream, EncodedStreamObject) else DecodedStreamObject()
    copy._data = stream._data
    for k in ("/Filter", "/DecodeParms"):
        if k in stream:
            copy[NameObject(k)] = stream[k]
    return copy


# ---------------------------------------------------------------------------------------------------------------
# pydyf (inside WeasyPrint's write_pdf)


class _CappedZlib:
    """zlib as pydyf sees it: the same module, with compressobj's level capped."""

    def __init__(self, level: int):
        self.level = level

    def __getattr__(self, name: str) -> Any:
        return getattr(zlib, name)

    def compressobj(self, level: int = -1, *args: Any, **kwargs: Any) -> Any:
        return zlib.compressobj(min(level, self.level) if level >= 0 else level, *args, **kwargs)


def cap_pdf_compression(level: int) -> None:
    """Make pydyf deflate streams at most at ``level`` (it asks zlib for 9, through its module-level ``zlib``).

    A no-op if pydyf no longer holds ``zlib`` under that name: the PDF is then only slower to write.
    """
    import pydyf

    if getattr(pydyf, "zlib", None) is zlib:
        pydyf.zlib = _CappedZlib(level)


# ---------------------------------------------------------------------------------------------------------------
# WeasyPrint's laid-out document


def anchor_boxes(doc: Any) -> dict[str, tuple[int, float, float, float, float]]:
    """Where every anchor (an element's ``id``) landed: (page index, x1, y1, x2, y2), CSS px from the page's
    top-left; the first page wins for an id on several.

    ``Page.anchors`` is documented as name -> (x, y), but WeasyPrint 68-70 store the element's box (its hit area:
    x1, y1, x2, y2): the merge needs its right edge and bottom for the contents' numbers and links.
    """
    out: dict[str, tuple[int, float, float, float, float]] = {}
    for i, page in enumerate(doc.pages):
        for name, rect in page.anchors.items():
            if name in out:
                continue
            if len(rect) != 4:
                raise RuntimeError(f"WeasyPrint's Page.anchors changed shape ({rect!r}): see orchestrator/typeset/"
                                   "compat.py")
            x1, y1, x2, y2 = rect
            out[name] = (i, float(x1), float(y1), float(x2), float(y2))
    return out


def toc_lines(doc: Any, prefix: str = "toc-") -> dict[str, tuple[int, float, float, bool]]:
    """For each block whose ``id`` starts with ``prefix``: (page, first line's baseline y, font size, bold), CSS px.

    The merge prints a contents entry's page number on that baseline, right-aligned to the entry's box. Read from
    the laid-out boxes (``Page._page_box`` and ``weasyprint.formatting_structure.boxes``, both internal); if they
    ever change shape this returns {} and the merge falls back to the entry's box.
    """
    out: dict[str, tuple[int, float, float, bool]] = {}
    try:
        from weasyprint.formatting_structure import boxes

        for i, page in enumerate(doc.pages):
            for box in page._page_box.descendants():
                if not isinstance(box, boxes.BlockBox) or box.element is None:
                    continue
                name = box.element.get("id") or ""
                if not name.startswith(prefix) or name in out:
                    continue
                line = next((c for c in box.children if isinstance(c, boxes.LineBox)), None)
                if line is None:
                    continue
                weight = box.style["font_weight"]
                out[name] = (i, float(line.position_y + line.baseline), float(box.style["font_size"]),
                             isinstance(weight, int | float) and weight >= 600)
    except Exception:
        return {}
    return out


# Flags of a galley unit (typeset/galley.py): the unit is (in) a heading; a page break right before it is refused
# (it would leave fewer than two lines of its paragraph on a page, as CSS's orphans and widows default to 2).
UNIT_HEAD = 1
UNIT_KEEP = 2
_HEADING_TAGS = frozenset({"h1", "h2", "h3", "h4", "h5", "h6"})


def page_geometry(doc: Any) -> dict[str, float]:
    """The first page's size and content box, CSS px: width, height, content_x, content_y, content_w, content_h.

    Read from ``Page._page_box`` (internal); the galley layout sizes its pages from it and the composer places the
    galley slices in that box."""
    page = doc.pages[0]
    box = page._page_box
    return {
        "width": float(page.width), "height": float(page.height),
        "content_x": float(box.content_box_x()), "content_y": float(box.content_box_y()),
        "content_w": float(box.width), "content_h": float(box.height),
    }


def galley_units(page: Any, tallest: float = float("inf")) -> list[tuple[float, float, int]]:
    """The units a page of running text can be cut between: every line box, and every table row (not cut inside
    unless it is taller than ``tallest``, the text box: then between the lines of its cells), as (top, bottom,
    flags) in CSS px from the page's top, in reading order, overlapping ones merged (a list item's marker and its
    first line are one unit; a tall row's cells' lines side by side).

    Walks ``Page._page_box`` and ``weasyprint.formatting_structure.boxes`` (internal); a change of shape there
    fails the layout loudly (the worker reports it) instead of cutting pages in the wrong places."""
    from weasyprint.formatting_structure import boxes

    raw: list[tuple[float, float, bool, int]] = []  # top, bottom, in a heading, the block the line belongs to

    def lines(box: Any) -> list[tuple[float, float]]:
        if isinstance(box, boxes.LineBox):
            return [(float(box.position_y), float(box.position_y) + float(box.margin_height()))]
        return [ln for child in getattr(box, "children", None) or () for ln in lines(child)]

    def walk(box: Any, parent: int, head: bool) -> None:
        if isinstance(box, boxes.TableRowBox) and box.margin_height() > tallest:
            raw.extend((top, bottom, head, -1) for top, bottom in sorted(lines(box)))
            return
        if isinstance(box, boxes.LineBox | boxes.TableRowBox):
            top = float(box.position_y)
            raw.append((top, top + float(box.margin_height()), head, parent if isinstance(box, boxes.LineBox) else -1))
            return
        for child in getattr(box, "children", None) or ():
            if isinstance(child, boxes.BlockBox):
                walk(child, id(child), head or child.element_tag in _HEADING_TAGS)
            else:
                walk(child, parent, head)

    walk(page._page_box, 0, False)
    lines_of: dict[int, int] = {}
    for _, _, _, parent in raw:
        lines_of[parent] = lines_of.get(parent, 0) + 1
    seen: dict[int, int] = {}
    out: list[tuple[float, float, int]] = []
    for top, bottom, head, parent in raw:
        k = seen.get(parent, 0)
        seen[parent] = k + 1
        flags = UNIT_HEAD if head else 0
        if parent != -1 and 0 < k and (k < 2 or lines_of[parent] - k < 2):
            flags |= UNIT_KEEP
        if out and top < out[-1][1] - 0.5:  # overlaps the previous unit: one unit
            ptop, pbottom, pflags = out[-1]
            out[-1] = (min(ptop, top), max(pbottom, bottom), pflags | (flags & UNIT_HEAD))
            continue
        out.append((top, bottom, flags))
    return out


# ---------------------------------------------------------------------------------------------------------------
# pydyf's content streams, as WeasyPrint 68-70 write them

_CTM = re.compile(rb"\A\s*1 0 0 -1 0 [-+.\d]+ cm\s+q\s+0\.75 0 0 0\.75 0 0 cm\s")
_TEXT = re.compile(rb"(?P<tm>(?:[-+.\d]+\s+){5}(?P<y>[-+.\d]+)\s+Tm)(?=\s)|(?P<show>\[[^\]]*\]\s*TJ|<[^>]*>\s*Tj)"
                   rb"|(?P<odd>\bT[dD*]\b|\bcm\b|\(|'|\")")


def page_contents(pdf: Any) -> list[bytes]:
    """Every page's content stream as it is written (before deflating), from the ``pydyf.PDF`` that WeasyPrint
    hands a ``write_pdf(finisher=...)``: ``PDF.page_references``, each page's ``Contents`` reference and
    ``Stream.stream`` are pydyf's, and pydyf joins a stream's items with ``\\n`` (``Stream.data``)."""
    import pydyf

    out = []
    for ref in pdf.page_references:
        page = pdf.objects[int(ref.split()[0])]
        stream = pdf.objects[int(page["Contents"].split()[0])]
        out.append(b"\n".join(pydyf._to_bytes(item) for item in stream.stream))
    return out


def text_runs(content: bytes) -> list[tuple[int, int, float]] | None:
    """Where a galley page's content stream shows text: (start, end, baseline y in CSS px from the page's top)
    of every ``TJ``/``Tj`` operation, in stream order. The composer removes those outside a page's slice, so that
    text clipped out of sight is not in the page either (copying, searching and screen readers would find it).

    WeasyPrint draws every run with an absolute ``1 0 0 -1 x y Tm`` in a space of CSS px (its page-wide ``cm``
    flips and scales once). Anything else (another ``cm``, a relative move, a literal string) returns None: the
    page then keeps all its text, clipped (never less than what shows)."""
    m = _CTM.match(content)
    if m is None:
        return None
    out: list[tuple[int, int, float]] = []
    y: float | None = None
    for t in _TEXT.finditer(content, m.end()):
        if t.group("odd") is not None:
            return None
        if t.group("tm") is not None:
            y = float(t.group("y"))
        elif y is None:
            return None
        else:
            out.append((t.start("show"), t.end("show"), y))
    return out
