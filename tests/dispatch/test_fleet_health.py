"""``Fleet.lease`` and ``Fleet.report`` driven directly, with fake clients: a backend that fails ``trip_after``
times in a row leaves the rotation and gets no lease, and when its probe answers again the waiters get it (when
every backend is out, they wait for the first one back).

Every test is bounded by ``anyio.fail_after``: a lost slot shows up as a waiter that never gets one.
"""

from __future__ import annotations

import anyio
import pytest
from fake_fleet import LIMIT, Waiter, failure, make_fleet, settle, success

from orchestrator.core.events import BackendState

pytestmark = pytest.mark.anyio

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
