"""How many simulated streams this machine holds: N cards x C closed-loop streams, measured against the model.

    .venv/bin/python benchmarks/sim_capacity.py --cards 6 --streams 256 --time-scale 3 --seconds 20

Starts the cards with SimFleet (a subprocess), runs C streams per card from this process (the client: raw
aiohttp SSE reading, or the OpenAI SDK with ``--client openai``), and prints, per card and in total, the
generation rate counted by the servers in wall time and in model time (wall rate x time-scale) next to what
the engine model predicts for the streams that were actually running. ``late`` is how far the engine's steps
slipped behind their schedule (0 when the CPU keeps up).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import aiohttp
import orjson

from orchestrator.sim.engine import EngineConfig
from orchestrator.sim.launch import SimFleet

PROMPT = "Write the section \"{i}\" of a software engineering handbook in about 250 words."


async def aiohttp_worker(session, url, i, max_tokens, stop, counts):
    k = 0
    while not stop.is_set():
        body = {"model": "sim-qwen3", "messages": [{"role": "user", "content": PROMPT.format(i=f"{i}-{k}")}],
                "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True}}
        k += 1
        try:
            async with session.post(url + "/chat/completions", data=orjson.dumps(body),
                                    headers={"Content-Type": "application/json"}) as r:
                async for line in r.content:
                    if line.startswith(b"data: {"):
                        d = orjson.loads(line[6:])
                        if d["choices"]:
                            counts["chunks"] += 1
        except (TimeoutError, aiohttp.ClientError):
            counts["errors"] += 1
        counts["requests"] += 1


async def openai_worker(client, i, max_tokens, stop, counts):
    import openai

    k = 0
    while not stop.is_set():
        k += 1
        try:
            s = await client.chat.completions.create(
                model="sim-qwen3", messages=[{"role": "user", "content": PROMPT.format(i=f"{i}-{k}")}],
                max_tokens=max_tokens, stream=True, stream_options={"include_usage": True})
            async for ch in s:
                if ch.choices:
                    counts["chunks"] += 1
        except openai.OpenAIError:
            counts["errors"] += 1
        counts["requests"] += 1


async def drive(fleet: SimFleet, streams: int, seconds: float, warmup: float, max_tokens: int, client: str):
    stop = asyncio.Event()
    counts = {"chunks": 0, "errors": 0, "requests": 0}
    tasks = []
    sessions = []
    if client == "openai":
        import httpx
        import openai

        for url in fleet.urls:
            c = openai.AsyncOpenAI(base_url=url, api_key="EMPTY", max_retries=0,
                                   http_client=httpx.AsyncClient(limits=httpx.Limits(max_connections=None,
                                                                                     max_keepalive_connections=None),
                                                                 timeout=600))
            sessions.append(c)
            tasks += [asyncio.create_task(openai_worker(c, i, max_tokens, stop, counts)) for i in range(streams)]
    else:
        for url in fleet.urls:
            s = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                      timeout=aiohttp.ClientTimeout(total=None))
            sessions.append(s)
            tasks += [asyncio.create_task(aiohttp_worker(s, url, i, max_tokens, stop, counts))
                      for i in range(streams)]
    await asyncio.sleep(warmup)
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # steady state: every card has all its streams running
        if all(st["running"] >= streams for st in await loop.run_in_executor(None, fleet.all_stats)):
            break
        await asyncio.sleep(0.2)
    stats0 = await loop.run_in_executor(None, fleet.all_stats)
    chunks0 = counts["chunks"]
    t0 = time.monotonic()
    running_samples: list[list[int]] = [[] for _ in fleet.urls]
    cpu0 = os.times()
    while time.monotonic() - t0 < seconds:
        await asyncio.sleep(0.5)
        for i, st in enumerate(await loop.run_in_executor(None, fleet.all_stats)):
            running_samples[i].append(st["running"])
    stats1 = await loop.run_in_executor(None, fleet.all_stats)
    t1 = time.monotonic()
    counts["window_chunks"] = counts["chunks"] - chunks0
    cpu1 = os.times()
    stop.set()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for s in sessions:
        await s.close()
    client_cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    return stats0, stats1, t1 - t0, running_samples, counts, client_cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cards", type=int, default=6)
    ap.add_argument("--streams", type=int, default=256, help="closed-loop streams per card")
    ap.add_argument("--time-scale", type=float, default=3.0)
    ap.add_argument("--procs", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--warmup", type=float, default=None, help="default: 2 s x time-scale")
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--client", choices=("aiohttp", "openai"), default="aiohttp")
    a = ap.parse_args()
    flags = {"time_scale": a.time_scale}
    if a.procs:
        flags["procs"] = a.procs
    warmup = a.warmup if a.warmup is not None else 2.0 * a.time_scale
    cfg = EngineConfig(time_scale=a.time_scale)
    with SimFleet(a.cards, **flags) as fleet:
        s0, s1, dt, running, counts, client_cpu = asyncio.run(
            drive(fleet, a.streams, a.seconds, warmup, a.max_tokens, a.client))
    print(f"{a.cards} cards x {a.streams} streams, time-scale {a.time_scale:g}, {dt:.1f} s wall, client {a.client}, "
          f"client CPU {client_cpu / dt:.2f} cores, {counts['requests']} requests, {counts['errors']} errors, "
          f"{counts['window_chunks'] / dt:.0f} chunks/s received")
    print(f"{'card':>4} {'running':>8} {'wall tok/s':>11} {'model tok/s':>12} {'predicted':>10} {'ratio':>6} "
          f"{'late s':>7} {'resync':>6}")
    tot_wall = tot_pred = 0.0
    for i, (a0, a1) in enumerate(zip(s0, s1)):
        # the servers' own clocks: a busy client cannot skew the window
        wall = (a1["generation_tokens"] - a0["generation_tokens"]) / (a1["uptime_s"] - a0["uptime_s"])
        r = sum(running[i]) / max(1, len(running[i]))
        pred = cfg.model_tok_s(round(r))
        model = wall * a.time_scale
        tot_wall += wall
        tot_pred += pred
        print(f"{i:>4} {r:>8.1f} {wall:>11.1f} {model:>12.1f} {pred:>10.1f} {model / pred if pred else 0:>6.3f} "
              f"{a1['late_s'] - a0['late_s']:>7.2f} {a1['resyncs'] - a0['resyncs']:>6}")
    print(f"{'all':>4} {'':>8} {tot_wall:>11.1f} {tot_wall * a.time_scale:>12.1f} {tot_pred:>10.1f} "
          f"{tot_wall * a.time_scale / tot_pred if tot_pred else 0:>6.3f}")
    received = counts["window_chunks"] * cfg.stream_interval / dt
    print(f"model at exactly {a.streams} streams per card: {cfg.model_tok_s(a.streams):.1f} tok/s per card; "
          f"client received ~{received:.0f} tok/s wall = {received * a.time_scale:.0f} model tok/s "
          f"({received / tot_wall if tot_wall else 0:.2f} of what the servers generated)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
