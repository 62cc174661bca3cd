"""Pure: what a job did -> Stats (the reference run's Table 5 row and more), and the row as text.

Honest labels: ``avg_tok_s_writing`` is the reference run's definition (usage tokens / write time), printed as
such; server-counted figures that cover only some backends are printed as "server-counted (k of n backends)";
``warnings`` names what makes a figure undercount (a backend that sent no usage).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..book.assemble import Book
from ..core.reply import STOPPED, Reply
from ..dispatch.dispatcher import REASK


@dataclass(frozen=True)
class BackendFigures:
    """How one backend's fleet slot fared: the client-side figures stats.json's ``per_backend`` adds to the
    replies' counts."""

    max_in_flight: int
    cap: int
    left_rotation: int  # times it was taken out of rotation
    probe_completions: int  # health-probe completions sent while it was out of rotation (not job requests) ...
    probe_failures: int  # ... how many of them failed ...
    probe_tokens: int  # ... and their tokens: the server counted them, so tokens_written does too


@dataclass(frozen=True)
class JobRecord:
    """Everything the report needs, gathered by the runner. Times are time.monotonic() values."""

    backends: tuple[str, ...]
    plan_levels: tuple[int, ...]
    book: Book
    replies: tuple[tuple[str, Reply], ...]  # (kind, reply) for every attempt this run made
    t_start: float
    t_titles_known: float
    t_write_start: float | None
    t_write_end: float | None
    t_end: float
    resumed_sections: int = 0
    loop_cut_stopped: int = 0  # Written.loop_cut_stopped: STOPPED answers kept that did not sign off
    server_counted: dict[str, Any] | None = None
    power: dict[str, Any] | None = None  # metrics.power_figures over the writing (None: nothing was written)
    readers: dict[str, Any] | None = None  # metrics.readers over the writing (None: nothing was written)
    fleet: tuple[BackendFigures, ...] = ()  # one per backend, in ``backends`` order (empty: not measured)
    model: str = ""
    interrupted: bool = False  # the run stopped before the book was done (Ctrl-C, every backend down)
    typeset_s: float | None = None
    pdf_pages: int | None = None
    typeset_error: str | None = None  # why book.html/book.pdf could not be made
    t_pdf: float | None = None  # book.pdf on disk
    typeset_cpu_s: dict[str, float] | None = None  # typeset/background.layout_split: layout CPU around the last section
    forecast: dict[str, Any] | None = None  # forecast.json of this run, when one was made


