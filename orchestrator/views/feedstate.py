"""The live feed's bookkeeping, apart from its web server (``orchestrator.feed``): the job's state, what every
browser has yet to be sent, and the recent sections a browser that connects mid-run starts from. No I/O.

Back-pressure: :meth:`FeedState.deliver` never awaits and never blocks. Each browser owns a :class:`ClientQueue` of
pending ops keyed by node path; a Delta appends to its node's op, so a slow browser gets fewer, larger messages. A
queue's pending bytes are capped: past the cap the oldest pending ops are dropped (and marked as gaps), so a stalled
browser costs at most the cap plus the socket's write buffer, and the job never waits for it.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

from ..core.events import Delta, Event, JobFinished, NodeFailed, NodeFinished, NodeStarted
from .jobstate import JobState
from .words import figure

__all__ = ["ClientQueue", "FeedState"]

OP_OVERHEAD = 160  # bytes charged per pending op, so that many tiny ops also count against the cap
ERROR_CHARS = 300


class Op:
    __slots__ = ("attempt", "chunks", "error", "gap", "kind", "nbytes", "path", "reset", "status", "title")

    def __init__(self, path: str) -> None:
        self.path = path
        self.kind: str | None = None
        self.title: str | None = None
        self.attempt: int | None = None
        self.reset = False
        self.chunks: list[str] = []
        self.nbytes = 0
        self.status: str | None = None
        self.error: str | None = None
        self.gap = False

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"p": self.path}
        if self.kind is not None:
            d["k"] = self.kind
        if self.title is not None:
            d["h"] = self.title
        if self.attempt is not None:
            d["a"] = self.attempt
        if self.reset:
            d["r"] = True
        if self.chunks:
            d["x"] = "".join(self.chunks)
        if self.status is not None:
            d["s"] = self.status
        if self.error is not None:
            d["e"] = self.error
        if self.gap:
            d["g"] = True
        return d


class ClientQueue:
    """One browser connection: its pending ops (coalesced, bounded), a wake-up signal, and ``gone``, set once the
    connection is over (so the handler's pause between messages ends at once)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.pending: dict[str, Op] = {}
        self.nbytes = 0
        self.gaps: set[str] = set()  # paths whose pending text was dropped; the next op for them says so
        self.dropped_ops = 0
        self.dropped_bytes = 0
        self.status_dirty = True
        self.final_pending = False
        self.wake = asyncio.Event()
        self.gone = asyncio.Event()
        self.sent_messages = 0
        self.peak_bytes = 0

    @property
    def closed(self) -> bool:
        return self.gone.is_set()

    def close(self) -> None:
        self.gone.set()
        self.wake.set()

    def op(self, path: str) -> Op:
        op = self.pending.get(path)
        if op is None:
            op = self.pending[path] = Op(path)
            self.nbytes += OP_OVERHEAD
            if path in self.gaps:
                op.gap = True
                self.gaps.discard(path)
            if self.nbytes > self.limit:
                self._shed()
        return op

    def add_text(self, path: str, text: str) -> None:
        op = self.op(path)
        op.chunks.append(text)
        n = len(text)
        op.nbytes += n
        self.nbytes += n
        self.peak_bytes = max(self.peak_bytes, self.nbytes)  # before shedding: at most the cap plus one delta
        if self.nbytes > self.limit:
            self._shed()

    def _shed(self) -> None:
        """Drop the oldest pending ops until half the cap is free; the newest op keeps its tail at least."""
        target = self.limit // 2
        while self.nbytes > target and len(self.pending) > 1:
            path, op = next(iter(self.pending.items()))
            del self.pending[path]
            self.nbytes -= op.nbytes + OP_OVERHEAD
            self.dropped_ops += 1
            self.dropped_bytes += op.nbytes
            if op.status is None and len(self.gaps) < 8192:
                self.gaps.add(path)  # its text is incomplete on the page: mark the gap when more comes
        if self.nbytes > self.limit and self.pending:
            # One huge op alone: keep its tail.
            op = next(iter(self.pending.values()))
            text = "".join(op.chunks)
            keep = text[-target:]
            self.dropped_bytes += len(text) - len(keep)
            self.nbytes -= op.nbytes - len(keep)
            op.chunks = [keep]
            op.nbytes = len(keep)
            op.gap = True

    def take(self) -> list[dict[str, Any]]:
        ops = [op.to_json() for op in self.pending.values()]
        self.pending = {}
        self.nbytes = 0
        return ops


class Recent:
    """The last few nodes with their text, for a browser that connects (or reconnects) mid-run."""

    def __init__(self, size: int, text_limit: int) -> None:
        self.size = size
        self.text_limit = text_limit
        self.items: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def start(self, e: NodeStarted) -> None:
        self.items[e.path] = {"p": e.path, "k": e.kind, "h": e.title, "a": e.attempt, "x": [], "n": 0}
        self.items.move_to_end(e.path)
        while len(self.items) > self.size:
            self.items.popitem(last=False)

    def text(self, path: str, text: str) -> None:
        item = self.items.get(path)
        if item is not None and item["n"] < self.text_limit:
            item["x"].append(text)
            item["n"] += len(text)

    def status(self, path: str, status: str, error: str | None = None) -> None:
        item = self.items.get(path)
        if item is not None:
            item["s"] = status
            if error:
                item["e"] = error

    def ops(self) -> list[dict[str, Any]]:
        out = []
        for item in self.items.values():
            op = {k: v for k, v in item.items() if k not in ("x", "n")}
            op["x"] = "".join(item["x"])
            op["r"] = True
            out.append(op)
        return out


def _pdf_ready(stats: dict[str, Any]) -> dict[str, Any] | None:
    """The reader's wait for the PDF, from stats.json: ``ready_s`` (the job's start to book.pdf on disk),
    ``after_write_s`` (the last section to book.pdf), ``pages``; None when the job made no PDF."""
    ready = figure(stats.get("pdf_ready_s"))
    if ready is None:
        return None
    pages = stats.get("pdf_pages")
    return {
        "ready_s": ready,
        "after_write_s": figure(stats.get("typeset_after_write_s")),
        "pages": pages if isinstance(pages, int) and not isinstance(pages, bool) else None,
    }


class FeedState:
    """The job as the feed knows it (``job``), the recent sections, and one queue per connected browser."""

    def __init__(self, recent: int) -> None:
        self.job = JobState()
        self.recent = Recent(recent, text_limit=16_384)
        self.clients: set[ClientQueue] = set()

    def deliver(self, e: Event) -> None:
        """Fold one event in and queue its news for every browser (on the feed's event loop)."""
        if isinstance(e, Delta):
            self._text(e)
            return
        for path in self.job.update(e):  # planning nodes that this event showed to be done
            self.recent.status(path, "done")
            for client in self.clients:
                client.op(path).status = "done"
        match e:
            case NodeStarted():
                self._node_started(e)
            case NodeFinished():
                self._node_finished(e)
            case NodeFailed():
                self._node_failed(e)
            case JobFinished():
                for client in self.clients:
                    client.final_pending = True
        for client in self.clients:
            client.status_dirty = True
            client.wake.set()

    def _text(self, e: Delta) -> None:
        recent = self.recent.items.get(e.path)
        kind = recent["k"] if recent is not None else ("section" if e.path.count(".") == 2 else "plan")
        if kind != "section":
            return  # planning nodes stream JSON title lists: their heading is shown, not their raw text
        self.recent.text(e.path, e.text)
        for client in self.clients:
            client.add_text(e.path, e.text)
            client.wake.set()

    def _node_started(self, e: NodeStarted) -> None:
        self.recent.start(e)
        for client in self.clients:
            op = client.op(e.path)
            if op.attempt is not None and op.attempt != e.attempt:
                client.nbytes -= op.nbytes
                op.chunks, op.nbytes = [], 0
            op.kind, op.title, op.attempt, op.reset = e.kind, e.title, e.attempt, True
            op.status = op.error = None

    def _node_finished(self, e: NodeFinished) -> None:
        self.recent.status(e.path, "done")
        for client in self.clients:
            op = client.op(e.path)
            op.status, op.error = "done", None

    def _node_failed(self, e: NodeFailed) -> None:
        status = "failed" if e.final else "retry"
        error = e.error[:ERROR_CHARS]
        self.recent.status(e.path, status, error)
        for client in self.clients:
            op = client.op(e.path)
            op.status, op.error = status, error

    def status(self) -> dict[str, Any]:
        with self.job.lock:
            return self.job.snapshot()

    def final(self) -> dict[str, Any] | None:
        """The finished job: its verdict, its stats, and ``pdf``: when book.pdf was on disk (None without one)."""
        with self.job.lock:
            if not self.job.finished:
                return None
            stats = self.job.stats or {}
            return {"complete": self.job.complete, "stats": stats, "pdf": _pdf_ready(stats)}

    def snapshot(self) -> dict[str, Any]:
        """The first message of every connection: the header's state, the recent sections, the rate history."""
        return {
            "snapshot": True,
            "status": self.status(),
            "ops": self.recent.ops(),
            "history": list(self.job.rate_history),
            "final": self.final(),
        }
