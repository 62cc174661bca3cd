"""`handbook write DIR [--backend ...]`: write the book of DIR/outline.md as edited, resuming DIR's journal."""

from __future__ import annotations

import argparse
import os
from functools import partial
from pathlib import Path
from typing import Any

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

# The flag (argparse dest) that sets each setting `write` may change (stepwise.WRITE_OVERRIDES), where it is not
# the setting's own name; None: `handbook write` has no flag for it (the library's awrite takes it in settings).
# A setting added to WRITE_OVERRIDES gets the flag of its own name, and tests/job/test_outline_first.py fails until
# `write` has that flag or this table names another (or None).
_FLAG_OF: dict[str, str | None] = {
    "first_token_timeout_s": "first_token_timeout", "chunk_timeout_s": "chunk_timeout",
    "request_timeout_s": "request_timeout", "formats": "format",
    "typeset_while_writing": "typeset_after_writing",  # on: the setting is False (_INVERTED)
    "connect_timeout_s": None, "metrics_interval_s": None, "interrupt_grace_s": None, "all_down_timeout_s": None,
}
_INVERTED = frozenset({"typeset_while_writing"})  # settings whose flag (store_true) turns them off


def _flags() -> dict[str, str]:
    """flag (argparse dest) -> the setting it overrides, for every setting `write` may change that has a flag."""
    from ..job.stepwise import WRITE_OVERRIDES

    flags: dict[str, str] = {}
    for setting in sorted(WRITE_OVERRIDES):
        flag = _FLAG_OF.get(setting, setting)
        if flag is not None:
            flags[flag] = setting
    return flags


def _values(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the flags given change: a store_true flag left out is False, an --x/--no-x flag left out None
    (its --no-x, False, is given: ``handbook write DIR --no-repairs`` turns repairs off)."""
    values: dict[str, Any] = {}
    on_off = _on_off_flags()
    for flag, setting in _flags().items():
        v = getattr(args, flag)
        if v or (v is False and flag in on_off):
            values[setting] = False if setting in _INVERTED else v
    return values


def _on_off_flags() -> frozenset[str]:
    """The dests of `write`'s --x/--no-x flags (BooleanOptionalAction: None when left out), read off its parser."""
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    return frozenset(a.dest for a in parser._actions if isinstance(a, argparse.BooleanOptionalAction))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", metavar="DIR", help="the folder `handbook plan` wrote (its outline.md, as edited)")
    add_connection_arguments(parser)
    add_forecast_arguments(parser)
    add_display_arguments(parser, planning=False)


def run(args: argparse.Namespace) -> int:
    from ..job.stepwise import write_settings

    out_dir = Path(args.dir)
    if not out_dir.is_dir():
        raise ConfigError(f"{out_dir} is not a folder: run `handbook plan PROMPT --out {out_dir}` first")
    outline = read_outline_md(out_dir / OUTLINE_FILE)  # a bad outline.md is reported before any backend is asked
    if args.model:
        raise ConfigError("--model cannot change between `handbook plan` and `handbook write`: the journal "
                          "records the model the outline was made with")
    values = _values(args)
    if "ladder" in values:
        values["ladder"] = os.path.abspath(values["ladder"])
    if "api_key" not in values and os.environ.get("OPENAI_API_KEY"):
        values["api_key"] = os.environ["OPENAI_API_KEY"]
    overrides = settings_from(values)
    _, settings = write_settings(out_dir, overrides, frozenset(values))
    backends = backends_of(args, {"cap": settings.cap}) or _planned_backends(out_dir, settings.cap,
                                                                              keep_cap=args.cap is None)
    args.record_to = out_dir
    return run_with_displays(partial(_write, out_dir, backends, settings, outline), settings, args, report)


def _planned_backends(out_dir: Path, cap: int, *, keep_cap: bool) -> list[Backend]:
    """No --backend and no $HANDBOOK_BACKENDS: the backends the plan was made on (none: the embedded engine),
    each at the cap it had then unless ``--cap`` says otherwise (``keep_cap`` False), with the power page it was
    given (``--power``)."""
    peeked = peek_job(out_dir / JOURNAL_FILE)
    if peeked is None:
        return []
    return [Backend(str(b["url"]), cap=int(b.get("cap", cap)) if keep_cap else cap,
                    power=b["power"] if isinstance(b.get("power"), str) else None)
            for b in peeked[2] if isinstance(b, dict) and "url" in b]


def _write(out_dir, backends, settings, outline, on_event, deltas):
    from ..job.stepwise import awrite

    return awrite(outline, backends, settings, out_dir, on_event, deltas=deltas, handle_sigint=True)
