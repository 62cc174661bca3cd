"""Fixtures the test modules share: simulated cards that stay up for a module, and the anyio backend."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from orchestrator.sim.launch import SimFleet


@pytest.fixture(scope="module")
def sim_fleet() -> Iterator[Callable[..., SimFleet]]:
    """``sim_fleet(cards, **flags)`` starts a :class:`SimFleet` (flags as ``handbook sim`` takes them) and returns
    it running; every fleet it started stops when the module's tests are done.

    A module's own fleet fixture asks for it, so that one start-up serves all the module's tests. A test that
    needs cards for itself alone (faults, outages, a fleet it stops) still uses ``with SimFleet(...)``, since the
    fleet's lifetime is part of what such a test checks.
    """
    with ExitStack() as stack:

        def start(cards: int, **flags: Any) -> SimFleet:
            return stack.enter_context(SimFleet(cards, **flags))

        yield start


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # aiohttp and playwright are asyncio libraries, and trio is not a dependency
