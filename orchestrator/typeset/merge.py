"""The merge: the chunk PDFs become one book with global page numbers, a numbered and linked contents, bookmarks.

No layout happens here. Every number is stamped onto the finished pages in a tiny embedded subset of the digits
of the body font (DejaVu Sans, as fontconfig finds it, else Helvetica), at the place the workers measured: the
footer of every page but the title page, and the right end of each contents entry's first line.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import threading
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any

from pypdf import PageObject, PdfReader, PdfWriter
from pypdf.generic import (
    ArrayObject,
    DecodedStreamObject,
    DictionaryObject,
    Fit,
    FloatObject,
    IndirectObject,
    NameObject,
    NullObject,
    NumberObject,
)

from ..core.osutil import atomic_path
from .compat import add_object
from .html import Node, plain_text, render_inline

__all__ = ["PX_TO_PT", "Destination", "Merger"]

PX_TO_PT = 0.75  # WeasyPrint's CSS px -> PDF pt

# Footer number: centred, this far above the bottom edge (pt), this size (pt), this grey.
FOOTER_BASELINE_PT = 8.5 * 72 / 25.4
FOOTER_SIZE_PT = 7.0
FOOTER_GREY = 0.35

# (page index, x, y): where a heading starts, in pt from the page's bottom-left
Destination = tuple[int, float, float]

# ---------------------------------------------------------------------------------------------------------------
# The digits font


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


@dataclass(frozen=True)
class _DigitFont:
    ref: IndirectObject
    widths: tuple[float, ...]  # '0'..'9' in 1/1000 em

    def width(self, text: str, size: float) -> float:
        return sum(self.widths[ord(c) - 48] for c in text) / 1000 * size


@dataclass(frozen=True)
class _DigitData:
    name: str
    data: bytes | None  # a TrueType subset with the digits, or None for Helvetica
    widths: tuple[float, ...]  # '0'..'9' in 1/1000 em
    bbox: tuple[float, ...] = (0, 0, 0, 0)
    ascent: float = 718.0
    descent: float = -207.0


def _digit_data(pattern: str) -> _DigitData:
    """The digits of the font fontconfig gives for ``pattern`` as a tiny TrueType subset (pure: no PDF objects)."""
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


def _embed_digits(writer: PdfWriter, d: _DigitData, tag: str) -> _DigitFont:
    if d.data is None:
        fontdict = DictionaryObject({
            NameObject("/Type"): NameObject("/Font"),
            NameObject("/Subtype"): NameObject("/Type1"),
            NameObject("/BaseFont"): NameObject("/" + d.name),
            NameObject("/Encoding"): NameObject("/WinAnsiEncoding"),
        })
        return _DigitFont(add_object(writer, fontdict), d.widths)
    ff = DecodedStreamObject()
    ff.set_data(d.data)
    ff[NameObject("/Length1")] = NumberObject(len(d.data))
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
        NameObject("/FontFile2"): add_object(writer, ff.flate_encode()),
    })
    fontdict = DictionaryObject({
        NameObject("/Type"): NameObject("/Font"),
        NameObject("/Subtype"): NameObject("/TrueType"),
        NameObject("/BaseFont"): base,
        NameObject("/FirstChar"): NumberObject(48),
        NameObject("/LastChar"): NumberObject(57),
        NameObject("/Widths"): ArrayObject([FloatObject(w) for w in d.widths]),
        NameObject("/Encoding"): NameObject("/WinAnsiEncoding"),
        NameObject("/FontDescriptor"): add_object(writer, descriptor),
    })
    return _DigitFont(add_object(writer, fontdict), d.widths)


# ---------------------------------------------------------------------------------------------------------------
# The merge


class Merger:
    """Holds the book being written: the front matter's pages (:meth:`add`), then the body's (typeset/compose.py);
    then numbers, links and writes it."""

    def __init__(self, writer: PdfWriter | None = None) -> None:
        self.writer = writer if writer is not None else PdfWriter()
        self.counts: dict[int, int] = {}
        self._digits: dict[str, _DigitData] = {}
        self._fonts_thread = threading.Thread(target=self._prepare_fonts, daemon=True)
        self._fonts_thread.start()

    def _prepare_fonts(self) -> None:
        for key, pattern in (("R", "DejaVu Sans"), ("B", "DejaVu Sans:bold")):
            self._digits[key] = _digit_data(pattern)

    @property
    def pages(self) -> int:
        """Pages read so far, from every chunk added."""
        return sum(self.counts.values())

    def add(self, index: int, pdf_path: str) -> None:
        """Put chunk ``index``'s pages after those of every lower-numbered chunk already added."""
        pos = sum(n for i, n in self.counts.items() if i < index)
        reader = PdfReader(pdf_path)
        n = 0
        for n, page in enumerate(reader.pages, start=1):
            self.writer.insert_page(page, pos + n - 1)
        self.counts[index] = n

    def finish(self, front: dict[str, Any], dest: dict[str, Destination], out_pdf: Path, root: Node,
               title: str) -> int:
        """Stamp the footers and the contents' numbers, link the contents, add the bookmarks, write ``out_pdf``
        (atomically); return its page count. ``front``: the front matter's layout report; ``dest``: where each
        heading is in the book (typeset/compose.py)."""
        self._fonts_thread.join()
        fonts = {k: _embed_digits(self.writer, self._digits[k], f"HBDGT{k}") for k in ("R", "B")}
        pages = list(self.writer.pages)  # indexing writer.pages re-counts the page tree each time
        stamps: dict[int, list[str]] = {}
        _footers(pages, fonts["R"], stamps)
        _contents(self.writer, pages, front, dest, fonts, stamps)
        _apply_stamps(self.writer, pages, fonts, stamps)
        _bookmarks(self.writer, pages, front, dest, root)
        self.writer.add_metadata({"/Title": title, "/Producer": "handbook (WeasyPrint + pypdf)"})
        self.writer.page_mode = "/UseOutlines"
        with atomic_path(out_pdf) as tmp_out, open(tmp_out, "wb") as fh:  # a full disk leaves the old book.pdf
            self.writer.write(fh)
        return len(pages)


