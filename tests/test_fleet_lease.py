"""The scheduler on its own: ``Fleet.lease`` driven directly, with fake clients (no HTTP, no dispatcher).

What orchestrator/fleet.py promises: a backend never has more than its cap of leases; waiting requests are granted
by (priority, arrival), lower first, so planning (0, _) goes before sections (1, _); a freed slot is handed to the
next waiter at once (a newcomer cannot take it); a waiter that is cancelled gets no slot, or gives back the one it
was granted; a free slot goes to the healthy backend with the lowest in flight / cap; a backend that fails
``trip_after`` times in a row leaves the rotation, and when its probe answers again the waiters get it.

Every test is bounded by ``anyio.fail_after``: a lost slot shows up as a waiter that never gets one.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from orchestrator.core.events import BackendState
from orchestrator.core.reply import Reply
from orchestrator.dispatch.fleet import Fleet

pytestmark = pytest.mark.anyio

LIMIT = 2.0  # seconds any one test may take; each needs well under one


class FakeClient:
    """What Fleet uses of a BackendClient: ``url``, ``watchdog()`` (run by ``Fleet.run``), ``probe()`` while out of
    rotation, and ``last_probe_reached_completion``."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.answering = False  # what probe() says
        self.probes = 0
        self.last_probe_reached_completion = False

    async def watchdog(self) -> None:
        await anyio.sleep_forever()

    async def probe(self, on_listening: Callable[[], None] | None = None) -> bool:
        self.probes += 1
        await anyio.lowlevel.checkpoint()
        return self.answering

    def __repr__(self) -> str:
        return f"FakeClient({self.url})"


def make_fleet(caps: list[int], **kw: Any) -> tuple[Fleet, list[FakeClient], list[Any]]:
    clients = [FakeClient(f"http://b{i}:8000/v1") for i in range(len(caps))]
    events: list[Any] = []
    fleet = Fleet(clients, caps, events.append, **kw)  # type: ignore[arg-type]  # duck-typed clients
    return fleet, clients, events


def failure(client: FakeClient, *, health: bool = True) -> Reply:
    return Reply("", None, 0, 0, client.url, 0.0, None, 0.0, error="connection refused", retryable=True,
                 health=health)


def success(client: FakeClient) -> Reply:
    return Reply("ok", "stop", 1, 1, client.url, 0.0, 0.0, 0.0)


class Waiter:
    """One request's lease, run as a task: ``order`` records who entered the block, in order; the block is held
    until ``release`` is set. ``await tg.start(w.run)`` returns once the lease is either held or queued (the
    fleet queues a waiter before its first await), so tests need no sleeps to know the queue's order."""

    def __init__(self, fleet: Fleet, label: str, order: list[str], priority: tuple[int, int] = (1, 0)) -> None:
        self.fleet, self.label, self.order, self.priority = fleet, label, order, priority
        self.scope = anyio.CancelScope()
        self.granted = anyio.Event()
        self.release = anyio.Event()
        self.done = anyio.Event()
        self.client: Any = None

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        try:
            with self.scope:
                task_status.started()
                async with self.fleet.lease(self.priority) as client:
                    self.client = client
                    self.order.append(self.label)
                    self.granted.set()
                    await self.release.wait()
        finally:
            self.done.set()


async def settle(n: int = 5) -> None:
    """Let every ready task run a few steps (a grant that should not happen would happen within these)."""
    for _ in range(n):
        await anyio.lowlevel.checkpoint()


# -- caps and spreading -------------------------------------------------------------------------------------------


async def test_no_backend_ever_holds_more_leases_than_its_cap():
    caps = [2, 3, 1]
    fleet, clients, _ = make_fleet(caps)
    holding = {c.url: 0 for c in clients}
    most = dict(holding)
    served = 0

    async def request(k: int) -> None:
        nonlocal served
        async with fleet.lease((1, k)) as client:
            # counted here, not read from the fleet's own bookkeeping, which a bug could get wrong in step
            holding[client.url] += 1
            most[client.url] = max(most[client.url], holding[client.url])
            await anyio.sleep(0.002 * (1 + k % 3))
            holding[client.url] -= 1
            served += 1

    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            for k in range(40):
                tg.start_soon(request, k)
    assert served == 40
    assert most == {c.url: cap for c, cap in zip(clients, caps)}  # every cap reached, none passed
    assert [x.max_in_flight for x in fleet.loads] == caps
    assert fleet.in_flight == 0 and [x.in_flight for x in fleet.loads] == [0, 0, 0]
    assert sum(x.requests for x in fleet.loads) == 40


