"""`handbook write DIR [--backend ...]`: write the book of DIR/outline.md as edited, resuming DIR's journal."""

from __future__ import annotations

import argparse
import os
from functools import partial
from pathlib import Path

from ..core.config import Backend, settings_from
from ..core.errors import ConfigError
from ..core.outline_md import FILENAME as OUTLINE_FILE
from ..core.outline_md import read_outline_md
from ..dispatch.journal import FILENAME as JOURNAL_FILE
from ..dispatch.journal_schema import peek_job
from .job import (
    add_connection_arguments,
    add_display_arguments,
    add_forecast_arguments,
    backends_of,
    report,
    run_with_displays,
)

# flag -> the setting it overrides (the only ones `write` may change: stepwise.WRITE_OVERRIDES)
_FLAGS = {"api_key": "api_key", "cap": "cap", "attempts": "attempts", "first_token_timeout": "first_token_timeout_s",
          "chunk_timeout": "chunk_timeout_s", "request_timeout": "request_timeout_s", "format": "formats",
          "ladder": "ladder", "forecast": "forecast", "timeline": "timeline"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", metavar="DIR", help="the folder `handbook plan` wrote (its outline.md, as edited)")
    add_connection_arguments(parser)
    add_forecast_arguments(parser)
    add_display_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from ..job.stepwise import write_settings

    out_dir = Path(args.dir)
    if not out_dir.is_dir():
        raise ConfigError(f"{out_dir} is not a folder: run `handbook plan PROMPT --out {out_dir}` first")
    outline = read_outline_md(out_dir / OUTLINE_FILE)  # a bad outline.md is reported before any backend is asked
    if args.model:
        raise ConfigError("--model cannot change between `handbook plan` and `handbook write`: the journal "
                          "records the model the outline was made with")
    values = {setting: getattr(args, flag) for flag, setting in _FLAGS.items() if getattr(args, flag)}
    if args.typeset_after_writing:
        values["typeset_while_writing"] = False
    if "ladder" in values:
        values["ladder"] = os.path.abspath(values["ladder"])
    if "api_key" not in values and os.environ.get("OPENAI_API_KEY"):
        values["api_key"] = os.environ["OPENAI_API_KEY"]
    overrides = settings_from(values)
    _, settings = write_settings(out_dir, overrides, frozenset(values))
    backends = backends_of(args, {"cap": settings.cap}) or _planned_backends(out_dir, settings.cap,
                                                                              keep_cap=args.cap is None)
    return run_with_displays(partial(_write, out_dir, backends, settings, outline), settings, args, report)


def _planned_backends(out_dir: Path, cap: int, *, keep_cap: bool) -> list[Backend]:
    """No --backend and no $HANDBOOK_BACKENDS: the backends the plan was made on (none: the embedded engine),
    each at the cap it had then unless ``--cap`` says otherwise (``keep_cap`` False)."""
    peeked = peek_job(out_dir / JOURNAL_FILE)
    if peeked is None:
        return []
    return [Backend(str(b["url"]), cap=int(b.get("cap", cap)) if keep_cap else cap)
            for b in peeked[2] if isinstance(b, dict) and "url" in b]


def _write(out_dir, backends, settings, outline, on_event, deltas):
    from ..job.stepwise import awrite

    return awrite(outline, backends, settings, out_dir, on_event, deltas=deltas, handle_sigint=True)