def build_stats(rec: JobRecord) -> dict[str, Any]:
    book = rec.book
    words = book.words
    sections = len(book.sections)
    section_replies = [r for k, r in rec.replies if k == "section"]
    reask_replies = [r for k, r in rec.replies if k == REASK]  # repairs and continuations of written sections
    planning = {k for k, _ in rec.replies} - {"section", REASK}
    plan_replies = [r for k, r in rec.replies if k in planning]
    section_tokens = sum(r.completion_tokens for r in section_replies)
    probe_tokens = sum(f.probe_tokens for f in rec.fleet)
    tokens = sum(r.completion_tokens for _, r in rec.replies) + probe_tokens
    write_s = (
        rec.t_write_end - rec.t_write_start
        if rec.t_write_start is not None and rec.t_write_end is not None
        else 0.0
    )
    per_backend = _per_backend(rec, section_replies)
    failed = [s.path for s in book.sections if s.failed]
    interrupted = [s.path for s in book.sections if s.interrupted]
    empty = [s.path for s in book.sections if s.empty]
    truncated = [s.path for s in book.sections if s.finish_reason == "length"]
    stats: dict[str, Any] = {
        "cards": len(rec.backends),
        "plan": list(rec.plan_levels),
        "sections": sections,
        "plan_time_s": round(rec.t_titles_known - rec.t_start, 3),
        "tokens_written": tokens,
        "section_tokens": section_tokens,
        "write_time_s": round(write_s, 3),
        "avg_tok_s_writing": round(section_tokens / write_s, 1) if write_s > 0 else 0.0,
        "whole_job_s": round(rec.t_end - rec.t_start, 3),
        "words": words,
        "pages_at_300_words": round(words / 300),
        "typeset_s": None if rec.typeset_s is None else round(rec.typeset_s, 2),
        # the reader's wait: from the job's start, and from the last section finished, to book.pdf on disk
        "pdf_ready_s": None if rec.t_pdf is None else round(rec.t_pdf - rec.t_start, 3),
        "typeset_after_write_s": (None if rec.t_pdf is None
                                  else round(rec.t_pdf - (rec.t_write_end or rec.t_end), 3)),
        "typeset_cpu_s": rec.typeset_cpu_s,
        "pdf_pages": rec.pdf_pages,
        "requests": len(rec.replies),
        "planning_requests": len(plan_replies),
        # a section asked again once it was written: a repair (--repairs: code, near-duplicates; a library's
        # --dedupe reask) or --finish-truncated's continuation; in requests and tokens_written, not in section_tokens
        "reask_requests": len(reask_replies),
        "reask_tokens": sum(r.completion_tokens for r in reask_replies),
        **_answer_counts(rec, planning, plan_replies),
        "failed_sections": len(failed),
        "interrupted_sections": len(interrupted),
        "empty_sections": len(empty),
        "truncated_sections": len(truncated),
        "resumed_sections": rec.resumed_sections,
        "server_counted": rec.server_counted,
        **power_keys(rec.power),
        "readers": rec.readers,
        "per_backend": per_backend,
        "failed_section_paths": failed,
        "warnings": usage_warnings(rec),
        "model": rec.model,
        "interrupted": rec.interrupted,
    }
    if rec.typeset_error is not None:
        stats["typeset_error"] = rec.typeset_error
    if rec.forecast is not None:
        stats["forecast"] = {**rec.forecast, "error": forecast_error(rec.forecast, stats)}
    return stats


def _answer_counts(rec: JobRecord, planning: set[str], plan_replies: list[Reply]) -> dict[str, int]:
    """stats.json's counts of how answers ended: refused, stopped as they streamed, signed off, cut before a loop."""
    return {
        "request_errors": sum(1 for _, r in rec.replies if not r.ok),
        # of them, answers a check of ours refused (Reply.unusable: a planning list it could not use, a section caught
        # in a loop), each asked again: the backend did its part (per_backend's errors leave them out)
        "unusable_replies": sum(1 for _, r in rec.replies if r.unusable),
        # section answers stopped as they streamed, in requests: one caught in a repetition loop, and one that
        # signed off that the check still refused (a loop in it), asked again at once (in request_errors); one that
        # signed off and was kept (signed_off_answers); one caught in a loop and kept cut before it (in
        # loop_cut_sections, not in signed_off_answers). Their tokens, in tokens_written, are the usage of the last
        # chunk read (a watched stream asks for continuous usage stats), else one a content delta read
        # (BackendClient._stopped)
        "stopped_answers": sum(1 for k, r in rec.replies if r.finish_reason == STOPPED and k not in planning),
        "signed_off_answers": sum(1 for k, r in rec.replies
                                  if r.finish_reason == STOPPED and r.ok and k not in planning) - rec.loop_cut_stopped,
        # sections kept as what they said before a repetition loop, cut there where they would have been asked
        # again (book/loopcut.py): in the book, those resumed from the journal too
        "loop_cut_sections": sum(1 for s in rec.book.sections if s.loop_cut),
        # planning replies read until their list was complete, then stopped (planning/stream.Expansion.watch): answers,
        # in requests and planning_requests, not in request_errors; tokens counted as stopped_answers' are
        "planning_stopped": sum(1 for r in plan_replies if r.finish_reason == STOPPED),
    }


