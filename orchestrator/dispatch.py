"""Spreading requests over the fleet: per-backend caps, one shared queue, retries, failover.

Every request (planning and sections alike) takes a *lease* on a backend before it is sent and gives it back when
its attempt ends, so a backend's cap bounds everything in flight on it. Leases are granted from one shared queue,
ordered by (priority, arrival): planning requests go before sections so the outline is never starved. A free
slot goes to the healthy backend with the lowest load (in flight / cap), which gives equal servers equal shares
and a slower server fewer (it holds its leases longer) — the behaviour of pull workers over one queue, without a
worker task per slot. Retries are tenacity's (exponential backoff with jitter, Retry-After honoured, sleeping
with anyio.sleep); each retry takes a new lease, so it may land on another backend. A backend that fails
``trip_after`` times in a row leaves the rotation, is probed, and comes back when it answers again.
"""

from __future__ import annotations

import heapq
import itertools
import re
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import anyio
import orjson
from tenacity import AsyncRetrying, retry_if_result, stop_after_attempt, wait_exponential_jitter

from .client import BackendClient, Reply
from .errors import BackendError
from .events import BackendState, Delta, NodeFailed, NodeStarted

T = TypeVar("T")


@dataclass
class BackendLoad:
    """Mutable per-backend bookkeeping, owned by the Fleet (never shared outside the event loop)."""

    client: BackendClient
    cap: int
    in_flight: int = 0
    max_in_flight: int = 0
    healthy: bool = True
    consecutive_failures: int = 0
    requests: int = 0
    errors: int = 0
    down_since: float | None = None
    trips: int = 0  # times it left the rotation
    listening_since: float | None = None  # out of rotation, its probe completion on its way (/v1/models answered)
    probe_failed: bool = False  # a probe completion failed during this outage: listening no longer counts


@dataclass(order=True)
class _Waiter:
    priority: tuple[int, int]
    seq: int
    event: anyio.Event = field(compare=False)
    granted: int | None = field(default=None, compare=False)
    abandoned: bool = field(default=False, compare=False)


