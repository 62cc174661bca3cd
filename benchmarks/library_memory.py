"""A library's peak memory against its size: the same books in flight, four times the books.

    .venv/bin/python benchmarks/library_memory.py                    # 50 and 200 books of 1 x 2 x 4, 4 in flight
    .venv/bin/python benchmarks/library_memory.py --books 50,200,800

Each size runs ``generate_library`` in a child process of its own (its peak RSS is its own) against the same
simulated cards, with ``--books-in-flight`` fixed, and prints the child's peak RSS, the whole job and the sections;
the last column is the peak over the first size's. What a library holds grows with the books only where it must:
one 64-bit digest per id while the file is checked, the ids of the dataset's books, and at the end the shingles of
every section for the library's near-duplicate search; the books in flight, their journals and the dataset's row
groups are the same size whatever the library's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from orchestrator.sim.launch import SimFleet

CHILD = r"""
import json, resource, sys, time
from orchestrator import Settings, generate_library
file, out, urls, in_flight = sys.argv[1], sys.argv[2], sys.argv[3].split(","), int(sys.argv[4])
settings = Settings(cap=16, words=40, max_tokens=60, formats=("md",), stream_sections="auto")
t = time.monotonic()
r = generate_library(file, urls, settings, out, books_in_flight=in_flight)
print(json.dumps({"rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "s": time.monotonic() - t,
                  "sections": r.stats["sections"], "failed": len(r.failed_books)}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--books", default="50,200")
    ap.add_argument("--in-flight", type=int, default=4)
    ap.add_argument("--cards", type=int, default=2)
    a = ap.parse_args()
    sizes = [int(x) for x in a.books.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp, SimFleet(a.cards, time_scale=1.0, stream_interval=4) as fleet:
        for n in sizes:
            file = Path(tmp) / f"lib{n}.jsonl"
            file.write_text("\n".join(json.dumps({"id": f"b{i:05d}", "prompt": f"A handbook of subject {i}",
                                                  "parts": 1, "chapters": 2, "sections": 4}) for i in range(n)) + "\n")
            proc = subprocess.run([sys.executable, "-c", CHILD, str(file), str(Path(tmp) / f"out{n}"),
                                   ",".join(fleet.urls), str(a.in_flight)], capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                sys.exit(f"library of {n} books failed: {proc.stderr.strip().splitlines()[-1:]}")
            rows.append((n, json.loads(proc.stdout.strip().splitlines()[-1])))
            print(f"[{n} books: {rows[-1][1]['s']:.0f} s]", file=sys.stderr, flush=True)
    base = rows[0][1]["rss_mb"]
    head = ("books", "in flight", "sections", "failed", "whole job s", "peak RSS MB", "of the first")
    cells = [(str(n), str(a.in_flight), f"{r['sections']:,}", str(r["failed"]), f"{r['s']:.1f}", f"{r['rss_mb']:.0f}",
              f"{r['rss_mb'] / base:.2f}") for n, r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    print("  ".join(h.rjust(w) for h, w in zip(head, widths)))
    for c in cells:
        print("  ".join(x.rjust(w) for x, w in zip(c, widths)))


if __name__ == "__main__":
    main()
