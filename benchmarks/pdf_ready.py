"""When the PDF is ready: the published take with typesetting while writing, and without it, in one run.

    .venv/bin/python benchmarks/pdf_ready.py                          # 6 cards, 8 x 12 x 16, time-scale 3
    .venv/bin/python benchmarks/pdf_ready.py --cards 1 --parts 8 --chapters 4 --time-scale 1   # two waves
    .venv/bin/python benchmarks/pdf_ready.py --json

Starts N simulated cards at the reference engine model (as benchmarks/published_take.py does) and runs
``--preset published-take`` with ``--format md,pdf`` twice on the same cards: typesetting while writing (each part
laid out as soon as its last section is in: orchestrator/typeset/background.py) and ``--typeset-after-writing``
(the whole PDF after the last section). Typesetting is CPU work on this machine, so every time here is *wall*
seconds, not model seconds:

    1st part lead s   how long before the last section the first part was whole (its sections all in): the most
                      time any part's layout has to run while writing; median lead s: the median part's
    whole job s       job start -> book.md, stats and defects written (stats.json whole_job_s)
    PDF ready s       job start -> book.pdf on disk (pdf_ready_s)
    after write s     last section finished -> book.pdf on disk (typeset_after_write_s): what a reader waits for
    share             after write s / the after-writing run's after write s (the issue's target: <= 0.15)
    CPU during/after  layout CPU seconds of the workers before and after the last section (typeset_cpu_s)
    chunks early      chunks (front matter, parts) laid out while writing and taken by the final layout
    sim late s        how far the simulated cards fell behind their schedule so far (wall s, cumulative)
    same PDF          the two PDFs have the same page count and the same text on every page

Why the share is what it is: each part waits for its slowest section, so the sections' end times decide it (on
the published take every section runs in one wave and every part finishes within the last second or two of the
writing; with more sections than slots, parts finish in book order, wave by wave). ``--json`` prints the rows.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

import anyio
from pypdf import PdfReader

from orchestrator import Settings, agenerate
from orchestrator.config import PRESETS
from orchestrator.events import NodeFinished
from orchestrator.sim.launch import SimFleet

STEP_MS, PER_STREAM_MS = 12.94, 0.2451


def pdf_digest(path: Path) -> tuple[int, str]:
    """Pages, and a digest of every page's text in order."""
    reader = PdfReader(str(path))
    h = hashlib.blake2b(digest_size=16)
    for page in reader.pages:
        h.update(page.extract_text().encode("utf-8", "replace") + b"\f")
    return len(reader.pages), h.hexdigest()


class PartClock:
    """Event consumer: when each part's last section finished (the earliest a part can be laid out)."""

    def __init__(self) -> None:
        self.ends: dict[str, float] = {}

    def __call__(self, ev: object) -> None:
        if isinstance(ev, NodeFinished) and ev.kind == "section":
            part = ev.path.split(".", 1)[0]
            self.ends[part] = max(self.ends.get(part, 0.0), ev.t)

    def lead_s(self) -> tuple[float, float]:
        """How long before the last section the first part, and the median part, were whole."""
        if not self.ends:
            return 0.0, 0.0
        last = max(self.ends.values())
        leads = sorted(last - t for t in self.ends.values())
        return leads[-1], leads[len(leads) // 2]


def run_once(fleet: SimFleet, background: bool, shape: dict, out: Path) -> dict:
    preset = dict(PRESETS["published-take"])
    prompt = preset.pop("prompt")
    preset.update(shape)
    settings = Settings(**preset, formats=("md", "pdf"), typeset_while_writing=background)
    clock = PartClock()
    t0 = time.monotonic()
    result = anyio.run(lambda: agenerate(prompt, fleet.urls, settings, out=str(out), on_event=clock, fresh=True))
    wall = time.monotonic() - t0
    st = result.stats
    cpu = st.get("typeset_cpu_s") or {}
    pages, digest = pdf_digest(out / "book.pdf")
    first_lead, median_lead = clock.lead_s()
    return {
        "mode": "while writing" if background else "after writing",
        "sections": st["sections"],
        "whole_job_s": st["whole_job_s"],
        "pdf_ready_s": st["pdf_ready_s"],
        "typeset_after_write_s": st["typeset_after_write_s"],
        "typeset_s": st["typeset_s"],
        "cpu_during_write_s": cpu.get("during_write", 0.0),
        "cpu_after_write_s": cpu.get("after_write", 0.0),
        "chunks_from_background": cpu.get("chunks_from_background", 0),
        "first_part_lead_s": first_lead,
        "median_part_lead_s": median_lead,
        "pdf_pages": st["pdf_pages"],
        "errors": st["request_errors"],
        "empty_sections": st["empty_sections"],
        "wall_s": wall,
        "sim_late_s": max(x["late_s"] for x in fleet.all_stats()),  # since the cards started
        "digest": digest,
        "pages_read": pages,
    }


def table(rows: list[dict]) -> str:
    base = next((r for r in rows if r["mode"] == "after writing"), rows[-1])
    cols = [("mode", "mode", "{}"), ("sections", "sections", "{:,}"),
            ("1st part lead s", "first_part_lead_s", "{:.1f}"), ("median lead s", "median_part_lead_s", "{:.1f}"),
            ("whole job s", "whole_job_s", "{:.1f}"),
            ("PDF ready s", "pdf_ready_s", "{:.1f}"), ("after write s", "typeset_after_write_s", "{:.2f}"),
            ("share", "share", "{:.2f}"), ("typeset s", "typeset_s", "{:.1f}"),
            ("CPU during", "cpu_during_write_s", "{:.1f}"), ("CPU after", "cpu_after_write_s", "{:.1f}"),
            ("chunks early", "chunks_from_background", "{}"), ("pages", "pdf_pages", "{:,}"),
            ("errors", "errors", "{}"), ("sim late s", "sim_late_s", "{:.2f}"), ("same PDF", "same", "{}")]
    for r in rows:
        r["share"] = r["typeset_after_write_s"] / base["typeset_after_write_s"] if base["typeset_after_write_s"] else 0
        r["same"] = "yes" if (r["pages_read"], r["digest"]) == (base["pages_read"], base["digest"]) else "NO"
    cells = [[fmt.format(r[k]) for _, k, fmt in cols] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, (h, _, _) in enumerate(cols)]
    lines = ["  ".join(h.rjust(w) for (h, _, _), w in zip(cols, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cards", type=int, default=6)
    ap.add_argument("--time-scale", type=float, default=3.0, help="stretch the simulator's clock (as published_take)")
    ap.add_argument("--parts", type=int)
    ap.add_argument("--chapters", type=int)
    ap.add_argument("--sections", type=int)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    shape = {k: v for k, v in (("parts", args.parts), ("chapters", args.chapters), ("sections", args.sections))
             if v is not None}
    rows = []
    with tempfile.TemporaryDirectory(prefix="pdf-ready-") as tmp, \
            SimFleet(args.cards, time_scale=args.time_scale, step_ms=STEP_MS, per_stream_ms=PER_STREAM_MS,
                     stream_interval=4, startup_timeout=60.0) as fleet:
        for background in (True, False):
            rows.append(run_once(fleet, background, shape, Path(tmp) / str(background)))
            print(f"[{rows[-1]['mode']}: {rows[-1]['wall_s']:.0f} s wall]", file=sys.stderr, flush=True)
    print(f"{args.cards} simulated cards, time-scale {args.time_scale:g}; wall seconds")
    print(table(rows))
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
