"""The one place where HTTP and SDK errors become ours. Returns Reply values, never raises for a failed request."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Reply:
    """The outcome of one attempt at one request.

    ``error`` is None for a usable answer. ``retryable`` says whether another attempt may succeed;
    ``retry_after`` carries a server's Retry-After in seconds; ``health`` is True when the failure says something
    about the backend itself (connection refused, timeout, 5xx, cut stream) rather than about this request.
    """

    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    backend: str
    t_start: float
    t_first: float | None
    t_end: float
    error: str | None = None
    status: int | None = None
    retryable: bool = False
    retry_after: float | None = None
    health: bool = False
    attempt: int = 1

    @property
    def ok(self) -> bool:
        return self.error is None


# --------------------------------------------------------------------------------------------------------------
# The streaming hot path.
#
# Section and planning requests are streamed with aiohttp + orjson rather than the openai SDK: the SDK's typed
# stream costs ~108 µs of CPU per SSE chunk here (NOTES.md), aiohttp + orjson ~10 µs, and at 1,536 concurrent
# streams that difference decides whether one process keeps up with the fleet. The openai SDK (max_retries=0)
# is still the client for everything else: model discovery and validation (``discover``).
# --------------------------------------------------------------------------------------------------------------

import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import aiohttp  # noqa: E402
import anyio  # noqa: E402
import orjson  # noqa: E402

from .config import Backend  # noqa: E402
from .errors import BackendError, ConfigError  # noqa: E402

# Only these finish reasons are answers: "stop" (the model ended) and "length" (the token cap; a truncated but
# real answer). vLLM and SGLang also send "abort"; servers send "error" and "content_filter".
ANSWERS = frozenset({"stop", "length"})
# Other servers' names for the same two (TGI's native "eos_token" and "stop_sequence", "max_tokens").
FINISH_SYNONYMS = {"eos_token": "stop", "eos": "stop", "stop_sequence": "stop", "end_turn": "stop",
                   "max_tokens": "length", "max_length": "length"}

_DATA = b"data:"
_DONE = b"[DONE]"


class _Watch:
    """Last-activity stamp of one in-flight stream, checked by the client's watchdog."""

    __slots__ = ("first", "last", "scope", "timed_out")

    def __init__(self, scope: anyio.CancelScope, now: float):
        self.scope = scope
        self.last = now
        self.first = False
        self.timed_out = False


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
    ):
        self.backend = backend
        self.url = backend.url
        self.model = model
        self.json_schema_ok: bool | None = None  # learnt on first use
        self._key = backend.api_key or api_key or "EMPTY"
        self._connect_timeout = connect_timeout
        self._first_timeout = first_token_timeout
        self._chunk_timeout = chunk_timeout
        self._session: aiohttp.ClientSession | None = None
        self._watches: set[_Watch] = set()
        self._chat_url = f"{self.url}/chat/completions"
        self.probe_completions = 0  # probe completions sent while out of rotation (not job requests) ...
        self.probe_failures = 0  # ... and how many of them failed (a faulty server's faults hit them too)
        self.probe_tokens = 0  # completion tokens the probes made
        self.last_probe_reached_completion = False  # the last probe got past /v1/models and its completion failed

    async def __aenter__(self) -> BackendClient:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=300, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers={"Authorization": auth_header(self.backend, self._key), "Content-Type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout),
            auto_decompress=False,
        )
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def watchdog(self) -> None:
        """Cancel streams that wait too long for their first token or between chunks. Runs until cancelled."""
        while True:
            await anyio.sleep(0.5)
            now = time.monotonic()
            for w in list(self._watches):
                limit = self._chunk_timeout if w.first else self._first_timeout
                if now - w.last > limit:
                    w.timed_out = True
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

    def body(
        self,
        messages: list[dict[str, str]],
        *,
        max_tokens: int,
        temperature: float,
        schema: dict[str, Any] | None = None,
        sampling: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A streamed chat request. ``sampling``: further fields of the model profile (top_p,
        repetition_penalty, frequency_penalty), sent only when set."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
            "chat_template_kwargs": {"enable_thinking": False},
        }
        if sampling:
            body.update(sampling)
        if schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "titles", "schema": schema, "strict": True},
            }
        return body

    async def chat(
        self, body: dict[str, Any], *, attempt: int = 1, on_delta: Callable[[str], None] | None = None
    ) -> Reply:
        """Stream one chat completion. Every failure comes back as a Reply with ``error`` set."""
        assert self._session is not None, "use BackendClient as an async context manager"
        t0 = time.monotonic()
        parts: list[str] = []
        state: dict[str, Any] = {"finish": None, "pt": 0, "ct": 0, "first": None, "usage": False}
        watch: _Watch | None = None
        try:
            with anyio.CancelScope() as scope:
                watch = _Watch(scope, t0)
                self._watches.add(watch)
                return await self._stream(body, attempt, on_delta, t0, parts, state, watch)
            # Only reached when the watchdog cancelled the scope.
            stage = "between chunks" if watch.first else "for the first token"
            return self._fail(t0, attempt, f"timed out waiting {stage}", parts, state, health=True)
        except aiohttp.ClientResponseError as e:
            return self._fail(t0, attempt, f"HTTP {e.status}", parts, state, status=e.status, health=True)
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError) as e:
            return self._fail(t0, attempt, f"stream cut: {_short(e)}", parts, state, health=True)
        except aiohttp.ClientConnectorError as e:
            return self._fail(t0, attempt, f"connection failed: {_short(e.os_error or e)}", parts, state, health=True)
        except (aiohttp.ClientError, OSError) as e:
            return self._fail(t0, attempt, f"connection error: {_short(e)}", parts, state, health=True)
        except TimeoutError:
            return self._fail(t0, attempt, "timed out connecting", parts, state, health=True)
        except (orjson.JSONDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
            return self._fail(t0, attempt, f"malformed stream: {_short(e)}", parts, state, health=True)
        finally:
            if watch is not None:
                self._watches.discard(watch)

    async def _stream(self, body, attempt, on_delta, t0, parts, state, watch) -> Reply:
        assert self._session is not None
        async with self._session.post(self._chat_url, data=orjson.dumps(body)) as resp:
            if resp.status != 200:
                text = (await resp.read())[:500].decode("utf-8", "replace")
                return self._http_error(resp, text, t0, attempt, parts, state)
            # Why this is leaner than the SDK's typed stream (~300 us of CPU per chunk here, ours ~16; see
            # benchmarks/client_overhead.py): no pydantic model per chunk, no httpx/anyio stream layers, no
            # line-by-line async iteration. Each read takes whatever bytes the socket delivered (usually one SSE
            # event), lines are cut with bytes.find in one loop, and only the fields we use are looked at
            # (delta.content, finish_reason, usage) after one orjson.loads. What is left per chunk is the event
            # loop's wake-up, one recv and aiohttp's chunked decoding.
            loads = orjson.loads
            append = parts.append
            monotonic = time.monotonic
            read = resp.content.readany
            pending = b""
            done = False
            eof = False
            while not done and not eof:
                data = await read()
                if not data:  # end of body
                    if not pending:
                        break
                    data, eof = b"\n", True  # the last line came without its newline
                watch.last = monotonic()
                if pending:
                    data = pending + data
                    pending = b""
                pos = 0
                while True:
                    nl = data.find(b"\n", pos)
                    if nl < 0:
                        if pos < len(data):
                            pending = data[pos:]  # a line split across reads
                        break
                    if not data.startswith(_DATA, pos):  # blank separator, comments, event:/id: lines
                        pos = nl + 1
                        continue
                    payload = data[pos + 5:nl].strip()
                    pos = nl + 1
                    if payload == _DONE:
                        done = True
                        break
                    obj = loads(payload)
                    choices = obj.get("choices")
                    if choices:
                        c = choices[0]
                        delta = c.get("delta")
                        if delta:
                            content = delta.get("content")
                            if content:
                                if not watch.first:
                                    watch.first = True
                                    state["first"] = watch.last
                                append(content)
                                if on_delta is not None:
                                    on_delta(content)
                        fr = c.get("finish_reason")
                        if fr:
                            state["finish"] = fr
                    usage = obj.get("usage")
                    if usage:
                        state["pt"] = usage.get("prompt_tokens") or 0
                        state["ct"] = usage.get("completion_tokens") or 0
                        state["usage"] = True
            if not done and state["finish"] is None:
                # The body ended without [DONE]: a cut stream unless we already have a finish reason.
                return self._fail(t0, attempt, "stream cut before it finished", parts, state, health=True)
        text = "".join(parts)
        finish = state["finish"]
        if finish is None:
            return self._fail(t0, attempt, "stream cut: it ended without a finish reason", parts, state, health=True)
        finish = state["finish"] = FINISH_SYNONYMS.get(finish, finish)
        if finish not in ANSWERS:
            # "abort" (the server dropped the request: shutdown, preemption), "error", "content_filter", or
            # anything unknown: the text is partial or withheld, so the attempt failed and is retried.
            return self._fail(t0, attempt, f"finish_reason {finish!r}: the answer is partial", parts, state,
                              health=finish in ("abort", "error"))
        if not text.strip():
            return self._fail(t0, attempt, "empty answer", parts, state)
        return self._reply(t0, attempt, text, state)

    def _http_error(self, resp: aiohttp.ClientResponse, text: str, t0, attempt, parts, state) -> Reply:
        status = resp.status
        msg = _error_message(text)
        if status == 429:
            return self._fail(
                t0, attempt, "HTTP 429 rate limited", parts, state, status=status,
                retry_after=_retry_after(resp.headers.get("Retry-After")),
            )
        if status >= 500:
            return self._fail(t0, attempt, f"HTTP {status} {msg}".strip(), parts, state, status=status, health=True)
        if status in (401, 403):
            return self._fail(t0, attempt, f"HTTP {status}: the server refused the API key", parts, state,
                              status=status, retryable=False)
        return self._fail(t0, attempt, f"HTTP {status} {msg}".strip(), parts, state, status=status, retryable=False)

    def _fail(
        self, t0, attempt, error, parts, state, *, status=None, health=False, retryable=True, retry_after=None
    ) -> Reply:
        return self._reply(
            t0, attempt, "".join(parts), state,
            error=error, status=status, retryable=retryable, retry_after=retry_after, health=health,
        )

    def _reply(self, t0: float, attempt: int, text: str, state: dict[str, Any], **outcome: Any) -> Reply:
        """One Reply from an attempt's stream state; ``outcome`` carries the error fields of a failure."""
        return Reply(
            text=text,
            finish_reason=state["finish"],
            prompt_tokens=state["pt"],
            completion_tokens=state["ct"],
            backend=self.url,
            t_start=t0,
            t_first=state["first"],
            t_end=time.monotonic(),
            attempt=attempt,
            **outcome,
        )


def auth_header(backend: Backend, key: str) -> str:
    """HTTP basic auth when the backend URL carried user:password (a proxy in front of the server), else the
    OpenAI-style bearer key."""
    if backend.auth is not None:
        import base64

        token = base64.b64encode(f"{backend.auth[0]}:{backend.auth[1]}".encode()).decode()
        return f"Basic {token}"
    return f"Bearer {key}"


def _short(e: BaseException) -> str:
    s = str(e) or type(e).__name__
    return " ".join(s.split())[:200]


def _error_message(text: str) -> str:
    try:
        data = orjson.loads(text)
        err = data.get("error", data) if isinstance(data, dict) else data
        if isinstance(err, dict):
            return str(err.get("message") or err.get("detail") or "")[:200]
        return str(err)[:200]
    except (orjson.JSONDecodeError, ValueError):
        return " ".join(text.split())[:200]


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


# --------------------------------------------------------------------------------------------------------------
# Discovery and validation through the openai SDK (not the hot path).
# --------------------------------------------------------------------------------------------------------------


async def discover(backend: Backend, api_key: str | None, wanted: str | None, timeout: float = 8.0) -> str:
    """Check that ``backend`` is an OpenAI-compatible server and return the model to use.

    Raises BackendError (unreachable, not OpenAI-compatible, key refused) or ConfigError (unknown --model).
    The key itself is never part of a message.
    """
    import openai

    key = backend.api_key or api_key or "EMPTY"
    client = openai.AsyncOpenAI(
        base_url=backend.url, api_key=key, max_retries=0, timeout=timeout,
        default_headers={"Authorization": auth_header(backend, key)} if backend.auth else None,
    )
    try:
        page = await client.models.list()
        ids = [m.id for m in page.data if getattr(m, "id", None)]
    except openai.AuthenticationError:
        raise BackendError(
            f"{backend.url} refused the API key (HTTP 401); pass --api-key or set OPENAI_API_KEY"
        ) from None
    except openai.PermissionDeniedError:
        raise BackendError(f"{backend.url} refused the API key (HTTP 403)") from None
    except openai.APITimeoutError:
        raise BackendError(f"{backend.url} did not answer within {timeout:g} s") from None
    except openai.APIConnectionError as e:
        cause = e.__cause__ or e
        raise BackendError(f"cannot reach {backend.url}: {_short(cause)}") from None
    except openai.NotFoundError:
        raise BackendError(f"{backend.url} is not an OpenAI-compatible server (no /models endpoint)") from None
    except (openai.APIStatusError, openai.APIResponseValidationError) as e:
        code = getattr(e, "status_code", None)
        raise BackendError(
            f"{backend.url} is not an OpenAI-compatible server ({'HTTP ' + str(code) if code else 'bad /models reply'})"
        ) from None
    except (ValueError, TypeError, AttributeError):
        raise BackendError(f"{backend.url} is not an OpenAI-compatible server (bad /models reply)") from None
    finally:
        await client.close()
    if not ids:
        raise BackendError(f"{backend.url} lists no models")
    want = backend.model or wanted
    if want is None:
        return ids[0]
    if want not in ids:
        raise ConfigError(f"model {want!r} is not served by {backend.url}; it offers: {', '.join(ids)}")
    return want
