"""Pure text measures the defect report counts with: how a heading-delimited block ends, the fenced code blocks in
it, whether Python code parses, and which texts nearly repeat one another. No I/O; the definitions are in
``orchestrator.defects``.
"""

from __future__ import annotations

import ast
import hashlib
import math
import re
import warnings
from array import array
from collections import defaultdict
from typing import TYPE_CHECKING

from markdown_it import MarkdownIt

from .fences import FENCE_OPEN, closer, closes

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

__all__ = ["block_ending", "code_blocks", "near_duplicates", "python_ok", "scan_block"]

NEAR_DUPLICATE_JACCARD = 0.5
NEAR_DUPLICATE_CONTAINMENT = 0.8
SHINGLE = 5
MIN_SHINGLES = 20  # sections shorter than this (in shingles) are never called near-duplicates
# A near-duplicate pair shares at least 2/3 of the smaller text's shingles (containment >= 0.8, or Jaccard >= 0.5,
# which implies containment >= 2/3), so it shares about as large a part of the smaller text's sampled ones. Pairs
# sharing less than this part of them are not measured: text in a shared style (the simulator's word banks) makes
# tens of thousands of such pairs in a 1,536-section book, 0.6 s of exact checks that the PDF waits for.
SAMPLED_SHARE = 0.3
SAMPLE = 8  # the sampled index keeps one shingle in SAMPLE (by hash value) of a text of 16 * SAMPLE or more
QUERY_SAMPLES = 16  # ... and one in the largest power of two that leaves a smaller text this many (all below 32)
MAX_DF = 50  # sampled shingles in more texts than this are boilerplate: they make no candidates of the index
# MinHash LSH (near_duplicates): ROWS rows a band, and the fewest bands that find a pair at the Jaccard threshold
# with probability RECALL: 1 - (1 - J**ROWS)**BANDS >= RECALL at J = 0.5 gives 72 bands, 288 permutations. Fewer
# rows collide more unrelated pairs (20,000 simulated sections: 20M at 2, 1.9M at 3, 0.43M at 4); 5 take 730.
RECALL = 0.99
ROWS = 4
BANDS = math.ceil(math.log(1 - RECALL) / math.log(1 - NEAR_DUPLICATE_JACCARD**ROWS))
NUM_PERM = ROWS * BANDS
LSH_SEED = 1  # datasketch's MinHash seed: its permutations, so the same texts always make the same candidates
ESTIMATE_SIGMAS = 5  # a candidate whose MinHash estimate is this far below a near-duplicate's is dropped (_plausible)
PRE_PERM = 96  # ... on the first PRE_PERM permutations, then on all
_BLOCK = 1 << 16  # shingles a block of the MinHash computation (256 KB of 32-bit hashes)

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


_WORD_IDS: dict[str, int] = {}  # each word's stable 64-bit id (blake2b), memoised: a book's vocabulary, not its text


def _word_id(word: str) -> int:
    if len(_WORD_IDS) >= 1 << 18:
        _WORD_IDS.clear()
    _WORD_IDS[word] = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little", signed=True)
    return _WORD_IDS[word]


def shingles(text: str) -> array[int]:
    """The distinct 5-word shingle hashes of one text, sorted, in an array: 8 bytes a shingle where a set of ints
    costs about 60, which is what a book of thousands of sections holds at once.

    A shingle's hash is that of the tuple of its words' ids (blake2b of the word), not of the words themselves:
    ints hash alike in every process (strings do not, PYTHONHASHSEED), so the samples and MinHash signatures
    :func:`near_duplicates` makes of them, and what it finds, are the same in every run."""
    words = _WORD.findall(text.lower())
    if len(words) < SHINGLE:
        return array("q")
    known = _WORD_IDS.get
    ids = [known(w) or _word_id(w) for w in words]
    return array("q", sorted(set(map(hash, zip(*(ids[k:] for k in range(SHINGLE)))))))


