"""Near-duplicates across books, found as books finish: the library's ``--dedupe reask`` asks each new book's
sections against every finished book's.

:class:`CrossIndex` keeps, for every section of the books finished so far, its MinHash LSH band keys (the same
signatures and bands as :func:`orchestrator.book.textscan.near_duplicates`: ``BANDS`` bands of ``ROWS`` rows, a pair
at Jaccard 0.5 found with probability 0.99), its shingles (to measure every candidate exactly, with the defect
report's thresholds) and its title and first sentence (what a re-ask is told). A book's sections are signed in one
vectorised batch; the index grows linearly with the library (about 2 KB a section: its shingles).

Only the LSH search is run here, not textscan's denser sampled index for a short text inside a long one: across
books a pair is called a near-duplicate when the LSH proposes it and the exact measure confirms it.
"""

from __future__ import annotations

from array import array
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from .textscan import (
    BANDS,
    MIN_SHINGLES,
    NEAR_DUPLICATE_CONTAINMENT,
    NEAR_DUPLICATE_JACCARD,
    ROWS,
    _signatures,
)

__all__ = ["CrossIndex", "Match"]


@dataclass(frozen=True)
class Match:
    """A finished book's section that a new one nearly duplicates."""

    key: str  # "<book id>/<path>"
    title: str
    first_sentence: str
    jaccard: float
    containment: float


class CrossIndex:
    def __init__(self) -> None:
        self._bands: dict[int, list[int]] = defaultdict(list)
        self._keys: list[str] = []
        self._titles: list[str] = []
        self._firsts: list[str] = []
        self._sets: list[array[int]] = []

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, keys: Sequence[str], titles: Sequence[str], firsts: Sequence[str],
            sets: Sequence[array[int]]) -> None:
        """Index one finished book's sections."""
        for k, bands in zip(range(len(keys)), self._band_keys(sets), strict=True):
            if bands is None:
                continue
            i = len(self._keys)
            self._keys.append(keys[k])
            self._titles.append(titles[k])
            self._firsts.append(firsts[k])
            self._sets.append(sets[k])
            for b in bands:
                self._bands[b].append(i)

    def query(self, sets: Sequence[array[int]]) -> list[Match | None]:
        """For each text's shingles, the indexed section it most nearly duplicates, or None."""
        out: list[Match | None] = []
        for s, bands in zip(sets, self._band_keys(sets), strict=True):
            best: Match | None = None
            if bands is not None and self._keys:
                mine = set(s)
                for i in {i for b in bands for i in self._bands.get(b, ())}:
                    other = self._sets[i]
                    inter = len(mine.intersection(other))
                    jac = inter / (len(mine) + len(other) - inter)
                    con = inter / min(len(mine), len(other))
                    if (jac >= NEAR_DUPLICATE_JACCARD or con >= NEAR_DUPLICATE_CONTAINMENT) and (
                            best is None or jac > best.jaccard):
                        best = Match(self._keys[i], self._titles[i], self._firsts[i], round(jac, 3), round(con, 3))
            out.append(best)
        return out

    @staticmethod
    def _band_keys(sets: Sequence[array[int]]) -> list[list[int] | None]:
        """Each text's band keys (None: too short ever to be called a near-duplicate)."""
        import numpy as np

        idx = [k for k, s in enumerate(sets) if len(s) >= MIN_SHINGLES]
        out: list[list[int] | None] = [None] * len(sets)
        if not idx:
            return out
        flat = np.concatenate([np.frombuffer(sets[k], dtype=np.int64) for k in idx])
        sizes = np.array([len(sets[k]) for k in idx], dtype=np.int64)
        sig = _signatures(flat, sizes)
        keys = np.zeros((len(idx), BANDS), dtype=np.uint64)
        for t in range(BANDS):
            key = np.zeros(len(idx), dtype=np.uint64)
            for col in sig[:, t * ROWS:(t + 1) * ROWS].T:  # as textscan._lsh_candidates keys a band
                key = key * np.uint64(0x9E3779B97F4A7C15) + col
            keys[:, t] = key
        for row, k in zip(keys.tolist(), idx, strict=True):
            out[k] = [key * BANDS + t for t, key in enumerate(row)]  # the band's number: equal rows of two differ
        return out