@pytest.mark.parametrize("caps", [[4, 2, 1], [8, 2]])  # [8, 2]: at 2/8 against 1/2 the load is not the count
async def test_a_free_slot_goes_to_the_least_loaded_backend(caps: list[int]):
    fleet, clients, _ = make_fleet(caps)
    by_url = {c.url: i for i, c in enumerate(clients)}
    held = [0] * len(caps)
    with anyio.fail_after(LIMIT):
        async with AsyncExitStack() as stack:
            for _ in range(sum(caps)):
                room = [i for i in range(len(caps)) if held[i] < caps[i]]
                least = min(held[i] / caps[i] for i in room)
                client = await stack.enter_async_context(fleet.lease())
                i = by_url[client.url]
                assert held[i] < caps[i], f"{client.url} was full"
                assert held[i] / caps[i] == least, f"{client.url} at {held[i]}/{caps[i]} while another was at {least}"
                held[i] += 1
            assert held == caps


async def test_equal_backends_get_equal_shares_and_a_freed_slot_is_refilled_where_it_was_freed():
    fleet, clients, _ = make_fleet([2, 2, 2])
    with anyio.fail_after(LIMIT):
        async with AsyncExitStack() as stack:
            got = [(await stack.enter_async_context(fleet.lease())).url for _ in range(3)]
            assert sorted(got) == sorted(c.url for c in clients)
            got += [(await stack.enter_async_context(fleet.lease())).url for _ in range(3)]
            assert sorted(got) == sorted(c.url for c in clients for _ in range(2))
        # Least loaded, not merely the next in turn: free a slot on one backend and it is the one the next lease
        # gets, whichever backend's turn a round robin would say it is.
        fleet, clients, _ = make_fleet([4, 4, 4])
        async with AsyncExitStack() as stack:
            leases: dict[str, list[AsyncExitStack]] = {c.url: [] for c in clients}

            async def take() -> str:
                inner = AsyncExitStack()
                url = (await inner.enter_async_context(fleet.lease())).url
                leases[url].append(inner)
                stack.push_async_callback(inner.aclose)
                return url

            for _ in range(6):
                await take()
            assert sorted(len(v) for v in leases.values()) == [2, 2, 2]
            for i in (0, 0, 1, 1, 2, 2, 0, 2, 1, 1, 0):
                url = clients[i].url
                await leases[url].pop().aclose()  # this backend is now the least loaded, alone
                assert await take() == url


async def test_a_slot_freed_on_a_full_fleet_goes_to_the_waiter_on_that_backend():
    fleet, clients, _ = make_fleet([1, 2])
    order: list[str] = []
    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            holders = [Waiter(fleet, f"h{k}", order) for k in range(3)]
            for h in holders:
                await tg.start(h.run)
            assert order == ["h0", "h1", "h2"] and fleet.in_flight == 3  # full
            late = Waiter(fleet, "late", order)
            await tg.start(late.run)
            await settle()
            assert order == ["h0", "h1", "h2"], "a lease was granted on a full fleet"
            freed = next(h for h in holders if h.client is clients[1])
            freed.release.set()
            await late.granted.wait()
            assert late.client is clients[1]
            for w in (*holders, late):
                w.release.set()
    assert fleet.in_flight == 0


# -- the queue ----------------------------------------------------------------------------------------------------


async def test_waiters_are_granted_by_priority_then_by_arrival():
    fleet, _, _ = make_fleet([1])
    order: list[str] = []
    # (label, priority) in arrival order; lower priority first, arrivals in order among equals
    arrivals = [("s5", (1, 5)), ("s0a", (1, 0)), ("p3", (0, 3)), ("s0b", (1, 0)), ("p1a", (0, 1)),
                ("late", (2, 0)), ("p1b", (0, 1)), ("s0c", (1, 0))]
    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            first = Waiter(fleet, "first", order, (5, 0))  # takes the free slot, whatever its priority
            await tg.start(first.run)
            waiters = [Waiter(fleet, label, order, prio) for label, prio in arrivals]
            for w in waiters:
                w.release.set()  # each gives its slot back as soon as it has it
                await tg.start(w.run)
            await settle()
            assert order == ["first"]
            first.release.set()
    expected = [label for (prio, k, label) in sorted((prio, k, label) for k, (label, prio) in enumerate(arrivals))]
    assert expected == ["p1a", "p1b", "p3", "s0a", "s0b", "s0c", "s5", "late"]
    assert order == ["first", *expected]
    assert fleet.in_flight == 0


