"""Our error types. Each carries the CLI exit code it maps to (see DESIGN: 1 failed, 2 bad input, 3 no backend;
4: the book was written but typesetting the PDF/HTML failed; 5: the output could not be written (a full disk);
130 interrupted).

Library and HTTP errors are translated into these in exactly one place (client.py); everything above the client
only ever sees these or plain values.
"""

from __future__ import annotations

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


def unwrap(exc: BaseException) -> BaseException:
    """The HandbookError inside an exception group raised by a task group, if there is one; else ``exc``."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = unwrap(inner)
            if isinstance(found, HandbookError | KeyboardInterrupt):
                return found
    return exc
