"""repair: loops caught, capped sections cut back cleanly; calibrated on the simulator's book (title debris:
test_title_debris.py)."""

from __future__ import annotations

import functools
import time

import orjson
import pytest

from orchestrator.book.checks import loop_reason, title_debris
from orchestrator.book.cutback import cut_back
from orchestrator.book.textscan import block_ending
from orchestrator.core.prompts import list_schema, render
from orchestrator.sim.text import answer
from orchestrator.sim.words import BOOK_TITLES, COMMON_SECTIONS, CONCEPTS, PART_THEMES

# --------------------------------------------------------------------------------------------------------------
# the simulator's published take: the product's own prompts, answered by the simulator's text generator

REQUEST = "Write me a complete software engineering handbook. Every topic, with examples."
MODEL = "sim-qwen3"
SHAPE = (8, 12, 16)
WORDS, MAX_TOKENS = 250, 520


def _titles(prompt: str, n: int, with_title: bool = False) -> tuple[str | None, list[str]]:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 1024,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "titles", "schema": list_schema(n, with_title)}}}
    value = orjson.loads(answer(MODEL, body).text)
    return value.get("title"), value["items"]


@functools.lru_cache(maxsize=1)
def published_take() -> tuple[str, tuple]:
    """(book title, ((part, ((chapter, ((section, text, finish_reason), ...)), ...)), ...)) at 8 x 12 x 16."""
    parts_n, chapters_n, sections_n = SHAPE
    book, parts = _titles(render("book", request=REQUEST, n=parts_n, json=True, retry_note=""), parts_n, True)
    out = []
    for pi, part in enumerate(parts, 1):
        _, chapters = _titles(render("part", book=book, request=REQUEST, part=part, index=pi, count=parts_n,
                                     siblings=parts[: pi - 1], n=chapters_n, json=True, retry_note=""), chapters_n)
        chs = []
        for ci, chapter in enumerate(chapters, 1):
            _, sections = _titles(render("chapter", book=book, request=REQUEST, part=part, chapter=chapter,
                                         index=ci, count=chapters_n, siblings=chapters[: ci - 1], n=sections_n,
                                         json=True, retry_note=""), sections_n)
            secs = []
            for section in sections:
                prompt = render("section", book=book, part=part, chapter=chapter, section=section, words=WORDS)
                a = answer(MODEL, {"messages": [{"role": "user", "content": prompt}], "max_tokens": MAX_TOKENS})
                pieces = a.pieces[:MAX_TOKENS]
                secs.append((section, "".join(pieces), "length" if len(a.pieces) > MAX_TOKENS else "stop"))
            chs.append((chapter, tuple(secs)))
        out.append((part, tuple(chs)))
    return book, tuple(out)


def sim_sections() -> list[tuple[str, str, str]]:
    _, parts = published_take()
    return [s for _, chapters in parts for _, sections in chapters for s in sections]


def test_the_simulated_book_has_the_reference_shape():
    # so that the calibration tests below run on a real book, not on an empty one
    sections = sim_sections()
    assert len(sections) == 8 * 12 * 16
    truncated = sum(f == "length" for _, _, f in sections)
    assert 0.04 < truncated / len(sections) < 0.10  # ~7% hit the 520-token cap
    assert 250 < sum(len(t.split()) for _, t, _ in sections) / len(sections) < 330


def test_no_simulated_section_loops():
    sections = sim_sections()
    t = time.perf_counter()
    flagged = [(title, why) for title, text, _ in sections if (why := loop_reason(text)) is not None]
    elapsed = time.perf_counter() - t
    assert flagged == []
    assert elapsed < 10  # ~1.5 s on this machine: cheap enough for defects on every job


def test_simulated_truncated_sections_cut_back_cleanly():
    capped = [(title, text) for title, text, f in sim_sections() if f == "length"]
    assert capped
    for title, text in capped:
        cut = cut_back(text)
        assert block_ending(cut)[0], (title, cut[-120:])  # ends on a sentence, item or closed block
        body = cut[: -3].rstrip() if cut.endswith("```") and not text.rstrip().endswith("```") else cut
        assert text.startswith(body)  # only ever cut (plus a closing fence), never rewritten
        assert len(cut) > 0.5 * len(text)  # the cap cuts one sentence or snippet, not half the section
        assert cut_back(cut) == cut