class Fleet:
    def __init__(
        self,
        clients: list[BackendClient],
        caps: list[int],
        emit: Callable[[Any], None],
        *,
        trip_after: int = 3,
        probe_interval: float = 1.0,
        all_down_timeout: float = 30.0,
    ):
        self.loads = [BackendLoad(c, cap) for c, cap in zip(clients, caps, strict=True)]
        self._emit = emit
        self._waiters: list[_Waiter] = []
        self._seq = itertools.count()
        self._rr = itertools.count()
        self._trip_after = trip_after
        self._probe_interval = probe_interval
        self._all_down_timeout = all_down_timeout
        self._tg: anyio.abc.TaskGroup | None = None
        self.all_down_error: BackendError | None = None
        self.all_down = anyio.Event()  # set together with all_down_error
        self.stopped = False  # no lease is granted any more (an interrupt): in-flight requests run out

    async def run(self, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """Background duties (watchdogs, probes). Runs until cancelled."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            for load in self.loads:
                tg.start_soon(load.client.watchdog)
            task_status.started()
            await anyio.sleep_forever()

    # -- leases -------------------------------------------------------------------------------------------------

    def _pick(self) -> int | None:
        best: int | None = None
        best_load = 2.0
        n = len(self.loads)
        start = next(self._rr) % n
        for k in range(n):
            i = (start + k) % n
            load = self.loads[i]
            if not load.healthy or load.in_flight >= load.cap:
                continue
            frac = load.in_flight / load.cap
            if frac < best_load:
                best, best_load = i, frac
        return best

    def _take(self, i: int) -> None:
        load = self.loads[i]
        load.in_flight += 1
        load.requests += 1
        if load.in_flight > load.max_in_flight:
            load.max_in_flight = load.in_flight

    def stop(self) -> None:
        """Grant no more leases: requests in flight finish, every other one waits until it is cancelled."""
        self.stopped = True

    @property
    def in_flight(self) -> int:
        return sum(x.in_flight for x in self.loads)

    def _grant(self) -> None:
        if self.stopped:
            return
        while self._waiters:
            i = self._pick()
            if i is None:
                return
            w = heapq.heappop(self._waiters)
            if w.abandoned:
                continue
            self._take(i)
            w.granted = i
            w.event.set()

    @asynccontextmanager
    async def lease(self, priority: tuple[int, int] = (1, 0)):
        """Hold one slot on some healthy backend for the duration of the block."""
        i = None if self._waiters or self.stopped else self._pick()
        if i is not None:
            self._take(i)
        else:
            w = _Waiter(priority, next(self._seq), anyio.Event())
            heapq.heappush(self._waiters, w)
            try:
                await w.event.wait()
            except BaseException:
                w.abandoned = True
                if w.granted is not None:
                    self._release(w.granted)
                raise
            i = w.granted
            assert i is not None
        try:
            yield self.loads[i].client
        finally:
            self._release(i)

    def _release(self, i: int) -> None:
        self.loads[i].in_flight -= 1
        self._grant()

    # -- health -------------------------------------------------------------------------------------------------

    def report(self, client: BackendClient, reply: Reply) -> None:
        load = next(x for x in self.loads if x.client is client)
        if reply.ok:
            load.consecutive_failures = 0
            return
        load.errors += 1
        if not reply.health:
            return
        load.consecutive_failures += 1
        if load.healthy and load.consecutive_failures >= self._trip_after:
            load.healthy = False
            load.trips += 1
            load.down_since = time.monotonic()
            self._emit(BackendState(load.client.url, False, reply.error or "failing", time.monotonic()))
            if self._tg is not None:
                self._tg.start_soon(self._probe, load)

    async def _probe(self, load: BackendLoad) -> None:
        def listening() -> None:
            load.listening_since = time.monotonic()

        while not load.healthy:
            await anyio.sleep(self._probe_interval)
            try:
                back = await load.client.probe(on_listening=listening)
            finally:
                load.listening_since = None
            if back:
                load.healthy = True
                load.consecutive_failures = 0
                load.down_since = None
                load.probe_failed = False
                self._emit(BackendState(load.client.url, True, "answering again", time.monotonic()))
                self._grant()
                return
            # A server whose probe completion is still on its way (it answered /v1/models; a busy CPU engine
            # queues the completion behind its running streams) is alive: it does not count towards "every
            # backend stopped answering". One whose completion failed does.
            load.probe_failed = load.probe_failed or load.client.last_probe_reached_completion
            if all(not x.healthy and (x.listening_since is None or x.probe_failed) for x in self.loads):
                all_down_since = max(x.down_since or time.monotonic() for x in self.loads)
                if time.monotonic() - all_down_since > self._all_down_timeout and self.all_down_error is None:
                    self.all_down_error = BackendError(
                        f"every backend stopped answering for {self._all_down_timeout:g} s: "
                        + ", ".join(x.client.url for x in self.loads)
                    )
                    self.all_down.set()
                    self._emit(BackendState("*", False, str(self.all_down_error), time.monotonic()))

    @property
    def healthy_count(self) -> int:
        return sum(1 for x in self.loads if x.healthy)


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """The end of a node: its last reply, the value parsed from it (None on failure) and attempts used."""

    reply: Reply
    value: T | None
    attempts: int


class Dispatcher:
    """Runs one node to completion: lease, send, validate, retry."""

    def __init__(self, fleet: Fleet, emit: Callable[[Any], None], attempts: int, wants_deltas: bool):
        self.fleet = fleet
        self.emit = emit
        self.attempts = attempts
        self.wants_deltas = wants_deltas
        self.requests = 0
        self.request_errors = 0
        self.replies: list[tuple[str, Reply]] = []  # (kind, reply) of every attempt, for usage and errors

    # Exponential backoff with jitter: 0.5, 1, 2, 4 ... s (at most 10 s) plus up to 0.5 s at random.
    try:
        _backoff = wait_exponential_jitter(multiplier=0.5, max=10.0, jitter=0.5)
    except TypeError:  # tenacity < 9.1: ``initial`` was the name
        _backoff = wait_exponential_jitter(initial=0.5, max=10.0, jitter=0.5)

    @classmethod
    def _wait(cls, state) -> float:
        base = cls._backoff(state)
        reply = state.outcome.result()[0] if state.outcome and not state.outcome.failed else None
        if reply is not None and reply.retry_after:
            return max(base, min(reply.retry_after, 60.0))
        return base

    async def run(
        self,
        path: str,
        kind: str,
        title: str,
        build: Callable[[BackendClient, int], dict[str, Any]],
        validate: Callable[[Reply], T] | None = None,
        priority: tuple[int, int] = (1, 0),
        on_delta: Callable[[str], None] | None = None,
    ) -> Outcome[T]:
        """``build(client, attempt)`` makes the request body; ``validate(reply)`` parses it or raises ValueError
        (an unusable reply is retried like an error). ``on_delta(text)``, when given, sees every content delta of
        every attempt as it streams (``build`` is called at the start of each attempt, so a caller can tell the
        attempts apart); the planner uses it to start children before the reply is complete."""
        caller_delta = on_delta
        counter = {"n": 0}

        async def attempt() -> tuple[Reply, Any]:
            counter["n"] += 1
            n = counter["n"]
            async with self.fleet.lease(priority) as client:
                now = time.monotonic()
                self.emit(NodeStarted(path, kind, title, client.url, n, now))
                on_delta = caller_delta
                if self.wants_deltas:
                    emit = self.emit

                    def on_delta(text: str, _p=path, _c=caller_delta) -> None:
                        emit(Delta(_p, text, time.monotonic()))
                        if _c is not None:
                            _c(text)

                body = build(client, n)
                self.requests += 1
                reply = await client.chat(body, attempt=n, on_delta=on_delta)
                if (
                    not reply.ok
                    and reply.status == 400
                    and "response_format" in body
                    and client.json_schema_ok is not True
                    and rejects_structured_output(reply.error)
                ):
                    # The server rejects structured output: remember, and ask again in text at once.
                    client.json_schema_ok = False
                    body = build(client, n)
                    self.requests += 1
                    self.replies.append((kind, reply))
                    reply = await client.chat(body, attempt=n, on_delta=on_delta)
                elif reply.ok and "response_format" in body and _is_json(reply.text):
                    # Only a reply that really is JSON proves the server honours the schema (some accept the
                    # field and ignore it).
                    client.json_schema_ok = True
                self.fleet.report(client, reply)
            value = None
            if reply.ok and validate is not None:
                try:
                    value = validate(reply)
                except ValueError as e:
                    reply = _unusable(reply, str(e))
            self.replies.append((kind, reply))
            if not reply.ok:
                self.request_errors += 1
                final = not reply.retryable or n >= self.attempts
                self.emit(NodeFailed(path, kind, title, reply.backend, n, reply.error or "?", final, time.monotonic()))
            return reply, value

        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.attempts),
            wait=self._wait,
            retry=retry_if_result(lambda rv: not rv[0].ok and rv[0].retryable),
            retry_error_callback=lambda state: state.outcome.result(),
            sleep=anyio.sleep,
        )
        reply, value = await retrying(attempt)
        return Outcome(reply, value if reply.ok else None, counter["n"])


_STRUCTURED = re.compile(
    r"response_format|json_schema|json schema|structured output|guided|grammar|xgrammar|outlines|schema",
    re.IGNORECASE,
)
_NOT_ABOUT_FORMAT = re.compile(
    r"context length|context window|maximum context|too long|too many tokens|max_tokens|prompt is too long",
    re.IGNORECASE,
)


def rejects_structured_output(error: str | None) -> bool:
    """Does a 400's message say the server cannot do ``response_format``? A 400 about something else (the
    context length, say) must not switch structured output off for the whole run."""
    msg = error or ""
    # A bare "HTTP 400 Bad Request" may well be the schema: fall back unless the message says it is not.
    return not _NOT_ABOUT_FORMAT.search(msg)


def _is_json(text: str) -> bool:
    try:
        orjson.loads(text.strip())
    except orjson.JSONDecodeError:
        return False
    return True


def _unusable(reply: Reply, why: str) -> Reply:
    from dataclasses import replace

    return replace(reply, error=f"unusable reply: {why}", retryable=True)
