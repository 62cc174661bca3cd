"""How a finished book reads: the quality checker of issue 12, over one or more job output directories.

    .venv/bin/python benchmarks/book_quality.py OUT_DIR [OUT_DIR ...]          # a table per out dir
    .venv/bin/python benchmarks/book_quality.py OUT_DIR --json                  # {out_dir: report} as JSON

An out dir is what a job writes (book.md, outline.json, stats.json, defects.json, journal.sqlite). Checked:

- outline titles that are debris (:func:`orchestrator.repair.title_debris`, or the planner's own
  :func:`orchestrator.planning.weak_title`): prompt words echoed back, markup and JSON fragments, numbering, dates,
  file names, copies of a parent's or the book's title, over-long lines, repeats under one parent; and titles
  that repeat an earlier title anywhere in the outline (reported apart: the reference run itself repeats 46 of
  its 1,536 section titles across chapters, so they are a defect to count, not debris);
- sections caught in a repetition loop (:func:`orchestrator.repair.loop_reason`) in their raw text, as the
  journal holds it (table ``nodes``, kind 'section'), else as book.md prints it;
- sections ending mid-sentence in book.md: the last line of a ``####`` section is prose that does not end with
  ``. ! ? : …`` (closing quotes, brackets or emphasis after them allowed), or a heading, or code left open; a
  closed code fence, a list item or a table row is a complete ending;
- planning requests per planning node: stats.json ``planning_requests`` / (1 + parts + parts x chapters);
- ``whole_job_s`` from stats.json.
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.book.checks import loop_reason, title_debris
from orchestrator.book.checks import norm_title as norm
from orchestrator.book.fences import FENCE_OPEN, closes
from orchestrator.planning import weak_title

EXAMPLES = 5  # examples shown per check


@dataclass(frozen=True)
class Title:
    level: str  # book, part, chapter, section
    title: str
    ancestors: tuple[str, ...]
    siblings: tuple[str, ...]  # earlier titles under the same parent


def outline_titles(outline: dict[str, Any]) -> list[Title]:
    """Every title of outline.json in reading order, with what is above it and before it."""
    book = outline.get("title") or ""
    out = [Title("book", book, (), ())]
    parts = outline.get("parts") or []
    part_titles = [p.get("title", "") for p in parts]
    for pi, part in enumerate(parts):
        out.append(Title("part", part_titles[pi], (book,), tuple(part_titles[:pi])))
        chapters = part.get("chapters") or []
        chapter_titles = [c.get("title", "") for c in chapters]
        for ci, chapter in enumerate(chapters):
            out.append(Title("chapter", chapter_titles[ci], (book, part_titles[pi]), tuple(chapter_titles[:ci])))
            sections = list(chapter.get("sections") or [])
            for si, section in enumerate(sections):
                out.append(Title("section", section, (book, part_titles[pi], chapter_titles[ci]),
                                 tuple(sections[:si])))
    return out


def debris_reason(t: Title) -> str | None:
    why = title_debris(t.title, t.ancestors, t.siblings)
    if why is None:
        why = weak_title(t.title, frozenset(norm(a) for a in t.ancestors))
    return why


def title_report(outline: dict[str, Any]) -> dict[str, Any]:
    titles = outline_titles(outline)
    debris = {i: why for i, t in enumerate(titles) if (why := debris_reason(t)) is not None}
    seen: set[str] = set()
    duplicates: list[int] = []
    for i, t in enumerate(titles):
        k = norm(t.title)
        if k in seen:
            duplicates.append(i)
        seen.add(k)
    flagged = set(debris) | set(duplicates)
    n = len(titles)
    return {
        "titles": n,
        "debris": _count(len(debris), n),
        "duplicates": _count(len(duplicates), n),
        "debris_or_duplicate": _count(len(flagged), n),
        "debris_examples": [{"level": titles[i].level, "title": titles[i].title, "why": why}
                            for i, why in list(debris.items())[:EXAMPLES]],
        "duplicate_examples": [{"level": titles[i].level, "title": titles[i].title}
                               for i in duplicates[:EXAMPLES]],
    }


def _count(k: int, n: int) -> dict[str, Any]:
    return {"count": k, "of": n, "share": round(k / n, 4) if n else 0.0}


# ---------------------------------------------------------------------------------------------------------------
# book.md

_BOOK_HEADING = re.compile(r"^(#{1,4})\s+(.*?)\s*$")  # a section's own headings are demoted to 5 and 6
_MISSING = "> **This section is missing**"
_LIST_ITEM = re.compile(r"^\s*(?:[-*+•]|\d+[.)])\s+\S")
_ATX = re.compile(r"^\s{0,3}#{1,6}(?:\s|$)")
_TRAILING = "*_` \t\"'”’»)]"


def book_sections(markdown: str) -> list[tuple[str, str]]:
    """(title, body) of every ``####`` section of book.md, in order; headings inside code fences are code."""
    out: list[tuple[str, list[str]]] = []
    fence: str | None = None
    for line in markdown.splitlines():
        if fence is not None:
            if closes(line, fence):
                fence = None
        elif m := FENCE_OPEN.match(line):
            fence = m.group(2)
        elif h := _BOOK_HEADING.match(line):
            # a section starts at its #### heading; a part's or chapter's heading ends the section before it
            out.append((h.group(2) if len(h.group(1)) == 4 else "", []))
            continue
        if out:
            out[-1][1].append(line)
    return [(title, "\n".join(body).strip()) for title, body in out if title]


