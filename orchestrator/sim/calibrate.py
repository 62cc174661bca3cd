"""Calibration: the shape of a whole simulated book, without HTTP.

    .venv/bin/python -c "from orchestrator.sim.calibrate import simulate_book; print(simulate_book())"
"""

from __future__ import annotations

import ast
from typing import Any

import orjson

from .text import Answer, answer

__all__ = ["simulate_book"]


def simulate_book(parts: int = 8, chapters: int = 12, sections: int = 16, words: int = 250,
                  max_tokens: int = 520, model: str = "sim-qwen3", json_schema: bool = True,
                  request: str = "Write me a complete software engineering handbook. Every topic, with examples.",
                  ) -> dict[str, Any]:
    """Plan and write a book the way the product asks for one, and measure the figures the reference reports.

    The prompts mirror the product's planning and section prompts; any wording gives similar figures, since
    only the request hash and the quoted names matter.
    """
    def ask(content: str, n: int | None, want_title: bool = False, mt: int = 1024) -> Answer:
        return answer(model, _request(content, n if json_schema else None, want_title, mt))

    book, part_titles = _titles(ask(f'You are planning a long book for this request: "{request}"\n'
                                    f"Give the book a title, and divide it into exactly {parts} parts.",
                                    parts, True))
    section_titles: list[str] = []
    stats = dict.fromkeys(("tokens", "words", "truncated", "code_blocks", "python_blocks", "python_syntax_errors",
                           "unterminated", "sections"), 0)
    for p in part_titles:
        _, chs = _titles(ask(f'You are planning the book "{book}", written for this request: "{request}"\n'
                             f'List exactly {chapters} chapter titles for part "{p}".', chapters))
        for ch in chs:
            _, secs = _titles(ask(f'You are planning the book "{book}", written for this request: "{request}"\n'
                                  f'In part "{p}", chapter "{ch}".\n'
                                  f'List exactly {sections} section titles for chapter "{ch}".', sections))
            section_titles += secs
            for sec in secs:
                a = ask(f'Book: "{book}"\nPart: "{p}"\nChapter: "{ch}"\n'
                        f'Write the section "{sec}" in about {words} words of Markdown.', None, mt=max_tokens)
                _measure(stats, a, max_tokens)
    return _figures(stats, section_titles, book, part_titles)


def _request(content: str, n: int | None, want_title: bool, max_tokens: int) -> dict[str, Any]:
    """A chat request; with ``n``, one that asks for exactly ``n`` titles (and the book's, ``want_title``) by a
    JSON schema."""
    body: dict[str, Any] = {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}
    if n is not None:
        props: dict[str, Any] = {"items": {"type": "array", "items": {"type": "string"},
                                           "minItems": n, "maxItems": n}}
        if want_title:
            props = {"title": {"type": "string"}, **props}
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "titles", "schema": {"type": "object",
                                                                               "properties": props}}}
    return body


def _titles(a: Answer) -> tuple[str | None, list[str]]:
    """The titles of a planning answer (JSON, or a numbered list) and the book's title if it gives one."""
    if a.kind == "json":
        v = orjson.loads(a.text)
        return v.get("title"), list(v["items"])
    lines = a.text.splitlines()
    book = lines[0][len("Title: "):] if lines and lines[0].startswith("Title: ") else None
    return book, [ln.split(". ", 1)[1] for ln in lines if ". " in ln and ln.split(".")[0].isdigit()]


def _measure(stats: dict[str, int], a: Answer, max_tokens: int) -> None:
    """Count one section's answer (cut at ``max_tokens``) into ``stats``."""
    pieces = a.pieces[:max_tokens]
    body = "".join(pieces)
    stats["sections"] += 1
    stats["tokens"] += len(pieces)
    stats["words"] += len(body.split())
    stats["truncated"] += len(a.pieces) > max_tokens
    stripped = body.rstrip()
    if not stripped or stripped[-1] not in ".!?:)\"'`*":
        stats["unterminated"] += 1
    blocks = body.split("```")
    stats["code_blocks"] += len(blocks) // 2
    for i in range(1, len(blocks), 2):
        if blocks[i].startswith("python\n") and i + 1 < len(blocks):
            stats["python_blocks"] += 1
            try:
                ast.parse(blocks[i][len("python\n"):])
            except SyntaxError:
                stats["python_syntax_errors"] += 1


def _figures(stats: dict[str, int], section_titles: list[str], book: str | None,
             part_titles: list[str]) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for t in section_titles:
        counts[t] = counts.get(t, 0) + 1
    n = max(1, stats["sections"])
    return {
        "sections": stats["sections"],
        "tokens": stats["tokens"],
        "words": stats["words"],
        "tokens_per_word": stats["tokens"] / max(1, stats["words"]),
        "mean_words": stats["words"] / n,
        "truncated": stats["truncated"],
        "truncated_share": stats["truncated"] / n,
        "unterminated": stats["unterminated"],
        "duplicate_section_titles": sum(1 for c in counts.values() if c > 1),
        "code_blocks": stats["code_blocks"],
        "code_blocks_per_section": stats["code_blocks"] / n,
        "python_blocks": stats["python_blocks"],
        "python_syntax_errors": stats["python_syntax_errors"],
        "book_title": book,
        "parts": part_titles,
    }