def near_duplicates(texts: list[str], sets: list[array[int]] | None = None) -> list[tuple[int, int, float, float]]:
    """(i, j, jaccard, containment) for every near-duplicate pair, most similar first. ``sets``: each text's
    :func:`shingles`, when already known (a section's are made as it lands: SectionText.shingles).

    Candidate pairs come from two searches over the texts of ``MIN_SHINGLES`` or more, and every candidate is
    then measured exactly on the full shingle sets (so every pair reported is one, with its exact figures). Both
    do work linear in the texts but for the LSH's chance collisions, a vectorised comparison each: their number
    is the sum over all pairs of a small chance (0.04 million at 6,144 simulated sections, 0.43 at 20,000):

    * MinHash LSH (:func:`_lsh_candidates`): datasketch's MinHash permutations, ``BANDS`` bands of ``ROWS`` rows.
      A pair of Jaccard similarity J shares a band with probability ``1 - (1 - J**ROWS)**BANDS``: 0.9904 at
      J = 0.5 (1 - (15/16)**72), 0.99995 at 0.6, 0.11 at 0.2 and 0.007 at 0.1, where the simulator's unrelated
      sections lie (at most 0.23; median 0.05). Boilerplate neither hides a pair from it nor makes it work. It
      has the containment pairs of similar sizes: containment >= 0.8 implies Jaccard >= 0.5 where the smaller
      text holds 5/7 of the larger's count of shingles or more (0.8 * r / (1 + 0.2 * r) >= 0.5).
    * A sampled inverted index (:func:`_index_candidates`), for a short text inside a long one, whose Jaccard
      similarity is no better than unrelated texts' (30 shingles inside 400: 0.075), and as a second search for
      the rest. Each text samples its shingles by hash value, one in the largest power of two up to ``SAMPLE``
      that leaves it about ``QUERY_SAMPLES`` (all of them below 32), and counts the texts at least as long that
      hold its samples; those holding ``SAMPLED_SHARE`` of them or more (and two) are candidates. A sampled
      shingle held by more than ``MAX_DF`` texts is boilerplate and counts for nothing, which bounds the work by
      the texts (the old bound, a tenth of the sections, made it grow with their square): a pair whose smaller
      text is mostly such boilerplate is left to the LSH, that is, found when its Jaccard similarity is high.

    A candidate of either whose signatures agree on too few permutations for a near-duplicate of its sizes is
    dropped unmeasured (:func:`_plausible`; one at the threshold is kept but for ~4e-7): the near-misses of texts
    in one style cost a vectorised comparison, not a set intersection. So a pair at the Jaccard threshold is found
    with probability >= 0.99, a containment pair with that of its smaller text's counted samples showing it (~1 -
    3e-6 with 16). Identical texts are always paired. Memory is linear in the texts: the shingles once more, 288
    32-bit minima a text, the index's sampled shingles and their pairs (``MAX_DF`` a sample at most).
    """
    sets = [shingles(t) for t in texts] if sets is None else sets
    kept = [i for i, s in enumerate(sets) if len(s) >= MIN_SHINGLES]
    found: dict[tuple[int, int], tuple[float, float]] = {}
    if len(kept) >= 2:
        _check_candidates(kept, sets, found)
    _check_identical(sets, found)
    out = [(i, j, jac, con) for (i, j), (jac, con) in found.items()]
    out.sort(key=lambda t: (-t[2], -t[3], t[0], t[1]))
    return out