def ending(body: str) -> tuple[bool, str]:
    """(ends cleanly, last line) of one printed section, by the rule in the module docstring."""
    fence: str | None = None
    last = ""
    closed_fence = False
    for line in body.splitlines():
        if fence is not None:
            if closes(line, fence):
                fence, closed_fence, last = None, True, line.strip()
            elif line.strip():
                last = line.strip()
            continue
        if m := FENCE_OPEN.match(line):
            fence, closed_fence, last = m.group(2), False, line.strip()
        elif line.strip():
            closed_fence, last = False, line.strip()
    if fence is not None:
        return False, last
    if closed_fence or _LIST_ITEM.match(last) or (last.startswith("|") and last.endswith("|")):
        return True, last
    if _ATX.match(last):
        return False, last
    core = last.rstrip(_TRAILING)
    return bool(core) and core[-1] in ".!?:…", last


def ending_report(markdown: str) -> dict[str, Any]:
    sections = [(t, b) for t, b in book_sections(markdown) if not b.startswith(_MISSING)]
    bad = []
    for title, body in sections:
        ok, last = ending(body)
        if not ok:
            bad.append((title, last))
    return {**_count(len(bad), len(sections)),
            "examples": [{"title": t, "last_line": last[-100:]} for t, last in bad[:EXAMPLES]]}


# ---------------------------------------------------------------------------------------------------------------
# raw section texts and loops


def raw_sections(out: Path, outline: dict[str, Any], markdown: str | None) -> tuple[str, list[tuple[str, str]]]:
    """(source, [(title, raw text)]): the journal's section nodes written for the outline's titles, else book.md."""
    wanted = {}
    for pi, part in enumerate(outline.get("parts") or [], 1):
        for ci, chapter in enumerate(part.get("chapters") or [], 1):
            for si, section in enumerate(chapter.get("sections") or [], 1):
                wanted[f"{pi}.{ci}.{si}"] = section
    journal = out / "journal.sqlite"
    if journal.exists():
        try:
            con = sqlite3.connect(f"file:{journal}?mode=ro", uri=True)
            try:
                rows = con.execute("SELECT path, title, text FROM nodes WHERE kind = 'section'").fetchall()
            finally:
                con.close()
            texts = [(title, text) for path, title, text in rows if wanted.get(path) == title]
            if texts:
                return "journal", texts
        except sqlite3.Error:
            pass
    if markdown is None:
        return "none", []
    return "book.md", [(t, b) for t, b in book_sections(markdown) if not b.startswith(_MISSING)]


