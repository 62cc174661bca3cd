"""A chat completion request as one simulated card reads it (vLLM's checks and error bodies), and the reply it
gets: used by the card's server (:mod:`.server`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from . import text as simtext
from .engine import Stream

__all__ = ["Ask", "Reply", "chunk_tail", "error", "read_ask"]


def error(status: int, message: str, etype: str, headers: dict | None = None) -> web.Response:
    """An error answer, shaped as vLLM's (OpenAI's ``error`` object, and its fields again at the top level)."""
    body = orjson.dumps({"error": {"message": message, "type": etype, "param": None, "code": status},
                         "object": "error", "message": message, "type": etype, "code": status})
    return web.Response(status=status, body=body, content_type="application/json", headers=headers)


@dataclass(frozen=True)
class Ask:
    """A chat request that passed the checks, as the card reads it."""

    body: dict[str, Any]
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    continuous_usage: bool  # stream_options.continuous_usage_stats (vLLM's): every chunk carries the usage so far


@dataclass(frozen=True)
class Reply:
    """What a request gets: the answer's pieces (the first ``n`` of them sent) and why it ends, its id and time,
    and, for a "drop" fault, after how many tokens the connection is cut. ``s``: its stream in the engine (None
    when there is nothing to generate)."""

    s: Stream | None
    pieces: tuple[str, ...]
    n: int
    finish: str
    rid: str
    created: int
    prompt_tokens: int
    include_usage: bool
    continuous_usage: bool
    drop_at: int | None


def read_ask(body: Any, model_name: str, json_schema: bool, max_model_len: int) -> Ask | web.Response:
    """The request as a card serving ``model_name`` serves it, or the error vLLM answers it with."""
    if not isinstance(body, dict):
        return error(400, "request body must be a JSON object", "BadRequestError")
    model = body.get("model")
    if model is not None and model != model_name:
        return error(404, f"The model `{model}` does not exist.", "NotFoundError")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return error(400, "messages must be a non-empty list", "BadRequestError")
    rf = body.get("response_format")
    if rf is not None and not isinstance(rf, dict):
        return error(400, "response_format must be an object", "BadRequestError")
    if not json_schema and isinstance(rf, dict) and rf.get("type") == "json_schema":
        return error(400, "response_format json_schema is not supported by this server", "BadRequestError")
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                   or max_tokens < 1):
        return error(400, "max_tokens must be a positive integer", "BadRequestError")
    prompt_tokens = simtext.count_prompt_tokens(messages)
    if max_tokens is None:
        max_tokens = max(1, max_model_len - prompt_tokens)
    elif prompt_tokens + max_tokens > max_model_len:
        return error(400, f"This model's maximum context length is {max_model_len} tokens. However, you "
                          f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, "
                          f"{max_tokens} in the completion).", "BadRequestError")
    stream = bool(body.get("stream", False))
    so = body.get("stream_options")
    include_usage = bool(stream and isinstance(so, dict) and so.get("include_usage"))
    continuous = bool(include_usage and isinstance(so, dict) and so.get("continuous_usage_stats"))
    return Ask(body, prompt_tokens, max_tokens, stream, include_usage, continuous)


def chunk_tail(finish: str, prompt_tokens: int, continuous: bool) -> Callable[[int, bool], bytes]:
    """What ends a stream's chunk after its delta, given the tokens sent so far and whether it is the last: the
    finish reason, and with vLLM's ``continuous_usage_stats`` the usage so far (on every chunk, the role's too)."""
    mid_open = b',"logprobs":null,"finish_reason":null}]'
    fin_open = b',"logprobs":null,"finish_reason":"' + finish.encode() + b'","stop_reason":null}]'
    if not continuous:
        mid, fin = mid_open + b"}\n\n", fin_open + b"}\n\n"
        return lambda _c, last: fin if last else mid

    def tail(c: int, last: bool) -> bytes:
        usage = b'{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}' % (prompt_tokens, prompt_tokens + c, c)
        return (fin_open if last else mid_open) + b',"usage":' + usage + b"}\n\n"

    return tail
