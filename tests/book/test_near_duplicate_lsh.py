"""The near-duplicate search (MinHash LSH beside a sampled index) against measuring every pair exactly: planted
pairs at, above and just below the thresholds, containment of short texts in long ones, boilerplate, the edge
cases, and the same answer in every process."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from datasketch import MinHash

from orchestrator.book import textscan
from orchestrator.book.textscan import (
    BANDS,
    ESTIMATE_SIGMAS,
    LSH_SEED,
    MIN_SHINGLES,
    NEAR_DUPLICATE_CONTAINMENT,
    NEAR_DUPLICATE_JACCARD,
    NUM_PERM,
    PRE_PERM,
    ROWS,
    near_duplicates,
    shingles,
)
from orchestrator.sim.context import Context
from orchestrator.sim.prose import make_prose
from orchestrator.sim.words import CONCEPTS

ROOT = Path(__file__).resolve().parents[2]


def truth(texts: list[str]) -> list[tuple[int, int, float, float]]:
    """Every pair measured exactly, in near_duplicates' order."""
    sets = [set(shingles(t)) for t in texts]
    want = []
    for i in range(len(texts)):
        for j in range(i + 1, len(texts)):
            a, b = sets[i], sets[j]
            if len(a) < MIN_SHINGLES or len(b) < MIN_SHINGLES:
                continue
            inter = len(a & b)
            jac, con = inter / len(a | b), inter / min(len(a), len(b))
            if jac >= NEAR_DUPLICATE_JACCARD or con >= NEAR_DUPLICATE_CONTAINMENT:
                want.append((i, j, jac, con))
    want.sort(key=lambda t: (-t[2], -t[3], t[0], t[1]))
    return want


def measure(a: str, b: str) -> tuple[float, float]:
    x, y = set(shingles(a)), set(shingles(b))
    inter = len(x & y)
    return inter / len(x | y), inter / min(len(x), len(y))


def styled(seed: int, words: int = 250) -> str:
    """A section in the simulator's style: its word banks make unrelated sections share many shingles."""
    rng = random.Random(seed)
    concept = rng.choice(CONCEPTS)
    return make_prose(rng, Context("section", (concept,), concept, f"{concept} {seed}"), words)


