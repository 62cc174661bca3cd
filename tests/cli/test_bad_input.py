"""Every bad input gets a one-line message and its exit code, never a traceback (issue 4, item 6).

Each case runs the real CLI (``python -m orchestrator ...``) in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_run import handbook, one_line_error
from fake_openai import FakeServer

from orchestrator.core.osutil import free_port
from orchestrator.sim.launch import SimFleet

SECRET = "sk-test-very-secret-key-0123456789abcdef"
SMALL = ["--parts", "1", "--chapters", "2", "--sections", "2", "--words", "40", "--max-tokens", "60",
         "--format", "md", "-q"]


@pytest.fixture(scope="module")
def card(sim_fleet):
    return sim_fleet(1).urls[0]


# -- flags and job files ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("prompt", ["", "   "])
def test_empty_prompt(prompt):
    line = one_line_error(handbook(prompt, "--backend", "http://127.0.0.1:9/v1"), 2)
    assert "prompt is empty" in line


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--parts", "0", "at least 1"),
        ("--chapters", "-3", "at least 1"),
        ("--sections", "2.5", "whole number"),
        ("--cap", "0", "at least 1"),
        ("--cap", "many", "whole number"),
        ("--words", "-1", "at least 1"),
        ("--max-tokens", "1e3", "whole number"),
    ],
)
def test_bad_numbers(flag, value, says):
    line = one_line_error(handbook("A book", flag, value, "--backend", "http://127.0.0.1:9/v1"), 2)
    assert flag in line and says in line


@pytest.mark.parametrize(
    "url",
    ["localhost:8000", "http://:8000/v1", "http://127.0.0.1:99999/v1", "ftp://127.0.0.1/v1",
     "http://127.0.0.1:8000/api"],
)
def test_malformed_url(url):
    line = one_line_error(handbook("A book", "--backend", url), 2)
    assert "backend URL" in line and url in line


def test_unreachable_backend_exit_3_fast(tmp_path):
    url = f"http://127.0.0.1:{free_port()}/v1"
    t0 = time.monotonic()
    proc = handbook("A book", "--backend", url, "--out", str(tmp_path / "o"), *SMALL)
    assert time.monotonic() - t0 < 10
    line = one_line_error(proc, 3)
    assert "cannot reach" in line and url in line


def test_invalid_toml_names_its_line(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('prompt = "A book"\nparts = 2\nchapters = = 3\n')
    line = one_line_error(handbook("--config", str(job)), 2)
    assert "invalid TOML" in line and "line 3" in line


def test_unknown_toml_key_names_its_line(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('prompt = "A book"\nparts = 2\n\nchapterz = 3\n')
    line = one_line_error(handbook("--config", str(job)), 2)
    assert "'chapterz'" in line and "line 4" in line


def test_bad_value_in_toml(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('prompt = "A book"\nparts = 0\nbackends = ["http://127.0.0.1:9/v1"]\n')
    line = one_line_error(handbook("--config", str(job)), 2)
    assert "parts" in line and "at least 1" in line


def test_out_dir_cannot_be_written(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    line = one_line_error(handbook("A book", "--backend", "http://127.0.0.1:9/v1", "--out",
                                   str(blocker / "out")), 2)
    assert "cannot write to output directory" in line


# -- servers that are not what they should be -------------------------------------------------------------------


def test_not_an_openai_server(tmp_path):
    with FakeServer("not-openai") as srv:
        line = one_line_error(handbook("A book", "--backend", srv.url, "--out", str(tmp_path / "o"), *SMALL), 3)
    assert "not an OpenAI-compatible server" in line and srv.url in line


def test_wrong_model_names_the_models_offered(card, tmp_path):
    line = one_line_error(handbook("A book", "--backend", card, "--model", "gpt-9", "--out", str(tmp_path / "o"),
                                   *SMALL), 2)
    assert "'gpt-9'" in line and "sim-qwen3" in line


def test_401_never_prints_the_key(tmp_path):
    with FakeServer("auth", key="the-right-key") as srv:
        proc = handbook("A book", "--backend", srv.url, "--api-key", SECRET, "--out", str(tmp_path / "o"), *SMALL)
        proc_env = handbook("A book", "--backend", srv.url, "--out", str(tmp_path / "o2"), *SMALL,
                            env={"OPENAI_API_KEY": SECRET})
        assert any(SECRET in a for a in srv.auth_seen)  # it was sent...
    for p in (proc, proc_env):
        line = one_line_error(p, 3)
        assert "refused the API key" in line and "401" in line
        assert SECRET not in p.stdout + p.stderr  # ...but never printed
        assert SECRET[-8:] not in p.stdout + p.stderr


def test_outline_replies_unusable_after_retries_name_the_node(tmp_path):
    with FakeServer("garbage") as srv:
        proc = handbook("A book", "--backend", srv.url, "--attempts", "2", "--out", str(tmp_path / "o"), *SMALL)
    line = one_line_error(proc, 1)
    assert "outline could not be made" in line
    assert "node '1' (part 'Part topic 1')" in line
    assert "unusable reply" in line


# -- the out dir's journal --------------------------------------------------------------------------------------


def test_out_dir_holding_another_jobs_journal(card, tmp_path):
    import json
    import sqlite3

    out = tmp_path / "o"
    first = handbook("A book about gardens", "--backend", card, "--out", str(out), *SMALL)
    assert first.returncode == 0, first.stderr
    assert (out / "journal.sqlite").exists()
    gardens_md = (out / "book.md").read_text()
    line = one_line_error(handbook("A book about boats", "--backend", card, "--out", str(out), *SMALL), 2)
    assert "another job's journal" in line and "A book about gardens" in line and "--fresh" in line
    # Settings that would change the book: say so and stop...
    line = one_line_error(handbook("A book about gardens", "--backend", card, "--out", str(out), *SMALL,
                                   "--sections", "3"), 2)
    assert "sections 2 -> 3" in line and "--fresh" in line
    # ...unless --fresh.
    again = handbook("A book about boats", "--backend", card, "--out", str(out), *SMALL, "--fresh")
    assert again.returncode == 0, again.stderr
    # --fresh started over: the journal is the new job's alone (its prompt, one run), nothing was resumed, the
    # whole outline was asked for again, and book.md is the new book, not the old one.
    db = sqlite3.connect(out / "journal.sqlite")
    try:
        assert db.execute("SELECT value FROM meta WHERE key='prompt'").fetchone() == ("A book about boats",)
        assert [r[0] for r in db.execute("SELECT status FROM runs")] == ["complete"]
        assert db.execute("SELECT count(*) FROM nodes WHERE kind='section'").fetchone() == (4,)
    finally:
        db.close()
    stats = json.loads((out / "stats.json").read_text())
    assert stats["resumed_sections"] == 0 and stats["sections"] == 4 and stats["failed_sections"] == 0
    assert stats["plan"] == [1, 1, 2]  # every outline node asked for again (a resumed one counts 0)
    assert (out / "book.md").read_text() != gardens_md


def test_not_a_journal(card, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "journal.sqlite").write_bytes(b"this is not a database, it is a text file " * 50)
    line = one_line_error(handbook("A book", "--backend", card, "--out", str(out), *SMALL), 2)
    # names the file, says what it is not, and how to go on
    assert str(out / "journal.sqlite") in line and "handbook journal" in line and "--fresh" in line


def journal_sections(out: Path) -> int:
    import sqlite3

    if not (out / "journal.sqlite").exists():
        return 0
    db = sqlite3.connect(out / "journal.sqlite", timeout=5)
    try:
        return db.execute("SELECT count(*) FROM nodes WHERE kind='section'").fetchone()[0]
    except sqlite3.OperationalError:  # not created yet
        return 0
    finally:
        db.close()


def test_all_backends_down_exit_3_journal_intact(tmp_path):
    """Every backend goes away mid-job: exit 3 with a clear message; the journal keeps the outline and what was
    finished, so the same command resumes once a backend is back."""
    import json
    import sqlite3

    job = tmp_path / "job.toml"
    job.write_text("all_down_timeout_s = 2.0\nconnect_timeout_s = 2.0\n")
    out = tmp_path / "o"
    args = ["A book about rivers", "--config", str(job), "--out", str(out), "--parts", "2", "--chapters", "3",
            "--sections", "8", "--words", "100", "--max-tokens", "150", "--cap", "4", "--format", "md", "-q"]
    e = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "HANDBOOK_BACKENDS")}
    with SimFleet(cards=2) as fleet:
        cmd = [sys.executable, "-m", "orchestrator", *args, *[a for u in fleet.urls for a in ("--backend", u)]]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)
        deadline = time.monotonic() + 120
        while journal_sections(out) < 8 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        t_down = time.monotonic()
        fleet.stop()  # every card gone at once
        stdout, stderr = proc.communicate(timeout=60)
    assert time.monotonic() - t_down < 20
    line = one_line_error(subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr), 3)
    assert "every backend stopped answering" in line and "rerun the same command to resume" in line
    db = sqlite3.connect(out / "journal.sqlite")
    assert db.execute("SELECT value FROM meta WHERE key='outline'").fetchone() is not None
    db.close()
    done = journal_sections(out)
    assert 8 <= done < 48
    assert "Incomplete" in (out / "book.md").read_text()
    # The same command against live cards resumes and requests only what is missing.
    with SimFleet(cards=2) as fleet:
        proc = handbook(*args, *[a for u in fleet.urls for a in ("--backend", u)])
    assert proc.returncode == 0, proc.stderr
    stats = json.loads((out / "stats.json").read_text())
    assert stats["resumed_sections"] == done
    assert stats["requests"] - stats["planning_requests"] == 48 - done
    assert stats["planning_requests"] == 0 and stats["sections"] == 48 and stats["failed_sections"] == 0


def test_secrets_never_written(card, tmp_path):
    """The API key goes to the server, never into logs, stats, the journal or any output."""
    out = tmp_path / "o"
    job = tmp_path / "job.toml"
    job.write_text(f'api_key = "{SECRET}"\n')
    dead = f"http://127.0.0.1:{free_port()}/v1"  # a warning about it goes to the log
    proc = handbook("A book about keys", "--backend", card, "--backend", dead, "--out", str(out),
                    "--format", "md,html", "--parts", "1", "--chapters", "2", "--sections", "2", "--words", "40",
                    "--max-tokens", "60", env={"OPENAI_API_KEY": SECRET})
    assert proc.returncode == 0, proc.stderr
    assert "leaving out a backend" in proc.stderr
    proc2 = handbook("A book about keys", "--backend", card, "--out", str(out), "--config", str(job), "-q",
                     "--format", "md,html", "--parts", "1", "--chapters", "2", "--sections", "2", "--words", "40",
                     "--max-tokens", "60")
    assert proc2.returncode == 0, proc2.stderr
    files = [p for p in Path(out).rglob("*") if p.is_file()]
    assert {"book.md", "stats.json", "journal.sqlite", "outline.json"} <= {p.name for p in files}
    for p in files:
        data = p.read_bytes()
        assert SECRET.encode() not in data, p
        assert SECRET[-12:].encode() not in data, p
    for p in (proc, proc2):
        assert SECRET not in p.stdout + p.stderr


def test_a_prompt_template_put_at_the_top_of_templates_is_an_error_not_ignored(card, tmp_path):
    # prompts live in DIR/prompts/ as in the bundled folder; one put in DIR itself would never be read
    (tmp_path / "tpl").mkdir()
    (tmp_path / "tpl" / "section.j2").write_text("Write {{ section }}.")
    line = one_line_error(handbook("A book", "--backend", card, "--templates", str(tmp_path / "tpl"), *SMALL,
                                   "--out", str(tmp_path / "o")), 2)
    assert "section.j2 is a prompts template" in line and str(tmp_path / "tpl" / "prompts") in line
    (tmp_path / "tpl" / "prompts").mkdir()
    (tmp_path / "tpl" / "prompts" / "section.j2").write_text("Write {{ section }}.")
    proc = handbook("A book", "--backend", card, "--templates", str(tmp_path / "tpl"), *SMALL, "--context", "none",
                    "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr
