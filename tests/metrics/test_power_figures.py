"""GPU power (issue 26, part 2): dcgm-exporter's page read, energy over a window, and coverage k of n."""

from __future__ import annotations

import pytest

from orchestrator.core.config import Backend, split_power
from orchestrator.core.errors import ConfigError
from orchestrator.metrics.counters import parse_metrics
from orchestrator.metrics.power import energy_over, parse_dcgm, power_figures, power_label
from orchestrator.metrics.series import cache_figures

LABELS = 'gpu="{g}",UUID="GPU-{g}abc",device="nvidia{g}",modelName="NVIDIA H200",Hostname="node1"'


def page(*gpus: tuple[int, float | None, float | None], extra: str = "") -> str:
    """A dcgm-exporter page: per GPU (index, W or None, mJ or None), among other metrics it also carries."""
    lines = ["# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).", "# TYPE DCGM_FI_DEV_SM_CLOCK gauge"]
    lines += [f"DCGM_FI_DEV_SM_CLOCK{{{LABELS.format(g=g)}}} 1980" for g, _, _ in gpus]
    if any(w is not None for _, w, _ in gpus):
        lines += ["# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).", "# TYPE DCGM_FI_DEV_POWER_USAGE gauge"]
        lines += [f"DCGM_FI_DEV_POWER_USAGE{{{LABELS.format(g=g)}}} {w}" for g, w, _ in gpus if w is not None]
    if any(e is not None for _, _, e in gpus):
        lines += ["# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).",
                  "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter"]
        lines += [f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{LABELS.format(g=g)}}} {e}"
                  for g, _, e in gpus if e is not None]
    return "\n".join(lines) + "\n" + extra


def test_dcgm_picks_the_labelled_gpu_or_sums_all():
    text = page((0, 400.0, 1e6), (1, 300.0, 2e6), (2, 100.0, 5e5))
    one = parse_dcgm(text, "1")
    assert (one.power_w, one.energy_mj, one.matched) == (300.0, 2e6, 1)
    assert parse_dcgm(text, "GPU-2abc").power_w == 100.0  # by UUID
    every = parse_dcgm(text)
    assert every.power_w == pytest.approx(800.0) and every.energy_mj == pytest.approx(3.5e6)
    assert every.matched == 3 and every.gpus == ("0", "1", "2")
    none = parse_dcgm(text, "7")
    assert none.power_w is None and none.energy_mj is None and none.matched == 0


def test_dcgm_missing_counters():
    only_power = parse_dcgm(page((0, 350.0, None)), "0")
    assert only_power.power_w == 350.0 and only_power.energy_mj is None
    assert parse_dcgm(page((0, None, None))).power_w is None  # dcgm page without either metric
    assert parse_dcgm("").matched == 0
    with pytest.raises(ValueError):
        parse_dcgm("DCGM_FI_DEV_POWER_USAGE{gpu=\"0\"} not-a-number\n")


def test_energy_from_the_counter_where_present_else_the_integrated_gauge():
    # 400 W for 10 s, counter in mJ: 4,000 J; the gauge alone integrates to the same
    pts = [(float(t), 400.0, 1e6 + 400_000.0 * t) for t in range(0, 11)]
    j, source, w = energy_over(pts, 2.0, 7.0)
    assert source == "counter" and j == pytest.approx(2000.0) and w == pytest.approx(400.0)
    gauge_only = [(t, w_, None) for t, w_, _ in pts]
    j2, source2, _ = energy_over(gauge_only, 2.0, 7.0)
    assert source2 == "power-integrated" and j2 == pytest.approx(2000.0)
    # a ramp 100 -> 300 W over 2 s: trapezoids give 400 J
    ramp = [(0.0, 100.0, None), (1.0, 200.0, None), (2.0, 300.0, None)]
    assert energy_over(ramp, 0.0, 2.0)[0] == pytest.approx(400.0)  # type: ignore[index]
    # a counter reset (exporter restart) is stitched over, as the token counters are
    reset = [(0.0, None, 5000.0), (1.0, None, 6000.0), (2.0, None, 500.0), (3.0, None, 1500.0)]
    assert energy_over(reset, 0.0, 3.0)[0] == pytest.approx(2.5)  # type: ignore[index]
    assert energy_over([], 0.0, 1.0) is None and energy_over(pts, 5.0, 5.0) is None


