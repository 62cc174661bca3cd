"""`handbook replay OUT [--speed K] [--feed PORT]`: the live feed (and the terminal progress) served again from the
recording a run made with --record (OUT/recording.jsonl.gz), at the run's pace or K times faster."""

from __future__ import annotations

import argparse
import math
import sys

import anyio

from ..core.errors import ConfigError
from .job import positive_float


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", metavar="OUT", help="the folder a run with --record wrote (or its recording file)")
    parser.add_argument("--speed", type=positive_float, default=1.0, metavar="K",
                        help="play K times faster than the run went (default 1: the run's own pace)")
    parser.add_argument("--feed", type=int, default=0, metavar="PORT",
                        help="serve the feed on this port of 127.0.0.1 (default: a free one)")
    parser.add_argument("--feed-linger", type=float, metavar="S",
                        help="keep the feed up S seconds after the replay (default: until Ctrl-C)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress display")


def run(args: argparse.Namespace) -> int:
    from ..views.recording import find_recording

    try:
        path = find_recording(args.out)
    except FileNotFoundError as e:
        raise ConfigError(str(e)) from None
    if args.feed_linger is not None and (math.isnan(args.feed_linger) or args.feed_linger < 0):
        raise ConfigError("--feed-linger must be a number of seconds, 0 or more")
    done: dict[str, int] = {}
    try:
        anyio.run(_replay, path, args, done)
    except KeyboardInterrupt:
        return done.get("code", 130)  # Ctrl-C after the replay only closes the lingering feed
    return done["code"]


async def _replay(path, args: argparse.Namespace, done: dict[str, int]) -> None:
    from contextlib import AsyncExitStack

    from ..views.feed import Feed
    from ..views.replay import replay

    async with AsyncExitStack() as stack:
        feed = await stack.enter_async_context(Feed(port=args.feed, linger=args.feed_linger))
        print(f"handbook: replaying {path} at {args.speed:g}x on the live feed at {feed.url}", file=sys.stderr,
              flush=True)
        consumers: list = [feed]
        progress = None
        if not args.quiet:
            from ..views.progress import TerminalProgress

            progress = stack.enter_context(TerminalProgress())
            consumers.append(progress)
        try:
            played = await replay(path, consumers, args.speed)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if progress is not None:
            progress.stop()
        end = "the run's end" if played.finished else "where the recording stops (the run was cut short)"
        print(f"handbook: replayed {played.events:,} events of a {played.run_s:.1f} s run, to {end}",
              file=sys.stderr, flush=True)
        done["code"] = 0
        if args.feed_linger is None:
            print(f"handbook: the feed stays up at {feed.url} until Ctrl-C", file=sys.stderr, flush=True)
        await feed.linger()
