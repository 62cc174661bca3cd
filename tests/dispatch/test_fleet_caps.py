"""``Fleet.lease`` driven directly, with fake clients: a backend never has more than its cap of leases, and a free
slot goes to the healthy backend with the lowest in flight / cap (a freed one is refilled where it was freed).

Every test is bounded by ``anyio.fail_after``: a lost slot shows up as a waiter that never gets one.
"""

from __future__ import annotations

from contextlib import AsyncExitStack

import anyio
import pytest
from fake_fleet import LIMIT, Waiter, make_fleet, settle

pytestmark = pytest.mark.anyio


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
