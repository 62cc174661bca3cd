"""Book -> Defects: what a reader of the book would trip over, counted the way the reference run counted it.

Pure: no I/O, no clock. ``find_defects(book).to_json()`` is defects.json, ``.to_markdown()`` is defects.md. The text
measures behind the counts (block endings, code blocks, near-duplicate pairs) are in ``orchestrator.textscan``.

Definitions (each section's own text, as the model wrote it, is one "heading-delimited block"):

- duplicate section titles: titles equal after normalising case, spacing and punctuation
  (:func:`orchestrator.repair.norm_title`); ``count`` is how many distinct titles occur more than once.
- unterminated blocks: written sections whose last prose line does not end in closing punctuation
  (``. ! ? : …`` or a closing quote or bracket, after trailing ``*``/``_``/backtick markup) and that do not end
  with a closed code fence; a section that ends inside an open fence is unterminated; one that ends with a
  table row is not. ``of`` counts the written (non-empty, non-failed) sections. Counted on the text as generated
  (the reference's definition, so runs stay comparable); ``printed`` is the same measure over what book.md prints
  (:func:`orchestrator.assemble.section_body`: a section stopped by the token cap cut back to its last complete
  sentence).
- looping sections: written sections whose text (the final answer, as generated) is still caught in a repetition
  loop (:func:`orchestrator.repair.loop_reason`); ``repaired`` counts the sections whose first answer looped
  (``repaired_from`` set) and whose final answer does not; ``cut``, those of them kept as what the answer said
  before its loop began (:mod:`orchestrator.book.loopcut`; the text counted is the cut one) instead of asked again.
- truncated sections: ``finish_reason == "length"``; empty and failed sections as the job recorded them.
- code blocks: fenced blocks (markdown-it, so fences inside lists count), by language (first word of the info
  string, lower-cased; ``"none"`` without one); Python blocks (python, py, python3, py3) that ``ast.parse``
  rejects (REPL blocks are checked on their ``>>>``/``...`` lines); fences never closed before the section ends.
- near-duplicate sections: pairs whose 5-word shingle sets have Jaccard similarity >= 0.5, or where >= 80% of
  the smaller section's shingles occur in the other. The similarities are exact, not estimated: candidates come
  from MinHash with LSH banding (72 bands of 4 rows: a pair at Jaccard 0.5 is found with probability 0.99) and,
  for short texts inside long ones, from an inverted index over a sample of the shingles; each candidate is then
  measured on the full sets (textscan.near_duplicates). Shingles held by more than 50 sections are boilerplate and
  make no index candidates, so the search grows linearly with the sections (benchmarks/near_duplicates.py: 2.2 s
  at 20,000); identical texts are always paired.
- words: whitespace-separated tokens of every written section (code included), as ``Book.words`` counts.
- repeated titles: titles of the whole outline (the book, parts, chapters and sections) equal after normalising,
  each with the paths that carry it ("" the book, "3" a part, "3.7" a chapter); ``count`` as for section titles.
- word salad: written sections whose prose, as generated, stops reading as language (:func:`.salad.salad_at`), with
  where it starts; ``cut`` counts those book.md prints cut back before it.
- assistant talk: written sections where the model, as generated, talks to whoever asked for the section (a sign-off,
  an offer of more help, a report of the edits it made: :func:`.talk.talk_spans`), with ``words`` it holds and how
  it opens; book.md prints each section without it.
- sibling overlap: each written section's share of distinct word 5-grams of its prose that another section of its
  chapter also holds (:mod:`.overlap`), summarised (mean, p90, max, sections): how much a chapter repeats itself;
  ``printed`` the same over the sections as book.md prints them (without the talk above: "let me know if you have
  any questions" in two sections is no repetition a reader meets).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from .assemble import Book, SectionText, count_words, section_body
from .checks import norm_title
from .overlap import overlap_report
from .textscan import (
    NEAR_DUPLICATE_CONTAINMENT,
    NEAR_DUPLICATE_JACCARD,
    SHINGLE,
    block_ending,
    near_duplicates,
    python_ok,
    scan_block,
)

__all__ = ["Defects", "find_defects"]

LIST_LIMIT = 200  # entries kept per list in defects.json (counts are always complete)

_PYTHON = frozenset({"python", "py", "python3", "py3"})


@dataclass(frozen=True)
class Defects:
    """Every defect count, with the sections behind it. Values are JSON-ready."""

    duplicate_section_titles: dict[str, Any]
    unterminated_blocks: dict[str, Any]
    truncated_sections: dict[str, Any]
    empty_sections: dict[str, Any]
    failed_sections: dict[str, Any]
    code_blocks: dict[str, Any]
    near_duplicate_sections: dict[str, Any]
    looping_sections: dict[str, Any]
    words: dict[str, Any]
    repeated_titles: dict[str, Any]
    sibling_overlap: dict[str, Any]
    word_salad: dict[str, Any]
    assistant_talk: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "duplicate_section_titles": self.duplicate_section_titles,
            "unterminated_blocks": self.unterminated_blocks,
            "truncated_sections": self.truncated_sections,
            "empty_sections": self.empty_sections,
            "failed_sections": self.failed_sections,
            "code_blocks": self.code_blocks,
            "near_duplicate_sections": self.near_duplicate_sections,
            "looping_sections": self.looping_sections,
            "words": self.words,
            "repeated_titles": self.repeated_titles,
            "sibling_overlap": self.sibling_overlap,
            "word_salad": self.word_salad,
            "assistant_talk": self.assistant_talk,
        }

    def to_markdown(self, worst: int = 10) -> str:
        from .defects_md import defects_markdown  # the rendering of these counts, its own module

        return defects_markdown(self, worst)


# ---------------------------------------------------------------------------------------------------------------


def _first_line(text: str, limit: int = 100) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line if len(line) <= limit else line[: limit - 1] + "…"
    return ""


def _ref(s: SectionText, **extra: Any) -> dict[str, Any]:
    return {"path": s.path, "title": s.title, "first_line": _first_line(s.text), **extra}


def _listing(items: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"count": len(items), **extra, "sections": items[:LIST_LIMIT]}


def find_defects(book: Book) -> Defects:
    sections = list(book.sections)
    written = [s for s in sections if not s.failed and not s.empty and not s.interrupted]
    scans = {s.path: scan_block(s.text) for s in written}
    counts = [count_words(s.text) for s in sections if not s.failed and not s.interrupted]
    return Defects(
        duplicate_section_titles=_duplicate_titles(sections),
        unterminated_blocks=_unterminated(written, scans),
        truncated_sections=_listing([_ref(s, completion_tokens=s.completion_tokens) for s in sections
                                     if s.finish_reason == "length"]),
        empty_sections=_listing([_ref(s) for s in sections if s.empty]),
        failed_sections=_listing([_ref(s, error=s.error) for s in sections if s.failed]),
        code_blocks=_code(written, scans),
        near_duplicate_sections=_near_duplicates(written),
        looping_sections=_looping(written),
        words={
            "total": sum(counts),
            "mean": round(sum(counts) / len(counts), 1) if counts else 0.0,
            "min": min(counts, default=0),
            "max": max(counts, default=0),
        },
        repeated_titles=_repeated_titles(book),
        sibling_overlap=_sibling_overlap(written, book),
        word_salad=_word_salad(written),
        assistant_talk=_talk(written),
    )


_Scans = dict[str, tuple[bool, str, list[tuple[str, str, bool]]]]  # path -> scan_block(text)


def _duplicate_titles(sections: list[SectionText]) -> dict[str, Any]:
    groups: dict[str, list[SectionText]] = defaultdict(list)
    for s in sections:
        groups[norm_title(s.title)].append(s)
    dups = sorted((g for g in groups.values() if len(g) > 1), key=lambda g: (-len(g), norm_title(g[0].title)))
    return {
        "count": len(dups),
        "sections": sum(len(g) for g in dups),
        "titles": [{"title": g[0].title, "count": len(g), "paths": [s.path for s in g]} for g in dups][:LIST_LIMIT],
    }


def _repeated_titles(book: Book) -> dict[str, Any]:
    groups: dict[str, list[tuple[str, str]]] = defaultdict(list)  # normal form -> (path, title)
    for path, title in book.outline.titles():
        groups[norm_title(title)].append((path, title))
    dups = sorted((g for k, g in groups.items() if k and len(g) > 1), key=lambda g: (-len(g), norm_title(g[0][1])))
    return {"count": len(dups),
            "titles": [{"title": g[0][1], "count": len(g), "paths": [p for p, _ in g]} for g in dups][:LIST_LIMIT]}


def _sibling_overlap(written: list[SectionText], book: Book) -> dict[str, Any]:
    chapters: dict[str, dict[str, str]] = defaultdict(dict)
    printed: dict[str, dict[str, str]] = defaultdict(dict)
    for s in written:
        chapter = s.path.rsplit(".", 1)[0]
        chapters[chapter][s.path] = s.text
        printed[chapter][s.path] = section_body(s)
    return overlap_report(chapters, (title for _, title in book.outline.titles()), printed)


def _unterminated(written: list[SectionText], scans: _Scans) -> dict[str, Any]:
    unterminated = []
    for s in written:
        ok, last, _ = scans[s.path]
        if not ok:
            unterminated.append(_ref(s, last_line=last if len(last) <= 100 else "…" + last[-99:],
                                     truncated=s.finish_reason == "length"))
    of = len(written)
    # As printed: only a capped (cut back) or unterminated section can end differently in book.md; demoting
    # headings and closing fences leave a terminated ending terminated, so the others need no second look.
    printed = sum(not block_ending(section_body(s))[0] for s in written
                  if s.finish_reason == "length" or not scans[s.path][0])
    return {
        "count": len(unterminated), "of": of, "share": _share(len(unterminated), of),
        "printed": {"count": printed, "of": of, "share": _share(printed, of)},
        "sections": unterminated[:LIST_LIMIT],
    }


def _word_salad(written: list[SectionText]) -> dict[str, Any]:
    """Sections whose text, as generated, turns into word salad (:func:`.salad.salad_at`); ``cut``: those book.md
    prints without it, cut back before it (the rest are salad from their first sentence, printed as written)."""
    items = []
    for s in written:
        at = s.salad
        if at is not None:
            items.append(_ref(s, words_before=count_words(s.text[:at]), salad=_first_line(s.text[at:], 80),
                              cut=s.salad_cut is not None))
    return _listing(items, cut=sum(1 for it in items if it["cut"]))


def _talk(written: list[SectionText]) -> dict[str, Any]:
    """Sections whose text, as generated, talks to whoever asked for it (:func:`.talk.talk_spans`): how it opens, how
    many words it holds, and where it is (``at``: :attr:`.talk.Talk.at`, "start", "end", "both" or "within");
    ``words``: all of them.
    book.md prints every one without it."""
    items = []
    for s in written:
        if talk := s.talk:
            shown = (talk.tail, len(s.text)) if talk.tail is not None else talk.spans(len(s.text))[0]
            items.append(_ref(s, talk=_first_line(s.text[shown[0]:shown[1]], 80), at=talk.at,
                              words=sum(count_words(s.text[a:b]) for a, b in talk.spans(len(s.text)))))
    return _listing(items, words=sum(it["words"] for it in items))


def _looping(written: list[SectionText]) -> dict[str, Any]:
    """The final answers still looping; repaired ones (their first answer looped) that no longer do."""
    looping = [{"path": s.path, "title": s.title, "reason": why} for s in written if (why := s.loop) is not None]
    still = {it["path"] for it in looping}
    return {
        "count": len(looping),
        "repaired": sum(1 for s in written if s.repaired_from is not None and s.path not in still),
        # of them, kept as what they said before the loop began (book/loopcut.py) instead of asked again
        "cut": sum(1 for s in written if s.loop_cut and s.path not in still),
        "sections": looping[:LIST_LIMIT],
    }


def _code(written: list[SectionText], scans: _Scans) -> dict[str, Any]:
    by_language: Counter[str] = Counter()
    py_total = 0
    py_errors: list[dict[str, Any]] = []
    unclosed: list[dict[str, Any]] = []
    n_blocks = 0
    for s in written:
        blocks = scans[s.path][2]
        n_blocks += len(blocks)
        bad = 0
        open_langs = []
        for lang, code, closed in blocks:
            by_language[lang] += 1
            if not closed:
                open_langs.append(lang)
            if lang in _PYTHON:
                py_total += 1
                if not python_ok(code):
                    bad += 1
        if bad:
            py_errors.append(_ref(s, blocks=bad, truncated=s.finish_reason == "length"))
        if open_langs:
            unclosed.append(_ref(s, languages=open_langs, truncated=s.finish_reason == "length"))
    return {
        "count": n_blocks,
        "by_language": dict(sorted(by_language.items(), key=lambda kv: (-kv[1], kv[0]))),
        **_parsed(written),
        "python_syntax_errors": {"count": sum(e["blocks"] for e in py_errors), "of": py_total,
                                 "sections": py_errors[:LIST_LIMIT]},
        "unclosed_fences": {"count": sum(len(u["languages"]) for u in unclosed), "sections": unclosed[:LIST_LIMIT]},
    }


def _parsed(written: list[SectionText]) -> dict[str, Any]:
    """The blocks with a parser at hand (book/codecheck.py), by language: ``checked`` and ``broken`` in the final
    texts; ``repaired``: sections whose broken blocks a re-ask fixed (job/repairs.py); ``still_broken``: blocks that
    do not parse in the final texts."""
    checked: Counter[str] = Counter()
    broken: Counter[str] = Counter()
    repaired: Counter[str] = Counter()
    for s in written:
        for lang, n in s.code.languages.items():
            if n.checked:
                checked[lang] += n.checked
                broken[lang] += n.broken
        repaired.update(s.code_repaired)
    return {"checked": dict(checked), "repaired": dict(repaired),
            "still_broken": {k: v for k, v in broken.items() if v}}


def _near_duplicates(written: list[SectionText]) -> dict[str, Any]:
    pairs = near_duplicates([s.text for s in written], [s.shingles for s in written])
    return {
        "count": len(pairs),
        "repaired": sum(1 for s in written if s.rewritten_from is not None),
        "threshold": {"shingle_words": SHINGLE, "jaccard": NEAR_DUPLICATE_JACCARD,
                      "containment": NEAR_DUPLICATE_CONTAINMENT},
        "pairs": [
            {"a": written[i].path, "b": written[j].path, "a_title": written[i].title, "b_title": written[j].title,
             "jaccard": round(jac, 3), "containment": round(con, 3)}
            for i, j, jac, con in pairs[:LIST_LIMIT]
        ],
    }


def _share(count: int, of: int) -> float:
    return round(count / of, 4) if of else 0.0
