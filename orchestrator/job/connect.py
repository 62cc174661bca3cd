"""Reaching the backends: those given, or the embedded local engine for the length of the job (``backends_up``);
each one's model, asked of it (``discover_all``); one entered client per usable backend (``open_clients``)."""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager

import anyio

from ..core.config import Backend, Settings, unique_backends
from ..core.errors import BackendError, ConfigError, HandbookError
from ..wire.client import BackendClient, discover

__all__ = ["DISCOVER_TIMEOUT_S", "backends_up", "discover_all", "open_clients"]

log = logging.getLogger("handbook")

DISCOVER_TIMEOUT_S = 7.0  # an unreachable backend is reported within 10 s


def _engine_progress(message: str) -> None:
    # The engine takes about a minute to start on 2 cores: say what it is doing rather than stay silent.
    print(f"handbook: local engine: {message}", file=sys.stderr, flush=True)


@asynccontextmanager
async def backends_up(backends: Sequence[Backend | str] | None, settings: Settings) -> AsyncIterator[list[Backend]]:
    """The backends asked for, or the embedded local engine (started here, stopped on leaving) when none is."""
    if backends:
        yield unique_backends([b if isinstance(b, Backend) else Backend(b, cap=settings.cap) for b in backends])
        return
    from ..engine import LocalEngine  # the embedded default: a real model on the CPU

    async with LocalEngine(on_progress=_engine_progress) as engine:
        assert engine.url is not None  # set on entering
        yield [Backend(engine.url, cap=settings.cap)]


async def discover_all(backends: list[Backend], settings: Settings) -> list[tuple[Backend, str]]:
    found: list[tuple[Backend, str] | HandbookError] = [None] * len(backends)  # type: ignore[list-item]
    timeout = min(settings.connect_timeout_s, DISCOVER_TIMEOUT_S)

    async def one(i: int, b: Backend) -> None:
        try:
            found[i] = (b, await discover(b, settings.api_key, settings.model, timeout_s=timeout))
        except HandbookError as e:
            found[i] = e

    async with anyio.create_task_group() as tg:
        for i, b in enumerate(backends):
            tg.start_soon(one, i, b)
    errors = [e for e in found if isinstance(e, HandbookError)]
    config_errors = [e for e in errors if isinstance(e, ConfigError)]
    if config_errors:
        raise config_errors[0]
    ok = [x for x in found if not isinstance(x, HandbookError)]
    if not ok:
        if len(errors) == 1:
            raise errors[0]
        raise BackendError("no backend reachable: " + "; ".join(str(e) for e in errors))
    for e in errors:
        log.warning("leaving out a backend: %s", e)
    return ok


@asynccontextmanager
async def open_clients(usable: list[tuple[Backend, str]], settings: Settings) -> AsyncIterator[list[BackendClient]]:
    """One entered BackendClient per backend. They are closed under a shielded scope, each whatever happened to
    the others: a caller that cancels the job (``anyio.move_on_after`` around ``agenerate``) while they close
    still gets every session and pooled connection closed, none left open in its process."""
    clients = [
        BackendClient(
            b, model, api_key=settings.api_key, connect_timeout=settings.connect_timeout_s,
            first_token_timeout=settings.first_token_timeout_s, chunk_timeout=settings.chunk_timeout_s,
            request_timeout=settings.request_timeout_s,
        )
        for b, model in usable
    ]
    stack = AsyncExitStack()
    try:
        for c in clients:
            await stack.enter_async_context(c)
        yield clients
    finally:
        with anyio.CancelScope(shield=True):
            await stack.aclose()
