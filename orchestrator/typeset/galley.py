"""Galleys: the book's running text laid out one piece at a time, then cut into pages here, in the parent.

Why (issue 16, measured in benchmarks/pdf_ready.py): a part, or a chapter, is whole only when its last section
is in, and on a fleet that writes every section at once the last sections of nearly every part end in the last
seconds, so laying out parts while writing leaves ~70% of the layout for after the last section. A section's
*lines* do not depend on where its page breaks fall, only its pages do. So

1. every piece of the book (a chapter's heading, a section, a part's title page, a chapter's running head) is an
   :class:`Item`, laid out by a worker on a page of its own: a galley as wide as the book's text and as tall as
   it needs (typeset/worker.py). The worker reports each line (and table row) of it: its top and bottom, whether
   it is a heading line, and whether a page break before it would leave a lone line of a paragraph (orphans and
   widows of 2, as CSS has them). An item's layout depends only on its own content and the templates: its
   :attr:`Item.key`. Items can be laid out in any batch, at any time: typesetting while writing lays out each
   section as it lands (typeset/background.py);
2. :func:`paginate` cuts the running text into pages, greedily: as many lines as fit the page's text box, the
   break put before the last line that allows one (never right after a heading line, never leaving one line of
   a paragraph alone); the space between two items is their collapsed margins, as in one flow; a part's title
   page is a page of its own. No layout happens here, so it costs milliseconds for a 1,500-page book;
3. the composer (typeset/compose.py) draws each page from slices of the galleys (PDF form XObjects, clipped) and
   the chapter's running head; the merge numbers the pages (typeset/merge.py).

The same items in the same order give the same pages, whichever process laid them out and when: that is what
makes the PDF made while writing identical to the one made after the job.
"""

from __future__ import annotations

import hashlib
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .compat import UNIT_HEAD, UNIT_KEEP
from .html import Node

__all__ = [
    "GALLEY_HEIGHT_PX", "Item", "OutPage", "Slice", "batches", "book_items", "item_for_node", "paginate",
    "templates_digest",
]

GALLEY_HEIGHT_PX = 30_000.0  # a galley page: ~45 pages of A5 text; a longer item continues on the next one

KINDS = ("flow", "page", "head")


@dataclass(frozen=True)
class Item:
    """One piece of the book, laid out on its own. ``kind``: "flow" (running text: a heading with its body, or a
    part's body), "page" (a part's title page: a page of its own, as laid out) or "head" (a chapter's running
    head). ``key``: what its layout depends on (its content and the templates on disk)."""

    key: str
    kind: str
    level: int
    id: str  # the node's id ("" for a part's body); a running head: the chapter's id
    title: str
    body: str
    heading: bool = True  # "flow": the item starts with its node's heading
    cost: int = 0

    def job(self) -> dict[str, Any]:
        return {"key": self.key, "kind": self.kind, "level": self.level, "id": self.id, "title": self.title,
                "body": self.body, "heading": self.heading}


def templates_digest(template_dirs: list[str]) -> bytes:
    """The template files as they are on disk now (name, mtime, size): a layout made with others is not reused."""
    h = hashlib.blake2b(digest_size=16)
    for d in template_dirs:
        h.update(f"{d}\0".encode())
        for f in sorted(Path(d).glob("*")):
            if f.is_file():
                st = f.stat()
                h.update(f"{f.name}\0{st.st_mtime_ns}\0{st.st_size}\0".encode())
    return h.digest()


def _item(kind: str, level: int, node_id: str, title: str, body: str, heading: bool, digest: bytes) -> Item:
    h = hashlib.blake2b(pickle.dumps((kind, level, node_id, title, body, heading)), digest_size=16, key=digest)
    return Item(h.hexdigest(), kind, level, node_id, title, body, heading, len(title) + len(body))


def item_for_node(n: Node, digest: bytes) -> list[Item]:
    """A node's items (its children are not included): a part is its title page, then its body's text if it has
    any; a chapter or a section is its heading and body; a chapter also has its running head (last)."""
    if n.level == 2:
        out = [_item("page", 2, n.id, n.title, "", True, digest)]
        if n.body.strip():
            out.append(_item("flow", 2, "", "", n.body, False, digest))
        return out
    out = [_item("flow", n.level, n.id, n.title, n.body, True, digest)]
    if n.level == 3:
        out.append(_item("head", 3, n.id, n.title, "", False, digest))
    return out


