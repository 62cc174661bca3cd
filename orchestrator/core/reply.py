"""The outcome of one attempt at one request, as every layer sees it (the client makes it, the dispatcher retries
on it, the journal stores it, the report counts it), and the finish reasons that make it an answer."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Reply:
    """The outcome of one attempt at one request.

    ``error`` is None for a usable answer. ``retryable`` says whether another attempt may succeed;
    ``retry_after`` carries a server's Retry-After in seconds; ``health`` is True when the failure says something
    about the backend itself (connection refused, timeout, 5xx, cut stream) rather than about this request;
    ``unusable`` when it was an answer that a check of ours refused.
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
    streamed: bool = True  # False: read as one response, whose t_first is its end (no first token to see)
    # An answer a check of ours refused (the Dispatcher's validate: a planning list it could not use, a section caught
    # in a loop): the server did its part, so it is no failure of the server's (stats.json unusable_replies; the
    # progress view's and per_backend's errors leave it out), though it is not ok and is asked again like one.
    unusable: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None


# Only these finish reasons are answers: "stop" (the model ended) and "length" (the token cap; a truncated but
# real answer). vLLM and SGLang also send "abort"; servers send "error" and "content_filter".
ANSWERS = frozenset({"stop", "length"})
# Our own finish reason: the caller stopped reading the stream (``BackendClient.chat``'s ``stop_when``, a section
# caught in a repetition loop); the text so far, which the caller's check judges (and a section's refuses).
STOPPED = "stopped"
# Other servers' names for the same two (TGI's native "eos_token" and "stop_sequence", "max_tokens").
FINISH_SYNONYMS = {"eos_token": "stop", "eos": "stop", "stop_sequence": "stop", "end_turn": "stop",
                   "max_tokens": "length", "max_length": "length"}