def test_the_simulated_book_as_printed_never_stops_mid_sentence():
    from orchestrator.book.assemble import SectionText, assemble
    from orchestrator.core.outline import Chapter, Outline, Part

    book, parts = published_take()
    outline = Outline(book, tuple(Part(p, tuple(Chapter(c, tuple(s for s, _, _ in ss)) for c, ss in chapters))
                                  for p, chapters in parts))
    sections = {}
    for pi, (part, chapters) in enumerate(parts, 1):
        for ci, (chapter, secs) in enumerate(chapters, 1):
            for si, (title, text, finish) in enumerate(secs, 1):
                path = f"{pi}.{ci}.{si}"
                sections[path] = SectionText(path, part, chapter, title, text, finish)
    raw_unterminated = sum(not block_ending(s.text)[0] for s in sections.values())
    assert raw_unterminated > 50  # as generated, the capped sections stop mid-sentence (the reference's 6%)
    endings = _book_quality().ending_report(assemble(outline, sections).markdown)
    assert (endings["count"], endings["of"]) == (0, 1536), endings["examples"]


def test_no_simulated_outline_title_is_debris():
    book, parts = published_take()
    flagged = []
    checked = 0
    for t, ancestors, siblings in _outline_titles(book, parts):
        checked += 1
        if (why := title_debris(t, ancestors, siblings)) is not None:
            flagged.append(why)
    assert checked == 1 + 8 + 8 * 12 + 8 * 12 * 16
    assert flagged == []
    # and every fixed title of the simulator's banks
    assert [t for t in BOOK_TITLES + PART_THEMES + COMMON_SECTIONS + CONCEPTS if title_debris(t)] == []


def _outline_titles(book, parts):
    yield book, (), ()
    part_titles = [p for p, _ in parts]
    for pi, (part, chapters) in enumerate(parts):
        yield part, (book,), part_titles[:pi]
        chapter_titles = [c for c, _ in chapters]
        for ci, (chapter, sections) in enumerate(chapters):
            yield chapter, (book, part), chapter_titles[:ci]
            section_titles = [s for s, _, _ in sections]
            for si, section in enumerate(section_titles):
                yield section, (book, part, chapter), section_titles[:si]


# --------------------------------------------------------------------------------------------------------------
# loops

PROSE = ("Version control records every change to a codebase, so a team can see who changed what and why. "
         "Branches let several people work at once without stepping on each other's changes. "
         "A good commit message explains the reason for a change, not only its content.")

PARAGRAPH = ("Unit tests check one small piece of behaviour in isolation, which makes failures easy to locate and "
             "cheap to fix. They run in milliseconds, so developers can run them on every save, and they document "
             "the intended behaviour of the code for the next reader who has to change it without breaking the "
             "callers that depend on it today.")


def _cap(text: str, chars: int = 2000) -> str:
    """A loop runs until the token cap: about 2,000 characters at 520 tokens."""
    return text[:chars]


LOOPS = {
    "heading line": "## The Year\n\nThe year in review.\n\n" + "##### 2023\n" * 40,
    "title line": _cap("#Software Engineering Handbook. 6.3\n" * 60),
    "numbered title line": "\n".join(f"#Software Engineering Handbook. 6.{i}" for i in range(3, 40)),
    "paragraph, to the cap": _cap(PROSE + "\n\n" + (PARAGRAPH + "\n\n") * 5),
    # a long unit loops only 2-3 times before the cap: the cap cuts the third copy
    "paragraph, two and a half times": (PROSE + "\n\n" + (PARAGRAPH + "\n\n") * 3)[
        : len(PROSE) + 2 + int(2.5 * (len(PARAGRAPH) + 2))],
    "paragraph, three times": PROSE + "\n\n" + "\n\n".join([PROSE.split(". ")[0] + "."] * 3),
    "list item": PROSE + "\n\nKey points:\n\n- Use branches for features.\n- Keep commits small.\n"
                 + "- Write clear commit messages for every change.\n" * 12,
    "sentence inside a paragraph": _cap(PROSE + "\n\n" + "Software engineering is important for everyone. " * 60),
    # no line and no 12-word run repeats (each names its number), but it compresses like no prose does
    "numbered sentences inside a paragraph": _cap(PROSE + "\n\n" + " ".join(
        f"Item {i} is the best item in the list of items." for i in range(1, 80))),
    "code line": PROSE + "\n\n```python\n" + "import numpy as np\n" * 30 + "```\n",
    "short code line": PROSE + "\n\n```python\n" + "print(x)\n" * 200,
}


