"""`handbook PROMPT [options]`: the main job's flags, merged as defaults < preset < job file < flags."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from ..core.config import PRESETS, STREAM_SECTIONS, Backend, backends_from_env, load_job_file, settings_from
from ..core.errors import TYPESET_FAILED_EXIT, ConfigError
from ..core.profiles import PLANNING_STYLES, PROFILE_NAMES
from ..engine import LOCAL_DEFAULT_SHAPE
from .common import OneLineParser
from .quality import add_quality_arguments, quality_values

SHAPE = ("parts", "chapters", "sections")


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="handbook",
        description="One prompt in, a book out: plan an outline, write every section in parallel over "
        "OpenAI-compatible servers, assemble Markdown and an A5 PDF. Subcommands: plan, write, sim, bench, "
        "typeset, engine.",
    )
    add_job_arguments(p)
    return p


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return v


def add_forecast_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ladder", metavar="LADDER.json",
                   help="take the forecast's step times from a `handbook bench` ladder.json (default: a short probe "
                   "of each backend's counters)")
    p.add_argument("--forecast", action="store_true",
                   help="forecast the job (time, tokens, A5 pages) before it starts and show the ETA")


def add_connection_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", action="append", metavar="URL",
                   help="OpenAI-compatible base URL ending in /v1; repeatable (default: $HANDBOOK_BACKENDS, "
                   "else the embedded local engine)")
    p.add_argument("--power", action="append", metavar="URL[#gpu=LABEL]",
                   help="the GPU power page (dcgm-exporter, e.g. http://gpu1:9400/metrics#gpu=0) of each --backend, "
                   "in order; repeatable, one per --backend: stats.json then has energy_j and tokens_per_joule")
    p.add_argument("--model", help="model name (default: the first model the backend lists)")
    p.add_argument("--api-key", help="API key (default: $OPENAI_API_KEY, else EMPTY); never printed")
    p.add_argument("--cap", type=positive_int, help="in-flight cap per backend (default 256)")


def add_display_arguments(p: argparse.ArgumentParser, *, planning: bool = True) -> None:
    """``planning`` False: `handbook write`, whose outline exists (see add_quality_arguments)."""
    p.add_argument("--format", help="any of md,html,pdf (default md,pdf)")
    p.add_argument("--feed", nargs="?", const=0, type=int, metavar="PORT",
                   help="serve the live feed on 127.0.0.1 (a free port unless given) and print its address")
    p.add_argument("--feed-linger", type=float, metavar="S",
                   help="keep the feed up S seconds after the job (default: until Ctrl-C)")
    p.add_argument("--attempts", type=positive_int, help="attempts per request (default 8)")
    p.add_argument("--first-token-timeout", type=float, metavar="S", help="seconds to wait for a first token")
    p.add_argument("--chunk-timeout", type=float, metavar="S", help="seconds to wait between streamed chunks")
    p.add_argument("--request-timeout", type=positive_float, metavar="S",
                   help="seconds one request may stream in all before it is cut (default 1800)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress display")
    p.add_argument("--timeline", action="store_true",
                   help="also write OUT/timeline.png (in-flight streams per card, planning requests and their "
                   "critical path, the servers' tokens/s) and its data, OUT/timeline.json")
    p.add_argument("--record", action="store_true",
                   help="keep the run's event stream, timestamped and compressed, in OUT/recording.jsonl.gz "
                   "(`handbook replay OUT` serves the live feed again from it)")
    add_quality_arguments(p, planning=planning)
    p.add_argument("--stream-sections", choices=STREAM_SECTIONS,
                   help="always (default for a book: a stalled server is caught between chunks); auto (the "
                   "library's default): stream only when the text is read as it arrives (the feed, --record), else "
                   "one whole response per section (less client CPU); never")
    p.add_argument("--typeset-after-writing", action="store_true",
                   help="lay out the whole PDF after the last section (default: each section as soon as it is in, "
                   "on idle cores, at low priority)")


def add_job_arguments(p: argparse.ArgumentParser) -> None:
    """The main job's flags (`handbook plan` takes the same)."""
    p.add_argument("prompt", nargs="?", help="what the book is about (may come from --preset or --config)")
    add_connection_arguments(p)
    add_forecast_arguments(p)
    p.add_argument("--pages", type=positive_int, metavar="N",
                   help="choose parts, chapters, sections and words so the forecast book has about N A5 pages")
    p.add_argument("--minutes", type=positive_float, metavar="M",
                   help="choose the largest book the forecast says these backends write within M minutes")
    p.add_argument("--parts", type=positive_int, help="parts in the book (default 8)")
    p.add_argument("--chapters", type=positive_int, help="chapters per part (default 12)")
    p.add_argument("--sections", type=positive_int, help="sections per chapter (default 16)")
    p.add_argument("--words", type=positive_int, help="target words per section (default 250)")
    p.add_argument("--max-tokens", type=positive_int, help="output-token cap per section request (default 520)")
    p.add_argument("--temperature", type=float,
                   help="sampling temperature (default: the model profile's; 0 for the reference profile)")
    p.add_argument("--profile", choices=PROFILE_NAMES,
                   help="how the model is asked: reference (the published run's prompts, temperature 0), small "
                   "(few-shot lists, a system message, temperature 0.3, repetition penalty: measured on the "
                   "embedded 135M model), or auto (default: small for small models, else reference)")
    p.add_argument("--top-p", type=float, help="nucleus sampling (default: the profile's / the server's)")
    p.add_argument("--repetition-penalty", type=float, help="vLLM repetition_penalty (1 = off)")
    p.add_argument("--frequency-penalty", type=float, help="OpenAI frequency_penalty (0 = off)")
    p.add_argument("--system", metavar="TEXT", help="a system message sent with every request")
    p.add_argument("--planning", choices=PLANNING_STYLES,
                   help="json: JSON-schema title lists; list: few-shot numbered lists (small models)")
    p.add_argument("--finish-truncated", action="store_true",
                   help="finish a section stopped by the token cap with one short continuation request "
                   "(default: cut it back to its last complete sentence in book.md)")
    p.add_argument("--preset", choices=sorted(PRESETS), help="published-take: every setting of the reference run")
    p.add_argument("--config", metavar="FILE.toml", help="a job file; flags override it")
    p.add_argument("--out", metavar="DIR", help="output directory (default ./handbook-out/<slug of the prompt>)")
    add_display_arguments(p)
    p.add_argument("--fresh", action="store_true", help="ignore an existing journal in --out (default: resume)")
    p.add_argument("--no-pipeline", action="store_true",
                   help="plan strictly level by level before writing (the reference run's order)")
    p.add_argument("--templates", metavar="DIR", help="a folder overriding the bundled templates")


