"""Peak memory of one job against its section count: is it linear, and how many KB does a section cost?

    .venv/bin/python benchmarks/section_memory.py                          # 1,536 / 3,072 / 6,144 sections
    .venv/bin/python benchmarks/section_memory.py --sections 1536,6144 --time-scale 2

Each size runs the real job (``agenerate``, ``formats=("md",)``, the published take's prompts and 250 words, cap
256 per card) against simulated cards in a fresh child process, so that each peak RSS (``ru_maxrss``) is that
run's own. Besides the peak the child reports its RSS when the last section came in (``rss at last section``):
the difference is what finishing the book (assembly, the defect report, stats) adds on top of the writing.
``KB/section`` is the slope between consecutive rows: (peak RSS difference) / (sections difference).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time

SHAPES = {1536: (8, 12, 16), 3072: (16, 12, 16), 6144: (16, 24, 16), 768: (4, 12, 16), 12288: (32, 24, 16)}


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def one(sections: int, cards: int, time_scale: float, interval: int) -> dict:
    import anyio

    from orchestrator import Settings, agenerate
    from orchestrator.core.config import PRESETS
    from orchestrator.core.events import NodeFinished
    from orchestrator.sim.launch import SimFleet

    parts, chapters, per = SHAPES[sections]
    preset = dict(PRESETS["published-take"])
    prompt = preset.pop("prompt")
    preset.update(parts=parts, chapters=chapters, sections=per)
    settings = Settings(**preset, formats=("md",))
    seen = {"done": 0, "rss_last": 0.0}

    def on_event(ev: object) -> None:
        if isinstance(ev, NodeFinished) and ev.kind == "section":
            seen["done"] += 1
            if seen["done"] == sections:
                seen["rss_last"] = _rss_mb()

    with SimFleet(cards, time_scale=time_scale, stream_interval=interval, startup_timeout=60.0) as fleet, \
            tempfile.TemporaryDirectory() as out:
        t0 = time.monotonic()
        result = anyio.run(lambda: agenerate(prompt, fleet.urls, settings, out=out, on_event=on_event, fresh=True))
        wall = time.monotonic() - t0
    return {"sections": result.stats["sections"], "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            / 1024, "rss_last_mb": seen["rss_last"], "wall_s": wall, "empty": result.stats["empty_sections"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sections", default="1536,3072,6144", help=f"comma-separated, from {sorted(SHAPES)}")
    ap.add_argument("--cards", type=int, default=6)
    ap.add_argument("--time-scale", type=float, default=1.0, help="memory does not depend on the simulator keeping up")
    ap.add_argument("--stream-interval", type=int, default=4)
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the child: run one size, print its row as JSON
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one, a.cards, a.time_scale, a.stream_interval)))
        return 0
    try:
        sizes = [int(x) for x in a.sections.split(",") if x.strip()]
    except ValueError:
        sizes = []
    if not sizes or any(s not in SHAPES for s in sizes):
        print(f"section_memory: --sections takes counts from {sorted(SHAPES)}", file=sys.stderr)
        return 2
    rows = []
    for n in sizes:
        cmd = [sys.executable, __file__, "--one", str(n), "--cards", str(a.cards), "--time-scale", str(a.time_scale),
               "--stream-interval", str(a.stream_interval)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            print(f"section_memory: the {n}-section run failed:\n{out.stderr[-2000:]}", file=sys.stderr)
            return 1
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"[{n} sections: {rows[-1]['wall_s']:.0f} s wall]", file=sys.stderr, flush=True)
    print(f"{a.cards} cards, time-scale {a.time_scale:g}, stream interval {a.stream_interval}")
    print(f"{'sections':>8}  {'peak RSS MB':>11}  {'rss at last section MB':>22}  {'KB/section (slope)':>18}  "
          f"{'empty':>5}  {'wall s':>6}")
    prev = None
    for r in rows:
        slope = "" if prev is None else (f"{(r['peak_rss_mb'] - prev['peak_rss_mb']) * 1024 / (r['sections'] - prev['sections']):.1f}")
        print(f"{r['sections']:>8,}  {r['peak_rss_mb']:>11.0f}  {r['rss_last_mb']:>22.0f}  {slope:>18}  "
              f"{r['empty']:>5}  {r['wall_s']:>6.0f}")
        prev = r
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
