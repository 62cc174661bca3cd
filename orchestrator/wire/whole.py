"""An unstreamed chat completion (``"stream": false``): the whole response read into the same StreamState a stream
fills, so that the client words its outcome the same way.

Where nobody reads a section's text as it arrives (no live feed, no recording, no delta consumer), streaming it
costs the client an event per chunk for nothing: one response per section costs one parse. ``WholeParser`` has the
SseParser's interface (``feed`` pieces cut anywhere, ``close`` at the end of the body, True when the reply was
read whole) so that both readers (sseproto's protocol and aiohttp's path) take either. Its caps are the stream's:
a body over ``StreamState.max_bytes``, or content past max_tokens by the margin, is MalformedStream. An unstreamed
reply has no first token the client can see: ``StreamState.first`` is the time its last byte came, which is when
its text reached us.

An unstreamed request is timed by its deadline alone (``Watch.whole``): the server says nothing until it is done,
so the first-token and between-chunk timers do not apply.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import aiohttp
import orjson

from .sse import MalformedStream, StreamState, Watch, finish_reason, usage_counts

__all__ = ["WholeParser", "read_whole"]


class WholeParser:
    """One unstreamed response body, fed in pieces, read into a StreamState at its end."""

    __slots__ = ("body", "done", "on_delta", "st", "watch")

    def __init__(self, st: StreamState, watch: Watch, on_delta: Callable[[str], str | None] | None):
        self.st = st
        self.watch = watch
        self.on_delta = on_delta
        self.body = bytearray()
        self.done = False

    def feed(self, data: bytes | memoryview) -> bool:
        """Keep a piece of the body; never done before the body ends (:meth:`close`)."""
        self.body += data
        if len(self.body) > self.st.max_bytes:
            raise MalformedStream(f"the response is over {self.st.max_bytes:,} bytes, more than max_tokens "
                                  f"{self.st.max_tokens} allows: the server is not honouring max_tokens")
        return False

    def close(self) -> bool:
        """The body ended: read the completion (True), or raise MalformedStream for what cannot be one."""
        if self.done:
            return True
        text, finish, usage = _completion(bytes(self.body))
        st = self.st
        if usage is not None:
            st.prompt_tokens, st.completion_tokens = usage
        if text:
            st.first = self.watch.last
            st.deltas = 1
            st.chars = len(text)
            if st.chars > st.max_chars or st.completion_tokens > st.max_reported:
                raise MalformedStream(f"the reply runs past max_tokens {st.max_tokens} ({st.completion_tokens} "
                                      f"tokens reported, {st.chars} characters): the server is not honouring "
                                      "max_tokens")
            st.parts.append(text)
            if self.on_delta is not None:
                self.on_delta(text)  # ours: whatever it raises propagates as it is
        st.finish = finish
        self.done = True
        return True


def _completion(body: bytes) -> tuple[str | None, str | None, tuple[int, int] | None]:
    """A chat completion's message content, finish reason and usage; MalformedStream for what does not fit (as
    sse._fields: every type relied on is checked, so no TypeError of ours is taken for the server's fault)."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise MalformedStream(f"the response is not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise MalformedStream(f"the response is a JSON {type(obj).__name__}, not an object")
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise MalformedStream("the response's choices are not a list of objects")
    c = choices[0]
    message = c.get("message")
    if not isinstance(message, dict):
        raise MalformedStream("the response's message is not an object")
    text = message.get("content")
    if text is not None and not isinstance(text, str):
        raise MalformedStream("the response's message.content is not a string")
    return text, finish_reason(c, "the response's"), usage_counts(obj, "the response's")


async def read_whole(content: aiohttp.StreamReader, st: StreamState, watch: Watch,
                     on_delta: Callable[[str], str | None] | None) -> bool:
    """Read an unstreamed completion from aiohttp into ``st`` (True: read whole)."""
    parser = WholeParser(st, watch, on_delta)
    while True:
        data = await content.readany()
        if not data:
            return parser.close()
        watch.last = time.monotonic()
        parser.feed(data)