def resolve(argv: list[str] | argparse.Namespace) -> tuple[str, list[Backend], Any, str | None, argparse.Namespace]:
    """Flags -> (prompt, backends, settings, out, args). Raises ConfigError for anything wrong."""
    args = parser().parse_args(argv) if isinstance(argv, list) else argv
    values: dict[str, Any] = {}
    preset = args.preset
    job: dict[str, Any] = {}
    if args.config:
        job = load_job_file(args.config)
        preset = preset or job.get("preset")
    if preset:
        if preset not in PRESETS:
            raise ConfigError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
        values.update(PRESETS[preset])
    values.update({k: v for k, v in job.items() if k != "preset"})
    flag_map = {
        "model": args.model, "api_key": args.api_key, "cap": args.cap, "parts": args.parts,
        "chapters": args.chapters, "sections": args.sections, "words": args.words,
        "max_tokens": args.max_tokens, "temperature": args.temperature, "attempts": args.attempts,
        "first_token_timeout_s": args.first_token_timeout, "chunk_timeout_s": args.chunk_timeout,
        "request_timeout_s": args.request_timeout,
        "templates": args.templates, "out": args.out, "profile": args.profile, "top_p": args.top_p,
        "repetition_penalty": args.repetition_penalty, "frequency_penalty": args.frequency_penalty,
        "system": args.system, "planning": args.planning, "finish_truncated": args.finish_truncated or None,
        "pages": args.pages, "minutes": args.minutes, "forecast": args.forecast or None,
        "timeline": args.timeline or None,
        "typeset_while_writing": False if args.typeset_after_writing else None,
        "stream_sections": args.stream_sections, **quality_values(args),
        "ladder": os.path.abspath(args.ladder) if args.ladder else None,  # a later `write` may run elsewhere
    }
    values.update({k: v for k, v in flag_map.items() if v is not None})
    if args.format:
        values["formats"] = args.format
    elif "format" in values:
        values["formats"] = values.pop("format")
    if args.no_pipeline:
        values["pipeline"] = False
    if args.prompt is not None:
        values["prompt"] = args.prompt
    prompt = values.get("prompt")
    if prompt is None or not str(prompt).strip():
        raise ConfigError("the prompt is empty: say what the book should be about, e.g. "
                          "handbook \"Write me a complete software engineering handbook\"")
    if "api_key" not in values and os.environ.get("OPENAI_API_KEY"):
        values["api_key"] = os.environ["OPENAI_API_KEY"]

    backends = backends_of(args, values)
    if not backends and not any(k in values for k in (*SHAPE, "pages", "minutes")):
        values.update(LOCAL_DEFAULT_SHAPE)
        print(
            "handbook: no backend given: using the embedded local engine with a small book "
            "(3 parts x 3 chapters x 4 sections); ask for more with --parts/--chapters/--sections or --pages",
            file=sys.stderr,
        )
    settings = settings_from(values)
    return str(prompt), backends, settings, values.get("out"), args


