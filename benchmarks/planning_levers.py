"""Planning on the published take's critical path: what each lever buys, measured on the forecast's fleet model.

    .venv/bin/python benchmarks/planning_levers.py            # four tables, ~10 s
    .venv/bin/python benchmarks/planning_levers.py --json     # ... then the rows as JSON

The published take (8 x 12 x 16 sections, 520-token cap, cap 256 on each of 6 cards, a step of 12.94 ms + 0.2451
ms per running stream) is run through ``orchestrator.forecasting.simulate``: the event simulation of the fleet
that ``handbook plan`` forecasts with (within 2.4% of the simulated cards on this take: forecast_accuracy.py), so a
lever is measured in milliseconds rather than in two-minute runs whose noise is as large as the effect. Each row
changes one thing and reports the whole job in model seconds and the efficiency (tokens / capacity / whole job,
as benchmarks/published_take.py computes it). Check a chosen row there with the real client and simulator.

1. Reply format: the tokens of a 16-title planning reply in each format, counted with the simulator's tokenizer
   on the simulator's own titles, and the whole job when every planning reply is that much longer or shorter.
2. Card load while planning runs: the 96 chapter requests held on ``k`` cards, whose sections are limited to
   ``L`` in flight until their planning is done (the lower the load, the faster a planning token).
3. Floors: planning at no cost (the outline known at t=0) and a fraction of today's planning tokens.
4. Assembly after the last section: book.md's section bodies (markdown-it parse, cut back) made after the last
   section, as before, or as each section lands (SectionText.body), in CPU seconds on this machine.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import time
from contextlib import contextmanager
from dataclasses import replace

import orjson

from orchestrator import Settings
from orchestrator.book.assemble import SectionText, assemble
from orchestrator.core.config import PRESETS
from orchestrator.core.outline import Chapter, Outline, Part
from orchestrator.forecasting import model as fmodel
from orchestrator.forecasting import simulate as fsim
from orchestrator.forecasting.model import StepFit, forecast
from orchestrator.sim import text as simtext
from orchestrator.sim.context import Context
from orchestrator.sim.titles import make_titles

STEP_MS, PER_STREAM_MS, CAP, CARDS = 12.94, 0.2451, 256, 6
CAPACITY = CARDS * CAP * 1000.0 / (STEP_MS + PER_STREAM_MS * CAP)


class _Policy(fsim._Run):
    """The fleet of forecasting/simulate.py, but planning requests of levels up to ``protect`` (1: the book and
    the parts; 2: the chapters too) only on ``plan_cards`` and, on a card with such a request in flight, at most
    ``limit`` requests in all (the others wait for room elsewhere or for the planning to end)."""

    plan_cards: frozenset[int] | None = None
    limit = CAP
    protect = 2

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.planning = [0] * len(self.cap)

    def _pick_for(self, level: int) -> int:
        n = len(self.cap)
        start = next(self.rr) % n
        best, best_load = -1, 2.0
        for j in range(n):
            i = (start + j) % n
            room = self.limit if self.planning[i] and level > self.protect else self.cap[i]
            if self.run[i] >= min(room, self.cap[i]):
                continue
            if level <= self.protect and self.plan_cards is not None and i not in self.plan_cards:
                continue
            load = self.run[i] / self.cap[i]
            if load < best_load:
                best, best_load = i, load
        return best

    def _dispatch(self) -> None:
        held = []
        while self.ready:
            item = heapq.heappop(self.ready)
            node = self.nodes[item[2]]
            i = self._pick_for(node.level)
            if i < 0:
                held.append(item)
                if node.level == fsim.SECTION:
                    break  # sections are served in order: none may pass the one that waits
                continue
            self.planning[i] += node.level <= self.protect
            self._start(i, item[2])
        for item in held:
            heapq.heappush(self.ready, item)

    def _fire(self, i: int) -> None:
        _, _, k, c = self.due[i][0]
        if c < 0 and self.nodes[k].level <= self.protect:
            self.planning[i] -= 1
        super()._fire(i)


@contextmanager
def _patched(*, plan_scale: float = 1.0, plan_cards: frozenset[int] | None = None, limit: int = CAP,
             protect: int = 2):
    planning = fmodel.PLANNING
    run = fsim._Run
    fmodel.PLANNING = replace(planning, per_title=tuple(x * plan_scale for x in planning.per_title),
                              overhead=tuple(x * plan_scale for x in planning.overhead))
    if plan_cards is not None or limit != CAP:
        _Policy.plan_cards, _Policy.limit, _Policy.protect = plan_cards, limit, protect
        fsim._Run = _Policy
    try:
        yield
    finally:
        fmodel.PLANNING, fsim._Run = planning, run


def whole_job(**lever) -> dict:
    preset = dict(PRESETS["published-take"])
    preset.pop("prompt")
    settings = Settings(**preset, pipeline=True, formats=("md",))
    fits = [StepFit(f"card{i}", STEP_MS, PER_STREAM_MS, CAP, "reference engine model") for i in range(CARDS)]
    with _patched(**lever):
        f = forecast(None, settings, fits)
    return {"whole_job_s": f.whole_job_s, "plan_s": f.plan_s, "tokens": f.tokens,
            "efficiency": f.tokens / CAPACITY / f.whole_job_s}


def planned_floor() -> dict:
    """Every section ready at t=0 (no planning request): the one-wave bound plus the job's own overheads."""
    preset = dict(PRESETS["published-take"])
    preset.pop("prompt")
    settings = Settings(**preset, pipeline=True, formats=("md",))
    fits = [StepFit(f"card{i}", STEP_MS, PER_STREAM_MS, CAP, "reference engine model") for i in range(CARDS)]
    full = forecast(None, settings, fits)
    book = fmodel._Book.of(None, settings)
    outline = Outline("Book", tuple(Part(f"P{p}", tuple(Chapter(f"C{c}", tuple(f"S{s}" for s in range(n)))
                                                         for c, n in enumerate(ch)))
                                    for p, ch in enumerate([[len(c) for c in part] for part in book.parts])))
    f = forecast(outline, settings, fits, planned=True)
    # the same tokens as the planned job (sections and planning), so the rows compare
    return {"whole_job_s": f.whole_job_s, "plan_s": 0.0, "tokens": full.tokens,
            "efficiency": full.tokens / CAPACITY / f.whole_job_s}


