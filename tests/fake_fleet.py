"""The scheduler on its own: ``Fleet`` with fake clients (no HTTP, no dispatcher), the replies reported to it, and
``Waiter``, one request's lease run as a task. Every test using them is bounded by ``anyio.fail_after(LIMIT)``: a
lost slot shows up as a waiter that never gets one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel

from orchestrator.core.reply import Reply
from orchestrator.dispatch.fleet import Fleet

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
