"""One process's ceiling: the simulated fleet is raised (6, 12, 24, 48 cards, stream interval 1) until the client
falls behind, with chunks/s, CPU and memory at each step.

    .venv/bin/python benchmarks/one_process_ceiling.py                     # 6, 12, 24, 48 cards, time-scale 4
    .venv/bin/python benchmarks/one_process_ceiling.py --quick             # 6 and 12 cards
    .venv/bin/python benchmarks/one_process_ceiling.py --cards 6,24 --time-scale 6 --json
    .venv/bin/python benchmarks/one_process_ceiling.py --stream-sections never   # sections as whole responses

Each step runs the real job (``agenerate``, ``formats=("md",)``, the published take's prompts, cap 256 per card) in
a child process of its own, so that its peak RSS is its own, against N simulated cards at stream interval 1 (every
chunk is one token). The shape grows with the fleet so that every card is full: N parts x 16 chapters x 16
sections = 256 sections per card (1,536 at 6 cards). Sections are short (``--words``, default 60, capped at
``--max-tokens`` 96) so that a step takes a minute or two: the client's cost is per chunk, and a chunk is a chunk
whatever the section's length.

The cards run in subprocesses on the same machine, so the simulator's clock is stretched (``--time-scale``): at a
fixed time-scale the chunks/s the client must take grows with the cards (model chunks/s = wall chunks/s x
time-scale), which is the point. What the parent measures while the child runs:

- queued: bytes sent to the client and not yet read by it, from the kernel (``ss``: Recv-Q of the client's
  sockets plus Send-Q of the cards' sockets), sampled every second while sections are written; shown as
  milliseconds of traffic (queued bytes / the bytes per second the client read). A client that keeps up leaves a
  few chunks per socket at most; one that falls behind leaves a queue that grows.
- sim late: the cards' ``late_s`` (the sum of how far their steps slipped behind schedule, the worst card, in
  model seconds, as published_take.py reports it): the simulator's own share of the machine.

Falls behind (the verdict column): the client, when the median queue while writing is 100 ms of traffic or more;
the simulator, when its late seconds exceed 5% of the job's model seconds (then the step says more about this
machine than about the client). ``client`` / ``sim`` / ``both`` / ``no``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

CARD_CAP = 256
CLIENT_BEHIND_MS = 100.0  # median queue while writing, in ms of traffic
SIM_BEHIND_SHARE = 0.05  # the cards' late seconds over the job's model seconds


# -- the child: one job, its own CPU, RSS and event-loop lag ---------------------------------------------------
STREAM = ["always"]  # --stream-sections of the job (always: every chunk is read, the client's hardest case)


def child(urls: list[str], words: int, max_tokens: int) -> dict:
    import anyio

    from orchestrator import Settings, agenerate
    from orchestrator.core.config import PRESETS
    from orchestrator.core.events import NodeFailed
    from orchestrator.wire.sseproto import event_loop_options

    cards = len(urls)
    preset = dict(PRESETS["published-take"])
    prompt = preset.pop("prompt")
    preset.update(parts=cards, chapters=16, sections=16, words=words, max_tokens=max_tokens, cap=CARD_CAP)
    settings = Settings(**preset, formats=("md",), stream_sections=STREAM[0])
    lags: list[float] = []
    failures: dict[str, int] = {}  # why attempts failed: on fault-free cards, a failure is a finding

    def on_event(ev) -> None:
        if isinstance(ev, NodeFailed):
            why = f"{ev.kind}: {ev.error.split(':')[0]}"
            failures[why] = failures.get(why, 0) + 1

    async def job():
        async def lag_probe() -> None:  # how late the loop wakes a 0.25 s sleep: a busy loop answers late
            while True:
                t = time.monotonic()
                await anyio.sleep(0.25)
                lags.append(time.monotonic() - t - 0.25)

        with tempfile.TemporaryDirectory() as out:
            async with anyio.create_task_group() as tg:
                tg.start_soon(lag_probe)
                result = await agenerate(prompt, urls, settings, out=out, on_event=on_event, fresh=True)
                tg.cancel_scope.cancel()
        return result

    rchar0 = _rchar()
    cpu0 = time.process_time()
    t0 = time.monotonic()
    result = anyio.run(job, backend_options=event_loop_options())  # the loop a job runs on (uvloop here)
    wall = time.monotonic() - t0
    cpu = time.process_time() - cpu0
    st = result.stats
    lags.sort()
    return {
        "sections": st["sections"], "tokens_written": st["tokens_written"],
        "section_tokens": st.get("section_tokens", st["tokens_written"]), "write_time_s": st["write_time_s"],
        "whole_job_s": st["whole_job_s"], "empty": st["empty_sections"], "failed": st["failed_sections"],
        "errors": st["request_errors"], "wall_s": wall, "cpu_s": cpu,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "bytes_read": _rchar() - rchar0,
        "lag_p95_ms": 1000 * lags[int(0.95 * (len(lags) - 1))] if lags else 0.0,
        "failures": failures,
    }


def _rchar() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    return 0


# -- the parent: the fleet, the kernel's queues, the simulator's CPU -------------------------------------------
def queued_bytes(first_port: int, cards: int) -> int:
    """Bytes on their way to the client that it has not read: Recv-Q of its sockets to the cards plus Send-Q of
    the cards' sockets (the kernel holds them; the simulator's own write buffers come on top once these are full).
    ``ss`` reads them over netlink: parsing /proc/net/tcp for 20,000 sockets would cost this machine a CPU."""
    last = first_port + cards - 1
    total = 0
    for filt in (f"( dport >= :{first_port} and dport <= :{last} )", f"( sport >= :{first_port} and sport <= :{last} )"):
        out = subprocess.run(["ss", "-tnH", "state", "established", filt], capture_output=True, text=True,
                             check=False).stdout
        col = 0 if filt.startswith("( d") else 1  # Recv-Q of the client's side, Send-Q of the cards' side
        for line in out.splitlines():
            f = line.split(None, 2)
            if len(f) > 1:
                total += int(f[col])
    return total


def group_cpu_s(pgid: int) -> float:
    """User + system CPU seconds of every live process in a process group (the simulator and its workers)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after the name: state ppid pgrp ...
            total += int(fields[11]) + int(fields[12])
    return total / tick


