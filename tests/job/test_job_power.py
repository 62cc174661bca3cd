"""A job's GPU power (issue 26, part 2): --power per backend gives stats.json energy_j and tokens_per_joule with
their coverage; without it the job says "power: not available (...)" and runs as before."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from cli_run import handbook

SMALL = ["--parts", "1", "--chapters", "2", "--sections", "3", "--words", "60", "--max-tokens", "90",
         "--format", "md", "-q"]


@pytest.fixture(scope="module")
def cards(sim_fleet):
    return sim_fleet(2)


def stats_of(out: Path) -> dict:
    return json.loads((out / "stats.json").read_text())


def test_job_with_power_on_every_backend(cards, tmp_path):
    out = tmp_path / "book"
    # longer sections than SMALL's: a writing window of several of the sampler's 0.5 s rounds, so that the counter's
    # joules and the gauge's mean watts (each read at the rounds nearest the window's ends) agree within 10%
    argv = ["A handbook of kites", *SMALL, "--words", "200", "--max-tokens", "300", "--out", str(out)]
    for url, power in zip(cards.urls, cards.power_urls, strict=True):
        argv += ["--backend", url, "--power", power]
    proc = handbook(*argv)
    assert proc.returncode == 0, proc.stderr
    st = stats_of(out)
    p = st["power"]
    assert p["available"] and p["coverage"] == "2 of 2 backends" and p["energy_source"] == "counter"
    assert st["energy_j"] == p["energy_j"] > 0 and st["tokens_per_joule"] == p["tokens_per_joule"] > 0
    # joules over the writing window: mean watts x its length (the window of stats.json's write_time_s)
    assert p["energy_j"] == pytest.approx(p["power_w"] * st["write_time_s"], rel=0.1)
    assert set(p["per_backend"]) == set(cards.urls)
    sc = st["server_counted"]
    assert 0 < sc["kv_cache_usage_peak"] <= 1
    # a chapter's section requests share their prompt's prefix (book, brief, part, chapter): the cards find it cached
    assert 0 < sc["prefix_cache_hit_rate"] < 1 and sc["prefix_cache_coverage"] == "2 of 2"
    assert "power while writing:" in proc.stdout and "tokens per joule" in proc.stdout


def test_job_without_power_says_so_and_runs_as_before(cards, tmp_path):
    out = tmp_path / "book"
    proc = handbook("A handbook of kites", *SMALL, "--backend", cards.urls[0], "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    st = stats_of(out)
    assert st["energy_j"] is None and st["tokens_per_joule"] is None
    assert st["power"]["available"] is False and st["power"]["reason"] == "no --power endpoint given"
    assert "power: not available (no --power endpoint given)" in proc.stdout
    assert st["failed_sections"] == 0 and st["sections"] == 6


def test_power_on_some_backends_covers_only_their_tokens(cards, tmp_path):
    out = tmp_path / "book"
    job = tmp_path / "job.toml"
    job.write_text(f'prompt = "A handbook of kites"\nbackends = [{{url = "{cards.urls[0]}", power = '
                   f'"{cards.power_urls[0]}"}}, "{cards.urls[1]}"]\n')
    proc = handbook("--config", str(job), *SMALL, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    st = stats_of(out)
    p = st["power"]
    assert p["coverage"] == "1 of 2 backends" and p["covered_backends"] == [cards.urls[0]]
    assert p["uncovered_backends"] == [{"url": cards.urls[1], "reason": "no --power endpoint given"}]
    # the covered card's tokens over the writing window (its sections'; the planning, the brief's included, ended
    # before the first section with --context outline), not the fleet's
    db = sqlite3.connect(out / "journal.sqlite")
    (mine,) = db.execute("SELECT sum(completion_tokens) FROM nodes WHERE kind = 'section' AND backend = ?",
                         (cards.urls[0],)).fetchone()
    db.close()
    assert p["tokens"] == pytest.approx(mine, rel=0.2, abs=30)
    assert "power (1 of 2 backends) while writing" in proc.stdout


@pytest.mark.parametrize(("power", "says"), [
    (["http://127.0.0.1:9400", "http://127.0.0.1:9401"], "--power given 2 time(s) for 1 backend(s)"),
    (["gpu0:9400"], "malformed power endpoint"),
    (["http://127.0.0.1:9400#gpu"], "gpu=LABEL"),
])
def test_bad_power_flags_exit_2_with_one_line(power, says, tmp_path):
    argv = ["A handbook of kites", "--backend", "http://127.0.0.1:9/v1", "--out", str(tmp_path / "x")]
    for p in power:
        argv += ["--power", p]
    proc = handbook(*argv, timeout=60)
    assert proc.returncode == 2, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("handbook: error:")]
    assert len(errors) == 1 and says in errors[0] and "Traceback" not in proc.stderr


def test_write_without_backends_keeps_the_power_pages_the_plan_was_given(cards, tmp_path):
    out = tmp_path / "book"
    argv = ["plan", "A handbook of kites", *SMALL, "--out", str(out)]
    for url, power in zip(cards.urls, cards.power_urls, strict=True):
        argv += ["--backend", url, "--power", power]
    proc = handbook(*argv)
    assert proc.returncode == 0, proc.stderr
    proc = handbook("write", str(out), "-q")  # no --backend: the plan's backends, each with its power page
    assert proc.returncode == 0, proc.stderr
    p = stats_of(out)["power"]
    assert p["available"] and p["coverage"] == "2 of 2 backends", p