async def test_a_freed_slot_is_handed_to_the_waiter_before_a_newcomer_can_take_it():
    # The slot is granted when it is freed, not when the waiter next runs: a request made in that gap (here by
    # the releasing task itself, with the best priority there is) queues behind the waiter.
    fleet, _, _ = make_fleet([1])
    order: list[str] = []
    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            waiting = Waiter(fleet, "waiting", order, (1, 9))
            waiting.release.set()  # it gives the slot back as soon as it has run its block
            async with fleet.lease((1, 0)):
                await tg.start(waiting.run)
            # no await since the release: the waiter has not run yet
            assert fleet.in_flight == 1 and not waiting.granted.is_set()
            async with fleet.lease((0, 0)):
                order.append("newcomer")
                assert waiting.done.is_set()
    assert order == ["waiting", "newcomer"]
    assert fleet.in_flight == 0


@pytest.mark.parametrize("when", ["cancelled, then granted", "granted, then cancelled"])
async def test_a_waiter_cancelled_around_its_grant_gives_the_slot_back(when: str):
    # "cancelled, then granted": the cancellation reaches the waiter, and before it runs (it is still in the
    # queue) the slot is freed and granted to it; it must hand the slot on (lease()'s except branch).
    # "granted, then cancelled": anyio lets a task whose wait already ended run on to its next checkpoint, so the
    # waiter enters its block and is cancelled there; the slot comes back as the block ends.
    fleet, _, _ = make_fleet([1])
    order: list[str] = []
    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            doomed = Waiter(fleet, "doomed", order, (0, 0))
            next_ = Waiter(fleet, "next", order, (1, 0))
            async with fleet.lease():
                await tg.start(doomed.run)
                await tg.start(next_.run)
                if when == "cancelled, then granted":
                    doomed.scope.cancel()
            # the slot was freed just now and granted at once, to the best waiter: the doomed one
            assert fleet.in_flight == 1 and not next_.granted.is_set()
            if when == "granted, then cancelled":
                doomed.scope.cancel()
            await doomed.done.wait()
            assert doomed.scope.cancelled_caught
            await next_.granted.wait()  # never set if the doomed waiter kept the slot
            assert fleet.in_flight == 1
            next_.release.set()
    if when == "cancelled, then granted":
        assert order == ["next"], "the cancelled waiter ran its block"
    else:
        assert order in (["next"], ["doomed", "next"])
    assert fleet.in_flight == 0 and fleet.loads[0].in_flight == 0
    async with fleet.lease():  # and the fleet still grants at once
        assert fleet.in_flight == 1


async def test_waiters_cancelled_while_waiting_get_no_slot():
    fleet, _, _ = make_fleet([1])
    order: list[str] = []
    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            holder = Waiter(fleet, "holder", order)
            await tg.start(holder.run)
            gone = [Waiter(fleet, f"gone{k}", order, (0, k)) for k in range(3)]  # ahead of `last` in the queue
            for w in gone:
                await tg.start(w.run)
            last = Waiter(fleet, "last", order, (1, 0))
            await tg.start(last.run)
            for w in gone:
                w.scope.cancel()
                await w.done.wait()  # abandoned: out of lease(), though still in the queue
            assert fleet.in_flight == 1
            holder.release.set()
            await last.granted.wait()  # never set if an abandoned waiter was granted the slot
            assert fleet.in_flight == 1
            last.release.set()
    assert order == ["holder", "last"]
    assert fleet.in_flight == 0
    assert fleet.loads[0].requests == 2, "a slot was taken for an abandoned waiter"
    assert fleet._waiters == []


async def test_a_stopped_fleet_grants_nothing_and_a_cancelled_wait_holds_nothing():
    fleet, _, _ = make_fleet([2])
    order: list[str] = []
    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            running = Waiter(fleet, "running", order)
            await tg.start(running.run)
            fleet.stop()
            after = Waiter(fleet, "after", order)
            await tg.start(after.run)
            running.release.set()  # the lease in flight runs out
            await running.done.wait()
            await settle()
            assert order == ["running"] and fleet.in_flight == 0
            after.scope.cancel()
    assert order == ["running"] and fleet.in_flight == 0 and fleet.loads[0].requests == 1


# -- health: out of rotation and back -----------------------------------------------------------------------------