@pytest.mark.parametrize("name", list(LOOPS))
def test_loops_are_caught(name):
    why = loop_reason(LOOPS[name])
    assert why is not None, name
    assert "repeated" in why or "compresses" in why


def test_loop_reasons_say_what_repeats():
    assert loop_reason(LOOPS["heading line"]) == "line repeated 40 times: '##### 2023'"
    assert loop_reason(LOOPS["paragraph, to the cap"]).startswith("paragraph repeated")
    assert "numbers changed" in loop_reason(LOOPS["numbered title line"])
    assert loop_reason(LOOPS["code line"]).startswith("code line repeated 30 times")
    assert loop_reason(LOOPS["numbered sentences inside a paragraph"]).startswith("prose compresses to")
    assert loop_reason(LOOPS["short code line"]).startswith("code compresses to")


PYTHON = '''```python
class Repository:
    def __init__(self) -> None:
        self._items: dict[str, dict] = {}

    @property
    def size(self) -> int:
        return len(self._items)

    @property
    def empty(self) -> bool:
        return not self._items

    @property
    def keys(self) -> list[str]:
        return list(self._items)

    def get(self, key: str) -> dict | None:
        if key not in self._items:
            return None
        return self._items[key]

    def pop(self, key: str) -> dict | None:
        if key not in self._items:
            return None
        return self._items.pop(key)
```'''

GO = '''```go
func Sum(values []int) int {
	total := 0
	for _, v := range values {
		if v < 0 {
			continue
		}
		total += v
	}
	return total
}

func Max(values []int) int {
	best := 0
	for _, v := range values {
		if v > best {
			best = v
		}
	}
	return best
}
```'''

HTML = "```html\n<ul>\n" + "".join(f"  <li>\n    <a href=\"/p/{i}\">Page {i}</a>\n  </li>\n" for i in range(6)) + "</ul>\n```"

NOT_LOOPS = {
    "prose": PROSE + "\n\n" + PARAGRAPH,
    "lead-ins before each example": "\n\n".join(
        f"For example:\n\n```python\nprint({i} + {i})\n```\n\nOutput:\n\n```\n{2 * i}\n```" for i in range(4)),
    "code repeating short lines": PROSE + "\n\n" + PYTHON + "\n\n" + GO + "\n\n" + HTML,
    "pros and cons per option": "\n\n".join(
        f"##### Option {n}\n\n**Pros:**\n\n- {n} is fast to set up.\n\n**Cons:**\n\n- {n} costs more at scale."
        for n in ("Redis", "Memcached", "A local dict", "SQLite")),
    "list differing in numbers": "Releases:\n\n" + "\n".join(
        f"- Python 3.{v} was released in October 20{v + 8}." for v in range(9, 13)),
    "table with repeated cells": "| feature | Redis | Memcached |\n|---|---|---|\n"
                                 + "\n".join(f"| {f} | yes | yes |" for f in ("TTL", "LRU", "Sharding", "Auth")),
    "title named in every paragraph": "\n\n".join(
        f"Case Study: Monitoring Failure Modes in Open Source Maintenance {tail}" for tail in (
            "starts with a question about what the project can afford to watch.",
            "is about choosing the few signals that matter to the maintainers.",
            "shows that alerts without an owner are ignored within weeks.",
            "ends with a checklist the team reviews every release.",
            "also reminds us that volunteers burn out when paged at night.")),
    "short": "Done.",
    "empty": "",
}


