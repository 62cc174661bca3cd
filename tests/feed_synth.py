"""A synthetic job: emits the events a real job emits, at a chosen pace, with no server at all.

Used by the progress and feed tests (and to take docs/feed.png). Planning level by level, then every section
streamed as deltas over a few fake backends with a per-backend cap, one retry, a hostile section, server-counted
MetricsSample events from a fake token counter, and a JobFinished with stats.json-shaped stats. Given
``forecast_s``, a ForecastReady (forecast.json-shaped) comes before the first request, as a job that made a forecast
sends one.

    python tests/feed_synth.py [PORT [FORECAST_S]]   # serve the feed with a slow synthetic job, print its address
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import anyio

from orchestrator.core.events import (
    Delta,
    ForecastReady,
    JobFinished,
    JobStarted,
    LevelPlanned,
    MetricsSample,
    NodeFailed,
    NodeFinished,
    NodeStarted,
    OutlineReady,
)
from orchestrator.core.outline import Chapter, Outline, Part
from orchestrator.core.reply import Reply

HOSTILE = "<img src=x onerror=\"document.title='pwned'\">"

TOPICS = [
    "Version Control", "Code Review", "Testing Strategy", "Continuous Integration", "Observability",
    "Error Handling", "API Design", "Concurrency", "Caching", "Data Modelling", "Security Basics", "Profiling",
    "Dependency Management", "Release Engineering", "Incident Response", "Documentation",
]
WORDS = [
    "the", "system", "request", "queue", "latency", "budget", "retry", "backoff", "token", "stream",
    "server", "client", "cache", "index", "schema", "review", "commit", "branch", "merge", "test",
    "fixture", "mock", "deploy", "rollout", "metric", "trace", "span", "log", "error", "handler",
]


def _prose(rng: random.Random, words: int) -> str:
    out, line = [], []
    for i in range(words):
        line.append(rng.choice(WORDS))
        if len(line) > 12 and rng.random() < 0.15:
            out.append(" ".join(line).capitalize() + ".")
            line = []
        if i and i % 60 == 0:
            out.append("\n\n")
    if line:
        out.append(" ".join(line).capitalize() + ".")
    text = " ".join(out).replace(" \n\n ", "\n\n")
    if rng.random() < 0.3:
        text += "\n\n```python\ndef retry(fn, attempts=3):\n    for i in range(attempts):\n        try:\n" \
                "            return fn()\n        except OSError:\n            continue\n```\n"
    return text


async def synthetic_job(
    emit: Callable[[Any], None],
    *,
    parts: int = 2,
    chapters: int = 2,
    sections: int = 4,
    backends: tuple[str, ...] = ("http://127.0.0.1:8101/v1", "http://127.0.0.1:8102/v1"),
    cap: int = 4,
    words: int = 120,
    chunk_tokens: int = 4,
    chunk_delay: float = 0.01,
    metrics_interval: float = 0.25,
    hostile_path: str | None = "1.1.2",
    retry_path: str | None = "1.2.1",
    fail_path: str | None = None,
    unusable_path: str | None = None,
    seed: int = 7,
    between: Callable[[], Any] | None = None,
    forecast_s: float | None = None,
    pdf_pages: int | None = None,
) -> dict[str, Any]:
    """Run a synthetic job, sending every event to ``emit``; return the stats it finished with."""
    rng = random.Random(seed)
    counters = {b: 0 for b in backends}  # the fake servers' generation-token counters
    running = {b: 0 for b in backends}
    t0 = time.monotonic()
    settings = {"parts": parts, "chapters": chapters, "sections": sections, "cap": cap, "words": words}
    emit(JobStarted("Write me a complete software engineering handbook", tuple(backends), settings, t0))
    if forecast_s is not None:
        emit(synthetic_forecast(forecast_s, parts * chapters * sections, words, backends))
    stats: dict[str, Any] = {"requests": 0, "request_errors": 0, "unusable_replies": 0, "tokens_written": 0}
    per_backend = {b: {"url": b, "sections": 0, "tokens": 0, "errors": 0, "unusable": 0} for b in backends}
    history: list[tuple[float, int]] = []
    best = 0.0

    async def sampler() -> None:
        nonlocal best
        while True:
            now = time.monotonic()
            total = sum(counters.values())
            history.append((now, total))
            old = [h for h in history if h[0] <= now - 1.0]
            base = old[-1] if old else history[0]
            rate = (total - base[1]) / max(1e-6, now - base[0]) if now > base[0] else 0.0
            best = max(best, rate)
            per = {b: {"tokens": float(counters[b]), "running": float(running[b]), "waiting": 0.0} for b in backends}
            emit(MetricsSample(now, float(total), rate, per))
            await anyio.sleep(metrics_interval)

    slots = {b: anyio.Semaphore(cap) for b in backends}
    turn = {"i": 0}

    async def request(path: str, kind: str, title: str, text: str, fail_first: bool = False,
                      fail_always: bool = False, unusable_first: bool = False) -> bool:
        attempt = 0
        while True:
            attempt += 1
            b = backends[turn["i"] % len(backends)]
            turn["i"] += 1
            async with slots[b]:
                running[b] += 1
                t_start = time.monotonic()
                emit(NodeStarted(path, kind, title, b, attempt, t_start))
                stats["requests"] += 1
                pos, tokens = 0, 0
                failing = fail_always or (fail_first and attempt == 1)
                stop_at = len(text) // 3 if failing else len(text)
                while pos < stop_at:
                    step = chunk_tokens * 5
                    piece = text[pos: pos + step]
                    pos += step
                    tokens += chunk_tokens
                    counters[b] += chunk_tokens
                    emit(Delta(path, piece, time.monotonic()))
                    await anyio.sleep(chunk_delay)
                running[b] -= 1
                if unusable_first and attempt == 1:  # answered whole; a check of ours refused it
                    stats["request_errors"] += 1
                    stats["unusable_replies"] += 1
                    per_backend[b]["unusable"] += 1
                    emit(NodeFailed(path, kind, title, b, attempt, "unusable reply: repetition loop", False,
                                    time.monotonic(), unusable=True))
                    continue
                if failing:
                    stats["request_errors"] += 1
                    per_backend[b]["errors"] += 1
                    final = fail_always and attempt >= 2
                    emit(NodeFailed(path, kind, title, b, attempt, "connection cut mid-stream", final,
                                    time.monotonic()))
                    if final:
                        return False
                    continue
                reply = Reply(text, "stop", 40, tokens, b, t_start, t_start + chunk_delay, time.monotonic(),
                              attempt=attempt)
                emit(NodeFinished(path, kind, title, reply, time.monotonic()))
                if kind == "section":
                    per_backend[b]["sections"] += 1
                    per_backend[b]["tokens"] += tokens
                    stats["tokens_written"] += tokens
                return True

    def titles(n: int, offset: int) -> list[str]:
        return [TOPICS[(offset + i) % len(TOPICS)] for i in range(n)]

    failed = 0
    async with anyio.create_task_group() as tg:
        tg.start_soon(sampler)
        t_plan = time.monotonic()
        part_titles = titles(parts, 0)
        await request("", "book", "Software Engineering Handbook", '{"titles": ' + str(part_titles) + "}")
        emit(LevelPlanned(1, parts, time.monotonic()))
        chapter_titles: dict[int, list[str]] = {}

        async def plan_part(pi: int) -> None:
            chapter_titles[pi] = titles(chapters, pi * 3)
            await request(f"{pi}", "part", part_titles[pi - 1], '{"titles": []}')

        async with anyio.create_task_group() as g:
            for pi in range(1, parts + 1):
                g.start_soon(plan_part, pi)
        emit(LevelPlanned(2, parts * chapters, time.monotonic()))
        section_titles: dict[tuple[int, int], list[str]] = {}

        async def plan_chapter(pi: int, ci: int) -> None:
            section_titles[pi, ci] = [f"{t} in Practice" if k % 2 else f"{t}: First Principles"
                                      for k, t in enumerate(titles(sections, pi * 5 + ci * 2))]
            await request(f"{pi}.{ci}", "chapter", chapter_titles[pi][ci - 1], '{"titles": []}')

        async with anyio.create_task_group() as g:
            for pi in range(1, parts + 1):
                for ci in range(1, chapters + 1):
                    g.start_soon(plan_chapter, pi, ci)
        emit(LevelPlanned(3, parts * chapters * sections, time.monotonic()))
        outline = Outline(
            "Software Engineering Handbook",
            tuple(
                Part(part_titles[pi - 1], tuple(
                    Chapter(chapter_titles[pi][ci - 1], tuple(section_titles[pi, ci]))
                    for ci in range(1, chapters + 1)))
                for pi in range(1, parts + 1)
            ),
        )
        emit(OutlineReady(outline, time.monotonic()))
        plan_time = time.monotonic() - t_plan
        if between is not None:
            r = between()
            if hasattr(r, "__await__"):
                await r
        t_write = time.monotonic()

        async def write(ref: Any) -> None:
            nonlocal failed
            text = HOSTILE if ref.path == hostile_path else _prose(rng, rng.randint(words // 2, words * 3 // 2))
            ok = await request(ref.path, "section", ref.title, text, fail_first=ref.path == retry_path,
                               fail_always=ref.path == fail_path, unusable_first=ref.path == unusable_path)
            if not ok:
                failed += 1

        async with anyio.create_task_group() as g:
            for ref in outline.sections():
                g.start_soon(write, ref)
        write_time = time.monotonic() - t_write
        tg.cancel_scope.cancel()

    n = parts * chapters * sections
    whole = time.monotonic() - t0
    sustained = stats["tokens_written"] / write_time if write_time > 0 else 0.0
    final_stats = {
        "cards": len(backends),
        "plan": [1, parts, parts * chapters],
        "sections": n,
        "plan_time_s": round(plan_time, 2),
        "tokens_written": stats["tokens_written"],
        "write_time_s": round(write_time, 2),
        "avg_tok_s_writing": round(sustained, 1),
        "whole_job_s": round(whole, 2),
        "words": n * words,
        "pages_at_300_words": round(n * words / 300),
        "typeset_s": 0.0,
        "pdf_pages": pdf_pages,
        "requests": stats["requests"],
        "planning_requests": 1 + parts + parts * chapters,
        "request_errors": stats["request_errors"],
        "unusable_replies": stats["unusable_replies"],
        "failed_sections": failed,
        "empty_sections": 0,
        "truncated_sections": 0,
        "server_counted": {"sustained_tok_s": round(sustained, 1), "best_second_tok_s": round(best, 1),
                           "metric": "vllm:generation_tokens_total"},
        "per_backend": list(per_backend.values()),
    }
    emit(JobFinished(final_stats, failed == 0, time.monotonic()))
    return final_stats


def synthetic_forecast(whole_job_s: float, sections: int, words: int, backends: tuple[str, ...]) -> ForecastReady:
    """A forecast.json-shaped forecast for the synthetic job (its prose runs about 1.3 tokens a word)."""
    tokens = round(sections * words * 1.3)
    pages = max(1, round(sections * words / 260))
    forecast = {
        "sections": sections, "tokens": tokens, "pages": pages, "whole_job_s": whole_job_s, "words": sections * words,
        "plan_s": round(whole_job_s * 0.15, 2), "write_s": round(whole_job_s * 0.8, 2),
        "per_backend": [{"url": b, "sections": sections // len(backends)} for b in backends],
        "inputs": {"fit": "synthetic", "words": words},
    }
    return ForecastReady(whole_job_s, pages, sections, tokens, forecast, time.monotonic())


if __name__ == "__main__":  # a slow synthetic job behind a real feed, for a look in a browser
    import sys

    from orchestrator.views.feed import Feed

    async def main() -> None:
        async with Feed(port=int(sys.argv[1]) if len(sys.argv) > 1 else 0) as feed:
            print("live feed:", feed.url, flush=True)
            await synthetic_job(feed, parts=3, chapters=4, sections=6, cap=8, backends=(
                "http://gpu1:8000/v1", "http://gpu2:8000/v1", "http://gpu3:8000/v1", "http://gpu4:8000/v1"),
                chunk_delay=0.05, words=200, forecast_s=float(sys.argv[2]) if len(sys.argv) > 2 else 40.0)
            await feed.linger()

    anyio.run(main)