async def test_only_consecutive_health_failures_trip_a_backend():
    fleet, clients, events = make_fleet([1, 1], trip_after=3)
    a = clients[0]
    for reply in (failure(a), failure(a), success(a), failure(a), failure(a), failure(a, health=False)):
        fleet.report(a, reply)  # type: ignore[arg-type]
    assert fleet.loads[0].healthy and events == []
    assert fleet.loads[0].errors == 5
    fleet.report(a, failure(a))  # type: ignore[arg-type]
    assert not fleet.loads[0].healthy and fleet.loads[0].trips == 1
    assert [(e.url, e.healthy) for e in events] == [(a.url, False)]
    assert isinstance(events[0], BackendState) and events[0].reason == "connection refused"
    assert fleet.loads[1].healthy


async def test_a_backend_out_of_rotation_gets_no_lease_and_its_return_serves_the_waiters():
    fleet, clients, events = make_fleet([2, 1], trip_after=2, probe_interval=0.005)
    a, b = clients
    order: list[str] = []
    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as outer:
            await outer.start(fleet.run)  # the probes run in its task group
            async with anyio.create_task_group() as tg:
                on_a = Waiter(fleet, "on_a", order)
                await tg.start(on_a.run)
                on_b = Waiter(fleet, "on_b", order)
                await tg.start(on_b.run)
                assert {on_a.client, on_b.client} == {a, b}
                holder_a = on_a if on_a.client is a else on_b
                holder_b = on_b if holder_a is on_a else on_a
                # a fails twice in a row: it leaves the rotation, with one slot free and one lease in flight
                for _ in range(2):
                    fleet.report(a, failure(a))  # type: ignore[arg-type]
                assert not fleet.loads[0].healthy
                waiting = [Waiter(fleet, f"w{k}", order, (1, k)) for k in range(3)]
                for w in waiting:
                    await tg.start(w.run)
                await settle()
                assert not any(w.granted.is_set() for w in waiting), "a lease went to a backend out of rotation"
                # a's lease in flight ends: its slot is not handed out while a is out of rotation
                holder_a.release.set()
                await holder_a.done.wait()
                await settle()
                assert fleet.loads[0].in_flight == 0 and not any(w.granted.is_set() for w in waiting)
                # b's ends: the first waiter gets b
                holder_b.release.set()
                await waiting[0].granted.wait()
                assert waiting[0].client is b
                # a is probed meanwhile, and stays out while its probe fails
                while a.probes < 3:  # noqa: ASYNC110 - the probe loop has no event to wait on
                    await anyio.sleep(0.005)
                assert not any(w.granted.is_set() for w in waiting[1:])
                # a answers again: it rejoins, and both waiters left get it
                a.answering = True
                await waiting[1].granted.wait()
                await waiting[2].granted.wait()
                assert waiting[1].client is a and waiting[2].client is a
                assert fleet.loads[0].healthy and fleet.loads[0].in_flight == 2
                assert [(e.url, e.healthy) for e in events] == [(a.url, False), (a.url, True)]
                for w in waiting:
                    w.release.set()
            outer.cancel_scope.cancel()
    assert order[2:] == ["w0", "w1", "w2"]
    assert fleet.in_flight == 0


async def test_when_every_backend_is_out_the_waiters_wait_for_the_first_back():
    fleet, clients, events = make_fleet([1, 1], trip_after=1, probe_interval=0.005)
    order: list[str] = []
    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as outer:
            await outer.start(fleet.run)
            for c in clients:
                fleet.report(c, failure(c))  # type: ignore[arg-type]
            assert not any(x.healthy for x in fleet.loads)
            async with anyio.create_task_group() as tg:
                waiting = [Waiter(fleet, f"w{k}", order, (1, k)) for k in range(3)]
                for w in waiting:
                    await tg.start(w.run)
                while clients[1].probes < 2:  # noqa: ASYNC110 - the probe loop has no event to wait on
                    await anyio.sleep(0.005)
                assert order == [] and fleet.in_flight == 0
                clients[1].answering = True  # one comes back, cap 1: the waiters take turns on it
                for w in waiting:
                    await w.granted.wait()
                    assert w.client is clients[1] and fleet.in_flight == 1
                    w.release.set()
                    await w.done.wait()
            outer.cancel_scope.cancel()
    assert order == ["w0", "w1", "w2"]
    assert not fleet.loads[0].healthy and fleet.loads[1].healthy
    a, b = (c.url for c in clients)
    assert [(e.url, e.healthy) for e in events] == [(a, False), (b, False), (b, True)]
    assert fleet.in_flight == 0
