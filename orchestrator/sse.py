"""The streaming hot path: the server-sent events of one streamed chat completion, read as they arrive.

Section and planning requests are streamed with our own reader (``sseproto``: an asyncio protocol that parses the
HTTP response and the events in the event loop's read callback) or, where that does not apply, aiohttp; both feed
``SseParser`` below, and orjson decodes each event. The openai SDK's typed stream costs ~108 µs of CPU per SSE chunk
on this kind of machine (shared/NOTES.md), and at 1,536 concurrent streams that difference decides whether one
process keeps up with the fleet (benchmarks/client_overhead.py measures it).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import aiohttp
import anyio
import orjson

_DATA = b"data:"
_DONE = b"[DONE]"


class Watch:
    """Last-activity stamp of one in-flight stream, checked by its client's watchdog."""

    __slots__ = ("first", "last", "scope")

    def __init__(self, scope: anyio.CancelScope, now: float):
        self.scope = scope
        self.last = now
        self.first = False


class StreamState:
    """What one attempt's stream has delivered so far: a failed attempt reports it too."""

    __slots__ = ("completion_tokens", "finish", "first", "parts", "prompt_tokens")

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.finish: str | None = None
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.first: float | None = None  # when the first content arrived


class SseParser:
    """The events of one response body, fed in pieces cut anywhere, into a StreamState.

    Hand-written rather than a library's (aiohttp-sse-client, httpx-sse) because it is the hot path: lines are
    cut with bytes.find, an event that is one ``data:`` line followed by its blank line (what every
    OpenAI-compatible server sends) is decoded at once, and only the fields we use are looked at (delta.content,
    finish_reason, usage) after one orjson.loads. Events of several ``data:`` lines are joined with newlines as
    the SSE standard says; comments and other fields are skipped; nothing after ``[DONE]`` is read."""

    __slots__ = ("append", "done", "lines", "on_delta", "pending", "st", "watch")

    def __init__(self, st: StreamState, watch: Watch, on_delta: Callable[[str], None] | None):
        self.st = st
        self.watch = watch
        self.on_delta = on_delta
        self.append = st.parts.append
        self.pending = b""  # a line cut between two pieces
        self.lines: list[bytes] | None = None  # the data lines of an event whose blank line has not come yet
        self.done = False  # [DONE] was read

    def feed(self, data: bytes) -> bool:
        """Read one piece of the body; True once ``[DONE]`` was read (what follows it is ignored)."""
        if self.done:
            return True
        if self.pending:
            data = self.pending + data
            self.pending = b""
        pos = 0
        while True:
            nl = data.find(b"\n", pos)
            if nl < 0:
                if pos < len(data):
                    self.pending = data[pos:]
                return False
            if data.startswith(_DATA, pos):
                value = data[pos + 5:nl]
                pos = nl + 1
                if self.lines is None:
                    # The usual event: one data line and its blank line, in the same piece.
                    if data.startswith(b"\n", pos):
                        pos += 1
                    elif data.startswith(b"\r\n", pos):
                        pos += 2
                    else:
                        self.lines = [value]
                        continue
                    if self._event(value):
                        return True
                else:
                    self.lines.append(value)
                continue
            if nl == pos or (nl == pos + 1 and data[pos] == 13):  # a blank line ends the event
                if self.lines is not None and self._flush():
                    return True
            pos = nl + 1  # comments, event:/id:/retry: lines

    def close(self) -> bool:
        """The body ended: its last line may have come without a newline, its last event without a blank line.
        True when ``[DONE]`` was read."""
        if not self.done and self.pending:
            self.feed(b"\n")
        if not self.done and self.lines is not None:
            self._flush()
        return self.done

    def _flush(self) -> bool:
        lines = self.lines or []
        self.lines = None
        return self._event(b"\n".join(_field_value(v) for v in lines))

    def _event(self, payload: bytes) -> bool:
        if payload.strip() == _DONE:
            self.done = True
            return True
        obj = orjson.loads(payload)
        choices = obj.get("choices")
        if choices:
            c = choices[0]
            delta = c.get("delta")
            if delta:
                text = delta.get("content")
                if text:
                    watch = self.watch
                    if not watch.first:
                        watch.first = True
                        self.st.first = watch.last
                    self.append(text)
                    if self.on_delta is not None:
                        self.on_delta(text)
            fr = c.get("finish_reason")
            if fr:
                self.st.finish = fr
        usage = obj.get("usage")
        if usage:
            self.st.prompt_tokens = usage.get("prompt_tokens") or 0
            self.st.completion_tokens = usage.get("completion_tokens") or 0
        return False


def _field_value(v: bytes) -> bytes:
    """A data line's value: one leading space and the CR of a CRLF ending are not part of it."""
    if v.endswith(b"\r"):
        v = v[:-1]
    return v[1:] if v.startswith(b" ") else v


async def read_events(
    content: aiohttp.StreamReader, st: StreamState, watch: Watch, on_delta: Callable[[str], None] | None
) -> bool:
    """Read a streamed completion from aiohttp into ``st`` until ``[DONE]`` (returns True) or the end of the body
    (False). Each read takes whatever bytes the socket delivered (usually one SSE event)."""
    parser = SseParser(st, watch, on_delta)
    monotonic = time.monotonic
    read = content.readany
    while True:
        data = await read()
        if not data:  # end of body
            return parser.close()
        watch.last = monotonic()
        if parser.feed(data):
            return True
