"""`handbook bench --power` (issue 26, part 2): each level's watts, joules and tokens per joule, on one and on two
simulated cards, read from their dcgm-exporter-like pages; and the flag's errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import cli

ROOT = Path(__file__).resolve().parents[2]
TS = 2.0
# The reference's one-card column (shared/reference_run.json, ladder_one_card_plain): streams -> gpu_power_w
REFERENCE_W = {1: 384.6, 16: 424.5, 256: 493.7}


def bench(*argv: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator", "bench", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, check=False)


@pytest.fixture(scope="module")
def one_card(sim_fleet, tmp_path_factory):
    fleet = sim_fleet(1, time_scale=TS)
    out = tmp_path_factory.mktemp("power1")
    proc = bench("--backend", fleet.urls[0], "--power", fleet.power_urls[0], "--streams", "1,16,256",
                 "--window", "3", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    return proc, json.loads((out / "ladder.json").read_text())


def test_one_card_reproduces_the_reference_power_column(one_card):
    proc, ladder = one_card
    assert ladder["time_scale"] == TS
    for lv in ladder["levels"]:
        # wall watts x time scale = the model's draw (sim/power.py), within 5% of the reference's column
        assert lv["power_w"] * TS == pytest.approx(REFERENCE_W[lv["streams"]], rel=0.05)
        assert lv["energy_source"] == "counter"
        assert lv["power"]["coverage"] == "1 of 1 backend"
        # tokens per joule: the window's server-counted tokens / its joules = sustained / mean watts
        assert lv["tokens_per_joule"] == pytest.approx(lv["sustained_tok_s"] / lv["power_w"], rel=0.05)
        assert lv["energy_j"] == pytest.approx(lv["power_w"] * lv["window_s"], rel=0.05)
        assert 0 <= lv["kv_cache_usage"]["median"] <= lv["kv_cache_usage"]["max"] <= 1
    tpj = [lv["tokens_per_joule"] for lv in ladder["levels"]]
    assert tpj == sorted(tpj)  # batching buys tokens faster than it costs watts
    assert "tokens" in proc.stdout and "per joule" in proc.stdout
    assert proc.stderr.count("tok/J") == 3


def test_two_cards_sum_their_power(sim_fleet, tmp_path):
    fleet = sim_fleet(2, time_scale=TS)
    entries = ", ".join(f'{{url = "{u}", power = "{p}"}}' for u, p in zip(fleet.urls, fleet.power_urls, strict=True))
    cfg = tmp_path / "bench.toml"
    cfg.write_text(f"backends = [{entries}]\nstreams = [1, 16]\nwindow = 2\n")
    proc = bench("--config", str(cfg), "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    ladder = json.loads((tmp_path / "out" / "ladder.json").read_text())
    for lv in ladder["levels"]:
        p = lv["power"]
        assert p["coverage"] == "2 of 2 backends" and p["covered_share"] == 1
        cards = p["per_backend"]
        assert set(cards) == set(fleet.urls)
        assert lv["power_w"] == pytest.approx(sum(c["power_w"] for c in cards.values()), abs=0.2)
        for c in cards.values():  # each card its own draw at that many streams
            assert c["power_w"] * TS == pytest.approx(REFERENCE_W[lv["streams"]], rel=0.05)
        assert lv["tokens_per_joule"] == pytest.approx(lv["sustained_tok_s"] / lv["power_w"], rel=0.05)


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("handbook: error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_power_count_mismatch_and_bad_url(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    a, b = "http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1"
    assert cli.main(["bench", "--backend", a, "--backend", b, "--power", "http://127.0.0.1:9400"]) == 2
    assert "--power given 1 time(s) for 2 backend(s)" in one_line(capsys)
    assert cli.main(["bench", "--backend", a, "--power", "gpu0:9400"]) == 2
    assert "malformed power endpoint" in one_line(capsys)
    assert cli.main(["bench", "--backend", a, "--power", "http://h:9400/metrics#card=0"]) == 2
    assert "gpu=LABEL" in one_line(capsys)
