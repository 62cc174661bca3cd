"""The book the trust tests script: a well-behaved model for a small fixed SHAPE (``book_answer``), and the checks
run on what a job leaves behind (sections under their own headings, journal rows) or on a running job."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import time
from pathlib import Path

from scripted_openai import Answer, Request, prose, titles


def sections_of(md: str) -> dict[str, str]:
    """heading -> body of every #### section of book.md."""
    parts = re.split(r"^#### (.+)$", md, flags=re.MULTILINE)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def assert_each_section_under_its_own_heading(md: str, n: int) -> None:
    got = sections_of(md)
    assert len(got) == n, list(got)
    for heading, body in got.items():
        m = re.search(r"This section is about (.+?)\. ", body)
        assert m, f"section {heading!r} has no text: {body[:80]!r}"
        assert m.group(1) == heading, f"#### {heading} holds the text written for {m.group(1)!r}"


def journal_rows(out: Path, sql: str) -> list[tuple]:
    try:
        db = sqlite3.connect(out / "journal.sqlite", timeout=5)
        try:
            return db.execute(sql).fetchall()
        finally:
            db.close()
    except sqlite3.Error:
        return []


def wait_until(cond, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        assert proc.poll() is None, f"the job ended early: {proc.stderr.read() if proc.stderr else ''}"
        time.sleep(0.05)
    raise AssertionError("timed out waiting")


# the book brief the scripted model writes (--context outline): every section request of the book carries it
BRIEF = ("This book is for testers who read it front to back. It speaks plainly to the reader. One running example, "
         "a small shop's order system, carries through every chapter, and the word \"check\" means one thing "
         "throughout.")

SHAPE = ["--parts", "1", "--chapters", "2", "--sections", "4", "--attempts", "3"]


def book_answer(req: Request) -> Answer:
    """A well-behaved model for the SHAPE book: one part, chapters "Basics" and "Practice", four sections each
    ("Basics 1"...), prose naming its section. Tests answer their special cases first and hand the rest here."""
    if req.kind == "book":
        return Answer(titles(["Foundations"], "The Test Book"))
    if req.kind == "part":
        return Answer(titles(["Basics", "Practice"]))
    if req.kind == "chapter":
        return Answer(titles([f"{req.title} {i}" for i in range(1, 5)]))
    if req.kind == "section":
        return Answer(prose(req.title))
    if req.kind == "brief":
        return Answer(BRIEF)
    raise AssertionError(f"unexpected request: {req.prompt[:200]!r}")
