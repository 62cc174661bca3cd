"""The job's states are enums that mypy checks: a typo is a type error, not a new state; every stop has its status;
and a job whose outline could not be made is journaled as failed."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from scripted_openai import Answer, ScriptedServer

from orchestrator import Settings, generate
from orchestrator.core.errors import PlanError
from orchestrator.core.states import NodeKind, RunStatus, Stop, status_after


def test_every_stop_has_its_status_and_a_typo_is_no_stop():
    assert status_after(None) is RunStatus.COMPLETE
    assert {s: status_after(s) for s in Stop} == {
        Stop.INTERRUPT: RunStatus.INTERRUPTED, Stop.CANCEL: RunStatus.INTERRUPTED,
        Stop.ALL_DOWN: RunStatus.ABORTED, Stop.OUTPUT: RunStatus.ABORTED,
    }
    with pytest.raises(ValueError):
        Stop("interupt")
    assert NodeKind("section") is NodeKind.SECTION and NodeKind.SECTION == "section"  # journaled as it was


def test_mypy_refuses_a_misspelt_state(tmp_path):
    """What the enums are for: the old ``.get(stop, "interrupted")`` took any string; now mypy says no."""
    snippet = tmp_path / "typo.py"
    snippet.write_text(textwrap.dedent("""
        from orchestrator.core.states import NodeKind, RunStatus, status_after
        from orchestrator.job.writing import Writer
        from orchestrator.dispatch.journal import Journal

        def f(w: Writer, j: Journal) -> None:
            w.stop = "interupt"
            status_after("all-down")
            j.end_run("complet", 0)
            j.get("1.1.1", "sektion", "A title")
    """))
    import os

    import orchestrator

    root = Path(orchestrator.__file__).resolve().parents[1]  # mypy finds the package here, editable install or not
    env = {**os.environ, "MYPYPATH": str(root)}
    r = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary", "--follow-imports=silent",
                        "--no-site-packages", "--cache-dir", str(tmp_path / "mypy-cache"), str(snippet)],
                       capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    errors = [line for line in r.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 4, r.stdout + r.stderr
    assert all("incompatible type" in e or "Incompatible types" in e for e in errors), errors


def _unplannable(req):
    return Answer(status=400, error="this server will not plan")  # a refusal: not retried, the outline fails


def test_a_job_whose_outline_cannot_be_made_is_journaled_as_failed(tmp_path):
    with ScriptedServer(_unplannable) as srv:
        with pytest.raises(PlanError):
            generate("A handbook of tide pools", [srv.url], Settings(parts=2, chapters=2, sections=2, attempts=2,
                                                                     formats=("md",)), tmp_path / "o")
    db = sqlite3.connect(tmp_path / "o" / "journal.sqlite")
    statuses = [s for (s,) in db.execute("SELECT status FROM runs")]
    db.close()
    assert statuses == [RunStatus.FAILED]