def book_items(root: Node, digest: bytes) -> list[Item]:
    """Every item of the book's body, in reading order (a chapter's running head right after its heading)."""
    return [it for n in root.walk() if n.level > 1 for it in item_for_node(n, digest)]


def batches(items: list[Item], workers: int, most: int = 128, least: int = 16) -> list[list[Item]]:
    """Items in layout documents: at least ``least`` and at most ``most`` items each (a document costs ~66 ms
    of fixed layout work, an item ~29 ms), and about four per worker so that no worker idles at the end."""
    if not items:
        return []
    size = max(least, min(most, -(-len(items) // max(1, workers * 4))))
    return [items[i:i + size] for i in range(0, len(items), size)]


# ---------------------------------------------------------------------------------------------------------------
# Pagination


@dataclass(frozen=True)
class Slice:
    """Lines ``top``..``bottom`` (CSS px) of galley page ``page`` of the PDF ``pdf``, drawn from ``dest_top`` px
    below the top of the page's text box."""

    pdf: str
    page: int
    top: float
    bottom: float
    dest_top: float


@dataclass(frozen=True)
class OutPage:
    """One page of the book's body: a whole laid-out page (``whole``: pdf, page) or slices of running text, and the
    id of the chapter whose running head it carries (None: none)."""

    whole: tuple[str, int] | None
    slices: tuple[Slice, ...]
    head: str | None


@dataclass
class _Unit:
    vtop: float  # in the running text's own coordinate (items one after the other)
    vbottom: float
    flags: int
    pdf: str
    page: int
    top: float
    bottom: float
    item: int
    last_of_item: bool
    trail: float = 0.0  # space after the item's last unit that belongs to it (a code block's padding)


def paginate(items: list[tuple[Item, dict[str, Any]]], text_height: float, origin: tuple[float, float] = (0.0, 0.0),
             ) -> tuple[list[OutPage], dict[str, tuple[int, float, float]]]:
    """Cut the items (with their layouts, in reading order) into pages whose text box is ``text_height`` px tall
    and starts at ``origin`` (px from the page's top-left). Returns the pages and, for every anchor of the items,
    (page index, x, y) in px from the text box's top-left."""
    pages: list[OutPage] = []
    dest: dict[str, tuple[int, float, float]] = {}
    units: list[_Unit] = []
    anchors: list[tuple[str, int, int, float, float]] = []  # id, item, galley page, x, y
    whole_anchors: list[tuple[str, int, float, float]] = []
    chapters: set[str] = set()  # the chapters' ids, for running heads
    prev_trail: float | None = None

    def flush() -> None:
        nonlocal units, anchors, chapters
        if units:
            _cut(units, anchors, chapters, text_height, pages, dest)
        units, anchors, chapters = [], [], set()

    for idx, (item, lay) in enumerate(items):
        if item.kind == "head":
            continue
        if item.kind == "page":
            flush()
            prev_trail = None
            whole_anchors += _whole_pages(lay, pages)
            continue
        if not lay["units"]:
            continue
        _append_units(units, idx, lay, prev_trail)
        prev_trail = lay["trail"]
        for name, (g, x1, y1, _x2, _y2) in lay["anchors"].items():
            anchors.append((name, idx, g, x1, y1))
        if item.level == 3 and item.heading:
            chapters.add(item.id)
    flush()
    for name, page, x, y in whole_anchors:
        dest[name] = (page, x - origin[0], y - origin[1])
    return pages, dest


def _whole_pages(lay: dict[str, Any], pages: list[OutPage]) -> list[tuple[str, int, float, float]]:
    """Append a part's title page(s), as laid out; returns its anchors (id, book page, x, y)."""
    start = len(pages)
    for g in lay["pages"]:
        pages.append(OutPage((lay["out"], g), (), None))
    return [(name, start + lay["pages"].index(g), x1, y1) for name, (g, x1, y1, _x2, _y2) in lay["anchors"].items()]


def _append_units(units: list[_Unit], idx: int, lay: dict[str, Any], prev_trail: float | None) -> None:
    """Append item ``idx``'s units to the running text, after the collapsed margins between it and the last."""
    own = lay["units"]
    gap = lay["lead"] if prev_trail is None else max(prev_trail, lay["lead"])
    offset = units[-1].vbottom + gap if units else 0.0
    prev: _Unit | None = None
    for n, (g, top, bottom, flags) in enumerate(own):
        if prev is None:
            vtop = offset
        elif g == prev.page:
            vtop = prev.vtop + (top - prev.top)
        else:  # the item goes on over a second galley page: its text continues without a gap
            vtop = prev.vbottom
        prev = _Unit(vtop, vtop + (bottom - top), flags, lay["out"], g, top, bottom, idx, n == len(own) - 1)
        units.append(prev)
    units[-1].trail = max(0.0, lay["trail"])


def _cut(units: list[_Unit], anchors: list[tuple[str, int, int, float, float]], chapters: set[str],
         text_height: float, pages: list[OutPage], dest: dict[str, tuple[int, float, float]]) -> None:
    """Greedy page breaks over one run of running text; appends its pages and its anchors' destinations."""
    first_page = len(pages)
    on_page, dest_top, count = _breaks(units, text_height)
    per_page = _slices(units, on_page, dest_top, count)
    starts = _land_anchors(units, anchors, on_page, dest_top, first_page, dest)
    # running heads: the chapter that starts on the page (the first, if several), else the one in force
    current: str | None = None
    for p in range(count):
        here = [name for name in starts.get(p, []) if name in chapters]
        head = min(here, key=lambda c: dest[c][2]) if here else current
        if here:
            current = max(here, key=lambda c: dest[c][2])
        pages.append(OutPage(None, tuple(per_page[p]), head))


def _breaks(units: list[_Unit], text_height: float) -> tuple[list[int], list[float], int]:
    """The greedy page breaks: each unit's page (from 0), its top below the page's text box top, and the pages."""
    on_page: list[int] = []  # the page of each unit
    dest_top: list[float] = []
    count = 0
    i, n = 0, len(units)
    while i < n:
        y0 = units[i].vtop
        j = i
        best = None
        while j < n and (units[j].vbottom - y0 <= text_height or j == i):
            if j + 1 < n and _breakable(units[j], units[j + 1]):
                best = j
            j += 1
        if j >= n:
            best = n - 1
        elif best is None:  # nothing allows a break within the page: cut where it is full
            best = max(i, j - 1)
        for k in range(i, best + 1):
            on_page.append(count)
            dest_top.append(units[k].vtop - y0)
        count += 1
        i = best + 1
    return on_page, dest_top, count


def _slices(units: list[_Unit], on_page: list[int], dest_top: list[float], count: int) -> list[list[Slice]]:
    """Each page's slices: consecutive units of one page from the same galley page are one slice."""
    per_page: list[list[Slice]] = [[] for _ in range(count)]
    k, n = 0, len(units)
    while k < n:
        p = on_page[k]
        start = k
        while (k + 1 < n and on_page[k + 1] == p and units[k + 1].item == units[start].item
               and units[k + 1].page == units[start].page):
            k += 1
        u0, u1 = units[start], units[k]
        bottom = u1.bottom + (u1.trail if u1.last_of_item else 0.0)
        per_page[p].append(Slice(u0.pdf, u0.page, u0.top, bottom, dest_top[start]))
        k += 1
    return per_page


def _land_anchors(units: list[_Unit], anchors: list[tuple[str, int, int, float, float]], on_page: list[int],
                  dest_top: list[float], first_page: int, dest: dict[str, tuple[int, float, float]],
                  ) -> dict[int, list[str]]:
    """Where each anchor lands (into ``dest``): on the first unit that ends below it. Returns the anchors that
    land on each page (from 0)."""
    by_item: dict[int, list[int]] = {}
    for k, u in enumerate(units):
        by_item.setdefault(u.item, []).append(k)
    starts: dict[int, list[str]] = {}
    for name, item, g, x, y in anchors:
        ks = by_item.get(item)
        if not ks:
            continue
        k = next((k for k in ks if units[k].page == g and units[k].bottom > y), ks[-1])
        u = units[k]
        page = first_page + on_page[k]
        dest[name] = (page, x, max(0.0, dest_top[k] + (y - u.top)))
        starts.setdefault(on_page[k], []).append(name)
    return starts


def _breakable(before: _Unit, after: _Unit) -> bool:
    """A page break between these two units is allowed (not right after a heading line, not orphaning a line)."""
    return not (before.flags & UNIT_HEAD) and not (after.flags & UNIT_KEEP and after.item == before.item)
