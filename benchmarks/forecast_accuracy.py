"""How close the forecast comes to what the job then does, on simulated cards (issue 14's acceptance table).

    .venv/bin/python benchmarks/forecast_accuracy.py                  # the three cases below
    .venv/bin/python benchmarks/forecast_accuracy.py --cases two      # one case (two, six, pages100)
    .venv/bin/python benchmarks/forecast_accuracy.py --calibrate      # the data forecasting/*.py is fitted on

Each case starts simulated cards (the reference engine model: 12.94 ms + 0.2451 ms per running stream, stream
interval 4, stretched by --time-scale so this machine keeps up), probes them (``probe_fits``: the servers' own
counters), forecasts, runs the real job (``orchestrator.agenerate``, Markdown and PDF) and compares the forecast's
whole-job seconds and A5 pages with stats.json's ``whole_job_s`` and ``pdf_pages``. Times are wall seconds (the
forecast is made from the probed wall-clock step times). ``sim late s`` is how far the simulator fell behind its
own clock (it should stay near 0: otherwise the machine did not keep up and the actual time is inflated).

    two       2 cards, 4 x 6 x 8 sections at 250 words (the published take's settings otherwise)
    six       6 cards, --preset published-take (8 x 12 x 16), as benchmarks/published_take.py runs it
    pages100  2 cards, the shape fit_budget(pages=100) chooses; the issue asks for 90-110 typeset pages

``--calibrate`` prints SECTION_DATA (forecasting/lengths.py) and PAGE_DATA (forecasting/pages.py) again from the
simulator's text: no servers, the books assembled by orchestrator.assemble and typeset by orchestrator.typeset.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import anyio
from published_take import PER_STREAM_MS, STEP_MS

from orchestrator import Backend, Settings, agenerate
from orchestrator.core.config import PRESETS
from orchestrator.core.events import Event, JobStarted, NodeFinished, NodeStarted
from orchestrator.forecasting import StepFit, fit_budget, forecast, probe_fits
from orchestrator.sim.launch import SimFleet
from orchestrator.wire.client import discover

REFERENCE = dict(PRESETS["published-take"])
PROMPT = REFERENCE.pop("prompt")


@dataclass(frozen=True)
class Case:
    name: str
    cards: int
    time_scale: float
    shape: tuple[int, int, int] | None  # None: fit_budget(pages=...) chooses
    pages: int | None = None


CASES = {
    "two": Case("2 cards, 4 x 6 x 8", 2, 2.0, (4, 6, 8)),
    "six": Case("6 cards, published take", 6, 3.0, (8, 12, 16)),
    "pages100": Case("2 cards, --pages 100", 2, 2.0, None, pages=100),
}


class Edges:
    """Event consumer: when the job started, sent its first request and had its last section answered (what the
    forecast's fixed overheads are checked against)."""

    def __init__(self) -> None:
        self.t_job = self.t_first = self.t_last = 0.0

    def __call__(self, ev: Event) -> None:
        if isinstance(ev, JobStarted):
            self.t_job = ev.t
        elif isinstance(ev, NodeStarted) and not self.t_first:
            self.t_first = ev.t
        elif isinstance(ev, NodeFinished) and ev.kind == "section":
            self.t_last = max(self.t_last, ev.t)


async def _probe(urls: list[str], settings: Settings) -> list[StepFit]:
    pairs = []
    for url in urls:
        b = Backend(url, cap=settings.cap)
        pairs.append((b, await discover(b, None, None)))
    return await probe_fits(pairs, settings)


def run_case(case: Case, out: str) -> dict:
    settings = Settings(**REFERENCE, formats=("md", "pdf"))
    with SimFleet(case.cards, time_scale=case.time_scale, step_ms=STEP_MS, per_stream_ms=PER_STREAM_MS,
                  stream_interval=4, startup_timeout=60.0) as fleet:
        t0 = time.monotonic()
        fits = anyio.run(_probe, fleet.urls, settings)
        probe_s = time.monotonic() - t0
        sentence = ""
        if case.shape is None:
            settings, fc, sentence = fit_budget(settings, fits, pages=case.pages)
        else:
            p, c, s = case.shape
            settings = Settings(**{**REFERENCE, "parts": p, "chapters": c, "sections": s}, formats=("md", "pdf"))
            fc = forecast(None, settings, fits)
        before = fleet.all_stats()
        edges = Edges()
        result = anyio.run(lambda: agenerate(PROMPT, fleet.urls, settings, out=out, on_event=edges, fresh=True))
        sims = fleet.all_stats()
    st = result.stats
    late = max(s["late_s"] - b["late_s"] for s, b in zip(sims, before, strict=True))
    overheads = {"startup_s": edges.t_first - edges.t_job,
                 "after_writing_s": st["whole_job_s"] - (edges.t_last - edges.t_job)}
    return {"case": case, "fits": fits, "probe_s": probe_s, "forecast": fc, "stats": st, "late_s": late,
            "sentence": sentence, "shape": (settings.parts, settings.chapters, settings.sections),
            "overheads": overheads}


def _err(forecast_value: float, actual: float | None) -> str:
    if not actual:
        return "n/a"
    return f"{100.0 * (forecast_value - actual) / actual:+.1f}%"


def print_table(rows: list[dict]) -> None:
    head = ["case", "shape", "time scale", "fit a ms", "fit b ms", "probe s", "forecast s", "actual s", "error",
            "plan s (fc/act)", "requests (fc/act)", "tokens (fc/act)", "forecast pages", "pdf pages", "error",
            "sim late s"]
    cells = []
    for r in rows:
        case, fc, st = r["case"], r["forecast"], r["stats"]
        fits: list[StepFit] = r["fits"]
        cells.append([
            case.name, " x ".join(map(str, r["shape"])), f"{case.time_scale:g}",
            f"{statistics.mean(f.a_ms for f in fits):.2f}", f"{statistics.mean(f.b_ms for f in fits):.4f}",
            f"{r['probe_s']:.1f}", f"{fc.whole_job_s:.2f}", f"{st['whole_job_s']:.2f}",
            _err(fc.whole_job_s, st["whole_job_s"]), f"{fc.plan_s:.2f} / {st['plan_time_s']:.2f}",
            f"{fc.inputs['planning']['requests'] + fc.inputs['shape']['to_write']:,} / {st['requests']:,}",
            f"{fc.tokens:,} / {st['tokens_written']:,}", f"{fc.pages:,}", f"{st['pdf_pages'] or 0:,}",
            _err(fc.pages, st["pdf_pages"]), f"{r['late_s']:.2f}",
        ])
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    print("  ".join(h.rjust(w) for h, w in zip(head, widths, strict=True)))
    for c in cells:
        print("  ".join(x.rjust(w) for x, w in zip(c, widths, strict=True)))
    print(f"\nconfigured engine model: {STEP_MS} ms + {PER_STREAM_MS} ms x running, times the time scale "
          "(the fit columns are what the probe read, in wall ms)")
    for r in rows:
        fc_over, o = r["forecast"].inputs["overheads_s"], r["overheads"]
        print(f"{r['case'].name}: JobStarted -> first request {o['startup_s']:.3f} s (forecast "
              f"{fc_over['startup']:.3f}); last section -> book.md written {o['after_writing_s']:.3f} s (forecast "
              f"{fc_over['after_writing']:.3f})")
    for r in rows:
        if r["sentence"]:
            print(f"{r['case'].name}: {r['sentence']}")


# -- calibration data ---------------------------------------------------------------------------------------------


def section_data(asked: tuple[int, ...] = (250, 500, 800, 1500), n: int = 1000) -> None:
    """SECTION_DATA: the simulator's uncapped answers to the product's section prompt."""
    from orchestrator.sim.text import answer

    print("SECTION_DATA (words asked, mean words, mean tokens, sigma of log tokens)")
    for words in asked:
        w, t = [], []
        for i in range(n):
            a = answer("sim-qwen3", {"messages": _section_messages("The Handbook", f"Part {i % 7}",
                                                                   f"Chapter {i % 13}", f"Topic {i} of design",
                                                                   words), "max_tokens": 8000})
            w.append(len(a.text.split()))
            t.append(len(a.pieces))
        print(f"    ({words}, {statistics.mean(w):.1f}, {statistics.mean(t):.1f}, "
              f"{statistics.stdev(math.log(x) for x in t):.3f}),")


def _section_messages(book: str, part: str, chapter: str, section: str, words: int) -> list[dict[str, str]]:
    from orchestrator.core.profiles import PROFILES
    from orchestrator.core.prompts import render

    text = render("section", book=book, part=part, chapter=chapter, section=section, words=words, book_phrase="")
    return PROFILES["reference"].messages(text)


def _titles(prompt: str, n: int) -> tuple[str | None, list[str]]:
    from orchestrator.sim.text import answer

    lines = answer("sim-qwen3", {"messages": [{"role": "user", "content": prompt}], "max_tokens": 1024}).text
    rows = lines.splitlines()
    book = rows[0].removeprefix("Title: ") if rows and rows[0].startswith("Title: ") else None
    return book, [ln.split(". ", 1)[1] for ln in rows if ". " in ln and ln.split(".")[0].isdigit()][:n]


def sim_book(parts: int, chapters: int, sections: int, words: int, max_tokens: int):
    """A whole simulator book without servers: titles and sections answered as the simulator would."""
    from orchestrator.book.assemble import SectionText, assemble
    from orchestrator.core.outline import Chapter, Outline, Part
    from orchestrator.sim.text import answer

    book, part_titles = _titles(f'Plan a long book for: "{PROMPT}". Give the book title and exactly {parts} part '
                                "titles.", parts)
    book = book or "Handbook"
    out_parts, texts = [], {}
    for pi, pt in enumerate(part_titles, 1):
        _, chapter_titles = _titles(f'Book "{book}". List exactly {chapters} chapter titles for part "{pt}".',
                                    chapters)
        chs = []
        for ci, ct in enumerate(chapter_titles, 1):
            _, sts = _titles(f'Book "{book}", part "{pt}". List exactly {sections} section titles for chapter '
                             f'"{ct}".', sections)
            chs.append(Chapter(ct, tuple(sts)))
            for si, st in enumerate(sts, 1):
                a = answer("sim-qwen3", {"messages": _section_messages(book, pt, ct, st, words),
                                         "max_tokens": max_tokens})
                pieces = a.pieces[:max_tokens]
                path = f"{pi}.{ci}.{si}"
                texts[path] = SectionText(path, pt, ct, st, "".join(pieces),
                                          "length" if len(a.pieces) > max_tokens else "stop", len(pieces))
        out_parts.append(Part(pt, tuple(chs)))
    return assemble(Outline(book, tuple(out_parts)), texts)


PAGE_SHAPES = (
    (1, 1, 1, 250, 520), (1, 1, 4, 250, 520), (1, 2, 3, 250, 520), (2, 3, 4, 250, 520), (1, 3, 10, 250, 520),
    (2, 4, 6, 250, 520), (3, 4, 8, 250, 520), (4, 6, 8, 250, 520), (2, 12, 4, 250, 520), (12, 2, 2, 250, 520),
    (1, 2, 40, 250, 520), (4, 6, 8, 500, 1040), (3, 4, 6, 800, 1700), (4, 6, 8, 250, 300), (6, 8, 10, 250, 520),
    (8, 12, 16, 250, 520), (4, 6, 8, 120, 260), (4, 6, 8, 60, 130),
)


def page_data() -> None:
    """PAGE_DATA: simulator books of several shapes and lengths, typeset."""
    from orchestrator.typeset import typeset

    print("PAGE_DATA (parts, chapters, sections (in all), words asked, max_tokens, words, pages)")
    for p, c, s, words, max_tokens in PAGE_SHAPES:
        book = sim_book(p, c, s, words, max_tokens)
        with tempfile.TemporaryDirectory() as d:
            info = typeset(book.markdown, Path(d), ["pdf"])
        print(f"    ({p}, {p * c}, {p * c * s}, {words}, {max_tokens}, {book.words}, {info.pdf_pages}),", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="two,six,pages100", help=f"any of {', '.join(CASES)}")
    ap.add_argument("--time-scale", type=float, help="override every case's time scale")
    ap.add_argument("--calibrate", action="store_true", help="print the calibration data instead")
    a = ap.parse_args()
    if a.calibrate:
        section_data()
        page_data()
        return
    rows = []
    for name in (x.strip() for x in a.cases.split(",") if x.strip()):
        case = CASES[name]
        if a.time_scale:
            case = Case(case.name, case.cards, a.time_scale, case.shape, case.pages)
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory() as d:
            rows.append(run_case(case, d))
        print(f"[{case.name}: done in {time.monotonic() - t0:.0f} s wall]", file=sys.stderr, flush=True)
    print_table(rows)


if __name__ == "__main__":
    main()
