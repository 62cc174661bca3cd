"""The embedded engine's KV block size against the outline context's prefix cache (issue 28 on the embedded engine).

    .venv/bin/python benchmarks/engine_prefix_cache.py                    # block 128 (vLLM's CPU default) and 32
    .venv/bin/python benchmarks/engine_prefix_cache.py --block-sizes 32 --tokens 200 --order outline,none

vLLM's prefix cache keeps whole KV blocks only, and its CPU build's block is 128 tokens; the small profile's section
request (system line, the book, its chapter's section titles, then its own line) is about 100 tokens, so at 128 no
block is ever full and the outline context is computed afresh for every section. This starts the embedded engine
(SmolLM2-135M on vLLM's CPU build) once per block size, warms it with a few short requests, then sends the 36
section requests of a 3 x 3 x 4 book at once, rendered as a job renders them (the small profile, ``--context none``
and ``--context outline``), every answer exactly ``--tokens`` long (``min_tokens`` = ``max_tokens``), so that only
the prompts differ between the two ways. The figures are the servers' own counters (``vllm:prompt_tokens_total``,
``vllm:prefix_cache_queries_total`` / ``_hits_total``) and the wall time of each set.

What hits at block 32 is mostly the first block, which every request shares (the system line, the book's line and
"Topics of the"); a chapter's own part (56-66 tokens from token 32) fills a second shared block in few chapters.
Bare prompts get no hit at either size, and they ran faster at 32 as often as the outline did: the wall times say
block 32 costs nothing, not that the cache saves much.

A fixed answer length is what makes the ways comparable: a book's own run time on the 135M model varies by a third
from run to run with what it writes (benchmarks/context_quality.py). Runs of one way on one engine are not
independent (blocks a set leaves behind stay cached), so each way runs once per engine, in ``--order``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import time

import aiohttp

from orchestrator.core.config import Settings
from orchestrator.core.osutil import free_port
from orchestrator.core.outline import Chapter, Outline, Part
from orchestrator.core.profiles import PROFILES
from orchestrator.engine.children import stop_process
from orchestrator.engine.installer import prepare_model, require_engine_python
from orchestrator.engine.paths import MODEL_NAME, resolve_cache_dir, run_dir
from orchestrator.engine.server import spawn
from orchestrator.job.section_prompt import section_text
from orchestrator.metrics import parse_metrics

# A 3 x 3 x 4 outline as the embedded engine plans the demo prompt (titles of one of its runs, tidied).
OUTLINE = Outline("Software Engineering Handbook", (
    Part("Software Engineering Principles", (
        Chapter("Object-Oriented Programming", ("Objects and Classes", "Best Practices", "Testing", "Code Reuse")),
        Chapter("Best Practices for Software Development", (
            "Quality of Life", "Agile Work Process", "Perspectives on Technology", "Working with Colleagues")),
        Chapter("Continuous Integration and Deployment", (
            "Cloud Computing Platforms", "Automation", "Pipeline Execution", "Release Management")),
    )),
    Part("Design Patterns", (
        Chapter("Functional Patterns", ("Designing Services", "Writing Tests", "Performance Testing", "Threads")),
        Chapter("Interface Patterns", ("Adapters", "API Descriptions", "Facades", "Swimlanes")),
        Chapter("Framework Patterns", ("Spring Framework", "Spring Boot", "Spring Security", "Spring Data")),
    )),
    Part("Testing and Quality Assurance", (
        Chapter("Continuous Delivery", ("Continuous Integration", "Continuous Deployment", "Cloud Testing", "DevOps")),
        Chapter("Secure Deployment", ("Security and Deployment", "Deployment Reviews", "Secrets", "Audits")),
        Chapter("Web Security", ("Web Security Basics", "Best Practices for Web Security", "Security Tools",
                                 "Security Testing")),
    )),
))
COUNTERS = ("prompt_tokens", "generation_tokens", "prefix_queries", "prefix_hits")  # metrics.Counters fields


def requests_of(way: str) -> list[list[dict[str, str]]]:
    profile = PROFILES["small"]
    settings = Settings(context=way)
    return [profile.messages(section_text(ref, settings, profile, 250)) for ref in OUTLINE.sections()]


def counters(text: str) -> dict[str, float]:
    """The engine's counters this benchmark reads, from one /metrics page (metrics.parse_metrics)."""
    got = parse_metrics(text)
    out = {name: getattr(got, name) for name in COUNTERS}
    if missing := [name for name, v in out.items() if v is None]:
        sys.exit(f"engine_prefix_cache: the engine's /metrics has no counter for {', '.join(missing)}")
    return out


