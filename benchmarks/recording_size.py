"""What --record costs on the published take: the recording's size (whole, per section) and the client CPU it takes.

    .venv/bin/python benchmarks/recording_size.py                   # 6 simulated cards, time-scale 3
    .venv/bin/python benchmarks/recording_size.py --baseline        # and the same job without a recording

Runs ``--preset published-take`` (8 x 12 x 16 = 1,536 sections, 520-token cap) against simulated cards at the
reference engine model, in this process, with the text deltas on and a Recorder among the consumers (as
``handbook ... --record`` does), then reads the recording back and checks it holds every section's text whole.
Prints one row per run: events seen, records written (deltas coalesced per node over 0.1 s), raw JSON and gzip'd
bytes, bytes per section, the recorder's own CPU seconds, the job's whole time in model seconds.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import anyio

from orchestrator import Settings, agenerate
from orchestrator.core.config import PRESETS
from orchestrator.core.events import NodeFinished
from orchestrator.core.states import NodeKind
from orchestrator.sim.launch import SimFleet
from orchestrator.views.recording import RECORDING_FILE, Recorder, read_recording

STEP_MS, PER_STREAM_MS = 12.94, 0.2451


class Timed:
    """A consumer wrapped so that its own CPU time is counted."""

    def __init__(self, consumer):
        self.consumer = consumer
        self.cpu = 0.0

    def __call__(self, event) -> None:
        t = time.thread_time()
        self.consumer(event)
        self.cpu += time.thread_time() - t


def run(cards: int, time_scale: float, record: bool, out: Path) -> dict:
    preset = dict(PRESETS["published-take"])
    prompt = preset.pop("prompt")
    settings = Settings(**preset, formats=("md",))
    recorder = Recorder(out) if record else None
    timed = Timed(recorder) if recorder is not None else None
    with SimFleet(cards, time_scale=time_scale, step_ms=STEP_MS, per_stream_ms=PER_STREAM_MS, stream_interval=4,
                  startup_timeout=60.0) as fleet:
        cpu0 = time.process_time()
        result = anyio.run(lambda: agenerate(prompt, fleet.urls, settings, out=out, on_event=[timed] if timed else
                                             None, deltas=record, fresh=True))
        cpu = time.process_time() - cpu0
    row = {"mode": "record" if record else "no record", "sections": result.stats["sections"],
           "whole job s": result.stats["whole_job_s"] / time_scale, "client CPU s": cpu, "errors":
           result.stats["request_errors"]}
    if recorder is not None and timed is not None:
        recorder.close()
        path = out / RECORDING_FILE
        size = path.stat().st_size
        texts = {e.path: e.reply.text for e in read_recording(path)
                 if isinstance(e, NodeFinished) and e.kind == NodeKind.SECTION}
        whole = all(texts.get(ref.path) is not None for ref in result.outline.sections())
        row |= {"events": recorder.events, "records": recorder.records, "raw MB": recorder.bytes_raw / 1e6,
                "gzip MB": size / 1e6, "bytes/section": size / max(1, result.stats["sections"]),
                "recorder CPU s": timed.cpu, "texts whole": "yes" if whole else "NO"}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cards", type=int, default=6)
    ap.add_argument("--time-scale", type=float, default=3.0)
    ap.add_argument("--baseline", action="store_true", help="also run the job without a recording")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for record in ([True, False] if args.baseline else [True]):
            out = Path(tmp) / ("rec" if record else "plain")
            print(f"[{'record' if record else 'no record'}: {args.cards} cards, time-scale {args.time_scale:g}]",
                  file=sys.stderr, flush=True)
            rows.append(run(args.cards, args.time_scale, record, out))
    cols = list(dict.fromkeys(k for r in rows for k in r))
    cells = [[_fmt(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]
    print("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
    for x in cells:
        print("  ".join(v.rjust(w) for v, w in zip(x, widths)))


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.2f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


if __name__ == "__main__":
    main()