def step(cards: int, time_scale: float, words: int, max_tokens: int) -> dict:
    from orchestrator.sim.launch import SimFleet

    with SimFleet(cards, time_scale=time_scale, stream_interval=1, startup_timeout=120.0) as fleet:
        assert fleet.process is not None and fleet.port is not None
        pgid = fleet.process.pid
        sim_cpu0 = group_cpu_s(pgid)
        gen0 = sum(s["generation_tokens"] for s in fleet.all_stats())
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, __file__, "--child", ",".join(fleet.urls), "--words", str(words),
                                 "--max-tokens", str(max_tokens), "--stream-sections", STREAM[0]], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        samples: list[tuple[float, int, int]] = []  # (t, queued bytes, tokens the cards generated so far)
        while proc.poll() is None:
            time.sleep(1.0)
            gen = sum(s["generation_tokens"] for s in fleet.all_stats())
            samples.append((time.monotonic() - t0, queued_bytes(fleet.port, cards), gen - gen0))
        out, err = proc.communicate()
        wall = time.monotonic() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"the {cards}-card job failed:\n{err[-2000:]}")
        sims = fleet.all_stats()
        sim_cpu = group_cpu_s(pgid) - sim_cpu0
    r = json.loads(out.strip().splitlines()[-1])
    chunks = sum(s["generation_tokens"] for s in sims) - gen0  # stream interval 1: a chunk per token
    bytes_per_chunk = r["bytes_read"] / chunks if chunks else 0.0
    # "while writing": the seconds in which the cards generated at least half their peak rate
    rate = [(b - a) / (tb - ta) for (ta, _, a), (tb, _, b) in itertools.pairwise(samples)]
    peak = max(rate, default=0.0)
    busy = [q for (_, q, _), r_ in zip(samples[1:], rate, strict=True) if peak and r_ >= 0.5 * peak]
    write_rate = r["section_tokens"] / r["write_time_s"] if r["write_time_s"] else 0.0  # wall chunks/s
    q_med = statistics.median(busy) if busy else 0
    q_ms = 1000 * q_med / (bytes_per_chunk * write_rate) if bytes_per_chunk and write_rate else 0.0
    model_job_s = r["whole_job_s"] / time_scale
    late = max(s["late_s"] for s in sims) / time_scale
    client_behind = q_ms >= CLIENT_BEHIND_MS
    sim_behind = late > SIM_BEHIND_SHARE * model_job_s
    return {
        "cards": cards, "time_scale": time_scale, "sections": r["sections"], "chunks": chunks,
        "chunks_s_wall": chunks / r["wall_s"], "write_chunks_s_wall": write_rate,
        "write_chunks_s_model": write_rate * time_scale, "client_cpu_s": r["cpu_s"],
        "client_cpu_share": r["cpu_s"] / r["wall_s"], "cpu_us_per_chunk": 1e6 * r["cpu_s"] / chunks if chunks else 0,
        "sim_cpu_share": sim_cpu / wall, "peak_rss_mb": r["peak_rss_mb"],
        "rss_kb_per_section": r["peak_rss_mb"] * 1024 / r["sections"] if r["sections"] else 0.0,
        "queued_kb_median": q_med / 1024, "queued_kb_max": max((q for _, q, _ in samples), default=0) / 1024,
        "queued_ms": q_ms, "lag_p95_ms": r["lag_p95_ms"], "sim_late_s": late, "model_job_s": model_job_s,
        "wall_s": r["wall_s"], "empty": r["empty"], "failed": r["failed"], "errors": r["errors"],
        "failures": r["failures"],
        "behind": "both" if client_behind and sim_behind else
        ("client" if client_behind else ("sim" if sim_behind else "no")),
    }


