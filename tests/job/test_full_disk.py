"""Nothing lost to a full disk: the job stops asking for text it cannot keep, ends with its own exit code and one
line, and a rerun once there is room resumes from the journal; no output file is ever left half-written.

The full disk is real: a small tmpfs mounted by the test (it runs as root here, as CI does; a test that cannot
mount fails, it does not skip). Each output file's write is also failed on purpose (``osutil._sync``, the step
between writing a file's temporary copy and renaming it into place), and the file that stood must stand unchanged.
"""

from __future__ import annotations

import errno
import re
import sqlite3
import subprocess
from pathlib import Path

import orjson
import pytest
from local_http import env, job_cmd

from orchestrator.cli.main import main
from orchestrator.core import osutil
from orchestrator.core.errors import OUTPUT_FAILED_EXIT, TYPESET_FAILED_EXIT

PROMPT = "A handbook of incident response"
SHAPE = ["--parts", "2", "--chapters", "3", "--sections", "16", "--words", "120", "--max-tokens", "240"]
SECTIONS = 2 * 3 * 16
PLANNING = 1 + 2 + 2 * 3  # requests a fresh job makes for its outline
CAP = 4


def _mount(where: Path, size: str) -> None:
    where.mkdir(exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True,
                       text=True)
    if r.returncode != 0:  # a failure, not a skip: this test is the only proof that a full disk loses nothing
        pytest.fail(f"cannot mount a {size} tmpfs at {where} (the full-disk test needs root): {r.stderr.strip()}")


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    _mount(disk, "256k")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.fixture(scope="module")
def cards(sim_fleet):
    return sim_fleet(2)


def _served(cards) -> int:
    return sum(cards.stats(i)["requests"] for i in range(2))


def _journal_sections(out: Path) -> int:
    db = sqlite3.connect(out / "journal.sqlite")
    try:
        return db.execute("SELECT count(*) FROM nodes WHERE kind = 'section'").fetchone()[0]
    finally:
        db.close()


def test_a_full_disk_stops_the_job_and_the_rerun_resumes(cards, small_disk):
    out = small_disk / "book"
    cmd = job_cmd(PROMPT, cards.urls, out, *SHAPE, "--cap", str(CAP))
    before = _served(cards)
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env())
    served = _served(cards) - before
    lines = first.stderr.strip().splitlines()
    assert first.returncode == OUTPUT_FAILED_EXIT, first.stderr
    assert "Traceback" not in first.stderr
    assert len(lines) == 1, first.stderr  # one line: no warning before it
    m = re.fullmatch(r"handbook: error: cannot write (\S+): (.+); (\d+) finished section\(s\)(?: and \d+ outline "
                     r"node\(s\))? are safe in (\S+): free space and rerun to resume", lines[0])
    assert m is not None, lines[0]
    assert m.group(1) == str(out / "journal.sqlite") and "full" in m.group(2)
    safe = int(m.group(3))
    assert 0 < safe < SECTIONS
    # Dispatching stopped at once: what the servers were asked for is what was kept plus, at most, what was in
    # flight (CAP per card) and the outline's requests: not the whole book.
    assert served <= PLANNING + safe + 2 * CAP + 4, (served, safe)
    for f in out.iterdir():  # nothing half-written, no temporary copy left behind
        assert ".tmp" not in f.name, f
        assert f.name.startswith("journal.sqlite") or f.stat().st_size > 0, f

    subprocess.run(["mount", "-o", "remount,size=32m", str(small_disk)], check=True)
    assert _journal_sections(out) == safe  # what the message said is what the journal holds
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env())
    assert again.returncode == 0, again.stderr
    stats = orjson.loads((out / "stats.json").read_bytes())
    assert stats["resumed_sections"] == safe
    assert stats["sections"] == SECTIONS and stats["failed_sections"] == 0 and stats["empty_sections"] == 0
    assert stats["requests"] < SECTIONS + PLANNING  # fewer than a fresh job asks for
    assert stats["requests"] - stats["planning_requests"] <= SECTIONS - safe + 8  # retries at most beside
    book = (out / "book.md").read_text()
    assert book.count("\n#### ") == SECTIONS
    print(f"\nfull disk: {served} requests served before the stop, {safe} sections safe; the rerun made "
          f"{stats['requests']} requests (a fresh job: {SECTIONS + PLANNING})")


