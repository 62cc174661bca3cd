"""Pure text measures the defect report counts with: how a heading-delimited block ends, the fenced code blocks in
it, whether Python code parses, and which texts nearly repeat one another. No I/O; the definitions are in
``orchestrator.defects``.
"""

from __future__ import annotations

import ast
import hashlib
import re
import warnings
from array import array
from bisect import bisect_right
from collections import Counter, defaultdict

from markdown_it import MarkdownIt

from .fences import FENCE_OPEN, closer, closes

__all__ = ["block_ending", "code_blocks", "near_duplicates", "python_ok", "scan_block"]

NEAR_DUPLICATE_JACCARD = 0.5
NEAR_DUPLICATE_CONTAINMENT = 0.8
SHINGLE = 5
MIN_SHINGLES = 20  # sections shorter than this (in shingles) are never called near-duplicates
SAMPLE = 8  # candidate pairs are found on one shingle in SAMPLE
# A near-duplicate pair shares at least 2/3 of the smaller text's shingles (containment >= 0.8, or Jaccard >= 0.5,
# which implies containment >= 2/3), so it shares about as large a part of the smaller text's sampled ones. Pairs
# sharing less than this part of them are not measured: text in a shared style (the simulator's word banks) makes
# tens of thousands of such pairs in a 1,536-section book, 0.6 s of exact checks that the PDF waits for.
SAMPLED_SHARE = 0.3

_CLOSING = frozenset(".!?:…\"'”’»›)]}」』")
_TRAILING_MARKUP = "*_`~ \t"
_WORD = re.compile(r"\w+")


def scan_block(text: str) -> tuple[bool, str, list[tuple[str, str, bool]]]:
    """One pass over a heading-delimited block: (terminated, last line, code blocks as (language, code, closed)).

    Fences are found line by line (book/fences.py: CommonMark's rules at the left margin); a block with an
    indented fence line (a fence inside a list item) has its code blocks read by markdown-it instead, which strips
    the container's indentation.
    """
    fence: tuple[re.Pattern[str], str, list[str]] | None = None  # (its closing line, language, code lines)
    blocks: list[tuple[str, str, bool]] = []
    last = ""
    last_closed_fence = False
    indented_fence = False
    for line in text.splitlines():
        if fence is not None:
            if fence[0].match(line):
                blocks.append((fence[1], _code(fence[2]), True))
                fence = None
                last, last_closed_fence = line.strip(), True
                indented_fence |= line[:1] == " "
            else:
                fence[2].append(line)
                if line.strip():
                    last, last_closed_fence = line.strip(), False
            continue
        m = FENCE_OPEN.match(line)
        if m:
            info = m.group(3).strip().split()
            fence = (closer(m.group(2)), info[0].lower() if info else "none", [])
            indented_fence |= line[:1] == " "
        elif line[:1] in " \t" and ("```" in line or "~~~" in line):
            indented_fence = True  # perhaps a fence inside a list item: markdown-it decides (below)
        if line.strip():
            last, last_closed_fence = line.strip(), False
    if fence is not None:
        blocks.append((fence[1], _code(fence[2]), False))  # cut off inside a code block: not terminated
    terminated = fence is None and (last_closed_fence or _ends_cleanly(last))
    if indented_fence:
        blocks = code_blocks(text)
    return terminated, last, blocks


def _code(lines: list[str]) -> str:
    return "\n".join(lines) + ("\n" if lines else "")


def _ends_cleanly(last: str) -> bool:
    """A last line outside code that ends a block: a table row, or text ending in a closing mark."""
    if last.startswith("|") and last.endswith("|"):
        return True
    core = last.rstrip(_TRAILING_MARKUP)
    return bool(core) and core[-1] in _CLOSING


def block_ending(text: str) -> tuple[bool, str]:
    """(terminated, last line) of one heading-delimited block, by the definition above."""
    terminated, last, _ = scan_block(text)
    return terminated, last


_md = MarkdownIt("commonmark").disable(["inline", "text_join"])  # block structure is all we need


def _strip_container(line: str) -> str:
    return line.lstrip(" \t>")


def code_blocks(text: str) -> list[tuple[str, str, bool]]:
    """(language, code, closed) of every fenced block in one section's text, as markdown-it sees them."""
    out = []
    lines = text.splitlines()
    for tok in _md.parse(text):
        if tok.type != "fence" or tok.map is None:
            continue
        info = tok.info.strip().split()
        lang = info[0].lower() if info else "none"
        start, end = tok.map
        closed = False
        if end - 1 > start and end - 1 < len(lines):
            closed = closes(_strip_container(lines[end - 1]), tok.markup)
        out.append((lang, tok.content, closed))
    return out


def python_ok(code: str) -> bool:
    lines = code.splitlines()
    if any(line.startswith(">>> ") or line == ">>>" for line in lines):
        code = "\n".join(line[4:] for line in lines if line.startswith((">>> ", "... ")) or line in (">>>", "..."))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            ast.parse(code)
        except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
            return False
    return True


