"""The fleet: per-backend caps, one shared queue of leases, and each backend's health.

Every request (planning and sections alike) takes a *lease* on a backend before it is sent and gives it back when
its attempt ends, so a backend's cap bounds everything in flight on it. Leases are granted from one shared queue,
ordered by (priority, arrival): planning requests go before sections so the outline is never starved. A free
slot goes to the healthy backend with the lowest load (in flight / cap), which gives equal servers equal shares
and a slower server fewer (it holds its leases longer) — the behaviour of pull workers over one queue, without a
worker task per slot. A backend that fails ``trip_after`` times in a row leaves the rotation, is probed, and
comes back when it answers again.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Hashable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio

from ..core.errors import BackendError
from ..core.events import BackendState
from ..core.reply import Reply
from ..wire.client import BackendClient
from .affinity import Queues, Waiter
from .pick import pick_backend


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
        self._queues = Queues(caps)
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

    def _pick(self, avoid: BackendClient | None = None) -> int | None:
        """The least-loaded healthy backend with room (other than ``avoid``), None when there is none."""
        loads = self.loads
        start = next(self._rr) % len(loads)
        healthy = [x.healthy and x.client is not avoid for x in loads]
        return pick_backend([x.in_flight for x in loads], [x.cap for x in loads], healthy, start)

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

    @property
    def _waiters(self) -> list[Waiter]:
        """Every waiter still queued (abandoned ones until a grant passes them)."""
        return list(self._queues)

    def _grant(self) -> None:
        if self.stopped:
            return
        queues = self._queues
        while len(queues):
            i = self._pick()
            if i is None:
                return
            w = queues.pop_for(i)
            if w is None:
                return
            self._take(i)
            queues.granted(w, i)
            w.granted = i
            w.event.set()

    def _home(self, key: Hashable) -> int | None:
        loads = self.loads
        return self._queues.home_of(key, [x.in_flight for x in loads], [x.healthy for x in loads])

    def _now(self, key: Hashable | None, avoid: BackendClient | None = None) -> int | None:
        """The backend a lease asked for while nothing waits gets at once: the key's home when it has room, else
        the least-loaded backend with room (a free slot elsewhere is never left idle for affinity's sake). A retry
        (``avoid``: the backend its last attempt failed on) skips the home and takes the least-loaded other backend
        with room, else the failed one if that has room; it still counts as its key's request."""
        if key is not None and avoid is None:
            home = self._home(key)
            if home is not None and self.loads[home].in_flight < self.loads[home].cap:
                self._queues.served[home] += 1
                return home
        i = self._pick(avoid) if avoid is not None else None
        if i is None:
            i = self._pick()
        if i is not None and key is not None:
            self._queues.served[i] += 1
        return i

    @asynccontextmanager
    async def lease(self, priority: tuple[int, ...] = (1, 0), affinity: Hashable | None = None,
                    avoid: BackendClient | None = None):
        """Hold one slot on some healthy backend for the duration of the block. ``affinity``: a key (a chapter)
        whose requests prefer the backend that served the key first (dispatch/affinity.py). ``avoid``: the backend
        a retry's last attempt failed on. The retry goes to another healthy backend with room when there is one,
        even away from its key's home: on a real fleet a card's failures are not independent (a card in trouble
        fails the next request too), and the job's last sections retried on one card would stake every attempt on
        it while another stands idle. Else it takes the failed card if that has room, and when it must wait it
        waits in the shared queue, not its home's, where any backend's freed slot may take it. Either way it still
        counts as its key's request in the homes' shares."""
        i = None if len(self._queues) or self.stopped else self._now(affinity, avoid)
        if i is not None:
            self._take(i)
        else:
            w = Waiter(priority, next(self._seq), anyio.Event(), affinity)
            home = None if affinity is None or avoid is not None else self._home(affinity)
            self._queues.push(w, home)
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
