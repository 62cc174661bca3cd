"""A library caller that cancels a job (``anyio.move_on_after`` around ``agenerate``) gets its process back whole:
no session, pooled connection or socket of the job is left open, even when the cancel lands while the clients
close."""

from __future__ import annotations

import gc
import os

import anyio
import anyio.lowlevel
import pytest

from orchestrator import Settings, agenerate
from orchestrator.wire.client import BackendClient

pytestmark = pytest.mark.anyio


def open_sockets() -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:  # closed meanwhile (the listing's own descriptor)
            pass
    return n


@pytest.fixture(scope="module")
def cards(sim_fleet):
    return sim_fleet(3)


SETTINGS = Settings(parts=2, chapters=2, sections=4, words=60, max_tokens=120, formats=("md",))


async def settle() -> int:
    await anyio.sleep(0.2)  # aborted transports close on the loop's next turns
    gc.collect()
    return open_sockets()


@pytest.mark.parametrize("after_s", [0.2, 0.8, 2.0])
async def test_a_job_cancelled_midway_leaves_no_socket_open(cards, tmp_path, after_s):
    base = await settle()
    with anyio.move_on_after(after_s) as scope:
        await agenerate("A handbook of tide pools", cards.urls, SETTINGS, tmp_path / "o")
    assert scope.cancelled_caught, "the job finished before the cancel: make it longer"
    assert await settle() == base


async def test_a_cancel_while_the_clients_close_leaves_no_socket_open(cards, tmp_path, monkeypatch):
    """The cancel lands as the first client closes: every other client must still close its session and pool."""
    real_exit = BackendClient.__aexit__
    closed: list[str] = []
    outer = anyio.CancelScope()

    async def exit_as_cancelled(self, *exc):
        if not closed:
            outer.cancel()  # the caller gives up now, while the clients close ...
            await anyio.lowlevel.checkpoint()  # ... and this is where an unshielded teardown would stop
        closed.append(self.url)
        await real_exit(self, *exc)

    monkeypatch.setattr(BackendClient, "__aexit__", exit_as_cancelled)
    base = await settle()
    with outer:
        await agenerate("A handbook of tide pools", cards.urls, SETTINGS, tmp_path / "o")
    assert sorted(closed) == sorted(cards.urls)  # every client was closed
    assert await settle() == base
