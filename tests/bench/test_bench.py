"""`handbook bench` (issue 6) against simulated cards on 127.0.0.1, plus its outputs, compare and errors."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import anyio
import pytest

from orchestrator import cli
from orchestrator.bench import BenchSettings, chart_svg, fit_step, run_ladder
from orchestrator.cli.bench import add_arguments, settings_from_args
from orchestrator.core.errors import ConfigError
from orchestrator.core.osutil import free_port
from orchestrator.sim.launch import SimFleet

ROOT = Path(__file__).resolve().parents[2]
STEP_MS, PER_STREAM_MS = 12.94, 0.2451
LEVEL_KEYS = {"streams", "sustained_tok_s", "best_second_tok_s", "per_stream_tok_s", "step_ms", "ttft_median_ms",
              "running", "waiting"}
# The reference run's one-card ladder (streams, sustained tok/s) and the fit it published.
REFERENCE_ROWS = [(1, 73.1), (4, 279.0), (8, 523.2), (16, 960.9), (32, 1584.0), (64, 2288.4), (128, 2899.0),
                  (256, 3368.7)]
REFERENCE_FIT = {"a_ms": 12.94, "b_ms": 0.2451, "implied_ceiling_tok_s": 4080}


def bench_cli(*argv: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator", "bench", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, check=False)


def model_time(ladder: dict) -> float:
    """Wall seconds per model second (the simulator's --time-scale), as the bench recorded it."""
    ts = ladder.get("time_scale")
    return float(ts) if isinstance(ts, int | float) else 1.0


@pytest.fixture(scope="module")
def one_card_ladder(tmp_path_factory):
    """The ladder 1, 4, 16, 64 against one card at 12.94 ms + 0.2451 ms per stream, through the real command."""
    out = tmp_path_factory.mktemp("ladder1")
    with SimFleet(cards=1, step_ms=STEP_MS, per_stream_ms=PER_STREAM_MS) as fleet:
        proc = bench_cli("--backend", fleet.urls[0], "--streams", "1,4,16,64", "--window", "5", "--out", str(out),
                         "--label", "one card")
    assert proc.returncode == 0, proc.stderr
    return out, proc, json.loads((out / "ladder.json").read_text())


def test_fit_recovers_the_engine_model(one_card_ladder):
    _, _, ladder = one_card_ladder
    assert [lv["streams"] for lv in ladder["levels"]] == [1, 4, 16, 64]
    fit = ladder["fit"]
    ts = model_time(ladder)
    assert fit["a_ms"] / ts == pytest.approx(STEP_MS, rel=0.03)
    assert fit["b_ms"] / ts == pytest.approx(PER_STREAM_MS, rel=0.03)
    assert fit["ceiling_tok_s"] == pytest.approx(1000.0 / fit["b_ms"], rel=1e-3)
    for lv in ladder["levels"]:
        assert LEVEL_KEYS <= set(lv)
        n = lv["streams"]
        assert lv["held"] and lv["waiting"] == 0 and lv["running"] == n
        # the engine model's own rate at this level, within 3%
        model_rate = 1000.0 * n / (STEP_MS + PER_STREAM_MS * n) / ts
        assert lv["sustained_tok_s"] == pytest.approx(model_rate, rel=0.03)
        assert lv["per_stream_tok_s"] == pytest.approx(lv["sustained_tok_s"] / n, rel=1e-2)
        assert lv["step_ms"] == pytest.approx(1000.0 * n / lv["sustained_tok_s"], rel=1e-3)
        assert lv["ttft_median_ms"] is not None and lv["ttft_median_ms"] > 0
        assert lv["metric"] == "vllm:generation_tokens_total"


def test_levels_carry_the_servers_latency_percentiles(one_card_ladder):
    from orchestrator.sim.engine import ITL_BUCKETS

    _, proc, ladder = one_card_ladder
    for lv in ladder["levels"]:
        for key, pcts in (("ttft_s", ("p50", "p95", "p99")), ("itl_ms", ("p50", "p99")),
                          ("e2e_s", ("p50", "p95", "p99"))):
            entry = lv[key]
            if key == "e2e_s" and entry is None:  # no request of the level finished: 512 tokens outlive a level
                continue
            assert entry["source"] == "server" and entry["coverage"] == "1 of 1" and entry["n"] > 0, key
            values = [entry[p] for p in pcts]
            assert values == sorted(values), (key, values)
        # each token's gap is one engine step: the median lies in the bucket that holds the level's step time
        step_s = lv["step_ms"] / 1000.0
        i = next(i for i, b in enumerate(ITL_BUCKETS) if step_s <= b)
        lo = ITL_BUCKETS[i - 1] if i else 0.0
        assert 1000 * lo <= lv["itl_ms"]["p50"] <= 1000 * ITL_BUCKETS[i], (lv["streams"], lv["itl_ms"], step_s)
    assert "ITL p50/p99" in proc.stdout


def test_best_second_never_below_sustained(one_card_ladder):
    _, _, ladder = one_card_ladder
    for lv in ladder["levels"]:
        assert lv["best_second_tok_s"] >= lv["sustained_tok_s"]


def test_outputs_table_csv_chart(one_card_ladder):
    out, proc, ladder = one_card_ladder
    assert ladder["label"] == "one card" and ladder["max_tokens"] == 512 and ladder["window_s"] == 5
    # the table, like the reference's Table 1, and the fit under it
    assert "sustained" in proc.stdout and "best second" in proc.stdout and "TTFT median" in proc.stdout
    assert "fit over held levels: step = " in proc.stdout and "1000/b" in proc.stdout
    assert "NOT HELD" not in proc.stdout
    rows = (out / "ladder.csv").read_text().splitlines()
    assert rows[0].split(",")[:8] == ["streams", "sustained_tok_s", "best_second_tok_s", "per_stream_tok_s",
                                      "step_ms", "ttft_median_ms", "running", "waiting"]
    assert [r.split(",")[0] for r in rows[1:]] == ["1", "4", "16", "64"]
    svg = ET.parse(out / "ladder.svg").getroot()
    ns = "{http://www.w3.org/2000/svg}"
    assert svg.tag == f"{ns}svg"
    # each series is a group named by its id (report.chart_svg): total and per stream, a marker per level, and the fit
    series = {g.get("id"): g for g in svg.iter(f"{ns}g") if g.get("id") in ("total", "per-stream", "fit")}
    assert set(series) == {"total", "per-stream", "fit"}
    assert [len(series[s].findall(f".//{ns}use")) for s in ("total", "per-stream")] == [4, 4]
    assert series["fit"].find(f".//{ns}path") is not None
    texts = {t.text for t in svg.iter(f"{ns}text")}
    assert {"1", "4", "16", "64", "total tok/s (sustained)", "per-stream tok/s"} <= texts


def test_two_cards_sum_to_twice_one(one_card_ladder):
    _, _, ladder1 = one_card_ladder
    one = next(lv for lv in ladder1["levels"] if lv["streams"] == 16)
    with SimFleet(cards=2, step_ms=STEP_MS, per_stream_ms=PER_STREAM_MS) as fleet:
        settings = BenchSettings(backends=tuple(fleet.urls), streams=(16,), window=4.0, out="unused")
        partial: list[dict] = []
        ladder2 = anyio.run(run_ladder, settings, None, partial.append)
    assert len(partial) == 1 and partial[0]["levels"] == ladder2["levels"]  # written after every level
    two = ladder2["levels"][0]
    assert ladder2["backends"] == fleet.urls
    assert two["sustained_tok_s"] == pytest.approx(2 * one["sustained_tok_s"], rel=0.05)
    assert two["per_stream_tok_s"] == pytest.approx(one["per_stream_tok_s"], rel=0.05)
    assert two["step_ms"] == pytest.approx(one["step_ms"], rel=0.05)  # per server
    assert two["running"] == 32 and two["waiting"] == 0
    assert two["best_second_tok_s"] >= two["sustained_tok_s"]
    # the sum of the servers' own figures in the same window: sustained adds up exactly; the best second is a
    # simultaneous peak, never more than the servers' separate best seconds added up
    per = two["per_backend"]
    assert [b["url"] for b in per] == fleet.urls
    assert sum(b["sustained_tok_s"] for b in per) == pytest.approx(two["sustained_tok_s"], abs=0.2)
    assert two["best_second_tok_s"] <= sum(b["best_second_tok_s"] for b in per) + 0.2
    assert all(b["running"] == 16 and b["waiting"] == 0 for b in per)


def test_a_level_the_server_cannot_hold_is_flagged(tmp_path):
    out = tmp_path / "held"
    with SimFleet(cards=1, step_ms=STEP_MS, per_stream_ms=PER_STREAM_MS, max_seqs=8) as fleet:
        proc = bench_cli("--backend", fleet.urls[0], "--streams", "4,16", "--window", "3", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    ladder = json.loads((out / "ladder.json").read_text())
    four, sixteen = ladder["levels"]
    assert four["held"] and four["waiting"] == 0
    assert not sixteen["held"] and sixteen["waiting"] == 8 and sixteen["running"] == 8
    assert sixteen["best_second_tok_s"] >= sixteen["sustained_tok_s"]
    # the queued requests show in TTFT (a lower bound: they were still waiting when the load stopped)
    assert sixteen["ttft_median_ms"] > 10 * four["ttft_median_ms"]
    row = next(line for line in proc.stdout.splitlines() if line.strip().startswith("16 "))
    assert "NOT HELD" in row
    assert ladder["fit"] is None  # only one held level: no fit
    assert "fit: needs two or more levels" in proc.stdout
    assert "level not held" in (out / "ladder.svg").read_text()


# ------------------------------------------------------------------------------------------- pure pieces


def test_fit_on_the_reference_ladder():
    levels = [{"streams": n, "step_ms": 1000.0 * n / tok, "held": True} for n, tok in REFERENCE_ROWS]
    fit = fit_step(levels)
    ref = REFERENCE_FIT
    assert fit["a_ms"] == pytest.approx(ref["a_ms"], abs=0.01)
    assert fit["b_ms"] == pytest.approx(ref["b_ms"], abs=0.0001)
    assert fit["ceiling_tok_s"] == pytest.approx(ref["implied_ceiling_tok_s"], abs=1)


def test_fit_skips_levels_not_held_and_needs_two():
    levels = [{"streams": 1, "step_ms": 13.0, "held": True}, {"streams": 16, "step_ms": 17.0, "held": True},
              {"streams": 64, "step_ms": 99.0, "held": False}]
    fit = fit_step(levels)
    assert fit["a_ms"] == pytest.approx(12.7333, abs=1e-3) and fit["b_ms"] == pytest.approx(0.26667, abs=1e-4)
    assert fit_step(levels[:1]) is None
    assert fit_step([{"streams": 4, "step_ms": 13.0}, {"streams": 4, "step_ms": 14.0}]) is None


def test_chart_with_one_level_and_no_fit():
    ladder = {"levels": [{"streams": 8, "sustained_tok_s": 500.0, "best_second_tok_s": 510.0,
                          "per_stream_tok_s": 62.5, "held": True}], "fit": None, "backends": ["x"]}
    svg = ET.fromstring(chart_svg(ladder))
    ns = "{http://www.w3.org/2000/svg}"
    ids = {g.get("id") for g in svg.iter(f"{ns}g")}
    assert {"total", "per-stream"} <= ids and not ids & {"fit", "ceiling", "not-held"}


def ladder_file(path: Path, rows: list, label: str | None = None, ttft=None, running=None, waiting=None) -> str:
    levels = []
    for i, (n, tok) in enumerate(rows):
        levels.append({"streams": n, "sustained_tok_s": tok, "best_second_tok_s": tok * 1.02,
                       "per_stream_tok_s": tok / n, "step_ms": 1000 * n / tok,
                       "ttft_median_ms": ttft[i] if ttft else 50.0,
                       "running": running[i] if running else n, "waiting": waiting[i] if waiting else 0})
    path.write_text(json.dumps({"label": label, "levels": levels, "fit": fit_step(levels)}))
    return str(path)


def test_compare_prints_the_ratio_table(tmp_path, capsys):
    plain = [(1, 73.1), (4, 279.0), (8, 523.2), (16, 960.9), (32, 1584.0), (64, 2288.4), (128, 2899.0)]
    drafting = [(1, 160.1), (4, 586.3), (8, 989.5), (16, 1472.8), (32, 1914.5), (64, 2076.9), (128, 2063.0)]
    a = ladder_file(tmp_path / "plain.json", plain, "plain")
    b = ladder_file(tmp_path / "drafting.json", drafting, "drafting", ttft=[47, 72, 84, 113, 171, 3141, 19516],
                    running=[1, 4, 8, 16, 32, 51, 51], waiting=[0, 0, 0, 0, 0, 13, 77])
    assert cli.main(["bench", "compare", a, b]) == 0
    out = capsys.readouterr().out
    assert "drafting against plain" in out
    ratios = {}
    for line in out.splitlines():
        cells = line.split()
        if cells and cells[0].isdigit() and len(cells) >= 4:
            ratios[int(cells[0])] = float(cells[3])
    # the reference's Table 2 ratios
    assert ratios == {1: 2.19, 4: 2.10, 8: 1.89, 16: 1.53, 32: 1.21, 64: 0.91, 128: 0.71}


def test_compare_labels_from_directories(tmp_path, capsys):
    (tmp_path / "plain").mkdir()
    (tmp_path / "eagle").mkdir()
    a = ladder_file(tmp_path / "plain" / "ladder.json", [(1, 70.0)])
    b = ladder_file(tmp_path / "eagle" / "ladder.json", [(1, 140.0)])
    assert cli.main(["bench", "compare", a, b]) == 0
    out = capsys.readouterr().out
    assert "eagle against plain" in out and "2.00" in out


# ------------------------------------------------------------------------------------------------ errors


def closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}/v1"


@pytest.mark.parametrize(
    "argv",
    [
        ["--backend", "ftp://127.0.0.1:1/v1"],
        ["--backend", "http://127.0.0.1:1"],
        ["--backend", "http://127.0.0.1:1/v1", "--streams", "0,4"],
        ["--backend", "http://127.0.0.1:1/v1", "--streams", "four"],
        ["--backend", "http://127.0.0.1:1/v1", "--window", "0"],
        ["--backend", "http://127.0.0.1:1/v1", "--max-tokens", "0"],
        ["--backend", "http://127.0.0.1:1/v1", "--ramp", "-1"],
        ["--backend", "http://127.0.0.1:1/v1", "--config", "/nonexistent/bench.toml"],
        ["compare", "only-one.json"],
        ["compare", "/nonexistent/a.json", "/nonexistent/b.json"],
        ["frobnicate"],
    ],
)
def test_bad_input_exits_2_with_one_line(argv, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["bench", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("handbook: error: ") and "\n" not in err and "Traceback" not in err


def test_no_backend_is_a_config_error(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HANDBOOK_BACKENDS", raising=False)
    assert cli.main(["bench"]) == 2
    assert "no backend" in capsys.readouterr().err


def test_compare_rejects_files_that_are_not_ladders(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"levels": "no"}')
    good = ladder_file(tmp_path / "good.json", [(1, 70.0)])
    assert cli.main(["bench", "compare", str(bad), good]) == 2
    other = ladder_file(tmp_path / "other.json", [(2, 70.0)])
    assert cli.main(["bench", "compare", good, other]) == 2  # no stream count in common
    assert "share no stream count" in capsys.readouterr().err


def test_unreachable_backend_exits_3_with_one_line(tmp_path):
    proc = bench_cli("--backend", closed_port_url(), "--streams", "1", "--window", "1", "--out",
                     str(tmp_path / "x"), timeout=60)
    assert proc.returncode == 3
    err = proc.stderr.strip()
    # the job's own discovery (orchestrator.client.discover) and its words
    assert err.startswith("handbook: error: cannot reach http://127.0.0.1:")
    assert "\n" not in err and "Traceback" not in err


def test_a_backend_failing_every_request_exits_3_quickly(tmp_path):
    with SimFleet(cards=1, fail_rate=1.0) as fleet:
        proc = bench_cli("--backend", fleet.urls[0], "--streams", "4", "--window", "2", "--out", str(tmp_path),
                         timeout=60)
    assert proc.returncode == 3, proc.stderr
    err = proc.stderr.strip().splitlines()[-1]
    assert err.startswith("handbook: error: backend ") and "fails every request" in err and "500" in err


# ------------------------------------------------------------------------------------------------ config


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(argv)


def test_example_bench_file_and_flags_override(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    s = settings_from_args(parse(["--config", str(ROOT / "examples" / "bench_ladder.toml")]))
    assert s.streams == (1, 4, 8, 16, 32, 64, 128, 256) and s.window == 40 and s.max_tokens == 512
    assert s.backends == ("http://127.0.0.1:8000/v1",) and s.interval == 0.5 and s.api_key == "EMPTY"
    s = settings_from_args(parse(["--config", str(ROOT / "examples" / "bench_ladder.toml"), "--streams", "2,8",
                                  "--backend", "http://h:1/v1,http://h:2/v1", "--window", "3"]))
    assert s.streams == (2, 8) and s.window == 3 and s.backends == ("http://h:1/v1", "http://h:2/v1")


def test_bench_file_unknown_key(tmp_path):
    f = tmp_path / "b.toml"
    f.write_text('backends = ["http://h:1/v1"]\nstreamz = [1]\n')
    with pytest.raises(ConfigError, match="streamz"):
        settings_from_args(parse(["--config", str(f)]))


def test_backends_from_environment(monkeypatch):
    monkeypatch.setenv("HANDBOOK_BACKENDS", "http://a:1/v1, http://b:2/v1")
    assert settings_from_args(parse([])).backends == ("http://a:1/v1", "http://b:2/v1")
