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

    __slots__ = ("deadline", "first", "last", "scope", "start", "stopped", "whole")

    def __init__(self, scope: anyio.CancelScope, now: float, deadline: float = float("inf"), *, whole: bool = False):
        self.scope = scope
        self.start = now
        self.deadline = deadline  # seconds the whole request may take
        self.last = now
        self.first = False
        self.whole = whole  # an unstreamed request (wire/whole.py): timed by its deadline alone
        self.stopped: str | None = None  # why the caller stopped reading (BackendClient.chat's stop_when)

    def stop(self, why: str) -> None:
        """End the stream now: its text so far is what the caller wanted (``stop_when`` saw enough)."""
        if self.stopped is None:
            self.stopped = why
            self.scope.cancel()


class MalformedStream(Exception):
    """What the server sent cannot be read as a chat completion stream: not JSON, fields of the wrong type, or more
    than the request allows (a server that ignores ``max_tokens``). A fault of the server's: the client words it as
    a failed attempt of that backend. Anything else raised while a stream is read (a consumer of ``on_delta``, our
    own code) is not this, and propagates."""


# A stream may run past its request's max_tokens by this margin, counted in the completion tokens a server reports
# as it goes (vLLM's continuous usage stats) or, where it reports none until the end, in characters of content (no
# tokenizer's token is CHARS_PER_TOKEN long; content deltas are not counted, since a proxy may cut the text into
# pieces smaller than a token); past it the server is not honouring max_tokens and the stream is cut. Bytes are
# capped too (events without content keep a stream alive as well): vLLM's events are ~300 bytes a token at one
# token an event.
TOKEN_MARGIN = 1.25
TOKEN_SLACK = 16
BYTES_PER_TOKEN = 2048
BYTES_SLACK = 1 << 16
CHARS_PER_TOKEN = 64  # the text itself: no tokenizer's token is this long


class StreamState:
    """What one attempt's stream has delivered so far: a failed attempt reports it too. ``max_tokens``: the
    request's; the stream is cut (MalformedStream) when it runs past it by more than the margin above."""

    __slots__ = ("chars", "completion_tokens", "deltas", "finish", "first", "max_bytes", "max_chars", "max_reported",
                 "max_tokens", "parts", "prompt_tokens", "whole")

    def __init__(self, max_tokens: int | None = None) -> None:
        self.parts: list[str] = []
        self.finish: str | None = None
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.first: float | None = None  # when the first content arrived
        self.whole = False  # read as one response (wire/whole.py), not streamed
        self.deltas = 0  # content deltas so far
        self.chars = 0  # characters of content so far
        self.max_tokens = max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else 1 << 20
        allowed = int(self.max_tokens * TOKEN_MARGIN) + TOKEN_SLACK
        self.max_reported = allowed  # completion tokens, as the server reports them
        self.max_chars = allowed * CHARS_PER_TOKEN
        self.max_bytes = allowed * BYTES_PER_TOKEN + BYTES_SLACK


class SseParser:
    """The events of one response body, fed in pieces cut anywhere, into a StreamState.

    Hand-written rather than a library's (aiohttp-sse-client, httpx-sse) because it is the hot path: lines are
    cut with bytes.find, an event that is one ``data:`` line followed by its blank line (what every
    OpenAI-compatible server sends) is decoded at once, and only the fields we use are looked at (delta.content,
    finish_reason, usage) after one orjson.loads. Events of several ``data:`` lines are joined with newlines as
    the SSE standard says; comments and other fields are skipped; nothing after ``[DONE]`` is read."""

    __slots__ = ("append", "done", "lines", "on_delta", "pending", "received", "st", "watch")

    def __init__(self, st: StreamState, watch: Watch, on_delta: Callable[[str], str | None] | None):
        self.st = st
        self.watch = watch
        self.on_delta = on_delta
        self.append = st.parts.append
        # A line cut between pieces: gathered in a bytearray (amortised linear, where joining bytes objects piece by
        # piece is quadratic in a long line) and joined with the piece that ends it, once.
        self.pending = bytearray()
        self.lines: list[bytes] | None = None  # the data lines of an event whose blank line has not come yet
        self.done = False  # [DONE] was read
        self.received = 0  # bytes of the body so far

    def feed(self, data: bytes) -> bool:
        """Read one piece of the body; True once ``[DONE]`` was read (what follows it is ignored)."""
        if self.done:
            return True
        if self.watch.stopped is not None:  # the caller stopped the stream: nothing more is read (see _event)
            return False
        self.received += len(data)
        if self.received > self.st.max_bytes:
            raise MalformedStream(f"the stream passed {self.st.max_bytes} bytes: the server is not honouring "
                                  "max_tokens")
        if self.pending:
            if data.find(b"\n") < 0:
                self.pending += data
                return False
            data = bytes(self.pending) + data
            self.pending.clear()
        pos = 0
        while True:
            nl = data.find(b"\n", pos)
            if nl < 0:
                if pos < len(data):
                    self.pending += memoryview(data)[pos:]
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
        if self.watch.stopped is not None:
            # The caller stopped the stream (its scope is cancelled): what came with the stop's piece is not read,
            # so the answer is the text its check judged, and nothing the server sent after it can fail it
            return False
        if payload.strip() == _DONE:
            self.done = True
            return True
        text, fr, usage = _fields(payload)
        st = self.st
        if usage is not None:
            st.prompt_tokens, st.completion_tokens = usage
        if text:
            watch = self.watch
            if not watch.first:
                watch.first = True
                st.first = watch.last
            st.deltas += 1
            st.chars += len(text)
            if st.chars > st.max_chars or st.completion_tokens > st.max_reported:
                raise MalformedStream(f"the stream ran past max_tokens {st.max_tokens} ({st.completion_tokens} tokens "
                                      f"reported, {st.chars} characters in {st.deltas} deltas): the server is not "
                                      "honouring max_tokens")
            self.append(text)
            if self.on_delta is not None:
                # ours: whatever it raises propagates as it is; a reason it returns stops the stream (Watch.stop:
                # BackendClient.chat's stop_when, called here directly, one call a delta, on the hot path)
                why = self.on_delta(text)
                if why is not None:
                    watch.stop(why)
        if fr:
            st.finish = fr
        return False