def test_coverage_k_of_n_and_tokens_of_the_covered_only():
    a, b, c = "http://a:8000/v1", "http://b:8000/v1", "http://c:8000/v1"
    pts = [(float(t), 400.0, 1000.0 * 400 * t) for t in range(11)]
    series = {a: pts, b: [(float(t), 300.0, None) for t in range(11)], c: []}
    tokens = {a: 4000.0, b: 2000.0, c: 9999.0}
    f = power_figures(series, 0.0, 10.0, tokens, reasons={c: "no --power endpoint given"})
    assert f["available"] and f["coverage"] == "2 of 3 backends" and f["covered_share"] == pytest.approx(2 / 3, abs=1e-4)
    assert f["power_w"] == pytest.approx(700.0) and f["energy_j"] == pytest.approx(7000.0)
    assert f["energy_source"] == "counter + power-integrated"
    assert f["tokens"] == 6000 and f["tokens_per_joule"] == pytest.approx(6000 / 7000, abs=1e-3)  # c's tokens left out
    assert f["uncovered_backends"] == [{"url": c, "reason": "no --power endpoint given"}]
    assert power_label(f) == "power (2 of 3 backends)"
    whole = power_figures({a: pts}, 0.0, 10.0, {a: 4000.0})
    assert whole["coverage"] == "1 of 1 backend" and power_label(whole) == "power"
    none = power_figures({a: [], b: []}, 0.0, 10.0, {}, reasons={a: "no --power endpoint given",
                                                                  b: "no --power endpoint given"})
    assert none == {"available": False, "reason": "no --power endpoint given",
                    "uncovered_backends": [{"url": a, "reason": "no --power endpoint given"},
                                           {"url": b, "reason": "no --power endpoint given"}]}


def test_cache_fill_and_prefix_hit_rate():
    u, v = "http://a:1/v1", "http://b:1/v1"
    caches = {u: [(0.0, 0.2, 0.0, 0.0), (1.0, 0.6, 100.0, 25.0), (2.0, 0.4, 200.0, 50.0)],
              v: [(0.0, None, None, None), (1.0, None, None, None)]}
    f = cache_figures(caches, 0.0, 2.0)
    assert f["kv_cache_usage"] == {"median": 0.4, "max": 0.6} and f["prefix_cache_hit_rate"] == 0.25
    assert f["prefix_cache_coverage"] == "1 of 2"  # the rate is u's alone, and says so
    assert cache_figures({v: caches[v]}, 0.0, 2.0) == {"kv_cache_usage": None, "prefix_cache_hit_rate": None,
                                                       "prefix_cache_coverage": "0 of 1"}


def test_counters_read_the_kv_fill_and_the_prefix_cache():
    text = ("vllm:generation_tokens_total{engine=\"0\"} 10\nvllm:generation_tokens_total{engine=\"1\"} 5\n"
            "vllm:kv_cache_usage_perc{engine=\"0\"} 0.5\nvllm:kv_cache_usage_perc{engine=\"1\"} 0.9\n"
            "vllm:prefix_cache_queries_total{engine=\"0\"} 80\nvllm:prefix_cache_hits_total{engine=\"0\"} 20\n")
    c = parse_metrics(text)
    assert c.generation_tokens == 15 and c.kv_usage == pytest.approx(0.7)  # a fill is averaged, never summed
    assert (c.prefix_queries, c.prefix_hits) == (80, 20)
    older = parse_metrics("vllm:generation_tokens_total 1\nvllm:gpu_cache_usage_perc 0.3\n")
    assert older.kv_usage == pytest.approx(0.3) and older.prefix_queries is None


def test_power_spec_checked():
    assert split_power("http://h:9400#gpu=3") == ("http://h:9400/metrics", "3")
    assert split_power("https://h/dcgm/metrics") == ("https://h/dcgm/metrics", None)
    assert Backend("http://a:1/v1", power="http://h:9400/#gpu=GPU-x").power == "http://h:9400/metrics#gpu=GPU-x"
    for bad in ("ftp://h:9400", "h:9400", "http://h:x/", "http://h:9400#card=1", "http://h:9400#gpu=", ""):
        with pytest.raises(ConfigError) as e:
            Backend("http://a:1/v1", power=bad)
        assert "\n" not in str(e.value)
