"""The wire: the one place where HTTP and SDK errors become ours. Returns Reply values, never raises for a failed
request.

Requests stream through our own protocol-level reader (sseproto.py; aiohttp where it does not apply: https, or
after a response head it could not read) and orjson (the events themselves: sse.py); the openai SDK
(max_retries=0) is the client for everything else: model discovery and validation (``discover``, in discover.py,
importable from here as before). Structured output is decided here too: a client sends ``response_format`` until
its server refuses it (``send``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import aiohttp
import anyio
import orjson

from ..core.config import Backend
from ..core.reply import ANSWERS, FINISH_SYNONYMS, STOPPED, Reply
from .discover import auth_header as auth_header
from .discover import discover as discover
from .discover import short_error
from .hotpath import ConnectError, on_asyncio
from .refusal import error_message, is_json, parse_retry_after, rejects_continuous_usage, rejects_structured_output
from .sse import MalformedStream, StreamState, Watch, read_events
from .sseproto import Pool, usable
from .whole import read_whole

MIN_TOKENS_PER_S = 0.5  # the slowest decoding a request's deadline allows for (see BackendClient.deadline_for)


class BackendClient:
    """One backend: a pooled aiohttp session for the hot path, a watchdog for first-token and between-chunk
    timeouts (one task per backend instead of a timer per chunk), and the mapping of HTTP errors to Replies."""

    def __init__(
        self,
        backend: Backend,
        model: str,
        *,
        api_key: str | None = None,
        connect_timeout: float = 10.0,
        first_token_timeout: float = 120.0,
        chunk_timeout: float = 60.0,
        request_timeout: float = 1800.0,
    ):
        self.backend = backend
        self.url = backend.url
        self.model = model
        # Does the server honour response_format? None until it answered a structured request with JSON (True) or
        # refused one with a 400 about it (False): see send().
        self.json_schema_ok: bool | None = None
        # Does the server take stream_options.continuous_usage_stats (vLLM's and SGLang's: the usage so far on every
        # chunk), asked for on a watched stream so that an answer stopped as it streams has its tokens counted? False
        # once it refused it with a 400 naming it: see send().
        self.continuous_usage_ok: bool | None = None
        self._key = backend.api_key or api_key or "EMPTY"
        self._connect_timeout = connect_timeout
        self._first_timeout = first_token_timeout
        self._chunk_timeout = chunk_timeout
        self._request_timeout = request_timeout
        self._session: aiohttp.ClientSession | None = None
        self._pool: Pool | None = None  # the hot path's own connections (sseproto), where they apply
        self._watches: set[Watch] = set()
        self._chat_url = f"{self.url}/chat/completions"
        self.probe_completions = 0  # probe completions sent while out of rotation (not job requests) ...
        self.probe_failures = 0  # ... and how many of them failed (a faulty server's faults hit them too)
        self.probe_tokens = 0  # completion tokens the probes made
        self.last_probe_reached_completion = False  # the last probe got past /v1/models and its completion failed

    async def __aenter__(self) -> BackendClient:
        headers = {"Authorization": auth_header(self.backend, self._key), "Content-Type": "application/json"}
        if usable(self.url) and on_asyncio():
            self._pool = Pool(self.url, headers, self._connect_timeout)
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=300, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout),
            auto_decompress=False,
        )
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._session is not None:
            session, self._session = self._session, None
            with anyio.CancelScope(shield=True):  # a cancel arriving now must not leave the session's sockets open
                await session.close()

    async def watchdog(self) -> None:
        """Cancel streams that wait too long for their first token or between chunks, or that last longer than
        any request may (a server that drips tokens just inside the chunk timeout, for ever). Runs until
        cancelled."""
        while True:
            await anyio.sleep(0.5)
            now = time.monotonic()
            for w in list(self._watches):
                limit = float("inf") if w.whole else self._chunk_timeout if w.first else self._first_timeout
                if now - w.last > limit or now - w.start > w.deadline:
                    w.scope.cancel()

    async def probe(self, on_listening: Callable[[], None] | None = None) -> bool:
        """Is the server serving again? ``/v1/models`` answering is not enough (a server whose engine died still
        lists its models): a tiny completion must come back as an answer too. ``on_listening`` is called once
        ``/v1/models`` answered: the completion may then take as long as any first token (a busy CPU engine
        queues it behind its running streams), and the server is alive meanwhile."""
        assert self._session is not None
        try:
            async with self._session.get(
                f"{self.url}/models", timeout=aiohttp.ClientTimeout(total=self._connect_timeout)
            ) as r:
                if r.status != 200:
                    return False
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False
        if on_listening is not None:
            on_listening()
        self.probe_completions += 1
        self.last_probe_reached_completion = False
        # Bounded by the watchdog's first-token and between-chunk timeouts, like every request.
        reply = await self.chat(self.body([{"role": "user", "content": "Say OK."}], max_tokens=8, temperature=0))
        self.probe_tokens += reply.completion_tokens  # the server counted them: stats.json's tokens_written does too
        # An answer is what counts, words or not (a reasoning model may spend 8 tokens before any content).
        if reply.ok or reply.finish_reason in ANSWERS:
            return True
        self.probe_failures += 1
        self.last_probe_reached_completion = True
        return False

    def deadline_for(self, body: dict[str, Any]) -> float:
        """Seconds a request may take in all: ``request_timeout``, or longer for a request allowed many tokens (at
        MIN_TOKENS_PER_S, a floor no server that answers at all falls below), so that only a server that drips
        tokens for ever reaches it."""
        max_tokens = body.get("max_tokens")
        tokens = max_tokens if isinstance(max_tokens, int) else 0
        return max(self._request_timeout, self._first_timeout + tokens / MIN_TOKENS_PER_S)

    @property
    def structured(self) -> bool:
        """Will a schema passed to :meth:`body` be sent? Yes until the server refused one."""
        return self.json_schema_ok is not False

    def body(
        self,
        messages: list[dict[str, str]],
        *,
        max_tokens: int,
        temperature: float,
        schema: dict[str, Any] | None = None,
        sampling: dict[str, Any] | None = None,
        stream: bool = True,
    ) -> dict[str, Any]:
        """A chat request, streamed unless ``stream`` is False (one response: wire/whole.py). ``sampling``:
        further fields of the model profile (top_p, repetition_penalty, frequency_penalty), sent only when set.
        ``schema`` becomes ``response_format`` while the server takes it (:attr:`structured`)."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "stream": stream,
            "chat_template_kwargs": {"enable_thinking": False},
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        if sampling:
            body.update(sampling)
        if schema is not None and self.structured:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "titles", "schema": schema, "strict": True},
            }
        return body

    async def send(
        self, make_body: Callable[[], dict[str, Any]], *, attempt: int = 1,
        on_delta: Callable[[str], None] | None = None, stop_when: Callable[[str], str | None] | None = None,
    ) -> list[Reply]:
        """One request, falling back from structured output: ``make_body()`` is sent; when it carried
        ``response_format`` and the server refused that (a 400 about it), the server is marked as one that does
        not take it and ``make_body()`` is sent again at once, now in text. Every reply comes back, the answer
        last (a refused request was a request too: it is counted and recorded)."""
        body = make_body()
        # What this request asks for, judged before it goes (many share the client: the flag may change meanwhile)
        continuous = self._asks_continuous_usage(body, stop_when)
        reply = await self.chat(body, attempt=attempt, on_delta=on_delta, stop_when=stop_when)
        if continuous and not reply.ok and reply.status in (400, 422) and rejects_continuous_usage(reply.error):
            # A server that knows no continuous usage stats (a 422: a FastAPI one's validation): asked again at once
            # without them, as is every request asked for them before it said so; its stopped answers are then
            # counted a token a content delta (see chat())
            self.continuous_usage_ok = False
            return [reply, *await self.send(make_body, attempt=attempt, on_delta=on_delta, stop_when=stop_when)]
        if continuous and reply.ok and self.continuous_usage_ok is None:
            self.continuous_usage_ok = True  # an answer to a request that asked for them
        if "response_format" not in body:
            return [reply]
        refused = not reply.ok and reply.status == 400 and rejects_structured_output(reply.error)
        if refused and self.json_schema_ok is not True:
            self.json_schema_ok = False
            # through send(): the text request may still ask for continuous usage stats (a watched stream), which
            # this server may refuse in turn
            return [reply, *await self.send(make_body, attempt=attempt, on_delta=on_delta, stop_when=stop_when)]
        if reply.ok and is_json(reply.text):
            # Only a reply that really is JSON proves the server honours the schema (some accept the field and
            # ignore it).
            self.json_schema_ok = True
        return [reply]

    async def chat(
        self, body: dict[str, Any], *, attempt: int = 1, on_delta: Callable[[str], None] | None = None,
        stop_when: Callable[[str], str | None] | None = None,
    ) -> Reply:
        """One chat completion, streamed or (``"stream": false`` in ``body``) read whole. Every failure comes back as
        a Reply with ``error`` set.

        ``stop_when(delta)`` sees every content delta of a streamed answer after ``on_delta`` (an answer read whole
        is not given to it); when it returns a reason, reading stops at once (the connection is dropped, so the
        server stops generating) and the text so far comes back as an answer with finish_reason :data:`STOPPED`: the
        caller's check judges it (a section caught in a repetition loop is asked again without waiting for the token
        cap). A watched stream asks for ``stream_options.continuous_usage_stats``, so that the stopped answer's
        completion tokens are the server's own count of what it sent; from a server that refuses it (see send()) or
        sends no usage before its last event, they are counted one a content delta, at least the number read."""
        assert self._session is not None, "use BackendClient as an async context manager"
        t0 = time.monotonic()
        st = StreamState(body.get("max_tokens"))
        watch: Watch | None = None
        reader_delta: Callable[[str], str | None] | None = on_delta
        if self._asks_continuous_usage(body, stop_when):
            body = {**body, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        if stop_when is not None and body.get("stream") is True:  # an answer read whole is judged whole, after
            # The stream reader stops on the reason stop_when returns (sse.SseParser): given alone, it is called
            # directly, one call a delta
            reader_delta = stop_when if on_delta is None else partial(_watched, on_delta, stop_when)
        try:
            with anyio.CancelScope() as scope:
                watch = Watch(scope, t0, self.deadline_for(body), whole=body.get("stream") is not True)
                st.whole = watch.whole
                self._watches.add(watch)
                return await self._stream(body, attempt, reader_delta, t0, st, watch)
            # Only reached when the watchdog, or stop_when, cancelled the scope.
            assert watch is not None
            if watch.stopped is not None:
                return self._stopped(t0, attempt, st)
            if time.monotonic() - t0 > watch.deadline:
                return self._fail(t0, attempt, f"timed out: the request took longer than {watch.deadline:g} s", st,
                                  health=True)
            stage = "between chunks" if st.first is not None else "for the first token"
            return self._fail(t0, attempt, f"timed out waiting {stage}", st, health=True)
        except TimeoutError:
            # Before the OSError and ClientError clauses: TimeoutError is an OSError (and aiohttp's connect timeout a
            # ClientError too). Only connecting has a timer on either path; the watchdog times the stream.
            return self._fail(t0, attempt, "timed out connecting", st, health=True)
        except aiohttp.ClientResponseError as e:
            # What both paths raise for a response head they cannot parse (aiohttp's status 400 is its own, not the
            # server's): the request may have reached the server, so it is no refusal of the request (see send()).
            why = " ".join(str(e.message or type(e).__name__).split())[:200]
            return self._fail(t0, attempt, f"connection error: unreadable response head: {why}", st, health=True)
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError) as e:
            return self._fail(t0, attempt, f"stream cut: {short_error(e)}", st, health=True)
        except (aiohttp.ClientConnectorError, ConnectError) as e:
            return self._fail(t0, attempt, f"connection failed: {short_error(e.os_error or e)}", st, health=True)
        except (aiohttp.ClientError, OSError) as e:
            return self._fail(t0, attempt, f"connection error: {short_error(e)}", st, health=True)
        except MalformedStream as e:  # what the server sent (sse._fields, the stream caps); nothing of ours
            return self._fail(t0, attempt, f"malformed stream: {short_error(e)}", st, health=True)
        # Anything else is a fault of ours (a consumer of the deltas, the planner's stream, this client): it
        # propagates, ends the job as an internal error and counts against no backend.
        finally:
            if watch is not None:
                self._watches.discard(watch)

    async def _stream(self, body: dict[str, Any], attempt: int, on_delta: Callable[[str], str | None] | None, t0: float,
                      st: StreamState, watch: Watch) -> Reply:
        assert self._session is not None
        data = orjson.dumps(body)
        pool = self._pool
        # A pool retires when a response head could not be read (that request failed, as on aiohttp's path, and is
        # not sent again): aiohttp carries this backend's later requests.
        if pool is not None and not pool.retired:
            got = await pool.post(data, st, watch, on_delta)
            if got.status != 200:
                text = got.body[:500].decode("utf-8", "replace")
                return self._http_error(got.status, got.retry_after, text, t0, attempt, st)
            done = got.done
        else:
            async with self._session.post(self._chat_url, data=data) as resp:
                if resp.status != 200:
                    text = (await resp.read())[:500].decode("utf-8", "replace")
                    return self._http_error(resp.status, resp.headers.get("Retry-After"), text, t0, attempt, st)
                read = read_whole if watch.whole else read_events
                done = await read(resp.content, st, watch, on_delta)
        if watch.stopped is not None:  # the rest of the body was at hand: it ended before the stop's cancellation
            return self._stopped(t0, attempt, st)
        if not done and st.finish is None:
            # The body ended without [DONE]: a cut stream unless we already have a finish reason.
            return self._fail(t0, attempt, "stream cut before it finished", st, health=True)
        text = "".join(st.parts)
        finish = st.finish
        if finish is None:
            return self._fail(t0, attempt, "stream cut: it ended without a finish reason", st, health=True)
        finish = st.finish = FINISH_SYNONYMS.get(finish, finish)
        if finish not in ANSWERS:
            # "abort" (the server dropped the request: shutdown, preemption), "error", "content_filter", or
            # anything unknown: the text is partial or withheld, so the attempt failed and is retried.
            return self._fail(t0, attempt, f"finish_reason {finish!r}: the answer is partial", st,
                              health=finish in ("abort", "error"))
        if not text.strip():
            return self._fail(t0, attempt, "empty answer", st)
        return self._reply(t0, attempt, text, st)

    def _http_error(self, status: int, retry_after: str | None, text: str, t0: float, attempt: int,
                    st: StreamState) -> Reply:
        msg = error_message(text)
        if status == 429:
            return self._fail(t0, attempt, "HTTP 429 rate limited", st, status=status,
                              retry_after=parse_retry_after(retry_after))
        if status >= 500:
            return self._fail(t0, attempt, f"HTTP {status} {msg}".strip(), st, status=status, health=True)
        if status in (401, 403):
            return self._fail(t0, attempt, f"HTTP {status}: the server refused the API key", st, status=status,
                              retryable=False)
        return self._fail(t0, attempt, f"HTTP {status} {msg}".strip(), st, status=status, retryable=False)

    def _asks_continuous_usage(self, body: dict[str, Any], stop_when: Callable[[str], str | None] | None) -> bool:
        """Does ``chat`` ask for continuous usage stats with ``body``: a watched stream, to a server not known to
        refuse them (send() asks the same before it calls)."""
        return stop_when is not None and body.get("stream") is True and self.continuous_usage_ok is not False

    def _stopped(self, t0: float, attempt: int, st: StreamState) -> Reply:
        """The answer of a stream the caller stopped (stop_when), as far as it was read."""
        st.finish = STOPPED
        # Its tokens are the usage of the last event read where the server reports it as it goes (continuous usage
        # stats); else no usage came (a server sends it in its last event) and they are counted one a content delta,
        # the fewest it can be where a delta holds a token or more (vLLM and the simulator join several under load),
        # so that tokens_written keeps at least what was read of it
        st.completion_tokens = max(st.completion_tokens, st.deltas)
        return self._reply(t0, attempt, "".join(st.parts), st)

    def _fail(self, t0: float, attempt: int, error: str, st: StreamState, *, status: int | None = None,
              health: bool = False, retryable: bool = True, retry_after: float | None = None) -> Reply:
        return self._reply(t0, attempt, "".join(st.parts), st, error=error, status=status, retryable=retryable,
                           retry_after=retry_after, health=health)

    def _reply(self, t0: float, attempt: int, text: str, st: StreamState, **outcome: Any) -> Reply:
        """One Reply from an attempt's stream state; ``outcome`` carries the error fields of a failure."""
        return Reply(
            text=text,
            finish_reason=st.finish,
            prompt_tokens=st.prompt_tokens,
            completion_tokens=st.completion_tokens,
            backend=self.url,
            t_start=t0,
            t_first=st.first,
            t_end=time.monotonic(),
            attempt=attempt,
            streamed=not st.whole,
            **outcome,
        )


def _watched(on_delta: Callable[[str], None], stop_when: Callable[[str], str | None], delta: str) -> str | None:
    """``chat``'s ``on_delta`` and ``stop_when`` both: the stream reader stops on the reason stop_when returns."""
    on_delta(delta)
    return stop_when(delta)
