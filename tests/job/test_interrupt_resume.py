"""Nothing lost (issue 4) when a job is stopped: kill -9 (while writing or while planning) and Ctrl-C (once: what
exists is written; twice: it stops at once), each followed by a rerun that resumes from the journal.

Every job here is the real CLI in a subprocess against simulated cards (or a tiny fake server) on 127.0.0.1.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import time

import pytest
from book_checks import assert_whole_book, journal_sections, wait_for_sections
from fake_openai import FakeServer
from local_http import env, job_cmd

# -- kill -9 and resume -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cards(sim_fleet):
    return sim_fleet(3)


BOOK = ["--parts", "2", "--chapters", "4", "--sections", "12", "--words", "60", "--max-tokens", "120",
        "--cap", "6"]


def test_kill_9_then_resume(cards, tmp_path):
    out = tmp_path / "o"
    cmd = job_cmd("A handbook of incident response", cards.urls, out, *BOOK)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env())
    wait_for_sections(proc, out, 48)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert proc.returncode == -signal.SIGKILL
    done = journal_sections(out)  # what the journal holds after the kill (committed nodes only)
    unfinished = 96 - done
    assert 48 <= done < 96
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env())
    assert again.returncode == 0, again.stderr
    stats = assert_whole_book(out, 96)
    section_requests = stats["requests"] - stats["planning_requests"]
    assert stats["resumed_sections"] == done
    assert stats["planning_requests"] == 0 and stats["plan"] == [0, 0, 0]
    assert section_requests <= unfinished
    db = sqlite3.connect(out / "journal.sqlite")
    runs = db.execute("SELECT id, status, requests, resumed FROM runs ORDER BY id").fetchall()
    db.close()
    assert runs[0][1] == "running" and runs[1][1] == "complete" and runs[1][3] == done
    print(f"\nkill test: killed at {done}/96 sections in the journal; the rerun made {section_requests} section "
          f"requests for {unfinished} unfinished, resumed {stats['resumed_sections']}")


def test_kill_during_planning_resumes_the_planned_nodes(cards, tmp_path):
    out = tmp_path / "o"
    cmd = job_cmd("A handbook of type systems", cards.urls, out, *BOOK)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env())
    deadline = time.monotonic() + 60
    planned = 0
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            db = sqlite3.connect(out / "journal.sqlite", timeout=5)
            planned = db.execute("SELECT count(*) FROM nodes WHERE kind IN ('book', 'part')").fetchone()[0]
            db.close()
        except sqlite3.Error:
            planned = 0
        if planned >= 3:  # the book and both parts are in; the chapters are being asked for
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert planned >= 3
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env())
    assert again.returncode == 0, again.stderr
    stats = assert_whole_book(out, 96)
    assert stats["plan"][0] == 0 and stats["plan"][1] == 0  # the book and part nodes came from the journal
    assert stats["requests"] - stats["planning_requests"] == 96 - stats["resumed_sections"]


# -- Ctrl-C ----------------------------------------------------------------------------------------------------


def test_ctrl_c_writes_what_exists_and_resumes(cards, tmp_path):
    out = tmp_path / "o"
    cmd = job_cmd("A handbook of observability", cards.urls, out, *BOOK)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
    at_signal = wait_for_sections(proc, out, 30)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert time.monotonic() - t0 < 10
    assert "Traceback" not in stderr
    assert "interrupted" in stderr and "rerun the same command to resume" in stderr
    done = journal_sections(out)
    assert at_signal <= done < 96  # requests in flight were let finish, nothing new was started
    md = (out / "book.md").read_text()
    assert "Incomplete" in md and "interrupted" in md
    stats = json.loads((out / "stats.json").read_text())
    assert stats["interrupted"] is True
    # the sections the Ctrl-C left unwritten are interrupted, not failed
    assert stats["sections"] == 96 and stats["interrupted_sections"] == 96 - done and stats["failed_sections"] == 0
    assert (out / "outline.json").exists()
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env())
    assert again.returncode == 0, again.stderr
    stats = assert_whole_book(out, 96)
    assert stats["resumed_sections"] == done
    assert stats["requests"] - stats["planning_requests"] == 96 - done


def test_second_ctrl_c_stops_at_once(tmp_path):
    out = tmp_path / "o"
    # Sections that take ~10 s each: after the first Ctrl-C the job would wait out its grace; the second ends it.
    with FakeServer("ok", section_chunk_delay=0.4) as srv:
        cmd = job_cmd("A handbook of patience", [srv.url], out, "--parts", "1", "--chapters", "2", "--sections",
                      "3")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
        deadline = time.monotonic() + 60
        while srv.sections_started < 6 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert time.monotonic() - t0 < 3
    assert "Traceback" not in stderr
    assert "second Ctrl-C" in stderr and "rerun the same command to resume" in stderr
    db = sqlite3.connect(out / "journal.sqlite")
    assert db.execute("SELECT value FROM meta WHERE key='outline'").fetchone() is not None
    db.close()
