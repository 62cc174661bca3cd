"""Our error types. Each carries the CLI exit code it maps to (see DESIGN: 1 failed, 2 bad input, 3 no backend;
4: the book was written but typesetting the PDF/HTML failed; 5: the output could not be written (a full disk);
130 interrupted).

Library and HTTP errors are translated into these in exactly one place (client.py); everything above the client
only ever sees these or plain values.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

TYPESET_FAILED_EXIT = 4  # book.md, stats.json, defects.json and the journal are written; the PDF is not
OUTPUT_FAILED_EXIT = 5  # an output file (the journal, book.md, ...) could not be written: free space and rerun


class HandbookError(Exception):
    """Base class: a one-line, user-facing message and an exit code."""

    exit_code = 1

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:  # one line, always
        return " ".join(self.message.split())


class ConfigError(HandbookError):
    """Bad input or configuration: flags, job files, output directories."""

    exit_code = 2


class BackendError(HandbookError):
    """No backend reachable, or a backend that is not what it claims to be."""

    exit_code = 3


class PlanError(HandbookError):
    """The outline could not be obtained: a node's replies stayed unusable after every attempt."""

    exit_code = 1


class OutputError(HandbookError):
    """A file of the job could not be written (the journal, book.md, stats.json ...: a full disk, a quota, a folder
    gone). The job stops asking the servers at once (text that cannot be kept is GPU time lost); what the journal
    holds is safe, and rerunning the same command once there is room resumes from it."""

    exit_code = OUTPUT_FAILED_EXIT


class Interrupted(HandbookError):
    """The user stopped the job (Ctrl-C); what exists was written."""

    exit_code = 130


class InternalError(HandbookError):
    """A bug of ours (not the servers', not the input's): the job stops at once, no backend is blamed, and the
    traceback goes to a log file rather than the terminal (:func:`internal_error`). ``__cause__`` is the bug."""

    exit_code = 1


def unwrap(exc: BaseException) -> BaseException:
    """The one error an exception group raised by a task group stands for: its HandbookError (or Ctrl-C) when
    every exception in it is ours or one; a lone exception of any kind; else the group itself. A PlanError beside a
    real bug must not hide the bug: such a group stays a group, which the caller reports as an internal error."""
    if not isinstance(exc, BaseExceptionGroup):
        return exc
    leaves = list(_leaves(exc))
    if len(leaves) == 1:
        return leaves[0]
    if all(isinstance(e, HandbookError | KeyboardInterrupt) for e in leaves):
        return next((e for e in leaves if isinstance(e, KeyboardInterrupt)), leaves[0])
    return exc


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


def internal_error(exc: BaseException, log_dir: str | os.PathLike[str] | None) -> InternalError:
    """``exc`` (a bug, or a group holding one) as an InternalError of one line, its traceback appended to
    ``log_dir``/handbook.log (a temporary file when there is no folder, or it cannot be written)."""
    import tempfile
    import time
    import traceback

    bugs = [e for e in _leaves(exc) if not isinstance(e, HandbookError | KeyboardInterrupt)] or [exc]
    first = bugs[0]
    what = " ".join(str(first).split())[:200]
    more = f" (and {len(bugs) - 1} more)" if len(bugs) > 1 else ""
    text = (f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} handbook internal error\n"
            + "".join(traceback.format_exception(exc)))
    where = None
    for folder in (log_dir, tempfile.gettempdir()):
        if folder is None:
            continue
        try:
            path = Path(folder) / "handbook.log" if folder == log_dir else Path(
                tempfile.mkstemp(prefix="handbook-", suffix=".log", dir=folder)[1])
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(text)
            where = path
            break
        except OSError:
            continue
    log = f"; the traceback is in {where}" if where is not None else "; the traceback could not be written"
    error = InternalError(f"internal error: {type(first).__name__}: {what}{more}{log}")
    error.__cause__ = exc
    return error
