"""`handbook library merge DIR... --out DIR`: the shards of one library (`handbook library --shard I/N` on N hosts)
joined into one: their datasets concatenated, their stats merged, their books linked (job/library_dataset.merge)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dirs", nargs="+", metavar="DIR", help="the shards' --out folders")
    parser.add_argument("--out", required=True, metavar="DIR", help="the merged library's folder")
    parser.add_argument("--dataset", metavar="LIST", help="parquet (always) and optionally jsonl (default: jsonl "
                        "too when every shard has it)")


def run(args: argparse.Namespace) -> int:
    from ..job.library_merge import merge

    formats = None
    if args.dataset:
        formats = tuple(dict.fromkeys(("parquet", *(x.strip() for x in args.dataset.split(",") if x.strip()))))
    stats = merge(args.dirs, args.out, formats)
    print(f"library merge: {len(args.dirs)} shard(s), {stats.get('books', 0)} books, {stats.get('sections', 0):,} "
          f"sections -> {args.out}")
    return 0
