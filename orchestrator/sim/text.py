"""Deterministic text for the simulator: "temperature 0" answers built from word banks.

An answer depends only on the request (model, messages, max_tokens, response_format): its hash seeds a
``random.Random``. Three kinds of answer:

* JSON when ``response_format`` carries a JSON schema (objects, strings, arrays with minItems/maxItems);
* a numbered list of titles when the last user message asks for "exactly N" things (with a ``Title:`` line
  first when it also asks for a book title);
* Markdown prose otherwise: paragraphs, sometimes a bullet list, fenced code (~0.92 blocks per answer, 3 in 4
  Python and always valid), with a log-normal length around ``LENGTH_FACTOR x`` the "about W words" asked, so
  that at 250 words and a 520-token cap the mean is ~288 words and ~7% of answers hit the cap.

Calibrated with :func:`orchestrator.sim.calibrate.simulate_book` (8 x 12 x 16, 250 words, 520 tokens) against
the reference run: 1.42 tokens per word, 288 words per section, ~7% truncated, ~46 of 1,536 section titles
repeated, ~0.91 code blocks.

Tokens are text pieces (:func:`tokenize`): the concatenation of the pieces is the text, and the number of
pieces is what usage reports, about 1.42 per whitespace-separated word on prose.

The pieces: :mod:`.words` (the banks, from ``words.toml``), :mod:`.context` (what a prompt is about),
:mod:`.titles` (titles and JSON), :mod:`.prose` (Markdown and code).
"""

from __future__ import annotations

import hashlib
import random
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson

from .context import Context
from .prose import make_prose
from .titles import fill_schema, make_book_title, make_titles

__all__ = ["Answer", "answer", "count_prompt_tokens", "schema_of", "tokenize"]

# --------------------------------------------------------------------------------------------------------------
# tokenisation

WORD_PIECE = 8  # most letters in one piece: longer words become several pieces (calibrated: ~1.42 per word)
_PIECE_RE = re.compile(rf" ?[A-Za-z]{{1,{WORD_PIECE}}}|[A-Za-z]{{1,{WORD_PIECE}}}| ?\d{{1,3}}|\n+| +"
                       r"|[^\sA-Za-z\d]{1,2}|\s")


def tokenize(text: str) -> list[str]:
    """Split text into pieces ("tokens"); ``"".join(tokenize(t)) == t`` for every string.

    Every character matches one of the alternatives, so the pieces cover the text without gaps.
    """
    return _PIECE_RE.findall(text)


def count_prompt_tokens(messages: Any) -> int:
    """About 1.3 tokens per word of every message (plus a few for the chat template)."""
    words = 0
    if isinstance(messages, list):
        for m in messages:
            if isinstance(m, dict):
                c = m.get("content")
                if isinstance(c, str):
                    words += len(c.split())
                elif isinstance(c, list):
                    for part in c:
                        if isinstance(part, dict) and isinstance(part.get("text"), str):
                            words += len(part["text"].split())
    return max(1, round(words * 1.3) + 4 * (len(messages) if isinstance(messages, list) else 1))


# --------------------------------------------------------------------------------------------------------------
# the answer of one request


@dataclass(frozen=True)
class Answer:
    kind: str  # "json", "list", "prose"
    pieces: tuple[str, ...]  # the full, natural answer (before max_tokens)

    @property
    def text(self) -> str:
        return "".join(self.pieces)


_CACHE: OrderedDict[bytes, Answer] = OrderedDict()
_CACHE_MAX = 2048  # ~20 KB each


def request_key(model: str, body: dict, salt: int | None = None) -> bytes:
    key = [model, body.get("messages"), body.get("max_tokens", body.get("max_completion_tokens")),
           body.get("response_format"), body.get("guided_json"), body.get("seed"), salt]
    return hashlib.blake2b(orjson.dumps(key, option=orjson.OPT_SORT_KEYS), digest_size=16).digest()


def answer(model: str, body: dict, salt: int | None = None) -> Answer:
    """The deterministic answer to a chat request (cached). ``salt`` (the server's --seed) varies all answers."""
    key = request_key(model, body, salt)
    a = _CACHE.get(key)
    if a is not None:
        _CACHE.move_to_end(key)
        return a
    a = _compose(key, body)
    _CACHE[key] = a
    if len(_CACHE) > _CACHE_MAX:
        _CACHE.popitem(last=False)
    return a


def schema_of(body: dict) -> dict | None:
    rf = body.get("response_format")
    if isinstance(rf, dict):
        if rf.get("type") == "json_schema":
            js = rf.get("json_schema") or {}
            sch = js.get("schema") if isinstance(js, dict) else None
            return sch if isinstance(sch, dict) else {"type": "object"}
        if rf.get("type") == "json_object":
            return {"type": "object"}
    gj = body.get("guided_json")
    if isinstance(gj, dict):
        return gj
    if isinstance(gj, str):
        try:
            v = orjson.loads(gj)
            return v if isinstance(v, dict) else None
        except orjson.JSONDecodeError:
            return None
    return None


def _last_user(messages: Any) -> str:
    if isinstance(messages, list):
        for m in reversed(messages):
            if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str):
                return m["content"]
        for m in reversed(messages):
            if isinstance(m, dict) and isinstance(m.get("content"), str):
                return m["content"]
    return ""


def _all_text(messages: Any) -> str:
    if isinstance(messages, list):
        return "\n".join(m["content"] for m in messages if isinstance(m, dict) and isinstance(m.get("content"), str))
    return ""


_EXACTLY_RE = re.compile(r"exactly (\d+)", re.IGNORECASE)
_WORDS_RE = re.compile(r"about (\d+) words", re.IGNORECASE)


def _compose(key: bytes, body: dict) -> Answer:
    rng = random.Random(key)
    messages = body.get("messages")
    last = _last_user(messages)
    everything = _all_text(messages)
    ctx = Context.from_prompt(last, everything)
    schema = schema_of(body)
    if schema is not None:
        n = _exactly(last)
        value = fill_schema(schema, rng, ctx, n, name="")
        text = orjson.dumps(value).decode()
        return Answer("json", tuple(tokenize(text)))
    n = _exactly(last)
    if n is not None:
        titles = make_titles(rng, ctx, n)
        lines = []
        if "book title" in last.lower():
            lines.append(f"Title: {make_book_title(rng)}")
        lines += [f"{i}. {t}" for i, t in enumerate(titles, 1)]
        return Answer("list", tuple(tokenize("\n".join(lines))))
    m = _WORDS_RE.search(last)
    words = int(m.group(1)) if m else 250
    return Answer("prose", tuple(tokenize(make_prose(rng, ctx, words))))


def _exactly(text: str) -> int | None:
    m = _EXACTLY_RE.search(text)
    if not m:
        return None
    return max(0, min(int(m.group(1)), 1000))
