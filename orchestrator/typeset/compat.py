"""Every use of a private or undocumented part of pypdf, WeasyPrint and pydyf, in one place.

Checked against (each function's library source read, and tests/test_typeset.py run with each version):

    WeasyPrint 68.0, 69.0, 70.0     pyproject pins weasyprint>=68,<71
    pypdf      7.0.0, 7.1.1         pyproject pins pypdf>=7,<8
    pydyf      0.13.0               WeasyPrint's PDF writer (WeasyPrint 68-70 ask for pydyf>=0.11)

Before widening a pin, re-read the library's source at the new version for each function below. Each one imports
its library when called: the parent process, which only merges, must never import WeasyPrint.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pypdf import PdfWriter
    from pypdf.generic import IndirectObject, PdfObject

__all__ = ["add_object", "anchor_boxes", "cap_pdf_compression", "toc_lines"]

# ---------------------------------------------------------------------------------------------------------------
# pypdf


def add_object(writer: PdfWriter, obj: PdfObject) -> IndirectObject:
    """Make ``obj`` an indirect object of ``writer`` and return its reference.

    Streams (a font file, a page's extra content) must be indirect objects, and pypdf 7 has no public call that
    adds one: ``PdfWriter._add_object`` is what its own page, outline and metadata code uses.
    """
    return writer._add_object(obj)


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
