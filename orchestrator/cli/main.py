"""`handbook` and its subcommands. Maps our errors to one-line messages and exit codes.

Subcommands live in their own modules, each with ``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import importlib
import sys

from ..core.errors import HandbookError, InternalError, internal_error, unwrap
from .common import OneLineParser

SUBCOMMANDS = {
    "plan": ("orchestrator.cli.plan", "plan the book only: DIR/outline.md to review and edit, DIR/forecast.json"),
    "write": ("orchestrator.cli.write", "write the book of DIR/outline.md as edited, resuming DIR's journal"),
    "sim": ("orchestrator.cli.sim", "start N simulated GPU servers (vLLM-like) on 127.0.0.1"),
    "bench": ("orchestrator.cli.bench", "throughput ladder against servers, read from their counters"),
    "typeset": ("orchestrator.cli.typeset", "typeset existing Markdown into an A5 PDF"),
    "engine": ("orchestrator.cli.engine", "start, stop or inspect the embedded local engine"),
    "replay": ("orchestrator.cli.replay", "serve the live feed again from a run's --record recording"),
    "library": ("orchestrator.cli.library", "many books over one fleet: FILE (JSONL or text, a book a line) -> DIR"),
    "library merge": ("orchestrator.cli.library_merge", "merge the shards of one library into DIR"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:2] == ["library", "merge"]:
            argv = ["library merge", *argv[2:]]
        if argv and argv[0] in SUBCOMMANDS:
            module_name, help_text = SUBCOMMANDS[argv[0]]
            module = importlib.import_module(module_name)
            parser = OneLineParser(prog=f"handbook {argv[0]}", description=help_text)
            module.add_arguments(parser)
            args = parser.parse_args(argv[1:])
            return int(module.run(args) or 0)
        from .job import run_job_cli

        return run_job_cli(argv)
    except BaseExceptionGroup as group:
        inner = unwrap(group)
        if isinstance(inner, KeyboardInterrupt):
            print("handbook: interrupted", file=sys.stderr)
            return 130
        return _say(inner if isinstance(inner, HandbookError) else internal_error(inner, None))
    except HandbookError as e:
        return _say(e)
    except KeyboardInterrupt:
        print("handbook: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug of ours outside a job (a job names its own OUT/handbook.log): one line too
        return _say(internal_error(e, None))


def _say(e: HandbookError) -> int:
    """One line on stderr for our error; its exit code."""
    print(f"handbook: {e}" if isinstance(e, InternalError) else f"handbook: error: {e}", file=sys.stderr)
    return e.exit_code