def reply_formats() -> dict[str, int]:
    rng = random.Random(7)
    titles = make_titles(rng, Context("section", "Version Control", "version control", "software engineering"), 16)
    texts = {
        "compact JSON (ours)": orjson.dumps({"items": titles}).decode(),
        "JSON with spaces": json.dumps({"items": titles}),
        "pretty JSON (indent 2)": json.dumps({"items": titles}, indent=2),
        "numbered list": "\n".join(f"{i}. {t}" for i, t in enumerate(titles, 1)),
        "plain lines": "\n".join(titles),
    }
    return {name: len(simtext.tokenize(text)) for name, text in texts.items()}


def assembly_cpu_s(sections: int = 1536) -> dict:
    """CPU seconds to assemble book.md after the last section: bodies made then, or made as sections landed."""
    parts = tuple(Part(f"P{p}", tuple(Chapter(f"C{p}.{c}", tuple(f"S{p}.{c}.{s}" for s in range(16)))
                                      for c in range(12))) for p in range(sections // 192))
    outline = Outline("Book", parts)
    texts = {}
    for r in outline.sections():
        body = {"model": "m", "max_tokens": 520, "messages": [{"role": "user", "content":
                f"Book: A Handbook. Part: {r.part}. Chapter: {r.chapter}. Write the section \"{r.title}\" "
                "in about 250 words of Markdown."}]}
        pieces = simtext.answer("m", body).pieces
        texts[r.path] = ("".join(pieces[:520]), "length" if len(pieces) > 520 else "stop")

    def fresh() -> dict[str, SectionText]:
        return {r.path: SectionText(r.path, r.part, r.chapter, r.title, *texts[r.path]) for r in outline.sections()}

    cold = fresh()
    t0 = time.process_time()
    assemble(outline, cold)
    after_cold = time.process_time() - t0
    warm = fresh()
    t0 = time.process_time()
    for s in warm.values():
        _ = s.body
    during = time.process_time() - t0
    t0 = time.process_time()
    assemble(outline, warm)
    after_warm = time.process_time() - t0
    return {"sections": sections, "after_last_s_before": after_cold, "while_writing_s": during,
            "after_last_s_now": after_warm}


def _table(title: str, header: list[str], rows: list[list[str]]) -> None:
    print(title)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print("  ".join(h.rjust(w) for h, w in zip(header, widths)))
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    out: dict = {}

    base = whole_job()
    out["today"] = base
    fmt = reply_formats()
    ours = fmt["compact JSON (ours)"]
    rows = []
    out["formats"] = {}
    for name, tokens in fmt.items():
        r = whole_job(plan_scale=tokens / ours)
        out["formats"][name] = {"tokens": tokens, **r}
        rows.append([name, str(tokens), f"{tokens / ours:.2f}", f"{r['plan_s']:.2f}", f"{r['whole_job_s']:.2f}",
                     f"{r['efficiency']:.3f}"])
    _table("1. Planning reply format (16 titles; the simulator's tokenizer and titles)",
           ["format", "tokens", "x ours", "plan s", "whole job s", "efficiency"], rows)

    rows = []
    out["card_load"] = []
    for protect, name in ((1, "book, parts"), (2, "all planning")):
        for k in (1, 2, 3, 6):
            for limit in (0, 32, 128, 256):
                r = whole_job(plan_cards=frozenset(range(k)), limit=limit, protect=protect)
                out["card_load"].append({"protected": name, "planning_cards": k, "limit": limit, **r})
                rows.append([name, str(k), str(limit), f"{r['plan_s']:.2f}", f"{r['whole_job_s']:.2f}",
                             f"{r['efficiency']:.3f}"])
    _table("2. Card load while planning runs (the protected requests on k cards; L requests on a card while one runs)",
           ["protected", "k cards", "L", "plan s", "whole job s", "efficiency"], rows)

    rows = []
    out["floors"] = {}
    for name, r in [("today's planning replies", base), ("half the planning tokens", whole_job(plan_scale=0.5)),
                    ("a quarter", whole_job(plan_scale=0.25)), ("planning at no cost", planned_floor())]:
        out["floors"][name] = r
        rows.append([name, f"{r['plan_s']:.2f}", f"{r['whole_job_s']:.2f}", f"{r['efficiency']:.3f}"])
    _table("3. Floors (target: efficiency >= 0.92, whole job <= 34.9 s)",
           ["planning", "plan s", "whole job s", "efficiency"], rows)

    asm = assembly_cpu_s()
    out["assembly"] = asm
    _table("4. Assembling book.md after the last section (CPU s on this machine; model s = / time-scale)",
           ["sections", "after last, bodies then", "bodies while writing", "after last, now"],
           [[f"{asm['sections']:,}", f"{asm['after_last_s_before']:.2f}", f"{asm['while_writing_s']:.2f}",
             f"{asm['after_last_s_now']:.3f}"]])
    if a.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
