"""What a job run as the real CLI leaves behind, checked while it runs and after: the sections its journal holds,
and a whole book (every section there, none failed, empty or missing)."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import time
from pathlib import Path


def journal_sections(out: Path) -> int:
    if not (out / "journal.sqlite").exists():
        return 0
    db = sqlite3.connect(out / "journal.sqlite", timeout=5)
    try:
        return db.execute("SELECT count(*) FROM nodes WHERE kind='section'").fetchone()[0]
    except sqlite3.OperationalError:  # the schema is not there yet
        return 0
    finally:
        db.close()


def wait_for_sections(proc: subprocess.Popen, out: Path, n: int, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = journal_sections(out)
        if done >= n:
            return done
        assert proc.poll() is None, "the job ended before it was stopped"
        time.sleep(0.05)
    raise AssertionError(f"fewer than {n} sections after {timeout} s")


def section_bodies(md: str) -> list[str]:
    return re.split(r"^#### .+$", md, flags=re.MULTILINE)[1:]


def assert_whole_book(out: Path, sections: int) -> dict:
    stats = json.loads((out / "stats.json").read_text())
    assert stats["sections"] == sections
    assert stats["failed_sections"] == 0 and stats["empty_sections"] == 0
    md = (out / "book.md").read_text()
    bodies = section_bodies(md)
    assert len(bodies) == sections
    assert all(len(b.split()) > 5 for b in bodies)
    assert "Incomplete" not in md and "This section is missing" not in md
    return stats