def _check_candidates(kept: list[int], sets: list[array[int]],
                      found: dict[tuple[int, int], tuple[float, float]]) -> None:
    """Both searches' candidates among the ``kept`` texts, measured exactly, once each, in (i, j) order."""
    import numpy as np

    flat = np.concatenate([np.asarray(sets[i], dtype=np.int64) for i in kept])
    sizes, m = np.array([len(sets[i]) for i in kept], dtype=np.int64), len(kept)
    sig, index = _signatures(flat, sizes), _index_candidates(flat, sizes)
    del flat
    index = index[_plausible(sig, sizes, index // m, index % m)]
    codes = np.union1d(_lsh_candidates(sig, sizes), index)
    del sig
    mine, last = set[int](), -1
    for i, j in zip((codes // m).tolist(), (codes % m).tolist()):
        if i != last:
            mine, last = set(sets[kept[i]]), i
        _check(kept[i], kept[j], mine, sets[kept[j]], found)


def _signatures(flat: NDArray[np.int64], sizes: NDArray[np.int64]) -> NDArray[np.uint32]:
    """The ``NUM_PERM`` MinHash minima of each text (a row a text; ``flat``: their shingles one after the other,
    ``sizes`` of them each, none empty): datasketch's ``MinHash(NUM_PERM, LSH_SEED, hashfunc=h -> (h ^ h >> 32) &
    0xFFFFFFFF).update_batch(shingles).hashvalues`` (affine32: MurmurHash3's finalizer, then a * h + b mod 2**32).

    Computed here, vectorised over blocks of texts, and banded here (:func:`_lsh_candidates`), because
    datasketch's per-text path cannot meet the time: at 20,000 simulated sections (288 permutations, 72 bands)
    MinHash.generator takes 3.1 s and MinHashLSH's insert and query 6.0 s (its bands are Python dicts of bytes),
    9 s of a 10 s budget before a candidate is measured, against 0.6 s for this and 0.3 s for the banding.
    """
    import numpy as np
    from datasketch import MinHash

    try:
        a, b = MinHash(num_perm=NUM_PERM, seed=LSH_SEED, scheme="affine32").permutations
    except TypeError:  # datasketch < 2 has no schemes: its (64-bit) parameters mod 2**32, each `a` odd
        a, b = MinHash(num_perm=NUM_PERM, seed=LSH_SEED).permutations.astype(np.uint32)
        a |= np.uint32(1)
    u = flat.view(np.uint64)
    h = ((u ^ (u >> np.uint64(32))) & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    h ^= h >> np.uint32(16)  # MurmurHash3's fmix32, as datasketch's _fmix
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0xC2B2AE35)
    h ^= h >> np.uint32(16)
    ends = np.cumsum(sizes)
    sig = np.empty((NUM_PERM, len(sizes)), dtype=np.uint32)
    first = 0
    while first < len(sizes):  # texts in blocks of about _BLOCK shingles, each in cache for all permutations
        last = max(first + 1, int(np.searchsorted(ends, ends[first] - sizes[first] + _BLOCK, side="right")))
        lo, hi = int(ends[first] - sizes[first]), int(ends[last - 1])
        block, starts = h[lo:hi], ends[first:last] - sizes[first:last] - lo
        tmp = np.empty_like(block)
        for k in range(NUM_PERM):
            np.multiply(block, a[k], out=tmp)
            np.add(tmp, b[k], out=tmp)
            sig[k, first:last] = np.minimum.reduceat(tmp, starts)
        first = last
    return np.ascontiguousarray(sig.T)


def _lsh_candidates(sig: NDArray[np.uint32], sizes: NDArray[np.int64]) -> NDArray[np.int64]:
    """``i * m + j`` (i < j) of the :func:`_plausible` pairs sharing a band of their signatures, ascending."""
    import numpy as np

    m = len(sig)
    out = np.empty(0, dtype=np.int64)
    for t in range(BANDS):
        key = np.zeros(m, dtype=np.uint64)
        for col in sig[:, t * ROWS:(t + 1) * ROWS].T:  # the band's rows in one 64-bit key (a collision only adds
            key = key * np.uint64(0x9E3779B97F4A7C15) + col  # a candidate, which _plausible then drops)
        lo, hi = _equal_pairs(key)
        if len(lo):
            keep = _plausible(sig, sizes, lo, hi)
            out = np.union1d(out, lo[keep] * m + hi[keep])
    return out


def _plausible(sig: NDArray[np.uint32], sizes: NDArray[np.int64], lo: NDArray[np.int64], hi: NDArray[np.int64]
               ) -> NDArray[np.bool_]:
    """Which pairs may be near-duplicates by their MinHash estimate. A near-duplicate whose smaller text holds r
    times the larger's shingles has Jaccard J >= need(r) = min(0.5, 0.8 * r / (1 + r - 0.8 * r)) (containment
    0.8 at the least, or Jaccard 0.5); its signatures agree on Binomial(k, J) of any k permutations, so pairs
    agreeing on fewer than need(r) less ESTIMATE_SIGMAS standard deviations are dropped, on the first ``PRE_PERM``
    (a cheap look that drops most unrelated pairs), then on all (at r = 1, 0.353 of 288; at r = 0.5, 0.22; none
    below r = 0.1). A pair at the threshold fails the looks with probability 1.6e-7 and 2.3e-7."""
    import numpy as np

    r = np.minimum(sizes[lo], sizes[hi]) / np.maximum(sizes[lo], sizes[hi])
    c = NEAR_DUPLICATE_CONTAINMENT
    need = np.minimum(NEAR_DUPLICATE_JACCARD, c * r / (1 + r - c * r))
    keep = np.ones(len(lo), dtype=bool)
    for k in (PRE_PERM, NUM_PERM):
        floor = need[keep] - ESTIMATE_SIGMAS * np.sqrt(need[keep] * (1 - need[keep]) / k)
        a, b = lo[keep], hi[keep]
        keep[keep] = np.count_nonzero(sig[a, :k] == sig[b, :k], axis=1) >= floor * k
    return keep


def _equal_pairs(key: NDArray[np.uint64]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Every pair (i < j) with ``key[i] == key[j]``: the keys sorted (stably, so i < j in a run of equal ones),
    those in runs of two or more, then one vectorised step a distance in the longest run."""
    import numpy as np

    order = np.argsort(key, kind="stable")
    sk = key[order]
    dup = sk[1:] == sk[:-1]
    grouped = np.zeros(len(sk), dtype=bool)
    grouped[1:] |= dup
    grouped[:-1] |= dup
    order, sk = order[grouped], sk[grouped]
    lo, hi = [np.empty(0, dtype=np.int64)], [np.empty(0, dtype=np.int64)]
    for d in range(1, len(sk)):
        same = sk[d:] == sk[:-d]
        if not same.any():
            break
        lo.append(order[:-d][same])
        hi.append(order[d:][same])
    return np.concatenate(lo), np.concatenate(hi)


def _index_candidates(flat: NDArray[np.int64], sizes: NDArray[np.int64]) -> NDArray[np.int64]:
    """``i * m + j`` (i < j) of the pairs where the smaller text's sampled shingles are held by the larger at
    ``SAMPLED_SHARE`` or more (and two or more), counting the sampled shingles held by 2 to ``MAX_DF`` texts."""
    import numpy as np

    m = len(sizes)
    owner = np.repeat(np.arange(m, dtype=np.int64), sizes)
    level = np.clip(np.floor(np.log2(sizes / QUERY_SAMPLES)), 0, SAMPLE.bit_length() - 1).astype(np.int64)
    sel = (flat & ((1 << int(level.min())) - 1)) == 0  # every shingle some text samples (and more)
    h, o = flat[sel], owner[sel]
    del owner, sel
    order = np.argsort(h, kind="stable")  # stable: the owners ascending in each run of one shingle
    h, o = h[order], o[order]
    start = np.flatnonzero(np.concatenate(([True], h[1:] != h[:-1])))
    run = np.repeat(np.arange(len(start)), np.diff(np.append(start, len(h))))
    df = np.diff(np.append(start, len(h)))[run]
    query = (h & ((np.int64(1) << level[o]) - 1)) == 0  # the shingles each text samples
    ok = (df >= 2) & (df <= MAX_DF)
    samples = np.bincount(o[query & ok], minlength=m)
    asks = np.bincount(run[query & ok], minlength=len(start)) > 0  # runs some text samples
    keep = ok & asks[run]
    h, o, query = h[keep], o[keep], query[keep]
    pair_codes = []
    for d in range(1, MAX_DF):
        same = h[d:] == h[:-d]
        if not same.any():
            break
        a, b = o[:-d][same], o[d:][same]  # a < b
        qa, qb = query[:-d][same], query[d:][same]
        ab = qa & (sizes[b] >= sizes[a])  # a samples, b is at least as long: a's share of b
        ba = qb & (sizes[a] >= sizes[b])
        pair_codes += [a[ab] * m + b[ab], b[ba] * m + a[ba]]
    if not pair_codes:
        return np.empty(0, dtype=np.int64)
    codes, shared = np.unique(np.concatenate(pair_codes), return_counts=True)
    q, t = codes // m, codes % m
    hit = (shared >= 2) & (shared >= SAMPLED_SHARE * samples[q])
    return np.unique(np.minimum(q, t)[hit] * m + np.maximum(q, t)[hit])


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
