"""Running a node to completion over the fleet: retries, failover, and resuming from the journal.

Each attempt takes a lease on some backend (fleet.py) and gives it back when it ends. Retries are tenacity's
(exponential backoff with jitter, Retry-After honoured, sleeping with anyio.sleep); each retry takes a new lease,
so it may land on another backend. With a journal, the Dispatcher is also the one resume path: a node an earlier
run finished is answered from the journal, and a node this run finishes is written to it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Generic, TypeVar, overload

import anyio
from tenacity import AsyncRetrying, RetryCallState, retry_if_result, stop_after_attempt, wait_exponential_jitter

from ..core.events import Delta, NodeFailed, NodeStarted
from ..core.outline import level_of
from ..core.reply import STOPPED, Reply
from ..core.states import NodeKind
from ..wire.client import BackendClient
from .fleet import Fleet
from .journal import Journal, StoredNode

T = TypeVar("T")
REASK = "reask"  # Dispatcher.replies' label of a request for a node already journaled (see Dispatcher.replies)


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """The end of a node: its last reply, the value parsed from it (None on failure) and attempts used (0: the
    journal answered it)."""

    reply: Reply
    value: T | None
    attempts: int


@dataclass
class _Node(Generic[T]):
    """One node on its way through the Dispatcher: what every attempt needs, and how many were made so far."""

    path: str
    kind: NodeKind
    title: str
    build: Callable[[BackendClient, int], dict[str, Any]]
    validate: Callable[[Reply], T] | None
    priority: tuple[int, int]
    on_delta: Callable[[str], None] | None
    affinity: Hashable | None = None
    attempts: int = 0
    label: str = ""  # what its replies are recorded as in ``Dispatcher.replies``: its kind, or REASK
    failed_on: BackendClient | None = None  # the backend its last attempt failed on: the retry avoids it
    watch: Callable[[], Callable[[str], str | None] | None] | None = None  # each attempt's stop_when (run's watch)


class Dispatcher:
    """Runs one node to completion: lease, send, validate, retry.

    With a ``journal``, a node an earlier run finished is answered from it without a request, and a node this run
    finishes is written to it (see :meth:`run`). ``resumed`` counts the nodes answered from the journal, by kind;
    ``resumed_levels`` by planning level (0 book, 1 part, 2 chapter, 3 section)."""

    def __init__(self, fleet: Fleet, emit: Callable[[Any], None], attempts: int, wants_deltas: bool, *,
                 journal: Journal | None = None, rank: int = 0):
        self.fleet = fleet
        # A library's books share one fleet: the book's place in it sits between a request's kind and its order, so
        # that every book's planning goes first, then the oldest book's sections (Fleet.lease orders by priority).
        self.rank = rank
        self.emit = emit
        self.attempts = attempts
        self.wants_deltas = wants_deltas
        self.journal = journal
        self.requests = 0
        # (kind, reply) of every attempt, for usage and errors; a request for a node already journaled (a repair's
        # re-ask, a continuation: journaled=False) is recorded as REASK, not as another of its kind
        self.replies: list[tuple[str, Reply]] = []
        self.resumed: dict[str, int] = {}
        self.resumed_levels = [0, 0, 0, 0]

    # Exponential backoff with jitter: 0.5, 1, 2, 4 ... s (at most 10 s) plus up to 0.5 s at random.
    try:
        _backoff = wait_exponential_jitter(multiplier=0.5, max=10.0, jitter=0.5)
    except TypeError:  # tenacity < 9.1: ``initial`` was the name
        _backoff = wait_exponential_jitter(initial=0.5, max=10.0, jitter=0.5)

    @classmethod
    def _wait(cls, state: RetryCallState) -> float:
        reply = state.outcome.result()[0] if state.outcome and not state.outcome.failed else None
        if reply is not None and reply.finish_reason == STOPPED:
            return 0.0  # we ended that answer ourselves (a loop caught as it streamed): its server is fine
        base = cls._backoff(state)
        if reply is not None and reply.retry_after:
            return max(base, min(reply.retry_after, 60.0))
        return base

    @overload
    async def run(
        self, path: str, kind: NodeKind, title: str, build: Callable[[BackendClient, int], dict[str, Any]],
        validate: None = None, priority: tuple[int, int] = (1, 0), *, on_delta: Callable[[str], None] | None = None,
        restore: None = None, keep: None = None, journaled: bool = True, affinity: Hashable | None = None,
        watch: Callable[[], Callable[[str], str | None] | None] | None = None,
    ) -> Outcome[None]: ...

    @overload
    async def run(
        self, path: str, kind: NodeKind, title: str, build: Callable[[BackendClient, int], dict[str, Any]],
        validate: Callable[[Reply], T], priority: tuple[int, int] = (1, 0), *,
        on_delta: Callable[[str], None] | None = None, restore: Callable[[StoredNode], T | None] | None = None,
        keep: Callable[[T], Any] | None = None, journaled: bool = True, context: Any = None,
        affinity: Hashable | None = None, watch: Callable[[], Callable[[str], str | None] | None] | None = None,
    ) -> Outcome[T]: ...

    async def run(
        self,
        path: str,
        kind: NodeKind,
        title: str,
        build: Callable[[BackendClient, int], dict[str, Any]],
        validate: Callable[[Reply], T] | None = None,
        priority: tuple[int, int] = (1, 0),
        *,
        on_delta: Callable[[str], None] | None = None,
        restore: Callable[[StoredNode], T | None] | None = None,
        keep: Callable[[T], Any] | None = None,
        journaled: bool = True,
        context: Any = None,
        affinity: Hashable | None = None,
        watch: Callable[[], Callable[[str], str | None] | None] | None = None,
    ) -> Outcome[T] | Outcome[None]:
        """``build(client, attempt)`` makes the request body; ``validate(reply)`` parses it or raises ValueError
        (an unusable reply is retried like an error). ``on_delta(text)``, when given, sees every content delta of
        every attempt as it streams (``build`` is called at the start of each attempt, so a caller can tell the
        attempts apart); the planner uses it to start children before the reply is complete.

        A node the journal holds answers only the node it was written for: same path, kind *and* title
        (``Journal.get``). ``restore(stored)`` turns it into the caller's value (planning nodes: the accepted
        titles), or returns None to ask again; without it the stored reply goes through ``validate`` like a fresh
        one. ``keep(value)`` gives the JSON-able value to journal with a node this run finishes. ``journaled=False``
        neither asks nor writes the journal (a continuation of a node that is already in it). ``context`` (sections:
        ``SectionRef.context``, which ``keep`` journals as the value's "context") lets a stored node answer wherever
        an edited outline moved it (``Journal.get``); it is then recorded at ``path`` too. ``affinity`` (sections with
        context: their chapter) is the fleet's prefix-cache affinity key, made this book's by its rank. ``watch()``,
        called as each attempt starts, gives that attempt's ``stop_when`` (``BackendClient.chat``), or None: what
        reads a streamed answer as it arrives and may end it early (a section's repetition loop)."""
        journal = self.journal if journaled else None
        stored = journal.get(path, kind, title, context) if journal is not None else None
        if stored is not None:
            resumed = self._resume(stored, validate, restore)
            if resumed is not None:
                if journal is not None and stored.path != path:
                    journal.move(stored, path)
                return resumed
        if self.wants_deltas:
            on_delta = partial(self._delta, path, on_delta)
        node = _Node(path, kind, title, build, validate, priority, on_delta,
                     None if affinity is None else (self.rank, affinity),
                     label=kind if journaled else REASK, watch=watch)
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.attempts),
            wait=self._wait,
            retry=retry_if_result(lambda rv: not rv[0].ok and rv[0].retryable),
            retry_error_callback=_last_result,
            sleep=anyio.sleep,
        )
        result: tuple[Reply, T | None] = await retrying(self._attempt, node)
        reply, value = result
        out = Outcome(reply, value if reply.ok else None, node.attempts)
        if reply.ok and journal is not None:
            kept = keep(out.value) if keep is not None and out.value is not None else None
            journal.record(path, kind, title, reply, out.attempts, kept)
        return out

    def _resume(self, stored: StoredNode, validate: Callable[[Reply], T] | None,
                restore: Callable[[StoredNode], T | None] | None) -> Outcome[T] | None:
        """A journaled node as this run's outcome, or None when the journal holds something that cannot be used
        any more (then it is asked again)."""
        value: T | None = None
        try:
            if restore is not None:
                value = restore(stored)
                if value is None:
                    return None
            elif validate is not None:
                value = validate(stored.reply())
        except ValueError:
            return None
        kind = stored.kind.value  # plain str keys: orjson writes no enum keys
        self.resumed[kind] = self.resumed.get(kind, 0) + 1
        self.resumed_levels[level_of(stored.path)] += 1
        return Outcome(stored.reply(), value, 0)

    def _delta(self, path: str, then: Callable[[str], None] | None, text: str) -> None:
        self.emit(Delta(path, text, time.monotonic()))
        if then is not None:
            then(text)

    def _body(self, node: _Node[T], client: BackendClient, attempt: int) -> dict[str, Any]:
        body = node.build(client, attempt)
        self.requests += 1  # the client sends every body it is given: one more request
        return body

    async def _attempt(self, node: _Node[T]) -> tuple[Reply, T | None]:
        node.attempts += 1
        n = node.attempts
        kind, *order = node.priority
        async with self.fleet.lease((kind, self.rank, *order), affinity=node.affinity, avoid=node.failed_on) as client:
            self.emit(NodeStarted(node.path, node.kind, node.title, client.url, n, time.monotonic()))
            # more than one reply when a structured request was refused and sent again in text (client.send)
            *refused, reply = await client.send(partial(self._body, node, client, n), attempt=n,
                                                on_delta=node.on_delta,
                                                stop_when=node.watch() if node.watch is not None else None)
            self.replies.extend((node.label, r) for r in refused)
            self.fleet.report(client, reply)
        node.failed_on = None if reply.ok else client
        value = None
        if reply.ok and node.validate is not None:
            try:
                value = node.validate(reply)
            except ValueError as e:
                reply = replace(reply, error=f"unusable reply: {e}", retryable=True, unusable=True)
        self.replies.append((node.label, reply))
        if not reply.ok:
            final = not reply.retryable or n >= self.attempts
            self.emit(NodeFailed(node.path, node.kind, node.title, reply.backend, n, reply.error or "?", final,
                                 time.monotonic(), unusable=reply.unusable))
        return reply, value


def _last_result(state: RetryCallState) -> Any:
    """Every attempt failed: the last one's (reply, value) is the node's end, not an exception."""
    assert state.outcome is not None
    return state.outcome.result()