def backends_of(args: argparse.Namespace, values: dict[str, Any]) -> list[Backend]:
    """--backend flags, else the job file's backends, else $HANDBOOK_BACKENDS; empty: the embedded engine."""
    urls: list[Any] = list(args.backend or [])
    if not urls:
        raw = values.get("backends", values.get("backend"))
        if isinstance(raw, str):
            urls = [raw]
        elif isinstance(raw, list):
            urls = raw
    if not urls:
        urls = backends_from_env()
    cap = values.get("cap", 256)
    power: list[str | None] = list(getattr(args, "power", None) or [])
    if power and len(power) != len(urls):
        raise ConfigError(f"--power given {len(power)} time(s) for {len(urls)} backend(s): give one --power per "
                          "backend, in the same order")
    backends = []
    for i, u in enumerate(urls):
        spec = power[i] if power else None
        if isinstance(u, dict):
            unknown = set(u) - {"url", "cap", "model", "power"}
            if unknown or "url" not in u:
                raise ConfigError(f"a backend entry takes url, cap, model and power; got {sorted(u)}")
            backends.append(Backend(u["url"], cap=u.get("cap", cap), model=u.get("model"),
                                    power=spec or u.get("power")))
        else:
            backends.append(Backend(str(u), cap=cap, power=spec))
    return backends


def run_job_cli(argv: list[str]) -> int:
    prompt, backends, settings, out, args = resolve(argv)
    args.record_to = record_folder(out, prompt)
    return run_with_displays(partial(_generate, prompt, backends, settings, out, args.fresh), settings, args, report)


def record_folder(out: str | None, prompt: str) -> Path:
    """Where --record writes: the job's out folder (the default one when --out is not given)."""
    from ..job.run import default_out

    return Path(out) if out is not None else default_out(prompt)


def _generate(prompt, backends, settings, out, fresh, on_event, deltas):
    from ..job.run import agenerate

    return agenerate(prompt, backends, settings, out, on_event=on_event, deltas=deltas, fresh=fresh,
                     handle_sigint=True)


def run_with_displays(call, settings, args: argparse.Namespace, report: Callable[[Any], int]) -> int:
    """Run ``call(on_event, deltas)`` (a job, a plan, a write) under the terminal progress and the live feed as
    the flags ask; ``report(result)`` prints the outcome and gives the exit code."""
    logging.basicConfig(format="handbook: warning: %(message)s", level=logging.WARNING, stream=sys.stderr)
    from ..wire.sseproto import event_loop_options

    done: dict[str, int] = {}
    try:
        anyio.run(_run_with_displays, call, settings, args, report, done,
                  backend_options=event_loop_options())  # uvloop where installed: the client's reads cost less
    except KeyboardInterrupt:
        if "code" in done:  # the job had finished; Ctrl-C only closed the lingering feed
            return done["code"]
        raise
    return done["code"]


def report(result) -> int:
    """Print the stats row, the outputs and any failed section; return the exit code."""
    from rich.console import Console
    from rich.table import Table

    from ..job.report import ROW_COLUMNS, power_line, readers_line, row_cells, server_counted_line

    console = Console() if sys.stdout.isatty() else Console(width=160)
    table = Table(title="handbook", show_lines=False)
    for name, _ in ROW_COLUMNS:
        table.add_column(name, justify="right")
    table.add_row(*row_cells(result.stats))
    console.print(table)
    for line in (server_counted_line(result.stats), readers_line(result.stats), power_line(result.stats)):
        if line:
            console.print(line, markup=False)
    width = max((len(key) for key in result.paths), default=0)
    for key, path in result.paths.items():
        console.print(f"{key:>{width}}: {path}")
    summary = defects_summary(result.defects)
    if summary:
        console.print(f"   defects: {summary}", markup=False)
    if getattr(result, "interrupted", False):
        st = result.stats
        done = st["sections"] - st["failed_sections"] - st["empty_sections"] - st["interrupted_sections"]
        print(f"handbook: interrupted: {done} of {result.stats['sections']} sections written (book.md is marked "
              "incomplete); rerun the same command to resume", file=sys.stderr)
        return 130
    if result.typeset_error and not result.complete:
        print(f"handbook: error: {result.typeset_error}", file=sys.stderr)
    if not result.complete:
        print(f"handbook: {len(result.failed_sections)} section(s) failed or came back empty:", file=sys.stderr)
        refs = {r.path: r.title for r in result.outline.sections()}
        for path in result.failed_sections:
            print(f"  {path} {refs.get(path, '')}", file=sys.stderr)
        return 1
    if result.typeset_error:
        print(f"handbook: error: {result.typeset_error}; book.md, stats.json and defects.json are written "
              f"({result.paths['md']}); retry the PDF with: handbook typeset {result.paths['md']}", file=sys.stderr)
        return TYPESET_FAILED_EXIT
    return 0


