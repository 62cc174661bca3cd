"""`handbook plan PROMPT [job options] --out DIR`: plan only; leave outline.md to edit and forecast.json."""

from __future__ import annotations

import argparse
import sys
from functools import partial
from typing import Any

from ..job.finish import Planned
from .job import add_job_arguments, record_folder, resolve, run_with_displays


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_job_arguments(parser)


def run(args: argparse.Namespace) -> int:
    prompt, backends, settings, out, args = resolve(args)
    args.record_to = record_folder(out, prompt)
    return run_with_displays(partial(_plan, prompt, backends, settings, out, args.fresh), settings, args, report)


def _plan(prompt, backends, settings, out, fresh, on_event, deltas):
    from ..job.stepwise import plan_job

    return plan_job(prompt, backends, settings, out, on_event, fresh=fresh, handle_sigint=True)


def report(planned: Planned) -> int:
    from rich.console import Console

    console = Console() if sys.stdout.isatty() else Console(width=160)
    fc = planned.forecast
    if fc is not None and fc.get("available") is False:
        print(f"handbook: no forecast: {fc.get('reason')}", file=sys.stderr)
    elif fc is not None:
        if fc.get("budget"):
            console.print(f"handbook: {fc['budget']}", markup=False)
        console.print(forecast_table(fc))
    for key, path in planned.paths.items():
        console.print(f"{key:>12}: {path}")
    if not planned.complete or planned.outline is None:
        print("handbook: planning did not finish; rerun the same command to resume it", file=sys.stderr)
        return 130 if planned.interrupted else 1
    if planned.kept_edits:
        print(f"handbook: {planned.paths['outline']} holds your edits: kept as it is (the forecast is of it; "
              "outline.json is the outline as planned)", file=sys.stderr)
    outline_md = planned.paths.get("outline")
    print(f"handbook: review and edit {outline_md}, then write the book with: handbook write "
          f"{outline_md.parent if outline_md else 'DIR'}", file=sys.stderr)
    return 0


def forecast_table(fc: dict[str, Any]) -> Any:
    """forecast.json as a table: the whole and each backend's share, with what it rests on below."""
    from rich.table import Table

    table = Table(title="forecast (writing this outline)", show_lines=False)
    for name in ("backend", "sections", "tokens", "A5 pages", "whole job s"):
        table.add_column(name, justify="right")
    for b in fc.get("per_backend") or []:
        table.add_row(str(b.get("url", "")), f"{b.get('sections', 0):,}", f"{b.get('tokens', 0):,}", "", "")
    table.add_row("all", f"{fc['sections']:,}", f"{fc['tokens']:,}", f"{fc['pages']:,}", f"{fc['whole_job_s']:,.1f}",
                  style="bold")
    inputs = fc.get("inputs") or {}
    fits = inputs.get("fits") or []
    table.caption = "; ".join(
        f"{f.get('url')}: step {f.get('a_ms', 0):.2f} ms + {f.get('b_ms', 0):.4f} ms x streams ({f.get('source')})"
        for f in fits
    )
    return table