def _per_backend(rec: JobRecord, section_replies: list[Reply]) -> list[dict[str, Any]]:
    """stats.json's ``per_backend``: each backend's sections, tokens and errors, and its fleet figures."""
    per_backend = []
    figures: Sequence[BackendFigures | None] = rec.fleet or (None,) * len(rec.backends)
    for url, f in zip(rec.backends, figures, strict=True):
        mine = [r for _, r in rec.replies if r.backend == url]
        entry: dict[str, Any] = {
            "url": url,
            "sections": sum(1 for r in section_replies if r.backend == url and r.ok),
            "tokens": sum(r.completion_tokens for r in mine),
            "errors": sum(1 for r in mine if not r.ok and not r.unusable),
            "unusable": sum(1 for r in mine if r.unusable),
        }
        if f is not None:
            entry.update(max_in_flight=f.max_in_flight, cap=f.cap, left_rotation=f.left_rotation,
                         probe_completions=f.probe_completions, probe_failures=f.probe_failures,
                         probe_tokens=f.probe_tokens)
        per_backend.append(entry)
    return per_backend


def power_keys(power: dict[str, Any] | None) -> dict[str, Any]:
    """``energy_j``, ``tokens_per_joule`` (None when not measured) and ``power``: the GPUs' figures over the writing
    with their coverage, or ``{"available": False, "reason"}``."""
    if power is None:
        power = {"available": False, "reason": "nothing was written"}
    on = power.get("available") is True
    return {"energy_j": power["energy_j"] if on else None,
            "tokens_per_joule": power["tokens_per_joule"] if on else None, "power": power}


def forecast_error(forecast: dict[str, Any], stats: dict[str, Any]) -> dict[str, float | None]:
    """How far the job landed from its forecast, as (actual - forecast) / forecast: + is slower or longer. Pages
    are known once the PDF is typeset (None before, or without a PDF)."""

    def rel(actual: Any, expected: Any) -> float | None:
        if not isinstance(actual, int | float) or not isinstance(expected, int | float) or expected <= 0:
            return None
        return round(actual / expected - 1, 4)

    return {"whole_job_s": rel(stats["whole_job_s"], forecast.get("whole_job_s")),
            "pages": rel(stats["pdf_pages"], forecast.get("pages")),
            "tokens": rel(stats["tokens_written"], forecast.get("tokens"))}


def usage_warnings(rec: JobRecord) -> list[str]:
    """One warning per backend that answered without usage: the token figures undercount what it wrote.

    A successful reply with text but ``completion_tokens == 0`` had no usage in it (a server that ignores
    ``stream_options.include_usage``); its tokens are missing from ``tokens_written``, ``section_tokens``,
    ``avg_tok_s_writing`` and ``per_backend``.
    """
    seen: dict[str, list[int]] = {u: [0, 0] for u in rec.backends}  # url -> [no usage, successful replies]
    for _, r in rec.replies:
        if not r.ok:
            continue
        counts = seen.setdefault(r.backend, [0, 0])
        counts[1] += 1
        if r.completion_tokens == 0 and r.text.strip():
            counts[0] += 1
    return [
        f"backend {url} returned no usage in {n} of {m} replies: tokens_written undercounts"
        for url, (n, m) in seen.items()
        if n
    ]


AVG_LABEL = "avg tok/s writing (usage/write s)"
"""The reference run's tok/s figure, printed with its definition: the usage tokens of the sections / write time.
It is not server-counted. (Short enough that the row's header stays one line in a 160-column log.)"""

ROW_COLUMNS: Sequence[tuple[str, str]] = (
    ("cards", "cards"),
    ("plan", "plan"),
    ("sections", "sections"),
    ("plan s", "plan_time_s"),
    ("tokens written", "tokens_written"),
    ("write s", "write_time_s"),
    (AVG_LABEL, "avg_tok_s_writing"),
    ("whole job s", "whole_job_s"),
    ("words", "words"),
    ("pages at 300 words", "pages_at_300_words"),
)


def row_cells(stats: dict[str, Any]) -> list[str]:
    cells = []
    for _, key in ROW_COLUMNS:
        v = stats.get(key)
        if key == "plan":
            cells.append(" -> ".join(str(x) for x in v or ()))
        elif isinstance(v, float):
            cells.append(f"{v:,.2f}")
        elif isinstance(v, int):
            cells.append(f"{v:,}")
        else:
            cells.append(str(v))
    return cells