def loop_report(source: str, texts: list[tuple[str, str]]) -> dict[str, Any]:
    looping = [(t, why) for t, text in texts if (why := loop_reason(text)) is not None]
    return {**_count(len(looping), len(texts)), "source": source,
            "examples": [{"title": t, "reason": why} for t, why in looping[:EXAMPLES]]}


# ---------------------------------------------------------------------------------------------------------------


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def check(out: Path) -> dict[str, Any]:
    outline = _read_json(out / "outline.json")
    if not isinstance(outline, dict):
        raise SystemExit(f"book_quality: {out}: no readable outline.json")
    stats = _read_json(out / "stats.json") or {}
    book = out / "book.md"
    markdown = book.read_text(encoding="utf-8") if book.exists() else None
    parts = outline.get("parts") or []
    planning_nodes = 1 + len(parts) + sum(len(p.get("chapters") or []) for p in parts)
    planning_requests = stats.get("planning_requests")
    source, texts = raw_sections(out, outline, markdown)
    return {
        "titles": title_report(outline),
        "looping_sections": loop_report(source, texts),
        "mid_sentence_endings": ending_report(markdown) if markdown is not None else None,
        "planning": {"requests": planning_requests, "nodes": planning_nodes,
                     "per_node": round(planning_requests / planning_nodes, 3)
                     if isinstance(planning_requests, int) and planning_nodes else None},
        "whole_job_s": stats.get("whole_job_s"),
    }


def _pct(c: dict[str, Any]) -> str:
    return f"{c['count']:,} of {c['of']:,} ({c['share']:.1%})"


def table(out: str, r: dict[str, Any]) -> str:
    t, lp, me, pl = r["titles"], r["looping_sections"], r["mid_sentence_endings"], r["planning"]
    rows = [
        ("outline titles", f"{t['titles']:,}"),
        ("debris titles", _pct(t["debris"])),
        ("duplicate titles (repeat an earlier one)", _pct(t["duplicates"])),
        ("debris or duplicate", _pct(t["debris_or_duplicate"])),
        (f"looping sections (raw text from {lp['source']})", _pct(lp)),
        ("sections ending mid-sentence in book.md", _pct(me) if me else "no book.md"),
        ("planning requests per planning node",
         f"{pl['per_node']:.2f} ({pl['requests']:,} / {pl['nodes']:,})" if pl["per_node"] is not None
         else f"n/a ({pl['nodes']:,} nodes; no planning_requests in stats.json)"),
        ("whole_job_s", f"{r['whole_job_s']:,.1f}" if isinstance(r["whole_job_s"], (int, float)) else "n/a"),
    ]
    width = max(len(a) for a, _ in rows)
    lines = [f"== {out}", f"{'check':<{width}}  value", f"{'-' * width}  {'-' * 24}"]
    lines += [f"{a:<{width}}  {b}" for a, b in rows]
    examples = ([f"  debris ({e['level']}): {e['why']}" for e in t["debris_examples"]]
                + [f"  duplicate ({e['level']}): {e['title']!r}" for e in t["duplicate_examples"]]
                + [f"  loop: {e['title']!r}: {e['reason']}" for e in lp["examples"]]
                + ([f"  mid-sentence: {e['title']!r} ends {e['last_line']!r}" for e in me["examples"]] if me else []))
    if examples:
        lines += ["examples:", *examples]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dirs", nargs="+", metavar="OUT_DIR", help="a job's output directory")
    ap.add_argument("--json", action="store_true", help="print {out_dir: report} as JSON")
    args = ap.parse_args(argv)
    reports = {d: check(Path(d)) for d in args.out_dirs}
    if args.json:
        print(json.dumps(reports, indent=2, ensure_ascii=False))
    else:
        print("\n\n".join(table(d, r) for d, r in reports.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
