"""Section templates compared on the same outlines: how much of a section's prose its siblings also hold.

    handbook plan "Write me a field guide to the rivers of Europe" --out /tmp/rivers     # one outline per prompt
    .venv/bin/python benchmarks/section_prompt_variants.py /tmp/rivers /tmp/data --reps 2 \
        --variant open=/tmp/open-templates      # holding its own prompts/section_small_outline.j2

benchmarks/context_quality.py runs whole jobs, so each way plans its own outline and the titles differ between the
ways compared. This script holds the outline fixed: every book of an outline folder (its outline.json) is written
once per variant and repeat, all its section requests sent at once, with the profile's sampling (default: small)
and nothing else of the job (no re-ask, no repair). The variants:

    none      --context none: the section's titles alone (the reference's request)
    outline   --context outline with the project's templates
    NAME=DIR  --context outline with DIR as --templates: a folder laid out as templates/, whose files stand before
              the project's (DIR/prompts/section_small_outline.j2 for the small profile), as a job's --templates

and each book is counted as defects.json counts it: the mean share of a section's word 5-grams that a sibling also
holds, as book.md prints the sections (book/overlap.py; titles set apart, the model's talk left out), and as
generated; the sections that write about a document instead of their topic ("the document", "the text", "the
chapter": what a first line "This is a <book>." made SmolLM2-135M do, templates/prompts/section_small_outline.j2);
the sections cut at the token cap; the completion tokens; the wall seconds of the book.

With no --backend the embedded engine must be running (`handbook engine start`); its URL is read from
`handbook engine status --json`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import aiohttp

from orchestrator.book.assemble import SectionText, section_body
from orchestrator.book.overlap import sibling_shares
from orchestrator.core.config import Settings
from orchestrator.core.outline import Outline
from orchestrator.core.profiles import PROFILES
from orchestrator.engine import running_engine_url
from orchestrator.job.section_prompt import section_text

DOCUMENT_TALK = re.compile(r"\b(?:the|this) (?:document|text|passage|article|chapter)\b", re.IGNORECASE)


def engine_url(script: str = "section_prompt_variants") -> str:
    """The running embedded engine's /v1 URL (orchestrator.engine.running_engine_url), or exit naming ``script``."""
    url = running_engine_url()
    if url is None:
        sys.exit(f"{script}: no --backend and the embedded engine is not running: `handbook engine start` first")
    return url


async def ask(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[str, str, int]:
    async with session.post(f"{url}/chat/completions", json=body) as r:
        r.raise_for_status()
        data = await r.json()
    choice = data["choices"][0]
    return choice["message"]["content"] or "", choice["finish_reason"], data["usage"]["completion_tokens"]


async def book(url: str, model: str, outline: Outline, settings: Settings, profile: str, max_tokens: int
               ) -> dict:
    prof = PROFILES[profile]
    refs = list(outline.sections())
    bodies = [{"model": model, "messages": prof.messages(section_text(r, settings, prof, r.words or settings.words)),
               "max_tokens": max_tokens, "temperature": prof.temperature, **prof.sampling()} for r in refs]
    t0 = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:
        answers = await asyncio.gather(*(ask(session, url, b) for b in bodies))
    seconds = time.monotonic() - t0
    printed: dict[str, dict[str, str]] = defaultdict(dict)
    generated: dict[str, dict[str, str]] = defaultdict(dict)
    for r, (text, finish, tokens) in zip(refs, answers, strict=True):
        chapter = r.path.rsplit(".", 1)[0]
        s = SectionText(r.path, r.part, r.chapter, r.title, text, finish_reason=finish, completion_tokens=tokens)
        printed[chapter][r.path] = section_body(s)
        generated[chapter][r.path] = text
    titles = [t for _, t in outline.titles()]
    shares_printed, _ = sibling_shares(printed, titles)
    shares_generated, _ = sibling_shares(generated, titles)
    return {"printed": statistics.mean(shares_printed.values()), "generated": statistics.mean(shares_generated.values()),
            "document_talk": sum(bool(DOCUMENT_TALK.search(t)) for t, _, _ in answers),
            "capped": sum(f == "length" for _, f, _ in answers), "tokens": sum(t for *_, t in answers),
            "seconds": seconds}


def arguments() -> tuple[argparse.Namespace, dict[str, Settings]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outlines", nargs="+", help="folders holding an outline.json (handbook plan --out DIR)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=DIR",
                    help="an outline variant with DIR as --templates (repeatable)")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--backend", help="an OpenAI-compatible /v1 URL (default: the running embedded engine)")
    ap.add_argument("--profile", default="small", choices=sorted(PROFILES))
    ap.add_argument("--max-tokens", type=int, default=520)
    args = ap.parse_args()
    base = Settings(profile=args.profile)
    variants = {"none": replace(base, context="none"), "outline": replace(base, context="outline")}
    for spec in args.variant:
        name, _, folder = spec.partition("=")
        if not name or not Path(folder).is_dir():
            sys.exit(f"section_prompt_variants: --variant {spec!r}: give NAME=DIR with DIR a folder of templates")
        variants[name] = replace(base, context="outline", templates=folder)
    for folder in args.outlines:
        if not (Path(folder) / "outline.json").is_file():
            sys.exit(f"section_prompt_variants: {folder} holds no outline.json (make one with handbook plan --out)")
    args.names = [Path(f).name for f in args.outlines]
    args.outlines = [Outline.from_json(json.loads((Path(f) / "outline.json").read_text())) for f in args.outlines]
    return args, variants


async def run(args: argparse.Namespace, variants: dict[str, Settings]) -> int:
    url = (args.backend or engine_url()).rstrip("/")
    async with aiohttp.ClientSession() as session, session.get(f"{url}/models") as r:
        model = (await r.json())["data"][0]["id"]
    print(f"{'outline':<12} {'rep':>3} {'variant':<10} {'printed':>8} {'generated':>9} {'doc talk':>8} {'capped':>6} "
          f"{'tokens':>7} {'seconds':>7}")
    for name_of, outline in zip(args.names, args.outlines, strict=True):
        for rep in range(args.reps):
            for name, settings in variants.items():
                m = await book(url, model, outline, settings, args.profile, args.max_tokens)
                print(f"{name_of:<12} {rep:>3} {name:<10} {m['printed']:>8.2%} {m['generated']:>9.2%} "
                      f"{m['document_talk']:>8} "
                      f"{m['capped']:>6} {m['tokens']:>7,} {m['seconds']:>7.0f}", flush=True)
    return 0


if __name__ == "__main__":
    parsed, ways = arguments()
    sys.exit(asyncio.run(run(parsed, ways)))
