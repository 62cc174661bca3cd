"""The defect report's near-duplicate search at a book's size and beyond: the new search (MinHash LSH beside a
sampled index, orchestrator.book.textscan.near_duplicates) against the old one (an inverted index over a
1-in-8 sample of the shingles, boilerplate cut at a tenth of the sections, copied below as it was).

    .venv/bin/python benchmarks/near_duplicates.py                      # 1,536, 6,144 and 20,000 sections
    .venv/bin/python benchmarks/near_duplicates.py --sizes 1536 --repeat 3 --old-up-to 20000

The sections are the simulator's (orchestrator.sim.text.answer to a section prompt, as a job gets them without
a server: sentence templates over shared word banks, so a tenth of all sections share each of their commonest
shingles), with planted near-duplicates: for every 256 sections, a copy of an earlier one with one paragraph
written anew and the first half of another (a short text inside a long one). Both searches get the shingles
made beforehand, as the defect report does (SectionText.shingles, made as each section lands); the time to make
them is shown apart. Each figure is the fastest of ``--repeat`` runs; the machine's load average is printed, as
wall time on a shared machine means little without it. The pairs each search finds are compared where both run.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import time
from array import array
from bisect import bisect_right
from collections import Counter, defaultdict
from functools import partial

from orchestrator.book import textscan
from orchestrator.book.textscan import MIN_SHINGLES, near_duplicates, shingles
from orchestrator.sim.text import answer
from orchestrator.sim.words import CONCEPTS, QUALIFIERS

PROMPT = 'Write the section "{}" of the chapter "{}" of "A software engineering handbook", about 250 words.'


def section_texts(n: int, seed: int = 20261130) -> list[str]:
    rng = random.Random(seed)
    texts: list[str] = []
    for k in range(n):
        if k % 256 == 100 and k > 200:  # an earlier section again, one paragraph of it written anew
            paragraphs = texts[rng.randrange(k - 200)].split("\n\n")
            paragraphs[len(paragraphs) // 2] = texts[rng.randrange(k)].split("\n\n")[0]
            texts.append("\n\n".join(paragraphs))
            continue
        if k % 256 == 200:  # the first half of an earlier one
            words = texts[rng.randrange(k - 100)].split(" ")
            texts.append(" ".join(words[: len(words) // 2]))
            continue
        title = f"{rng.choice(QUALIFIERS)} {rng.choice(CONCEPTS)} ({k})"
        body = {"messages": [{"role": "user", "content": PROMPT.format(title, rng.choice(CONCEPTS))}],
                "max_tokens": 520}
        texts.append(answer("sim-qwen3", body).text)
    return texts


# ---------------------------------------------------------------------------------------------------------------
# The old search, as textscan.py had it: candidates from an inverted index over the shingles whose hash is a
# multiple of 8, counted one text at a time; shingles in more than max(50, n / 10) texts make none.

OLD_SAMPLE = 8
OLD_SAMPLED_SHARE = 0.3


def old_near_duplicates(sets: list[array[int]]) -> list[tuple[int, int, float, float]]:
    max_df = max(50, len(sets) // 10)
    index: defaultdict[int, list[int]] = defaultdict(list)
    for i, s in enumerate(sets):
        if len(s) >= MIN_SHINGLES:
            for h in s:
                if h % OLD_SAMPLE == 0:
                    index[h].append(i)
    sampled = [sum(1 for h in s if h % OLD_SAMPLE == 0 and 2 <= len(index[h]) <= max_df)
               if len(s) >= MIN_SHINGLES else 0 for s in sets]
    found: dict[tuple[int, int], tuple[float, float]] = {}
    for i, s in enumerate(sets):
        if len(s) < MIN_SHINGLES:
            continue
        shared: Counter[int] = Counter()
        for h in s:
            if h % OLD_SAMPLE == 0:
                docs = index[h]
                if 2 <= len(docs) <= max_df:
                    shared.update(docs[bisect_right(docs, i):])
        mine = None
        for j, c in shared.items():
            if c >= 2 and c >= OLD_SAMPLED_SHARE * min(sampled[i], sampled[j]):
                mine = mine if mine is not None else set(s)
                textscan._check(i, j, mine, sets[j], found)
    same: dict[bytes, list[int]] = defaultdict(list)
    for i, s in enumerate(sets):
        if len(s) >= MIN_SHINGLES:
            same[hashlib.blake2b(s.tobytes(), digest_size=16).digest()].append(i)
    for group in same.values():
        for x in range(len(group)):
            for y in range(x + 1, len(group)):
                if (group[x], group[y]) not in found:
                    textscan._check(group[x], group[y], set(sets[group[x]]), sets[group[y]], found)
    out = [(i, j, jac, con) for (i, j), (jac, con) in found.items()]
    out.sort(key=lambda t: (-t[2], -t[3], t[0], t[1]))
    return out


# ---------------------------------------------------------------------------------------------------------------


def best(fn, repeat: int) -> tuple[float, list[tuple[int, int, float, float]]]:
    times, result = [], []
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return min(times), result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1536, 6144, 20000], help="sections per book")
    ap.add_argument("--repeat", type=int, default=1, help="runs per figure; the fastest is shown")
    ap.add_argument("--old-up-to", type=int, default=6144, help="time the old search up to this many sections")
    args = ap.parse_args()

    t = time.perf_counter()
    import datasketch  # noqa: F401  (the new search imports it on its first call: timed here, once a process)

    print(f"importing datasketch (numpy, scipy): {time.perf_counter() - t:.2f} s, once a process")
    print(f"LSH: {textscan.NUM_PERM} permutations, {textscan.BANDS} bands of {textscan.ROWS} rows; "
          f"P(found) at Jaccard {textscan.NEAR_DUPLICATE_JACCARD}: "
          f"{1 - (1 - textscan.NEAR_DUPLICATE_JACCARD ** textscan.ROWS) ** textscan.BANDS:.4f}\n")
    header = ("| sections | shingles s | new s | new pairs | old s | old pairs | same pairs | load |\n"
              "|---------:|-----------:|------:|----------:|------:|----------:|:----------:|-----:|")
    print(header)
    for n in args.sizes:
        texts = section_texts(n)
        t = time.perf_counter()
        sets = [shingles(x) for x in texts]
        shingle_s = time.perf_counter() - t
        load = os.getloadavg()[0]
        new_s, new = best(partial(near_duplicates, texts, sets), args.repeat)
        if n <= args.old_up_to:
            old_s, old = best(partial(old_near_duplicates, sets), args.repeat)
            lacks = f"new lacks {len(set(old) - set(new))}, old lacks {len(set(new) - set(old))}"
            cells = f"{old_s:.2f} | {len(old):,} | {'yes' if old == new else lacks}"
        else:
            cells = "– | – | –"
        print(f"| {n:,} | {shingle_s:.2f} | {new_s:.2f} | {len(new):,} | {cells} | {load:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
