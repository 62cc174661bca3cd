"""The one place where HTTP and SDK errors become ours. Returns Reply values, never raises for a failed request."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Reply:
    """The outcome of one attempt at one request.

    ``error`` is None for a usable answer. ``retryable`` says whether another attempt may succeed;
    ``retry_after`` carries a server's Retry-After in seconds; ``health`` is True when the failure says something
    about the backend itself (connection refused, timeout, 5xx, cut stream) rather than about this request.
    """

    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    backend: str
    t_start: float
    t_first: float | None
    t_end: float
    error: str | None = None
    status: int | None = None
    retryable: bool = False
    retry_after: float | None = None
    health: bool = False
    attempt: int = 1

    @property
    def ok(self) -> bool:
        return self.error is None
