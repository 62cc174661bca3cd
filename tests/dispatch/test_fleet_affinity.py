"""Prefix-cache affinity (dispatch/affinity.py) through ``Fleet.lease``: a key's requests go to its home backend,
caps are never passed, a free slot never idles while something waits, shares stay within 10%, and keyless
requests (planning) keep their priority."""

from __future__ import annotations

import random
from collections import Counter, defaultdict

import anyio
import pytest
from fake_fleet import LIMIT, make_fleet

pytestmark = pytest.mark.anyio


async def _book(fleet, chapters: int, sections: int, seed: int, *, keyed: bool = True):
    """Every section of every chapter at once, each holding its lease for a random short while; returns the
    backend each (chapter, section) was served by and the most in flight seen on each backend."""
    rnd = random.Random(seed)
    served: dict[tuple[int, int], str] = {}
    peak: Counter[str] = Counter()
    urls = [x.client.url for x in fleet.loads]

    async def section(c: int, s: int, hold: float) -> None:
        async with fleet.lease((1, c * sections + s), affinity=("book", c) if keyed else None) as client:
            served[(c, s)] = client.url
            for load in fleet.loads:
                assert load.in_flight <= load.cap, "a cap was passed"
                peak[load.client.url] = max(peak[load.client.url], load.in_flight)
            await anyio.sleep(hold)

    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            for c in range(chapters):
                for s in range(sections):
                    tg.start_soon(section, c, s, rnd.uniform(0.001, 0.01))
    assert set(served.values()) <= set(urls)
    return served, peak


def _homes(served: dict[tuple[int, int], str]) -> dict[int, Counter[str]]:
    by_chapter: dict[int, Counter[str]] = defaultdict(Counter)
    for (c, _s), url in served.items():
        by_chapter[c][url] += 1
    return by_chapter


async def test_a_chapters_sections_mostly_go_to_one_backend_within_caps_and_shares():
    fleet, _, _ = make_fleet([8, 8, 8, 8])
    served, peak = await _book(fleet, chapters=24, sections=16, seed=1)
    assert len(served) == 24 * 16
    on_home = sum(c.most_common(1)[0][1] for c in _homes(served).values())
    assert on_home / len(served) > 0.6, "affinity kept too few sections on their chapter's backend"
    share = Counter(served.values())
    fair = len(served) / 4
    assert max(share.values()) <= 1.1 * fair + 8, share  # SHARE_SLACK and SHARE_GRACE
    assert all(p == 8 for p in peak.values()), "a backend's free slot idled while sections waited"
    assert fleet.in_flight == 0 and fleet._waiters == []


async def test_without_a_key_sections_spread_as_before():
    fleet, _, _ = make_fleet([8, 8, 8, 8])
    served, _ = await _book(fleet, chapters=24, sections=16, seed=2, keyed=False)
    on_home = sum(c.most_common(1)[0][1] for c in _homes(served).values())
    assert on_home / len(served) < 0.6  # the control: affinity is what keeps chapters together


async def test_planning_without_a_key_goes_before_homed_sections():
    fleet, _, _ = make_fleet([1, 1])
    order: list[str] = []

    async def one(label: str, prio: tuple[int, int], key, ready: anyio.Event | None = None) -> None:
        async with fleet.lease(prio, affinity=key):
            order.append(label)
            if ready is not None:
                await ready.wait()

    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            hold = anyio.Event()
            tg.start_soon(one, "a", (1, 0), ("b", 1), hold)
            tg.start_soon(one, "b", (1, 1), ("b", 2), hold)
            await anyio.sleep(0.01)
            tg.start_soon(one, "section", (1, 2), ("b", 1))
            tg.start_soon(one, "plan", (0, 0), None)
            await anyio.sleep(0.01)
            hold.set()
    assert order[:2] == ["a", "b"] and order[2] == "plan", order


async def test_an_unhealthy_home_is_replaced():
    fleet, _, _ = make_fleet([4, 4])
    async with fleet.lease((1, 0), affinity="k") as first:
        pass
    home = next(i for i, x in enumerate(fleet.loads) if x.client is first)
    fleet.loads[home].healthy = False
    async with fleet.lease((1, 1), affinity="k") as second:
        assert second is not first


async def test_a_retry_goes_to_another_backend_with_room_even_away_from_its_home():
    fleet, _, _ = make_fleet([2, 2, 2])
    async with fleet.lease((1, 0), affinity="k") as first:
        pass
    async with fleet.lease((1, 0), affinity="k") as again:
        assert again is first  # the control: without ``avoid`` the key's home serves it
    for _ in range(6):
        async with fleet.lease((1, 0), affinity="k", avoid=first) as retry:
            assert retry is not first
    assert sum(fleet._queues.served) == 8  # a retry sent away from home is still one of its key's requests


async def test_a_retry_takes_the_failed_backend_when_it_alone_has_room_or_is_alone_healthy():
    fleet, clients, _ = make_fleet([1, 1])
    a, b = clients
    async with fleet.lease((1, 0), avoid=a) as got:
        assert got is b
        async with fleet.lease((1, 1), avoid=a) as only:  # b is full: a free slot is never left idle
            assert only is a
    fleet.loads[1].healthy = False
    async with fleet.lease((1, 2), avoid=a) as got:
        assert got is a
    assert fleet.in_flight == 0


async def test_a_waiting_retry_takes_the_first_slot_freed_elsewhere_before_later_work_homed_there():
    fleet, clients, _ = make_fleet([1, 1])
    a, b = clients
    got: dict[str, object] = {}
    free_a, free_b, done = anyio.Event(), anyio.Event(), anyio.Event()

    async def hold(label: str, prio: tuple[int, int], key: str, free: anyio.Event, avoid=None) -> None:
        async with fleet.lease(prio, affinity=key, avoid=avoid) as c:
            got[label] = c
            await free.wait()

    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(hold, "kA", (1, 0), "kA", free_a)  # homes kA on a, kB on b, and fills both
            await anyio.sleep(0.01)
            tg.start_soon(hold, "kB", (1, 0), "kB", free_b)
            await anyio.sleep(0.01)
            assert (got["kA"], got["kB"]) == (a, b)
            tg.start_soon(hold, "retry", (1, 1), "kA", done, a)  # its last attempt failed on a, its key's home
            tg.start_soon(hold, "later", (1, 9), "kB", done)
            await anyio.sleep(0.01)
            free_b.set()  # b's one slot: the retry, the older request, takes it rather than waiting for a
            await anyio.sleep(0.01)
            assert got.get("retry") is b and "later" not in got, got
            free_a.set()
            await anyio.sleep(0.01)
            assert got["later"] is a  # a's freed slot: nothing homed there waits, so b's waiter takes it
            done.set()
    assert fleet.in_flight == 0 and sum(fleet._queues.served) == 4