def _fields(payload: bytes) -> tuple[str | None, str | None, tuple[int, int] | None]:
    """An event's content delta, finish reason and usage (prompt, completion tokens). Only this reads what the
    server sent, and it checks every type it relies on: what does not fit raises MalformedStream, so that no
    TypeError of ours is ever mistaken for a server's fault (or the other way round)."""
    try:
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError as e:
        raise MalformedStream(f"an event is not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise MalformedStream(f"an event is a JSON {type(obj).__name__}, not an object")
    text = fr = None
    choices = obj.get("choices")
    if choices:
        if not isinstance(choices, list) or not isinstance(choices[0], dict):
            raise MalformedStream("an event's choices are not a list of objects")
        c = choices[0]
        delta = c.get("delta")
        if delta:
            if not isinstance(delta, dict):
                raise MalformedStream("an event's delta is not an object")
            text = delta.get("content")
            if text is not None and not isinstance(text, str):
                raise MalformedStream("an event's delta.content is not a string")
        fr = finish_reason(c, "an event's")
    return text, fr, usage_counts(obj, "an event's")


def finish_reason(choice: dict, whose: str) -> str | None:
    """A choice's finish reason, checked (``whose``: "an event's", "the response's", for the message)."""
    fr = choice.get("finish_reason")
    if fr is not None and not isinstance(fr, str):
        raise MalformedStream(f"{whose} finish_reason is not a string")
    return fr


def usage_counts(obj: dict, whose: str) -> tuple[int, int] | None:
    """(prompt, completion tokens) of an event's or a response's usage, checked; None when it has none."""
    usage = obj.get("usage")
    if not usage:
        return None
    if not isinstance(usage, dict):
        raise MalformedStream(f"{whose} usage is not an object")
    return count_tokens(usage.get("prompt_tokens")), count_tokens(usage.get("completion_tokens"))


def count_tokens(v: object) -> int:
    """A token count: a whole number (a float that is one too, as some servers send), or none (0)."""
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int | float) or not (v >= 0 and float(v).is_integer()):
        raise MalformedStream(f"an event's token count is not a whole number: {v!r}")
    return int(v)


def _field_value(v: bytes) -> bytes:
    """A data line's value: one leading space and the CR of a CRLF ending are not part of it."""
    if v.endswith(b"\r"):
        v = v[:-1]
    return v[1:] if v.startswith(b" ") else v


async def read_events(
    content: aiohttp.StreamReader, st: StreamState, watch: Watch, on_delta: Callable[[str], str | None] | None
) -> bool:
    """Read a streamed completion from aiohttp into ``st`` until ``[DONE]`` (returns True) or the end of the body
    (False). Each read takes whatever bytes the socket delivered (usually one SSE event)."""
    parser = SseParser(st, watch, on_delta)
    monotonic = time.monotonic
    read = content.readany
    while True:
        try:
            data = await read()
        except (aiohttp.ClientError, OSError):
            # what aiohttp already held when the caller stopped the stream (a cut it had seen): the answer stands as
            # read (BackendClient._stream)
            if watch.stopped is not None:
                return False
            raise
        if not data:  # end of body
            return parser.close()
        watch.last = monotonic()
        if parser.feed(data):
            return True