def test_a_disk_full_from_the_start_is_one_line(cards, small_disk):
    (small_disk / "filler").write_bytes(b"\0" * (256 * 1024))  # no room at all: ENOSPC
    out = small_disk / "book"
    r = subprocess.run(job_cmd(PROMPT, cards.urls, out, *SHAPE), capture_output=True, text=True, timeout=60,
                       env=env())
    assert r.returncode == OUTPUT_FAILED_EXIT, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "free space and rerun" in r.stderr


# -- every output file, written whole or not at all -----------------------------------------------------------------

TINY = ["--parts", "1", "--chapters", "1", "--sections", "2", "--words", "40", "--max-tokens", "80", "-q"]
# file -> how the run that rewrites it ends when its write fails: typesetting failures keep their own code (the
# book is written; `handbook typeset` retries the PDF)
OUTPUTS = {
    "book.md": OUTPUT_FAILED_EXIT, "outline.json": OUTPUT_FAILED_EXIT, "stats.json": OUTPUT_FAILED_EXIT,
    "defects.json": OUTPUT_FAILED_EXIT, "defects.md": OUTPUT_FAILED_EXIT, "forecast.json": OUTPUT_FAILED_EXIT,
    "book.html": TYPESET_FAILED_EXIT, "book.pdf": TYPESET_FAILED_EXIT,
}


@pytest.fixture(scope="module")
def made(cards, tmp_path_factory):
    """A whole tiny book with every output file, and `handbook plan`'s outline.md beside it."""
    out = tmp_path_factory.mktemp("whole") / "book"
    backends = [a for u in cards.urls for a in ("--backend", u)]
    job = [PROMPT, "--out", str(out), *TINY, *backends, "--format", "md,html,pdf", "--forecast"]
    assert main(job) == 0
    plan = ["plan", PROMPT, "--out", str(out), *TINY, *backends]
    assert main(plan) == 0
    return out, job, plan


def _fail_writes_of(monkeypatch, name: str) -> list[Path]:
    """Every write of ``name`` fails with ENOSPC once its temporary copy is written; returns the copies tried."""
    stem, suffix = name.rsplit(".", 1)
    tried: list[Path] = []
    real = osutil._sync

    def sync(path: Path) -> None:
        if path.name.startswith(f".{stem}.") and path.name.endswith(f".tmp.{suffix}"):
            tried.append(path)
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path)

    monkeypatch.setattr(osutil, "_sync", sync)
    return tried


@pytest.mark.parametrize("name", [*OUTPUTS, "outline.md"])
def test_a_failed_write_leaves_the_file_that_stood(made, monkeypatch, capsys, name):
    out, job, plan = made
    target = out / name
    assert target.stat().st_size > 0
    before = target.read_bytes()
    tried = _fail_writes_of(monkeypatch, name)
    capsys.readouterr()
    code = main(plan if name == "outline.md" else job)
    err = capsys.readouterr().err
    assert tried, f"{name} was not written by this run"
    assert target.read_bytes() == before  # the good file stands, whole
    assert not [p for p in out.iterdir() if ".tmp" in p.name]  # and no temporary copy is left
    assert "Traceback" not in err
    assert code == OUTPUTS.get(name, OUTPUT_FAILED_EXIT), err
    if code == OUTPUT_FAILED_EXIT:
        assert f"cannot write {target}: No space left on device" in err, err
        assert "free space and rerun to resume" in err
    else:
        assert "No space left on device" in err, err


def test_a_wrong_statement_is_a_bug_not_a_full_disk(tmp_path):
    """Only the database failing to store is a lost output; a statement or parameter of ours that is wrong
    propagates (an internal error), and the journal takes the next write as before."""
    import sqlite3

    from orchestrator.core.config import Settings
    from orchestrator.dispatch.journal import Journal

    j = Journal.open(tmp_path, "A prompt", Settings())
    try:
        with pytest.raises(sqlite3.OperationalError, match="no such table"):
            j._write("INSERT INTO nope VALUES (?)", (1,))
        with pytest.raises(sqlite3.ProgrammingError):
            j._write("INSERT INTO meta (key, value) VALUES (?, ?)", ("k", {}))
        assert j.failure is None and j.failures == 0
        j.set_meta("k", "v")
    finally:
        j.close()
