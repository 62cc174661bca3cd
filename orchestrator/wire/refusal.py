"""What a server's refusal says: its message, its Retry-After, and whether a 400 is about a field the client can
drop and ask again without (structured output, continuous usage stats). Pure; used by :mod:`.client`."""

from __future__ import annotations

import re

import orjson

__all__ = ["error_message", "is_json", "parse_retry_after", "rejects_continuous_usage", "rejects_structured_output"]


def error_message(text: str) -> str:
    try:
        data = orjson.loads(text)
        err = data.get("error", data) if isinstance(data, dict) else data
        if isinstance(err, dict):
            return str(err.get("message") or err.get("detail") or "")[:200]
        return str(err)[:200]
    except (orjson.JSONDecodeError, ValueError):
        return " ".join(text.split())[:200]


def parse_retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


_NOT_ABOUT_FORMAT = re.compile(
    r"context length|context window|maximum context|too long|too many tokens|max_tokens|prompt is too long",
    re.IGNORECASE,
)


def rejects_structured_output(error: str | None) -> bool:
    """Does a 400's message say the server cannot do ``response_format``? A 400 about something else (the
    context length, say) must not switch structured output off for the whole run."""
    # A bare "HTTP 400 Bad Request" may well be the schema: fall back unless the message says it is not.
    return not _NOT_ABOUT_FORMAT.search(error or "")


def rejects_continuous_usage(error: str | None) -> bool:
    """Does a 400's message name the continuous usage stats asked for (a server that validates stream_options and
    does not know the field)?"""
    return bool(error) and "continuous_usage" in (error or "")


def is_json(text: str) -> bool:
    try:
        orjson.loads(text.strip())
    except orjson.JSONDecodeError:
        return False
    return True
