"""`handbook library FILE [job options] --out DIR`: many books over one fleet, a dataset out
(``orchestrator.job.library``); `handbook library merge DIR... --out DIR`: the shards of one library joined."""

from __future__ import annotations

import argparse
import math
import sys
from contextlib import AsyncExitStack
from dataclasses import replace
from typing import Any

import anyio

from ..core.errors import ConfigError
from .job import add_job_arguments, positive_int, resolve


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_job_arguments(parser)
    parser.add_argument("--books-in-flight", type=positive_int, metavar="N",
                        help="books open at once (default: enough that every backend stays at its cap)")
    parser.add_argument("--shard", metavar="I/N",
                        help="only the books whose id hashes to shard I of N (0 <= I < N): one host of N, e.g. "
                        "--shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT")
    parser.add_argument("--dataset", default="parquet", metavar="LIST",
                        help="parquet (always) and optionally jsonl: DIR/sections.* and DIR/books.*")
    parser.add_argument("--dedupe", choices=("report", "reask"), default="report",
                        help="near-duplicate sections across books: report them in defects.json (default), or "
                        "also ask each book's sections that nearly repeat a finished book's again, once")
    # FILE takes the job's prompt place (the books' prompts are in it), and a few defaults differ from a book's
    helps = {
        "prompt": ("FILE", "the library: JSONL, one book a line ({\"prompt\": ...}), or text, a prompt a line"),
        "out": ("DIR", "the library's folder (default ./handbook-out/library-<FILE's name>)"),
        "format": ("LIST", "any of md,html,pdf for each book (default md: a PDF per book only when asked)"),
        "stream_sections": (None, "auto (the library's default): stream sections only when their text is read as "
                            "it arrives (--feed); always; never"),
    }
    for action in parser._actions:
        if action.dest in helps:
            metavar, action.help = helps[action.dest]
            if metavar:
                action.metavar = metavar


def run(args: argparse.Namespace) -> int:
    from ..job.library import LIBRARY_SETTINGS
    from ..job.library_input import parse_shard

    if not args.prompt:
        raise ConfigError("no library file given: handbook library FILE --out DIR")
    for flag, given in (("--pages", args.pages), ("--minutes", args.minutes), ("--timeline", args.timeline),
                        ("--record", args.record), ("--preset", args.preset)):
        if given:
            raise ConfigError(f"{flag} is a single book's: a library takes each book's shape from FILE (a line's "
                              "parts, chapters, sections, words) or from --parts/--chapters/--sections/--words")
    file, backends, settings, out, args = resolve(args)
    # a library writes Markdown only and streams no section nobody reads, unless asked (LIBRARY_SETTINGS)
    if not args.format and not _in_job_file(args, "format"):
        settings = replace(settings, formats=LIBRARY_SETTINGS["formats"])
    if args.stream_sections is None and not _in_job_file(args, "stream_sections"):
        settings = replace(settings, stream_sections=LIBRARY_SETTINGS["stream_sections"])
    shard = parse_shard(args.shard) if args.shard else None
    dataset = tuple(x.strip() for x in args.dataset.split(",") if x.strip())
    if "parquet" not in dataset:
        dataset = ("parquet", *dataset)
    return anyio.run(_run, file, backends, settings, out, args, shard, dataset)


def _in_job_file(args: argparse.Namespace, key: str) -> bool:
    if not args.config:
        return False
    from ..core.config import load_job_file

    return key in load_job_file(args.config)


async def _run(file: str, backends: Any, settings: Any, out: Any, args: argparse.Namespace,
               shard: tuple[int, int] | None, dataset: tuple[str, ...]) -> int:
    from ..job.library import agenerate_library
    from ..views.library_progress import LibraryState

    state = LibraryState()
    progress = None
    if not args.quiet:
        from ..views.library_progress import LibraryProgress

        progress = LibraryProgress(state, stream=sys.stderr)
        progress.start()
    async with AsyncExitStack() as stack:
        if args.feed is not None:  # the library's page: its books and the sections of those in flight
            from ..views.library_feed import LibraryFeed

            feed = await stack.enter_async_context(LibraryFeed(state, port=args.feed))
            print(f"handbook: library feed: {feed.url}", file=sys.stderr, flush=True)
        try:
            result = await agenerate_library(file, backends, settings, out, state,
                                             books_in_flight=args.books_in_flight, shard=shard, dataset=dataset,
                                             dedupe=args.dedupe,
                                             fresh=args.fresh, handle_sigint=True)
        finally:
            if progress is not None:
                progress.stop()
        code = report(result)
        if args.feed is not None:  # the page stays up: --feed-linger seconds, else until Ctrl-C
            try:
                await anyio.sleep(math.inf if args.feed_linger is None else max(0.0, args.feed_linger))
            except KeyboardInterrupt:
                pass
        return code


def report(result: Any) -> int:
    st = result.stats
    print(f"library: {st['books_done']} of {st['books']} books done ({st['carried_over']} before this run), "
          f"{st['failed_books']} failed; {st['sections']:,} sections, {st['tokens_written']:,} tokens, "
          f"{st['words']:,} words in {st['whole_job_s']:,.1f} s")
    from ..job.report import power_line, readers_line, server_counted_line

    for line in (server_counted_line(st), readers_line(st), power_line(st)):
        if line:
            print(line)
    nd = result.defects.get("near_duplicate_sections") or {}
    print(f"near-duplicate sections: {nd.get('count', 0)} pairs ({nd.get('across_books', 0)} across books)")
    for name, path in result.paths.items():
        print(f"{name:>16}: {path}")
    if result.interrupted:
        print(f"handbook: interrupted: {st['books_done']} of {st['books']} books done; rerun the same command to "
              "resume", file=sys.stderr)
        return 130
    if result.failed_books:
        print(f"handbook: {len(result.failed_books)} book(s) failed: "
              + ", ".join(i for i, _ in result.failed_books), file=sys.stderr)
        for i, why in result.failed_books:
            print(f"  {i}: {why}", file=sys.stderr)
        return 1
    return 0