def coverage_label(sc: dict[str, Any]) -> str:
    """"server-counted", or "server-counted (k of n backends)" when the figures cover only part of the fleet."""
    covered = sc.get("covered_backends")
    if covered is None:
        return "server-counted"
    n = len(covered) + len(sc.get("uncovered_backends") or ())
    return "server-counted" if len(covered) == n else f"server-counted ({len(covered)} of {n} backends)"


def power_line(stats: dict[str, Any]) -> str | None:
    """The printed summary of ``stats["power"]``: watts, joules and tokens per joule over the writing, with their
    coverage ("power (k of n backends)"), or "power: not available (reason)"."""
    p = stats.get("power")
    if not p:
        return None
    if p.get("available") is not True:
        return f"power: not available ({p.get('reason') or 'no power endpoint'})"
    from ..metrics.power import power_label

    tpj = p.get("tokens_per_joule")
    line = (f"{power_label(p)} while writing: {p['power_w']:,.0f} W mean, {p['energy_j']:,.0f} J ({p['energy_source']})"
            + (f", {tpj:,.2f} tokens per joule" if tpj is not None else ""))
    if len(p.get("covered_backends") or ()) > 0 and p.get("uncovered_backends"):
        line += "; tokens of the covered backends only; no power: " + "; ".join(
            f"{b['url']} ({b['reason']})" for b in p["uncovered_backends"])
    return line


def server_counted_line(stats: dict[str, Any]) -> str | None:
    """The printed summary of ``stats["server_counted"]``, never presenting a partial sum as the fleet's."""
    sc = stats.get("server_counted")
    if not sc:
        return None
    if sc.get("available") is False:
        return f"server-counted: not available: {sc.get('reason') or 'no server counter'}"
    line = (
        f"{coverage_label(sc)} while writing: {sc['sustained_tok_s']:,.0f} tok/s sustained, "
        f"best second {sc['best_second_tok_s'] or 0:,.0f} tok/s ({sc['metric']})"
    )
    kv, hit = sc.get("kv_cache_usage_peak"), sc.get("prefix_cache_hit_rate")
    if kv is not None:
        line += f"; KV cache peak {100 * kv:.0f}%"
    if hit is not None:
        line += f"; prefix-cache hit rate {100 * hit:.0f}% ({sc.get('prefix_cache_coverage') or '?'} backends)"
    missing = sc.get("uncovered_backends") or ()
    if missing:
        line += "; not counted: " + "; ".join(f"{b['url']} ({b['reason']})" for b in missing)
    return line


def _streams(n: float) -> str:
    """Streams in flight as printed: tenths, or as stats.json has them below one (metrics/readers.streams_figure)."""
    return f"{n:,.1f}" if n >= 0.95 else f"{n:g}"


def readers_line(stats: dict[str, Any]) -> str | None:
    """The printed summary of ``stats["readers"]``: "each reader: N tok/s" beside the streams it is shared by, and
    the latency percentiles, each group with its source (the servers' histograms, else the client's timing)."""
    rd = stats.get("readers")
    if not rd or rd.get("per_stream_tok_s") is None:
        return None
    rate = "server-counted" if rd.get("rate_source") == "server" else "client-timed"
    line = (f"each reader: {rd['per_stream_tok_s']:,.1f} tok/s ({rd['rate_tok_s']:,.0f} tok/s {rate} over "
            f"{_streams(rd['streams_in_flight'])} streams in flight, as the {rd['streams_source']} counts them)")
    parts = []
    for key, label, unit in (("ttft_s", "TTFT", "s"), ("itl_ms", "ITL", "ms"), ("e2e_s", "end to end", "s")):
        entry = rd.get(key)
        if not entry:
            continue
        ps = " ".join(f"{k} {v:,.3g} {unit}" for k, v in entry.items() if k.startswith("p") and v is not None)
        src = f"server, {entry['coverage']}" if entry.get("source") == "server" else "client"
        parts.append(f"{label} {ps} ({src})")
    if parts:
        line += "; " + ", ".join(parts)
    return line