COLS = [("cards", "cards", "{}"), ("sections", "sections", "{:,}"), ("chunks", "chunks", "{:,}"),
        ("chunks/s wall", "write_chunks_s_wall", "{:,.0f}"), ("chunks/s model", "write_chunks_s_model", "{:,.0f}"),
        ("job chunks/s wall", "chunks_s_wall", "{:,.0f}"), ("client CPU s", "client_cpu_s", "{:.1f}"),
        ("CPU share", "client_cpu_share", "{:.2f}"), ("µs/chunk", "cpu_us_per_chunk", "{:.1f}"),
        ("sim CPU share", "sim_cpu_share", "{:.2f}"), ("peak RSS MB", "peak_rss_mb", "{:.0f}"),
        ("RSS KB/section", "rss_kb_per_section", "{:.1f}"), ("queued KB", "queued_kb_median", "{:.0f}"),
        ("queued max KB", "queued_kb_max", "{:.0f}"), ("queued ms", "queued_ms", "{:.0f}"),
        ("loop lag p95 ms", "lag_p95_ms", "{:.0f}"), ("sim late s", "sim_late_s", "{:.2f}"),
        ("model job s", "model_job_s", "{:.1f}"), ("wall s", "wall_s", "{:.0f}"), ("errors", "errors", "{}"),
        ("behind", "behind", "{}")]


def print_table(rows: list[dict], time_scale: float) -> None:
    cells = [[fmt.format(r[k]) for _, k, fmt in COLS] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, (h, _, _) in enumerate(COLS)]
    print(f"stream interval 1, cap {CARD_CAP} per card, time-scale {time_scale:g} "
          f"(model chunks/s = wall chunks/s x {time_scale:g}); chunks/s: while writing (section tokens / write time)")
    print("  ".join(h.rjust(w) for (h, _, _), w in zip(COLS, widths, strict=True)))
    for c in cells:
        print("  ".join(x.rjust(w) for x, w in zip(c, widths, strict=True)))
    print(f"behind: the client when the median kernel queue toward it while writing is >= {CLIENT_BEHIND_MS:.0f} ms "
          f"of traffic; the simulator when its late seconds exceed {SIM_BEHIND_SHARE:.0%} of the model job time")
    for r in rows:
        if r["failures"]:
            print(f"{r['cards']} cards: failed attempts by reason: "
                  + "; ".join(f"{k} x{v}" for k, v in sorted(r["failures"].items())))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cards", default="6,12,24,48", help="comma-separated fleet sizes, in order")
    ap.add_argument("--quick", action="store_true", help="6 and 12 cards only")
    ap.add_argument("--time-scale", type=float, default=4.0)
    ap.add_argument("--words", type=int, default=60)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--stop-when-behind", action="store_true", help="no larger fleet once the client fell behind")
    ap.add_argument("--json", action="store_true", help="also print the rows as JSON")
    ap.add_argument("--stream-sections", choices=("always", "never"), default="always",
                    help="never: sections as one whole response each (the library's default where nobody reads them)")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # the job process: the fleet's URLs, comma-separated
    a = ap.parse_args()
    STREAM[0] = a.stream_sections
    if a.child:
        print(json.dumps(child(a.child.split(","), a.words, a.max_tokens)))
        return 0
    try:
        fleet_sizes = [6, 12] if a.quick else [int(x) for x in a.cards.split(",") if x.strip()]
    except ValueError:
        fleet_sizes = []
    if not fleet_sizes or min(fleet_sizes) < 1 or a.time_scale <= 0 or a.words < 1 or a.max_tokens < 1:
        print("one_process_ceiling: --cards takes positive integers (e.g. 6,12,24,48); --time-scale, --words and "
              "--max-tokens must be positive", file=sys.stderr)
        return 2
    rows = []
    for n in fleet_sizes:
        try:
            rows.append(step(n, a.time_scale, a.words, a.max_tokens))
        except RuntimeError as e:
            print(f"one_process_ceiling: {e}", file=sys.stderr)
            return 1
        r = rows[-1]
        print(f"[{n} cards: {r['wall_s']:.0f} s wall, {r['write_chunks_s_wall']:,.0f} chunks/s, behind: {r['behind']}]",
              file=sys.stderr, flush=True)
        if a.stop_when_behind and r["behind"] in ("client", "both"):
            break
    print_table(rows, a.time_scale)
    if a.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
