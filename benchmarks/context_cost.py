"""What sections that see the plan cost on the fleet (issue 28 §2): the published take's shape with ``--context
outline``, with and without prefix-cache affinity, beside ``--context none``, on simulated cards whose prefix
cache and prefill cost model vLLM's (orchestrator/sim/prefix.py: 16-token blocks, 0.07 ms a computed prompt token).

    .venv/bin/python benchmarks/context_cost.py                          # 6 cards, 8 x 12 x 16, time-scale 3
    .venv/bin/python benchmarks/context_cost.py --quick                  # 6 cards, 4 x 12 x 16
    .venv/bin/python benchmarks/context_cost.py --variants none,outline --time-scale 4

Each variant runs on a fresh fleet (empty caches, counters from zero): every setting of ``--preset published-take``
(its prompt, 250 words, a 520-token cap, temperature 0, cap 256, its plan with repeated titles and no repairs) but
the context and affinity, Markdown only. Printed per variant, times in model seconds (wall / time-scale):

    whole job     stats.json whole_job_s (plan, write) and its cost against ``none``: (variant / none - 1)
    prompt tok    prompt tokens the cards were sent (vllm:prompt_tokens_total, summed over cards)
    computed      of those, the tokens the cards computed: not found in their prefix cache (/sim/stats)
    hit rate      stats.json server_counted.prefix_cache_hit_rate: the job's own reading of the cards' counters
                  (vllm:prefix_cache_hits_total / queries_total over the writing window), with its coverage
    in home       the share of sections served by their chapter's first card (the affinity rule's aim)

The target of the issue: with affinity, the context costs at most 3% of the whole job.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter

import anyio

from orchestrator import Settings, agenerate
from orchestrator.core.config import PRESETS, Backend
from orchestrator.core.events import NodeFinished
from orchestrator.sim.launch import SimFleet

STEP_MS, PER_STREAM_MS = 12.94, 0.2451
VARIANTS = {
    "none": {"context": "none"},
    "outline": {"context": "outline", "affinity": True},
    "outline without affinity": {"context": "outline", "affinity": False},
}


def run_once(name: str, cards: int, time_scale: float, shape: dict) -> dict:
    preset = dict(PRESETS["published-take"])
    prompt = preset.pop("prompt")
    preset.update(shape)
    preset.update(VARIANTS[name])
    settings = Settings(**preset, formats=("md",))
    homes: dict[str, Counter] = {}

    def on_event(ev: object) -> None:
        if isinstance(ev, NodeFinished) and ev.kind == "section":
            homes.setdefault(ev.path.rsplit(".", 1)[0], Counter())[ev.reply.backend] += 1

    with SimFleet(cards, time_scale=time_scale, step_ms=STEP_MS, per_stream_ms=PER_STREAM_MS, stream_interval=4,
                  startup_timeout=60.0) as fleet, tempfile.TemporaryDirectory() as out:
        t0 = time.monotonic()
        backends = [Backend(u, cap=settings.cap) for u in fleet.urls]
        result = anyio.run(lambda: agenerate(prompt, backends, settings, out=out, on_event=on_event, fresh=True))
        wall = time.monotonic() - t0
        sims = fleet.all_stats()
    st = result.stats
    sc = st.get("server_counted") or {}
    ts = time_scale
    served = sum(sum(c.values()) for c in homes.values())
    return {
        "variant": name,
        "whole_job_s": st["whole_job_s"] / ts,
        "plan_time_s": st["plan_time_s"] / ts,
        "write_time_s": st["write_time_s"] / ts,
        "sections": st["sections"],
        "planning_requests": st["planning_requests"],
        "request_errors": st["request_errors"],
        "failed_sections": st["failed_sections"],
        "prompt_tokens": sum(s["prompt_tokens"] for s in sims),
        "prefill_tokens_computed": sum(s["prefill_tokens_computed"] for s in sims),
        "prefix_cache_hit_rate": sc.get("prefix_cache_hit_rate"),
        "hit_rate_coverage": sc.get("prefix_cache_coverage"),
        "in_home": sum(c.most_common(1)[0][1] for c in homes.values()) / served if served else 0.0,
        "sim_late_s": max(s["late_s"] for s in sims) / ts,
        "wall_s": wall,
    }


def table(rows: list[dict]) -> str:
    base = next((r for r in rows if r["variant"] == "none"), None)
    head = ("| variant | whole job s | vs none | plan s | write s | prompt tok | computed | hit rate | in home | "
            "planning requests | errors | sim late s |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        cost = f"{r['whole_job_s'] / base['whole_job_s'] - 1:+.1%}" if base else "-"
        hit = "-" if r["prefix_cache_hit_rate"] is None else f"{r['prefix_cache_hit_rate']:.1%}"
        lines.append(
            f"| {r['variant']} | {r['whole_job_s']:.2f} | {cost} | {r['plan_time_s']:.2f} | {r['write_time_s']:.2f} | "
            f"{r['prompt_tokens']:,} | {r['prefill_tokens_computed']:,} | {hit} | {r['in_home']:.0%} | "
            f"{r['planning_requests']} | {r['request_errors']} | {r['sim_late_s']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cards", type=int, default=6)
    ap.add_argument("--time-scale", type=float, default=3.0)
    ap.add_argument("--quick", action="store_true", help="4 parts instead of 8")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of: {', '.join(VARIANTS)}")
    ap.add_argument("--json", action="store_true", help="also print the rows as JSON")
    args = ap.parse_args()
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s): {', '.join(unknown)}")
    shape = {"parts": 4} if args.quick else {}
    rows = []
    for name in names:
        print(f"[{name} ...]", file=sys.stderr, flush=True)
        rows.append(run_once(name, args.cards, args.time_scale, shape))
    p = {**PRESETS["published-take"], **shape}
    print(f"published take's shape {p['parts']} x {p['chapters']} x {p['sections']} on {args.cards} simulated cards, "
          f"time-scale {args.time_scale:g} (model seconds)")
    print(table(rows))
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
