"""Galleys cut into pages (orchestrator/typeset/galley.py): the page breaks' rules on made-up layouts, and the text
of a real PDF where its pages show it."""

from __future__ import annotations

import random
import re
from typing import Any

import pypdf
import pytest

from orchestrator.typeset import typeset
from orchestrator.typeset.compat import UNIT_HEAD, UNIT_KEEP
from orchestrator.typeset.galley import Item, batches, book_items, paginate, templates_digest
from orchestrator.typeset.html import parse_book

A5 = (419.5, 595.3)

LINE = 15.0
TEXT_H = 100.0  # a text box of six and two-thirds lines


def flow(n: int, lines: list[int], heading: bool = True, level: int = 4, lead: float = 10.0,
         trail: float = 4.0) -> tuple[Item, dict[str, Any]]:
    """A made-up flow item: an optional one-line heading, then paragraphs of ``lines`` lines each."""
    node_id = f"s{n}"
    units = []
    y = lead
    if heading:
        units.append((0, y, y + LINE, UNIT_HEAD))
        y += LINE + 3
    for count in lines:
        for k in range(count):
            keep = 0 < k and (k < 2 or count - k < 2)
            units.append((0, y, y + LINE, UNIT_KEEP if keep else 0))
            y += LINE
        y += 4
    item = Item(f"k{n}", "flow", level, node_id, f"T{n}", "body", heading)
    lay = {"out": f"doc{n}.pdf", "pages": [0], "units": units, "lead": lead, "trail": trail,
           "anchors": {node_id: (0, 0.0, lead, 100.0, lead + LINE)} if heading else {}}
    return item, lay


def part(n: int) -> tuple[Item, dict[str, Any]]:
    item = Item(f"p{n}", "page", 2, f"p{n}", f"P{n}", "")
    return item, {"out": f"part{n}.pdf", "pages": [0], "units": [], "lead": 0, "trail": 0,
                  "anchors": {f"p{n}": (0, 40.0, 200.0, 300.0, 230.0)}}


def test_lines_fill_pages_and_never_overflow():
    rng = random.Random(7)
    items = [flow(n, [rng.randint(1, 9) for _ in range(rng.randint(1, 4))]) for n in range(40)]
    pages, dest = paginate(items, TEXT_H)
    for p in pages:
        assert p.whole is None and p.slices
        for s in p.slices:
            assert s.dest_top >= 0
            assert s.dest_top + (s.bottom - s.top) <= TEXT_H + 4.0 + 1e-6  # an item's own trailing space may hang
    assert set(dest) == {f"s{n}" for n in range(40)}
    pages_of = [dest[f"s{n}"][0] for n in range(40)]
    assert pages_of == sorted(pages_of) and pages_of[-1] < len(pages)
    # nothing lost or shown twice: every unit lands on exactly one page
    units = sum(len(lay["units"]) for _, lay in items)
    on_pages = 0
    for n, (_, lay) in enumerate(items):
        for _, top, bottom, _ in lay["units"]:
            hits = [p for p in pages for s in p.slices if s.pdf == f"doc{n}.pdf" and s.top <= top and bottom <= s.bottom]
            assert len(hits) == 1
            on_pages += 1
    assert on_pages == units


def test_no_break_after_a_heading_nor_a_lone_line_of_a_paragraph():
    rng = random.Random(11)
    items = [flow(n, [rng.randint(1, 7) for _ in range(3)]) for n in range(60)]
    pages, _ = paginate(items, TEXT_H)
    by_doc = {lay["out"]: lay["units"] for _, lay in items}
    for p in pages[:-1]:
        last = p.slices[-1]
        units = by_doc[last.pdf]
        k = max(i for i, u in enumerate(units) if u[2] <= last.bottom + 1e-6)
        assert not units[k][3] & UNIT_HEAD, "a page ends with a heading"
        if k + 1 < len(units):
            assert not units[k + 1][3] & UNIT_KEEP, "a page break leaves a lone line of a paragraph"


def test_space_between_items_is_their_collapsed_margins():
    a, b = flow(1, [2], lead=10, trail=4), flow(2, [2], lead=10, trail=4)
    pages, _ = paginate([a, b], 1000)
    s1, s2 = pages[0].slices
    end_of_first = s1.dest_top + (s1.bottom - s1.top) - 4  # its last line's bottom (the trail hangs below)
    assert s2.dest_top - end_of_first == pytest.approx(10)  # max(trail 4, lead 10), not their sum