def defects_summary(d: dict[str, Any] | None) -> str | None:
    """One line of defects.json for the end of a run (defects.md has the worst cases)."""
    if not d:
        return None
    loops = d.get("looping_sections") or {}
    cut = f", {loops['cut']} of them cut before the loop" if loops.get("cut") else ""
    parts = [f"{loops.get('count', 0)} looping sections ({loops.get('repaired', 0)} repaired{cut})"]
    ub = d.get("unterminated_blocks") or {}
    printed = ub.get("printed") or {}
    parts.append(f"{ub.get('count', 0)} of {ub.get('of', 0)} blocks unterminated as generated, "
                 f"{printed.get('count', 0)} as printed")
    parts.append(f"{_count(d.get('truncated_sections'))} truncated at the token cap")
    parts.append(f"{(d.get('duplicate_section_titles') or {}).get('count', 0)} repeated section titles")
    code = d.get("code_blocks") or {}
    if code.get("count"):
        parts.append(f"{code['count']} code blocks ({_count(code.get('python_syntax_errors'))} with Python syntax "
                     "errors)")
    return "; ".join(parts)


def _count(v: Any) -> int:
    return v.get("count", 0) if isinstance(v, dict) else int(v or 0)


async def _run_with_displays(call, settings, args, report, done: dict[str, int]) -> None:
    """Run the job with the terminal progress (unless --quiet) and, with --feed, the live browser feed;
    print the report, then keep the feed up as asked."""
    from contextlib import AsyncExitStack

    consumers: list[Any] = [_say_budget]
    progress = None
    async with AsyncExitStack() as stack:
        if not args.quiet:
            from ..views.progress import TerminalProgress

            progress = stack.enter_context(TerminalProgress())
            consumers.append(progress)
        feed = None
        if args.feed is not None:
            from ..views.feed import Feed

            feed = await stack.enter_async_context(
                Feed(port=args.feed, linger=args.feed_linger, templates=settings.templates)
            )
            print(f"handbook: live feed at {feed.url}", file=sys.stderr, flush=True)
            consumers.append(feed)
        recorder = None
        if getattr(args, "record", False):
            from ..views.recording import Recorder

            recorder = Recorder(args.record_to)
            consumers.append(recorder)
        try:
            result = await call(consumers, feed is not None or recorder is not None)
        finally:
            if recorder is not None:
                recorder.close()
        if progress is not None:
            progress.stop()
        done["code"] = report(result)
        if recorder is not None:  # `handbook plan` gives a Planned, which has no stats: no section was written
            stats = getattr(result, "stats", None)
            _say_recording(recorder, stats.get("sections", 0) if isinstance(stats, dict) else 0)
        if feed is not None:
            if args.feed_linger is None:
                print(f"handbook: the feed stays up at {feed.url} until Ctrl-C", file=sys.stderr, flush=True)
            await feed.linger()


def _say_recording(recorder: Any, sections: int) -> None:
    """Where the recording is and what it weighs (or why there is none)."""
    if recorder.error is not None:
        print(f"handbook: warning: no recording: {recorder.error}", file=sys.stderr)
        return
    if not recorder.path.is_file():
        return
    size = recorder.path.stat().st_size
    per = f", {size / sections:,.0f} bytes a section" if sections else ""
    print(f"handbook: recording {recorder.path} ({size / 1e6:,.2f} MB, {recorder.records:,} records of "
          f"{recorder.events:,} events{per}); replay it with: handbook replay {recorder.path.parent}",
          file=sys.stderr)


def _say_budget(event: Any) -> None:
    """The shape a --pages/--minutes budget chose, said before the job starts writing."""
    from ..core.events import ForecastReady

    if isinstance(event, ForecastReady) and event.forecast.get("budget"):
        print(f"handbook: {event.forecast['budget']}", file=sys.stderr, flush=True)
