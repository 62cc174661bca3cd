"""The simulator's command line and launcher: bad flags are a one-line exit 2, a port in use is a clear error, a
fleet that cannot start raises with its output, and stopping is clean.

A server that cannot start makes the test fail (SimFleet raises), never skip.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.sim.launch import SimFleet

REPO = Path(__file__).resolve().parents[2]


# -- fleets ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fleet(sim_fleet):
    return sim_fleet(2, time_scale=0.05)


# -- CLI and launcher ------------------------------------------------------------------------------------------


def _sim(*args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "orchestrator", "sim", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, check=False)


@pytest.mark.parametrize("args, words", [
    (["--cards", "0"], "--cards"),
    (["--fail-rate", "1.5"], "--fail-rate"),
    (["--fail-rate", "0.6", "--drop-rate", "0.6"], "add up"),
    (["--time-scale", "0"], "--time-scale"),
    (["--down-cards", "3", "--down-after", "1"], "--down-cards"),
    (["--down-for", "1"], "--down-after"),
])
def test_cli_bad_flags_exit_2_with_one_line(args, words):
    p = _sim(*args)
    assert p.returncode == 2, p
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in p.stderr


def test_port_in_use_is_a_clear_error(fleet):
    p = _sim("--port", str(fleet.port), "--procs", "1")
    assert p.returncode == 2
    assert "already in use" in p.stderr


def test_simfleet_start_failure_raises_with_output():
    with pytest.raises(RuntimeError, match="fail-rate"):
        SimFleet(1, fail_rate=3).start()


def test_stop_is_clean_and_prints_urls():
    f = SimFleet(3, procs=2, time_scale=0.1).start()
    try:
        assert len(f.urls) == 3 and len({u for u in f.urls}) == 3
        for i, u in enumerate(f.urls):
            assert f"sim card {i}: {u}" in f.output
        assert "sim ready" in f.output
        proc = f.process
    finally:
        f.stop()
    assert proc.returncode == 0
    assert "sim stopped" in f.output
