"""The client's CPU per section, streamed against unstreamed (issue 27's `--stream-sections never`).

    .venv/bin/python benchmarks/section_cpu.py                         # 4 cards, 1,024 sections of 520 tokens
    .venv/bin/python benchmarks/section_cpu.py --cards 6 --sections 1536 --time-scale 3
    .venv/bin/python benchmarks/section_cpu.py --stream-intervals 1,4  # one token a chunk, and four

The servers' stream interval (tokens per SSE chunk) sets what streaming costs: vLLM sends one token a chunk while
its output loop keeps up (``--stream-interval 1``, its default) and merges a stream's pending tokens into one chunk
when it falls behind under load; the sim's ``stream_interval`` models a fixed one. Each interval is one pair of rows.

Starts simulated cards (the reference engine model, stream interval 4: vLLM's default of one chunk per few
tokens at load) and sends the same section requests through ``BackendClient`` at cap 256 per card, once streamed
(``"stream": true``, an SSE event per chunk) and once unstreamed (one JSON response per section), and prints this
process's CPU seconds (user + system, ``time.process_time``) per section for each, and their ratio. The servers run
in their own processes; only the client's CPU is counted.

A third row per interval streams with a section's loop watch (``book/checks.LoopWatch`` as ``chat``'s
``stop_when``, what a job gives each section's first answer): its CPU over plain streaming is the watch's cost, and
``stopped`` counts the answers it ended (the simulator's text never loops, so any is a false alarm).
"""

from __future__ import annotations

import argparse
import time

import anyio

from orchestrator import Backend
from orchestrator.book.checks import LoopWatch
from orchestrator.core.reply import STOPPED
from orchestrator.sim.launch import SimFleet
from orchestrator.wire.client import BackendClient
from orchestrator.wire.sseproto import event_loop_options

STEP_MS, PER_STREAM_MS = 12.94, 0.2451
PROMPT = 'Write the section "{}" of the chapter "Testing" of "A software engineering handbook", about 250 words.'


async def _run(urls: list[str], sections: int, cap: int, max_tokens: int, stream: bool, watch: bool = False) -> dict:
    clients: list[BackendClient] = []
    async with anyio.create_task_group() as tg:
        for url in urls:
            c = BackendClient(Backend(url), "sim-qwen3")
            await c.__aenter__()
            clients.append(c)
            tg.start_soon(c.watchdog)
        limits = [anyio.Semaphore(cap) for _ in clients]
        results = {"ok": 0, "tokens": 0, "errors": 0, "stopped": 0}

        async def one(i: int) -> None:
            k = i % len(clients)
            async with limits[k]:
                c = clients[k]
                body = c.body([{"role": "user", "content": PROMPT.format(f"Section {i}")}], max_tokens=max_tokens,
                              temperature=0.0, stream=stream)
                reply = await c.chat(body, stop_when=LoopWatch() if watch else None)
            results["ok" if reply.ok else "errors"] += 1
            results["stopped"] += reply.finish_reason == STOPPED
            results["tokens"] += reply.completion_tokens

        cpu0, t0 = time.process_time(), time.monotonic()
        async with anyio.create_task_group() as work:
            for i in range(sections):
                work.start_soon(one, i)
        results["cpu_s"] = time.process_time() - cpu0
        results["wall_s"] = time.monotonic() - t0
        tg.cancel_scope.cancel()
    for c in clients:
        await c.__aexit__(None, None, None)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cards", type=int, default=4)
    ap.add_argument("--sections", type=int, default=1024)
    ap.add_argument("--cap", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=520)
    ap.add_argument("--time-scale", type=float, default=3.0)
    ap.add_argument("--stream-intervals", default="4", help="comma-separated tokens per chunk, e.g. 1,4")
    args = ap.parse_args()
    rows = []
    for interval in (int(x) for x in args.stream_intervals.split(",")):
        with SimFleet(args.cards, time_scale=args.time_scale, step_ms=STEP_MS, per_stream_ms=PER_STREAM_MS,
                      stream_interval=interval, startup_timeout=60.0) as fleet:
            for stream, watch in ((True, False), (False, False), (True, True)):
                r = anyio.run(_run, fleet.urls, args.sections, args.cap, args.max_tokens, stream, watch,
                              backend_options=event_loop_options())
                rows.append((interval, "watched" if watch else "streamed" if stream else "unstreamed", r))
    print(f"{args.sections:,} sections of up to {args.max_tokens} tokens on {args.cards} simulated cards, cap "
          f"{args.cap}, time-scale {args.time_scale:g}")
    print(f"{'interval':>8}  {'mode':>10}  {'sections ok':>11}  {'errors':>6}  {'tokens':>9}  {'wall s':>7}  "
          f"{'client CPU s':>12}  {'CPU ms/section':>14}  {'of streamed':>11}  {'stopped':>7}")
    for k in range(0, len(rows), 3):
        s = rows[k][2]
        streamed = s["cpu_s"] / max(1, s["ok"])
        for interval, mode, r in rows[k:k + 3]:
            per = r["cpu_s"] / max(1, r["ok"])
            print(f"{interval:>8}  {mode:>10}  {r['ok']:>11,}  {r['errors']:>6}  {r['tokens']:>9,}  "
                  f"{r['wall_s']:>7.1f}  {r['cpu_s']:>12.2f}  {1000 * per:>14.3f}  {per / streamed:>11.3f}  "
                  f"{r['stopped']:>7,}")


if __name__ == "__main__":
    main()
