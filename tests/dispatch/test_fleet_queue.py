"""``Fleet.lease`` driven directly, with fake clients: waiting requests are granted by (priority, arrival), lower
first, so planning (0, _) goes before sections (1, _); a freed slot is handed to the next waiter at once (a
newcomer cannot take it); a waiter that is cancelled gets no slot, or gives back the one it was granted; a
stopped fleet grants nothing.

Every test is bounded by ``anyio.fail_after``: a lost slot shows up as a waiter that never gets one.
"""

from __future__ import annotations

import anyio
import pytest
from fake_fleet import LIMIT, Waiter, make_fleet, settle

pytestmark = pytest.mark.anyio

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