def _stamp(stamps: dict[int, list[str]], page: int, font: str, size: float, x: float, y: float, text: str,
           grey: float) -> None:
    stamps.setdefault(page, []).append(f"BT {grey} g /HBNum{font} {size:.2f} Tf {x:.2f} {y:.2f} Td ({text}) Tj ET")


def _footers(pages: list[PageObject], font: _DigitFont, stamps: dict[int, list[str]]) -> None:
    """Every page but the title page: its number, centred in the footer."""
    for i in range(1, len(pages)):
        box = pages[i].mediabox
        label = str(i + 1)
        x = float(box.left) + (float(box.width) - font.width(label, FOOTER_SIZE_PT)) / 2
        _stamp(stamps, i, "R", FOOTER_SIZE_PT, x, float(box.bottom) + FOOTER_BASELINE_PT, label, FOOTER_GREY)


def _contents(writer: PdfWriter, pages: list[PageObject], front: dict[str, Any], dest: dict[str, Destination],
              fonts: dict[str, _DigitFont], stamps: dict[int, list[str]]) -> None:
    """Each contents entry: its heading's page number, right-aligned on its first line, and a link over it.

    The link is built here rather than with ``writer.add_annotation(..., Link(target_page_index=...))``, which
    counts the page tree again for every call (0.3 s for a 1,500-page book's 1,640 entries)."""
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
        key = "B" if bold else "R"
        size = size_px * PX_TO_PT
        _stamp(stamps, page, key, size, x2 * PX_TO_PT - fonts[key].width(label, size),
               (h_px - baseline_px) * PX_TO_PT, label, 0)
        rect = (x1 * PX_TO_PT, (h_px - y2) * PX_TO_PT, x2 * PX_TO_PT, (h_px - y1) * PX_TO_PT)
        on = pages[page]
        link = add_object(writer, DictionaryObject({
            NameObject("/Type"): NameObject("/Annot"),
            NameObject("/Subtype"): NameObject("/Link"),
            NameObject("/Rect"): ArrayObject([FloatObject(v) for v in rect]),
            NameObject("/Border"): ArrayObject([NumberObject(0), NumberObject(0), NumberObject(0)]),
            NameObject("/Dest"): ArrayObject([pages[target[0]].indirect_reference, NameObject("/XYZ"),
                                              FloatObject(target[1]), FloatObject(target[2]), NullObject()]),
            NameObject("/P"): on.indirect_reference,
        }))
        annots = on.get("/Annots")
        if annots is None:
            on[NameObject("/Annots")] = ArrayObject([link])
        else:
            annots.get_object().append(link)


def _stream(writer: PdfWriter, data: bytes) -> IndirectObject:
    s = DecodedStreamObject()
    s.set_data(data)
    return add_object(writer, s)


def _apply_stamps(writer: PdfWriter, pages: list[PageObject], fonts: dict[str, _DigitFont],
                  stamps: dict[int, list[str]]) -> None:
    """The stamps go after each page's own content, wrapped so its graphics state cannot leak into them."""
    q_ref = _stream(writer, b"q\n")
    end_q_ref = _stream(writer, b"\nQ\n")
    font_names = {NameObject(f"/HBNum{k}"): f.ref for k, f in fonts.items()}
    for i, ops in stamps.items():
        page = pages[i]
        contents = page.get("/Contents")
        if contents is None:
            arr: list[Any] = []
        else:
            obj = contents.get_object()
            arr = list(obj) if isinstance(obj, ArrayObject) else [contents]
        ours = _stream(writer, ("\n".join(ops) + "\n").encode("ascii"))
        page[NameObject("/Contents")] = ArrayObject([q_ref, *arr, end_q_ref, ours])
        _subdict(_subdict(page, "/Resources"), "/Font").update(font_names)


def _subdict(d: DictionaryObject, key: str) -> DictionaryObject:
    """``d[key]`` (resolved if indirect), made an empty dictionary first if missing."""
    value = d.get(key)
    value = value.get_object() if value is not None else None
    if not isinstance(value, DictionaryObject):
        value = DictionaryObject()
        d[NameObject(key)] = value
    return value


def _bookmarks(writer: PdfWriter, pages: list[PageObject], front: dict[str, Any], dest: dict[str, Destination],
               root: Node) -> None:
    """Contents, then parts > chapters > sections (a heading that never landed is skipped, its children kept)."""
    toc_page = next((v[0] for k, v in front["anchors"].items() if k.startswith("toc-")), None)
    if toc_page is not None:
        writer.add_outline_item(title="Contents", page_number=pages[toc_page])

    def add(nodes: list[Node], parent: IndirectObject | None) -> None:
        for n in nodes:
            d = dest.get(n.id)
            if d is None:
                add(n.children, parent)
                continue
            item = writer.add_outline_item(
                title=plain_text(render_inline(n.title)), page_number=pages[d[0]], parent=parent,
                fit=Fit.xyz(left=d[1], top=d[2]), is_open=n.level < 3,
            )
            add(n.children, item)

    add(root.children, None)
