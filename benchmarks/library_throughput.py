"""A library against the fleet's own sustained rate, and the same books one after another as the CLI would.

    .venv/bin/python benchmarks/library_throughput.py                  # 40 books of 2 x 4 x 8 on 4 cards, cap 64
    .venv/bin/python benchmarks/library_throughput.py --books 12 --quick

Starts 4 simulated cards (12.94 ms + 0.2451 ms per running stream per step, stream interval 4), measures one
`handbook bench` level at ``--cap`` streams per card on them (its server-counted sustained rate: what the fleet
delivers held at that cap), then runs a library of ``--books`` books (``generate_library``: one fleet, sections
unstreamed) and the same books one after another (``agenerate`` per book, as a loop over `handbook` would). Each
row: whole job (model seconds = wall / time-scale), server-counted tokens (the cards' own counters, before and
after), tokens per model second over the whole job, and that over the bench level's sustained rate.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import anyio

from orchestrator import Settings, agenerate, agenerate_library
from orchestrator.bench import BenchSettings, run_ladder
from orchestrator.sim.launch import SimFleet

STEP_MS, PER_STREAM_MS = 12.94, 0.2451


def books_file(path: Path, n: int, shape: tuple[int, int, int]) -> Path:
    parts, chapters, sections = shape
    lines = [json.dumps({"id": f"book-{i:03d}", "prompt": f"A handbook of subject number {i}", "parts": parts,
                         "chapters": chapters, "sections": sections}) for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


def server_tokens(fleet: SimFleet) -> int:
    return sum(s["generation_tokens"] for s in fleet.all_stats())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cards", type=int, default=4)
    ap.add_argument("--cap", type=int, default=64)
    ap.add_argument("--books", type=int, default=40)
    ap.add_argument("--shape", default="2x4x8", help="parts x chapters x sections of every book")
    ap.add_argument("--words", type=int, default=60)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--time-scale", type=float, default=2.0)
    ap.add_argument("--quick", action="store_true", help="skip the one-after-another run")
    ap.add_argument("--books-in-flight", type=int, help="default: the library's own choice")
    ap.add_argument("--context", choices=("outline", "none"), default="outline",
                    help="what each section request carries (default outline, the job's default; none: the titles "
                    "alone, as the bench level's short prompts)")
    a = ap.parse_args()
    shape = tuple(int(x) for x in a.shape.lower().split("x"))
    assert len(shape) == 3
    ts = a.time_scale
    rows = []
    with tempfile.TemporaryDirectory() as tmp, SimFleet(a.cards, time_scale=ts, step_ms=STEP_MS,
                                                       per_stream_ms=PER_STREAM_MS, stream_interval=4,
                                                       startup_timeout=60.0) as fleet:
        ladder = anyio.run(run_ladder, BenchSettings(backends=tuple(fleet.urls), streams=(a.cap,), window=10.0,
                                                     max_tokens=a.max_tokens, out=str(Path(tmp) / "bench")))
        level = ladder["levels"][0]
        sustained = level["sustained_tok_s"] * ts  # model tok/s
        print(f"[bench level: {a.cap} streams per card on {a.cards} cards: {sustained:,.0f} tok/s sustained "
              "(model)]", file=sys.stderr, flush=True)
        settings = Settings(cap=a.cap, words=a.words, max_tokens=a.max_tokens, formats=("md",),
                            stream_sections="auto", context=a.context)
        file = books_file(Path(tmp) / "library.jsonl", a.books, shape)  # type: ignore[arg-type]

        t0, tok0 = time.monotonic(), server_tokens(fleet)
        result = anyio.run(lambda: agenerate_library(file, fleet.urls, settings, Path(tmp) / "library",
                                                     books_in_flight=a.books_in_flight))
        rows.append(("library", time.monotonic() - t0, server_tokens(fleet) - tok0, result.stats["sections"],
                     result.stats["books_in_flight"], len(result.failed_books)))
        print(f"[library: {rows[-1][1]:.0f} s wall]", file=sys.stderr, flush=True)
        if not a.quick:
            t0, tok0 = time.monotonic(), server_tokens(fleet)
            sections = failed = 0

            async def one_by_one() -> None:
                nonlocal sections, failed
                for i in range(a.books):
                    book = Settings(cap=a.cap, words=a.words, max_tokens=a.max_tokens, formats=("md",),
                                    parts=shape[0], chapters=shape[1], sections=shape[2], context=a.context)
                    r = await agenerate(f"A handbook of subject number {i}", fleet.urls, book,
                                        Path(tmp) / "one" / str(i))
                    sections += r.stats["sections"]
                    failed += 0 if r.complete else 1

            anyio.run(one_by_one)
            rows.append(("one after another", time.monotonic() - t0, server_tokens(fleet) - tok0, sections, 1,
                         failed))
        late = max(s["late_s"] for s in fleet.all_stats()) / ts
    print(f"\n{a.books} books of {a.shape} (--context {a.context}) on {a.cards} simulated cards at cap {a.cap}; "
          "bench level sustained "
          f"{sustained:,.0f} tok/s (model); time-scale {ts:g}, sim late {late:.2f} model s\n")
    head = ("run", "books in flight", "sections", "failed books", "whole job s", "server tokens", "tok/s",
            "of bench level")
    cells = []
    for name, wall, tokens, secs, inflight, failed in rows:
        whole = wall / ts
        rate = tokens / whole if whole else 0.0
        cells.append((name, str(inflight), f"{secs:,}", str(failed), f"{whole:,.1f}", f"{tokens:,}", f"{rate:,.0f}",
                      f"{rate / sustained:.3f}"))
    if len(rows) == 2:
        speedup = rows[1][1] / rows[0][1]
        cells.append(("library / one after another", "", "", "", f"{speedup:.2f}x faster", "", "", ""))
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    print("  ".join(h.rjust(w) for h, w in zip(head, widths)))
    for c in cells:
        print("  ".join(x.rjust(w) for x, w in zip(c, widths)))


if __name__ == "__main__":
    main()
