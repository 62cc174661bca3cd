"""The SSE parser's line buffer on a long line cut into many pieces: linear (a bytearray, what sse.SseParser does)
against joining bytes piece by piece (what it did before: ``self.pending + data``, quadratic in the line).

    .venv/bin/python benchmarks/sse_long_line.py            # table: line sizes x piece sizes
    .venv/bin/python benchmarks/sse_long_line.py --json

A server that never ends a line (or one enormous event) is what makes the difference: the stream's byte cap
(sse.BYTES_PER_TOKEN x the request's max_tokens) bounds the line, and within it each piece must cost the same
however long the line already is. Times are CPU seconds of this process for the whole line.
"""

from __future__ import annotations

import argparse
import json
import time

import anyio
import orjson

from orchestrator.wire.sse import SseParser, StreamState, Watch


def event(chars: int) -> bytes:
    obj = {"id": "x", "object": "chat.completion.chunk",
           "choices": [{"index": 0, "delta": {"content": "x" * chars}, "finish_reason": None}]}
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def ours(data: bytes, piece: int) -> float:
    st = StreamState(max_tokens=1 << 20)
    parser = SseParser(st, Watch(anyio.CancelScope(), 0.0), None)
    t0 = time.process_time()
    for i in range(0, len(data), piece):
        parser.feed(data[i:i + piece])
    took = time.process_time() - t0
    assert len("".join(st.parts)) + 120 > len(data) - 120  # the whole event was read
    return took


def joined(data: bytes, piece: int) -> float:
    """The old way: pending + data at every piece until the newline."""
    pending = b""
    t0 = time.process_time()
    for i in range(0, len(data), piece):
        chunk = data[i:i + piece]
        if pending:
            chunk = pending + chunk
            pending = b""
        nl = chunk.find(b"\n")
        if nl < 0:
            pending = chunk
    return time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    async def inside() -> list[dict]:  # a Watch needs a cancel scope, which needs an event loop
        rows = []
        for size in (64 << 10, 256 << 10, 1 << 20):
            data = event(size)
            for piece in (256, 4096):
                rows.append({"line_bytes": len(data), "piece_bytes": piece, "pieces": -(-len(data) // piece),
                             "ours_s": round(ours(data, piece), 4), "joined_s": round(joined(data, piece), 4)})
        return rows

    rows = anyio.run(inside)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'line':>10} {'piece':>6} {'pieces':>8} {'bytearray s':>12} {'bytes + bytes s':>16} {'ratio':>7}")
    for r in rows:
        ratio = r["joined_s"] / r["ours_s"] if r["ours_s"] else float("inf")
        print(f"{r['line_bytes']:>10,} {r['piece_bytes']:>6} {r['pieces']:>8,} {r['ours_s']:>12.4f} "
              f"{r['joined_s']:>16.4f} {ratio:>7.1f}")


if __name__ == "__main__":
    main()