@pytest.mark.parametrize("name", list(NOT_LOOPS))
def test_normal_text_is_not_a_loop(name):
    assert loop_reason(NOT_LOOPS[name]) is None


BOOK = "Software Engineering Handbook"


# --------------------------------------------------------------------------------------------------------------
# the checker: benchmarks/book_quality.py over a crafted out dir


def _book_quality():
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "book_quality.py"
    spec = importlib.util.spec_from_file_location("book_quality", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_book_quality_counts_a_crafted_out_dir(tmp_path, capsys):
    import json

    from orchestrator.book.assemble import SectionText, assemble
    from orchestrator.core.outline import Chapter, Outline, Part

    bq = _book_quality()
    outline = Outline(BOOK, (Part("Tools", (Chapter("Version Control", ("Branching", "items", "Branching")),)),
                             Part("Testing", (Chapter("Tools", ("Mocks", "5.5")),))))
    written = {  # path -> (text, finish_reason)
        "1.1.1": (PROSE + " And then the cap cut it mid-sen", "length"),  # cut back in book.md
        "1.1.2": (LOOPS["heading line"], "stop"),  # loops, and ends on a heading line
        "1.1.3": (PROSE + " This one stopped mid-sen", "stop"),  # the model stopped: its broken tail is cut
        "2.1.1": (PROSE + "\n\n- a complete item\n- another", "stop"),
    }
    refs = {r.path: r for r in outline.sections()}
    sections = {p: SectionText(p, refs[p].part, refs[p].chapter, refs[p].title, text, fr)
                for p, (text, fr) in written.items()}
    book = assemble(outline, sections)  # 2.1.2 is missing: not counted as an ending
    (tmp_path / "book.md").write_text(book.markdown)
    (tmp_path / "outline.json").write_text(json.dumps({"title": BOOK, "parts": [
        {"title": p.title, "chapters": [{"title": c.title, "sections": list(c.sections)} for c in p.chapters]}
        for p in outline.parts]}))
    (tmp_path / "stats.json").write_text(json.dumps({"planning_requests": 6, "whole_job_s": 12.5}))

    r = bq.check(tmp_path)
    t = r["titles"]
    assert t["titles"] == 1 + 2 + 2 + 5
    # "items" (an echo), "5.5" (numbering), the second "Branching" (a repeat under its chapter), and the chapter
    # "Tools" (a copy of a part's title, though not of its own part's: it is only a duplicate)
    assert t["debris"]["count"] == 3
    assert t["duplicates"]["count"] == 2  # the second "Branching" and the chapter "Tools"
    assert t["debris_or_duplicate"]["count"] == 4
    assert r["looping_sections"] == {"count": 1, "of": 4, "share": 0.25, "source": "book.md",
                                     "examples": [{"title": "items", "reason": "line repeated 40 times: '###### 2023'"}]}
    me = r["mid_sentence_endings"]
    assert (me["count"], me["of"]) == (1, 4)
    assert {e["title"] for e in me["examples"]} == {"items"}  # the heading loop, printed as written
    assert r["planning"] == {"requests": 6, "nodes": 1 + 2 + 2, "per_node": 1.2}
    assert r["whole_job_s"] == 12.5

    assert bq.main([str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "debris titles" in printed and "3 of 10 (30.0%)" in printed and "1.20 (6 / 5)" in printed


def test_the_planners_gate_passes_every_simulated_outline_title():
    """The planner's title gate (debris, copies and near copies of a parent) must not re-ask any node of the
    published take: its plan stays 1 -> 8 -> 96 with 105 planning requests."""
    from orchestrator.book.checks import norm_title as norm
    from orchestrator.planning import weak_title

    book, parts = published_take()
    flagged = []
    for p, chapters in parts:
        flagged += [w for w in [weak_title(p, frozenset({norm(book)}))] if w]
        for c, sections in chapters:
            flagged += [w for w in [weak_title(c, frozenset({norm(book), norm(p)}))] if w]
            flagged += [w for s, _, _ in sections if (w := weak_title(s, frozenset({norm(book), norm(p), norm(c)})))]
    assert flagged == []