class Words:
    """Fresh words from a large vocabulary: their shingles are nobody else's."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def __call__(self, k: int) -> list[str]:
        return [f"w{self.rng.randrange(10**9)}" for _ in range(k)]


def jaccard_variant(base: list[str], target: float, fresh: Words) -> list[str]:
    """``base`` with its end written anew so that the two have Jaccard similarity ``target`` or just above it."""
    n = len(base) - 4  # shingles
    keep = math.ceil(2 * n * target / (1 + target) - 1e-9)  # the fewest shared shingles s: s / (2n - s) >= target
    return base[: keep + 4] + fresh(len(base) - keep - 4)


@pytest.fixture(scope="module")
def planted() -> tuple[list[str], dict[str, list[tuple[int, int]]]]:
    """~330 texts: styled sections and fresh ones, with planted pairs by kind (the pair's indices)."""
    fresh = Words(7)
    texts = [styled(s) for s in range(150)] + [" ".join(fresh(random.Random(s).randint(120, 420))) for s in range(90)]
    kinds: dict[str, list[tuple[int, int]]] = {}

    def plant(kind: str, base: int, text: str) -> None:
        texts.append(text)
        kinds.setdefault(kind, []).append((base, len(texts) - 1))

    for k, target in enumerate((0.46, 0.48, 0.5, 0.5, 0.51, 0.53, 0.6, 0.75, 0.9)):
        for base in (150 + 3 * k, 160 + 3 * k):  # fresh texts, beside styled ones
            words = texts[base].split()
            plant(f"jaccard {target}", base, " ".join(jaccard_variant(words, target, fresh)))
    for k in range(6):  # a styled section with a paragraph changed, and one cut in the middle
        words = texts[k].split()
        third = len(words) // 3
        plant("styled edit", k, " ".join(words[:third] + fresh(20) + words[third + 20:]))
        plant("styled half", k + 10, " ".join(texts[k + 10].split()[: len(texts[k + 10].split()) // 2]))
    for k, size in enumerate((24, 30, 45, 80, 160, 190)):  # a short text cut from a long one (ratio 0.05 to 0.47)
        long = fresh(400)
        texts.append(" ".join(long))
        at = 37 * k
        plant(f"inside {size}", len(texts) - 1, " ".join(long[at:at + size]))
    for size, changed in ((60, 0.12), (60, 0.22), (120, 0.15), (120, 0.25)):
        long = fresh(380)  # partly inside: containment about 0.85 and 0.75 (the second of each just below)
        texts.append(" ".join(long))
        part = long[50:50 + size]
        cut = round(size * changed)
        plant(f"partly {changed}", len(texts) - 1, " ".join(part[:size // 2 - cut // 2] + fresh(cut)
                                                            + part[size // 2 - cut // 2 + cut:]))
    plant("copy", 3, texts[3])
    plant("copy", 200, texts[200])
    return texts, kinds


def test_agrees_with_every_pair_measured(planted: tuple[list[str], dict[str, list[tuple[int, int]]]]):
    texts, kinds = planted
    want = truth(texts)
    got = near_duplicates(texts)
    assert got == want
    pairs = {(i, j) for i, j, _, _ in want}
    for kind, planted_pairs in kinds.items():  # the test means something: each kind is near, at and off the mark
        jac, con = zip(*(measure(texts[i], texts[j]) for i, j in planted_pairs))
        is_near = [(i, j) in pairs for i, j in planted_pairs]
        if kind.startswith("jaccard"):
            assert all(is_near) == (min(jac) >= NEAR_DUPLICATE_JACCARD), (kind, jac)
        elif kind in ("partly 0.22", "partly 0.25"):
            assert max(con) < NEAR_DUPLICATE_CONTAINMENT and not any(is_near), (kind, con)
        else:
            assert all(is_near), (kind, jac, con)
        if kind.startswith(("inside", "partly")):
            assert max(jac) < NEAR_DUPLICATE_JACCARD, (kind, jac)  # found on containment alone
    at_mark = [measure(texts[i], texts[j])[0] for i, j in kinds["jaccard 0.5"]]
    assert min(at_mark) < 0.51 and all(j >= NEAR_DUPLICATE_JACCARD for j in at_mark)
    assert all(measure(texts[i], texts[j])[0] < NEAR_DUPLICATE_JACCARD for i, j in kinds["jaccard 0.48"])


def test_styled_sections_alone_are_no_near_duplicates():
    texts = [styled(1000 + s) for s in range(300)]
    assert near_duplicates(texts) == truth(texts) == []


def test_the_lsh_finds_a_pair_the_index_cannot_see_beside_boilerplate():
    """The pair's shared part is boilerplate held by more than MAX_DF texts but for ten words, whose 10 shingles
    hold fewer than the two samples the index needs (made so); the LSH does not look at how common a shingle is."""
    for seed in range(20):
        fresh = Words(seed)
        boilerplate = fresh(262)
        texts = [" ".join(boilerplate + fresh(138)) for _ in range(textscan.MAX_DF + 30)]  # Jaccard 0.483 each
        texts.append(" ".join(texts[0].split()[:272] + fresh(128)))  # 0.511 with text 0
        rest = (set(shingles(texts[0])) & set(shingles(texts[-1]))) - set(shingles(texts[1]))
        if len(rest) == 10 and sum(h % textscan.SAMPLE == 0 for h in rest) < 2:
            break
    else:
        pytest.fail("no such pair made")
    sets = [shingles(t) for t in texts]
    flat, sizes = np.concatenate([np.asarray(s, dtype=np.int64) for s in sets]), np.array([len(s) for s in sets])
    m = len(texts)
    code = 0 * m + (m - 1)
    assert code in set(textscan._lsh_candidates(textscan._signatures(flat, sizes), sizes).tolist())
    assert code not in set(textscan._index_candidates(flat, sizes).tolist())
    assert [(i, j) for i, j, _, _ in near_duplicates(texts)] == [(0, m - 1)] == [(i, j) for i, j, _, _ in truth(texts)]


def test_the_index_finds_short_texts_inside_long_ones_that_the_lsh_misses():
    fresh = Words(5)
    texts = [styled(2000 + s, 300) for s in range(60)]
    longs = [fresh(420) for _ in range(8)]
    texts += [" ".join(w) for w in longs]
    for k, w in enumerate(longs):  # 24 to 94 words of each, at Jaccard 0.05 to 0.2
        texts.append(" ".join(w[10 * k:10 * k + 24 + 10 * k]))
    sets = [shingles(t) for t in texts]
    flat, sizes = np.concatenate([np.asarray(s, dtype=np.int64) for s in sets]), np.array([len(s) for s in sets])
    m = len(texts)
    index = set(textscan._index_candidates(flat, sizes).tolist())
    lsh = set(textscan._lsh_candidates(textscan._signatures(flat, sizes), sizes).tolist())
    inside = [(60 + k) * m + 68 + k for k in range(8)]
    assert all(c in index for c in inside)
    assert sum(c in lsh for c in inside) <= 1  # a band in common at Jaccard 0.2 is a one-in-nine chance
    assert near_duplicates(texts) == truth(texts)
    assert {(i, j) for i, j, _, _ in near_duplicates(texts)} == {(60 + k, 68 + k) for k in range(8)}


def test_signatures_are_datasketchs_minhash():
    sets = [shingles(styled(s)) for s in range(5)] + [shingles(" ".join(Words(1)(30)))]
    flat, sizes = np.concatenate([np.asarray(s, dtype=np.int64) for s in sets]), np.array([len(s) for s in sets])
    sig = textscan._signatures(flat, sizes)
    assert sig.shape == (len(sets), NUM_PERM)
    for s, row in zip(sets, sig):
        m = MinHash(num_perm=NUM_PERM, seed=LSH_SEED, hashfunc=lambda h: (h ^ (h >> 32)) & 0xFFFFFFFF)
        m.update_batch(list(s))
        assert np.array_equal(m.hashvalues, row)


def binomial_cdf(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, x) * p**x * (1 - p) ** (n - x) for x in range(k + 1))


def test_a_pair_at_the_threshold_is_found_with_probability_099():
    """The S-curve at the Jaccard threshold, less the chance that the estimate filter drops such a pair."""
    s = NEAR_DUPLICATE_JACCARD
    assert NUM_PERM == ROWS * BANDS == 288 and (ROWS, BANDS) == (4, 72)
    band = 1 - (1 - s**ROWS) ** BANDS
    assert band >= 0.99 and 1 - (1 - s**ROWS) ** (BANDS - 1) < 0.99  # the fewest bands that reach it
    dropped = 0.0
    for k in (PRE_PERM, NUM_PERM):  # the two looks at the estimate (_plausible), at most the sum of their misses
        floor = s - ESTIMATE_SIGMAS * math.sqrt(s * (1 - s) / k)
        dropped += binomial_cdf(math.ceil(floor * k) - 1, k, s)
    assert dropped < 1e-6
    assert band * (1 - dropped) >= 0.99
    # and far from it, where unrelated texts in one style lie, few candidates
    assert 1 - (1 - 0.1**ROWS) ** BANDS < 0.01


def test_containment_pairs_of_similar_size_have_the_jaccard_the_lsh_needs():
    c, s = NEAR_DUPLICATE_CONTAINMENT, NEAR_DUPLICATE_JACCARD
    for r in (5 / 7, 0.8, 0.9, 1.0):
        assert c * r / (1 + r - c * r) >= s - 1e-12


def test_empty_single_and_tiny_texts():
    assert near_duplicates([]) == []
    assert near_duplicates([styled(1)]) == []
    assert near_duplicates(["", "", "   "]) == []
    words = Words(9)(30)
    short = " ".join(words[:MIN_SHINGLES + 3])  # 19 shingles: too short to count, even as copies
    just = " ".join(words[:MIN_SHINGLES + 4])  # 20
    assert len(shingles(short)) == MIN_SHINGLES - 1 and len(shingles(just)) == MIN_SHINGLES
    assert near_duplicates([short, short, "a b c d", "a b c d"]) == []
    assert near_duplicates([short, just, just, styled(2)]) == [(1, 2, 1.0, 1.0)]
    assert near_duplicates([just, " ".join(words), short]) == [(0, 1, 20 / 26, 1.0)]
    assert near_duplicates([just], [shingles(just)]) == []


def test_identical_groups_pair_up_even_when_everything_is_boilerplate():
    same = styled(5)
    texts = [same] * 4 + [styled(6)]
    assert [(i, j) for i, j, _, _ in near_duplicates(texts)] == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]


def test_the_same_answer_twice_and_in_every_process(planted: tuple[list[str], dict[str, list[tuple[int, int]]]]):
    """Shingles hash words by blake2b and MinHash is seeded, so string hashing (PYTHONHASHSEED) changes nothing."""
    texts, _ = planted
    first = near_duplicates(texts)
    assert near_duplicates(texts) == first
    assert near_duplicates(texts, [shingles(t) for t in texts]) == first
    code = ("import json, sys\n"
            "sys.path.insert(0, sys.argv[1])\n"
            "from tests.book.test_near_duplicate_lsh import styled\n"
            "from orchestrator.book.textscan import near_duplicates, shingles\n"
            "texts = [styled(s) for s in range(40)] + [styled(3)[:900], styled(7) + ' and more words to end']\n"
            "print(json.dumps([near_duplicates(texts), list(shingles(texts[0]))[:20]]))\n")
    outs = []
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        res = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True, env=env,
                             check=True, cwd=ROOT)
        outs.append(json.loads(res.stdout))
    assert outs[0] == outs[1]
    assert len(outs[0][0]) == 2  # the cut one inside its whole, the lengthened one beside its original
