"""The flags of what a book knows and how it is checked (issue "a book that reads as one"): --context,
--distinct-titles, --repairs, --affinity, --stop-at-sign-off. Each maps to its Settings field; left out, the preset's,
job file's or default value stands."""

from __future__ import annotations

import argparse
from typing import Any

from ..core.config import CONTEXTS

__all__ = ["add_quality_arguments", "quality_values"]


def add_quality_arguments(p: argparse.ArgumentParser, *, planning: bool = True) -> None:
    """``planning`` False (`handbook write`: the outline exists) leaves out --distinct-titles, which only planning
    reads."""
    p.add_argument("--context", choices=CONTEXTS,
                   help="outline (default): each section request carries the book's brief, the part's chapter "
                   "titles and the chapter's section titles (served from the prefix cache); none: its titles "
                   "alone, as the reference's (the published preset)")
    p.add_argument("--affinity", action=argparse.BooleanOptionalAction, default=None,
                   help="with --context outline, send a chapter's sections to the backend that holds its prompt "
                   "prefix in its cache (default on; --no-affinity to measure what it brings)")
    if planning:
        p.add_argument("--distinct-titles", action=argparse.BooleanOptionalAction, default=None,
                       help="no title twice in one book: the planner asks for spares (default on; off in the "
                       "published preset)")
    p.add_argument("--repairs", action=argparse.BooleanOptionalAction, default=None,
                   help="ask a section again once when its code does not parse or it nearly repeats another "
                   "(default on; off in the published preset)")
    p.add_argument("--stop-at-sign-off", action=argparse.BooleanOptionalAction, default=None,
                   help="stop a section's stream where the model signs off to whoever asked (\"I hope this helps\"), "
                   "and keep the section written so far (default on; off in the published preset)")


def quality_values(args: argparse.Namespace) -> dict[str, Any]:
    return {"context": args.context, "distinct_titles": getattr(args, "distinct_titles", None),
            "repairs": args.repairs, "affinity": args.affinity, "stop_at_sign_off": args.stop_at_sign_off}
