"""Sampling for a looping section's re-ask, compared: how often each setting writes word salad or loops.

    handbook plan "Write me a complete software engineering handbook" --out /tmp/soft    # any outline folder
    .venv/bin/python benchmarks/loop_reask_settings.py /tmp/soft \
        --variant current=0.7:1.3 --variant profile=0.7:1.1 --variant base=0.3:1.1

A section caught in a repetition loop is asked again once with stronger settings (core/profiles.py
``loop_temperature``, ``loop_repetition_penalty``; job/writing.py). This script sends every section of an outline
(its outline.json), all at once, as the job's request for it (the profile's template and system message, ``--context``
as the job's default), once per variant ``NAME=TEMPERATURE:REPETITION_PENALTY`` and repeat, with the profile's other
sampling fields, and counts as defects.json does: the sections whose prose turns to word salad (book/salad.py; "from
the start": nothing before it that book.md could print), those still caught in a loop (book/checks.loop_reason), those
cut at the token cap, the completion tokens and the wall seconds. The prompts are not ones that looped: each setting
is judged on what it does to a section in general, which is what a re-ask's reply is.

With no --backend the embedded engine must be running (`handbook engine start`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import aiohttp
from section_prompt_variants import ask, engine_url  # this folder: the same request and engine lookup

from orchestrator.book.checks import loop_reason
from orchestrator.book.cutback import complete_part
from orchestrator.book.salad import salad_at
from orchestrator.core.config import Settings
from orchestrator.core.outline import Outline
from orchestrator.core.profiles import PROFILES
from orchestrator.job.section_prompt import section_text


def count(answers: list[tuple[str, str, int]], seconds: float) -> dict:
    salad = [text for text, _, _ in answers if salad_at(text) is not None]
    return {
        "salad": len(salad),
        "salad_from_start": sum(complete_part(t[: salad_at(t)]) is None for t in salad),
        "loops": sum(loop_reason(text) is not None for text, _, _ in answers),
        "capped": sum(finish == "length" for _, finish, _ in answers),
        "tokens": sum(tokens for *_, tokens in answers),
        "seconds": seconds,
    }


async def run(args: argparse.Namespace, outline: Outline, variants: dict[str, tuple[float, float]]
              ) -> list[dict]:
    url = (args.backend or engine_url("loop_reask_settings")).rstrip("/")
    profile = PROFILES[args.profile]
    settings = Settings(context=args.context, words=args.words, max_tokens=args.max_tokens)
    refs = list(outline.sections())
    rows = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:
        async with session.get(f"{url}/models") as r:
            model = (await r.json())["data"][0]["id"]
        for rep in range(args.reps):
            for name, (temperature, penalty) in variants.items():
                sampling = {**profile.sampling(), "repetition_penalty": penalty}
                # as the job asks: a length set in outline.md scales the section's cap (Settings.max_tokens_for)
                bodies = [{"model": model, "max_tokens": settings.max_tokens_for(ref.words or args.words),
                           "temperature": temperature, **sampling,
                           "messages": profile.messages(section_text(ref, settings, profile, ref.words or args.words))}
                          for ref in refs]
                t0 = time.monotonic()
                answers = await asyncio.gather(*(ask(session, url, b) for b in bodies))
                row = {"variant": name, "rep": rep, "temperature": temperature, "repetition_penalty": penalty,
                       "sections": len(refs), **count(answers, time.monotonic() - t0)}
                rows.append(row)
                print(f"{name:12} {rep:3} {temperature:5.2f} {penalty:5.2f} {len(refs):8} {row['salad']:6} "
                      f"{row['salad_from_start']:11} {row['loops']:5} {row['capped']:6} {row['tokens']:7,} "
                      f"{row['seconds']:7.0f}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outline", help="a folder holding an outline.json (handbook plan --out DIR)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=T:RP",
                    help="temperature and repetition penalty (repeatable; default: the profile's loop re-ask and its "
                         "first answer)")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--backend", help="an OpenAI-compatible /v1 URL (default: the running embedded engine)")
    ap.add_argument("--profile", default="small", choices=sorted(PROFILES))
    ap.add_argument("--context", default="outline", choices=("none", "outline"))
    ap.add_argument("--words", type=int, default=250)
    ap.add_argument("--max-tokens", type=int, default=520)
    ap.add_argument("--json", action="store_true", help="print the rows as JSON after the table")
    args = ap.parse_args()
    profile = PROFILES[args.profile]
    variants: dict[str, tuple[float, float]] = {}
    for spec in args.variant:
        name, sep, value = spec.partition("=")
        t, sep2, rp = value.partition(":")
        try:
            if not (sep and sep2 and name):
                raise ValueError
            variants[name] = (float(t), float(rp))
        except ValueError:
            sys.exit(f"loop_reask_settings: --variant {spec!r}: expected NAME=TEMPERATURE:REPETITION_PENALTY")
    if not variants:
        loop = profile.loop_sampling().get("repetition_penalty", 1.0)
        variants = {"loop re-ask": (max(profile.temperature, profile.loop_temperature), loop),
                    "first answer": (profile.temperature, profile.sampling().get("repetition_penalty", 1.0))}
    path = Path(args.outline, "outline.json")
    try:
        outline = Outline.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError) as e:
        sys.exit(f"loop_reask_settings: cannot read {path}: {e}")
    print(f"{'variant':12} {'rep':>3} {'temp':>5} {'rep.p':>5} {'sections':>8} {'salad':>6} {'from start':>11} "
          f"{'loops':>5} {'capped':>6} {'tokens':>7} {'seconds':>7}")
    rows = asyncio.run(run(args, outline, variants))
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