def test_a_part_opens_its_own_page_and_running_heads_follow_chapters():
    chap1 = flow(1, [3], level=3)
    sec = [flow(n, [5, 5]) for n in range(2, 6)]
    chap2 = flow(6, [3], level=3)
    items = [part(1), chap1, *sec, chap2, flow(7, [9, 9]), part(2), flow(8, [2])]
    pages, dest = paginate(items, TEXT_H, origin=(30.0, 40.0))
    assert pages[0].whole == ("part1.pdf", 0) and dest["p1"] == (0, 10.0, 160.0)  # page coordinates less origin
    second = dest["p2"][0]
    assert pages[second].whole == ("part2.pdf", 0)
    assert all(p.whole is None for i, p in enumerate(pages) if i not in (0, second))
    assert pages[1].head == "s1"  # the chapter that starts on the page
    c2 = dest["s6"][0]
    assert all(pages[i].head == "s1" for i in range(1, c2))
    assert pages[c2].head in ("s1", "s6") and all(pages[i].head == "s6" for i in range(c2 + 1, second))
    assert pages[second + 1].head is None  # no chapter in force after a part's title page


def test_keys_follow_content_and_templates(tmp_path):
    md = "# B\n\n## P\n\n### C\n\n#### S1\n\nOne.\n\n#### S2\n\nTwo.\n"
    d1 = templates_digest([str(tmp_path)])
    items = book_items(parse_book(md), d1)
    assert [(i.kind, i.id) for i in items] == [("page", "p1"), ("flow", "c1-1"), ("head", "c1-1"),
                                              ("flow", "s1-1-1"), ("flow", "s1-1-2")]
    again = book_items(parse_book(md.replace("Two.", "Two!")), d1)
    assert [a.key == b.key for a, b in zip(items, again, strict=True)] == [True, True, True, True, False]
    (tmp_path / "book.css").write_text("p { color: red }")
    assert all(a.key != b.key for a, b in zip(items, book_items(parse_book(md), templates_digest([str(tmp_path)])),
                                                 strict=True))
    assert [len(b) for b in batches(items * 40, workers=2)] == [25] * 8
    assert sum(len(b) for b in batches(items * 400, workers=2)) == 2000


# ---------------------------------------------------------------------------------------------------------------
# A real PDF: what a page shows is what its text holds


def test_each_page_holds_only_the_text_it_shows(tmp_path):
    """Every word of the book is in the PDF's text exactly once: a page cut from a galley shows part of it, and
    the lines it clips off (the neighbouring pages' lines) must not be in its text either."""
    n = 0

    def words(k: int) -> str:
        nonlocal n
        n += k
        return " ".join(f"w{i:05d}" for i in range(n - k, n))

    lines = ["# Every Word Once", ""]
    for p in range(1, 3):
        lines += [f"## Part {p}", ""]
        for c in range(1, 3):
            lines += [f"### Chapter {p}.{c}", ""]
            for s in range(1, 4):
                lines += [f"#### Section {p}.{c}.{s}", "", words(90), "", "- " + words(12), "- " + words(12), "",
                          "```python", *(f"x = '{words(3)}'" for _ in range(6)), "```", "", words(140),
                          f"[{words(2)}](https://example.org/{p}{c}{s}).", ""]
    # a table row taller than a page: cut between its cells' lines, nothing clipped away
    lines += ["| a | b |", "|---|---|", f"| {words(900)} | {words(40)} |", ""]
    info = typeset("\n".join(lines), tmp_path, formats=("pdf",), workers=2)
    reader = pypdf.PdfReader(str(info.pdf_path))
    assert info.pdf_pages == len(reader.pages) > 12
    text = " ".join(p.extract_text() for p in reader.pages)
    found: dict[str, int] = {}
    for w in re.findall(r"w\d{5}", text):
        found[w] = found.get(w, 0) + 1
    twice = sorted(w for w, k in found.items() if k > 1)
    missing = [f"w{i:05d}" for i in range(n) if f"w{i:05d}" not in found]
    assert not twice, f"{len(twice)} words on two pages, first {twice[:5]}"
    assert not missing, f"{len(missing)} words missing, first {missing[:5]}"
    # the links to the web come along, each on the page that shows its text
    uris = []
    for page in reader.pages:
        for a in page.get("/Annots") or []:
            a = a.get_object()
            if a.get("/Subtype") == "/Link" and "/A" in a:
                uris.append(str(a["/A"]["/URI"]))
                x1, y1, x2, y2 = (float(v) for v in a["/Rect"])
                assert 0 <= x1 < x2 <= A5[0] and 0 <= y1 < y2 <= A5[1]
    assert sorted(uris) == sorted(f"https://example.org/{p}{c}{s}" for p in (1, 2) for c in (1, 2)
                                  for s in (1, 2, 3))