def shingles(text: str) -> array[int]:
    """The distinct 5-word shingle hashes of one text, sorted, in an array: 8 bytes a shingle where a set of ints
    costs about 60, which is what a book of thousands of sections holds at once."""
    words = _WORD.findall(text.lower())
    if len(words) < SHINGLE:
        return array("q")
    return array("q", sorted({hash(tuple(words[i : i + SHINGLE])) for i in range(len(words) - SHINGLE + 1)}))


def near_duplicates(texts: list[str], sets: list[array[int]] | None = None) -> list[tuple[int, int, float, float]]:
    """(i, j, jaccard, containment) for every near-duplicate pair, most similar first. ``sets``: each text's
    :func:`shingles`, when already known (a section's are made as it lands: SectionText.shingles).

    Candidates come from an inverted index over a 1-in-``SAMPLE`` sample of the shingles (chosen by hash value,
    so two texts keep the same ones); every candidate sharing at least ``SAMPLED_SHARE`` of the smaller text's
    sampled shingles is then checked exactly on the full shingle sets. A pair at
    the thresholds shares dozens of sampled shingles, so sampling loses none of them in practice.

    Memory is linear in the texts: the candidates of one text at a time are counted and checked at once (a table of
    every pair sharing a sampled shingle grows with the square of the sections: 400 MB at 6,144), and identical
    texts are grouped by a digest of their shingles rather than by a copy of them.
    """
    sets = [shingles(t) for t in texts] if sets is None else sets
    max_df = max(50, len(sets) // 10)
    index = _sample_index(sets)
    # each text's sampled shingles that can be counted as shared (those in too many texts are not): a ratio at
    # most 1 only grows when the same number leaves its numerator and its denominator
    sampled = [sum(1 for h in s if h % SAMPLE == 0 and 2 <= len(index[h]) <= max_df)
               if len(s) >= MIN_SHINGLES else 0 for s in sets]
    found: dict[tuple[int, int], tuple[float, float]] = {}
    for i, s in enumerate(sets):
        if len(s) >= MIN_SHINGLES:
            _check_candidates(i, sets, index, sampled, max_df, found)
    _check_identical(sets, found)
    out = [(i, j, jac, con) for (i, j), (jac, con) in found.items()]
    out.sort(key=lambda t: (-t[2], -t[3], t[0], t[1]))
    return out


def _sample_index(sets: list[array[int]]) -> defaultdict[int, list[int]]:
    """The inverted index: each sampled shingle -> the texts (long enough to count) holding it, ascending."""
    index: defaultdict[int, list[int]] = defaultdict(list)
    for i, s in enumerate(sets):
        if len(s) >= MIN_SHINGLES:
            for h in s:
                if h % SAMPLE == 0:
                    index[h].append(i)  # ascending i: each list is sorted
    return index


def _check_candidates(i: int, sets: list[array[int]], index: defaultdict[int, list[int]], sampled: list[int],
                      max_df: int, found: dict[tuple[int, int], tuple[float, float]]) -> None:
    """Count the later texts sharing sampled shingles with text ``i`` and check those sharing enough exactly."""
    s = sets[i]
    shared: Counter[int] = Counter()  # later texts sharing sampled shingles with text i
    for h in s:
        if h % SAMPLE == 0:
            docs = index[h]
            if 2 <= len(docs) <= max_df:
                shared.update(docs[bisect_right(docs, i):])
    mine = None
    for j, c in shared.items():
        if c >= 2 and c >= SAMPLED_SHARE * min(sampled[i], sampled[j]):
            mine = mine if mine is not None else set(s)
            _check(i, j, mine, sets[j], found)


def _check_identical(sets: list[array[int]], found: dict[tuple[int, int], tuple[float, float]]) -> None:
    """Identical texts pair up even when every one of their shingles is too common to index."""
    same: dict[bytes, list[int]] = defaultdict(list)
    for i, s in enumerate(sets):
        if len(s) >= MIN_SHINGLES:
            same[hashlib.blake2b(s.tobytes(), digest_size=16).digest()].append(i)
    for group in same.values():
        for x in range(len(group)):
            for y in range(x + 1, len(group)):
                if (group[x], group[y]) not in found:
                    _check(group[x], group[y], set(sets[group[x]]), sets[group[y]], found)


def _check(i: int, j: int, a: set[int], b: array[int], found: dict[tuple[int, int], tuple[float, float]]) -> None:
    """Measure one candidate pair exactly (both hold distinct shingles, so the union is the sizes less the
    intersection) and keep it when it is a near-duplicate."""
    inter = len(a.intersection(b))
    jaccard = inter / (len(a) + len(b) - inter)
    containment = inter / min(len(a), len(b))
    if jaccard >= NEAR_DUPLICATE_JACCARD or containment >= NEAR_DUPLICATE_CONTAINMENT:
        found[(i, j)] = (jaccard, containment)