async def measure(base: str, order: list[str], tokens: int, block: int | None) -> list[dict]:
    rows = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as s:

        async def ask(messages: list[dict[str, str]], n: int) -> int:
            body = {"model": MODEL_NAME, "messages": messages, "max_tokens": n, "min_tokens": n, "temperature": 0}
            async with s.post(base + "/v1/chat/completions", json=body) as r:
                if r.status != 200:
                    sys.exit(f"engine_prefix_cache: HTTP {r.status}: {(await r.text())[:200]}")
                got = int((await r.json())["usage"]["completion_tokens"])
            if got != n:  # the ways compare only at one answer length
                sys.exit(f"engine_prefix_cache: an answer of {got} tokens where {n} were asked")
            return got

        async def metrics() -> dict[str, float]:
            async with s.get(base + "/metrics") as r:
                return counters(await r.text())

        # warm-up on prompts of neither set: no set pays the engine's first steps
        await asyncio.gather(*(ask([{"role": "user", "content": f"Count to {i + 3}."}], 32) for i in range(8)))
        for way in order:
            before, t0 = await metrics(), time.monotonic()
            done = await asyncio.gather(*(ask(m, tokens) for m in requests_of(way)))
            wall = time.monotonic() - t0
            after = await metrics()
            d = {k: after[k] - before[k] for k in COUNTERS}
            queries = d["prefix_queries"]
            rows.append({"block": block or 128, "way": way, "requests": len(done), "tokens": sum(done),
                         "wall_s": round(wall, 2), "tok_s": round(sum(done) / wall, 1),
                         "prompt_tokens": int(d["prompt_tokens"]),
                         "hit_rate": round(d["prefix_hits"] / queries, 3) if queries else None})
    return rows


async def healthy(base: str, proc, deadline: float) -> None:
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                sys.exit("engine_prefix_cache: the engine exited while starting (see its log in the cache's logs/)")
            try:
                async with s.get(base + "/health") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(1)
    sys.exit("engine_prefix_cache: the engine did not answer /health in time")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--block-sizes", default="128,32", help="KV block sizes; 128 is vLLM's CPU default")
    ap.add_argument("--tokens", type=int, default=300, help="every answer's exact length")
    ap.add_argument("--order", default="none,outline", help="the ways, in the order each engine runs them")
    args = ap.parse_args()
    order = args.order.split(",")
    if not set(order) <= {"none", "outline"}:
        sys.exit("engine_prefix_cache: --order takes none and outline")
    cache = resolve_cache_dir(None)
    py, model = require_engine_python(cache), prepare_model(cache)
    rows: list[dict] = []
    for size in (int(x) for x in args.block_sizes.split(",")):
        port = free_port()
        block = None if size == 128 else size  # 128: started without the flag, as vLLM's CPU build chooses
        proc, _ = spawn(cache, py, model, port, tie_to_parent=True, block_size=block)
        try:
            base = f"http://127.0.0.1:{port}"
            asyncio.run(healthy(base, proc, time.monotonic() + 900))
            rows += asyncio.run(measure(base, order, args.tokens, block))
        finally:  # the server and every process it started, as `handbook engine stop` does
            stop_process(proc.pid)
            shutil.rmtree(run_dir(cache, port), ignore_errors=True)
    print("| block | way | requests | tokens | wall s | tok/s | prompt tokens | prefix hit rate | outline / none |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        none = next((x["wall_s"] for x in rows if x["block"] == r["block"] and x["way"] == "none"), None)
        ratio = f"{r['wall_s'] / none:.2f}" if r["way"] == "outline" and none else ""
        hit = "-" if r["hit_rate"] is None else f"{r['hit_rate']:.1%}"
        print(f"| {r['block']} | {r['way']} | {r['requests']} | {r['tokens']:,} | {r['wall_s']:.1f} | {r['tok_s']:.1f} "
              f"| {r['prompt_tokens']:,} | {hit} | {ratio} |")
    print(json.dumps(rows), file=sys.stderr)


if __name__ == "__main__":
    main()
