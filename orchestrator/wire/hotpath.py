"""What the hot path's reader (sseproto.py) gives back: a finished ``Response``, or ``ConnectError`` when the TCP
connection could not be made; and the event loop it runs on (``on_asyncio``, ``event_loop_options``)."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import aiohttp


class ConnectError(aiohttp.ClientConnectionError):
    """The TCP connection could not be made (``os_error`` says why), as aiohttp's ClientConnectorError."""

    def __init__(self, os_error: OSError):
        super().__init__(str(os_error))
        self.os_error = os_error


class Response:
    """A finished response: ``done`` ([DONE] read) for a 200, else the status, Retry-After and the body's first
    500 bytes."""

    __slots__ = ("body", "done", "retry_after", "status")

    def __init__(self, status: int, done: bool = False, body: bytes = b"", retry_after: str | None = None):
        self.status = status
        self.done = done
        self.body = body
        self.retry_after = retry_after


def on_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # trio: aiohttp's path only
        return False
    return True


def event_loop_options() -> dict[str, Any]:
    """anyio.run's backend options for a job: uvloop where it is installed (not on Windows), which makes every
    socket read cheaper (benchmarks/client_overhead.py shows by how much); else asyncio's own loop."""
    if sys.platform == "win32":
        return {}
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return {}
    return {"use_uvloop": True}
