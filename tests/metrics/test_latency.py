"""The servers' latency histograms (issue 26, part 1): vLLM's and SGLang's pages read, percentiles as Prometheus'
histogram_quantile takes them, windows of snapshots, and the coverage of a fleet's figure."""

from __future__ import annotations

import math
import random

import pytest

from orchestrator.metrics.latency import (
    MAX_SNAPSHOTS,
    Histogram,
    HistogramSeries,
    parse_histograms,
    percentiles,
    server_latency,
)


def hist_lines(name: str, bounds: list[float], counts: list[int], total: float, labels: str = 'model_name="m"') -> str:
    """A histogram as prometheus_client writes it: cumulative buckets, +Inf, _count, _sum."""
    lines = [f"# HELP {name} latency", f"# TYPE {name} histogram"]
    acc = 0
    for b, c in zip(bounds, counts, strict=False):
        acc += c
        lines.append(f'{name}_bucket{{{labels},le="{b}"}} {acc}')
    acc += counts[len(bounds)]
    lines += [f'{name}_bucket{{{labels},le="+Inf"}} {acc}', f"{name}_count{{{labels}}} {acc}",
              f"{name}_sum{{{labels}}} {total}"]
    return "\n".join(lines) + "\n"


OTHER = "# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{model_name=\"m\"} 123\n"


def test_a_vllm_page_sums_label_sets_and_keeps_each_figure():
    text = (OTHER + hist_lines("vllm:time_to_first_token_seconds", [0.1, 0.5, 1.0], [1, 2, 3, 4], 9.0)
            + hist_lines("vllm:time_to_first_token_seconds", [0.1, 0.5, 1.0], [0, 1, 0, 0], 0.3,
                         'model_name="m",engine="1"')
            + hist_lines("vllm:inter_token_latency_seconds", [0.05, 0.1], [10, 5, 0], 1.0)
            + hist_lines("vllm:e2e_request_latency_seconds", [1.0, 2.0], [0, 3, 1], 6.5))
    snap = parse_histograms(text)
    name, ttft = snap["ttft"]
    assert name == "vllm:time_to_first_token_seconds"
    assert ttft.bounds == (0.1, 0.5, 1.0) and ttft.counts == (1, 4, 7, 11) and ttft.total_sum == pytest.approx(9.3)
    assert snap["itl"][1].count == 15 and snap["e2e"][1].count == 4


def test_older_and_other_servers_names_are_read_and_the_newer_wins():
    old = hist_lines("vllm:time_per_output_token_seconds", [0.05], [3, 1], 0.2)
    assert parse_histograms(old)["itl"][0] == "vllm:time_per_output_token_seconds"
    both = old + hist_lines("vllm:inter_token_latency_seconds", [0.05], [7, 0], 0.3)
    assert parse_histograms(both)["itl"][0] == "vllm:inter_token_latency_seconds"
    sg = hist_lines("sglang:time_to_first_token_seconds", [0.5], [1, 0], 0.2)
    assert parse_histograms(sg)["ttft"][0] == "sglang:time_to_first_token_seconds"
    assert parse_histograms(OTHER) == {}  # llama.cpp, TGI, a page without them: nothing
    with pytest.raises(ValueError):
        parse_histograms('vllm:e2e_request_latency_seconds_bucket{le="1.0"} not-a-number\n')


def test_quantile_is_prometheus_histogram_quantile():
    h = Histogram((0.1, 0.2, 0.5), (2, 6, 8, 10), 1.0)
    assert h.quantile(0.5) == pytest.approx(0.175)  # rank 5 in (0.1, 0.2]: 0.1 + 0.1 * 3/4
    assert h.quantile(0.1) == pytest.approx(0.05)  # the first bucket interpolates from 0
    assert h.quantile(0.99) == 0.5  # the +Inf bucket reads as the highest finite bound
    assert Histogram((0.1,), (0, 0), 0.0).quantile(0.5) is None


def test_quantiles_of_a_histogram_bracket_the_true_percentiles():
    rng = random.Random(7)
    bounds = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3)
    values = [rng.lognormvariate(math.log(0.06), 0.4) for _ in range(5000)]
    per = [0] * (len(bounds) + 1)
    for v in values:
        per[next((i for i, b in enumerate(bounds) if v <= b), len(bounds))] += 1
    cum = tuple(float(sum(per[: i + 1])) for i in range(len(per)))
    h = Histogram(bounds, cum, sum(values))
    for q in (0.5, 0.95):
        true = percentiles(values, [int(q * 100)])[f"p{int(q * 100)}"]
        assert true is not None
        i = next(i for i, b in enumerate(bounds) if true <= b)
        lo = bounds[i - 1] if i else 0.0
        got = h.quantile(q)
        assert got is not None and lo <= got <= bounds[i]  # in the true value's bucket


def test_a_window_is_the_increase_between_its_snapshots_and_survives_a_restart():
    s = HistogramSeries()
    b = (1.0, 2.0)
    for t, counts in ((0.0, (1, 1, 1)), (1.0, (2, 4, 4)), (2.0, (3, 7, 9)), (3.0, (0, 1, 1))):
        s.add(t, {"e2e": ("vllm:e2e_request_latency_seconds", Histogram(b, counts, 0.0))})
    _, inc = s.window(1.0, 2.0)["e2e"]
    assert inc.counts == (1, 3, 5)
    assert s.window(0.5, 1.5)["e2e"][1].counts == (2, 6, 8)  # from the snapshot at or before t0 to the one after t1
    assert s.window(2.0, 3.0)["e2e"][1].counts == (0, 1, 1)  # counts fell: the server restarted, the new counts
    assert s.window(3.0, 3.0) == {} and HistogramSeries().window(0, 1) == {}


def test_snapshots_stay_bounded_and_keep_the_latest():
    s = HistogramSeries()
    h = Histogram((1.0,), (0, 0), 0.0)
    for i in range(3 * MAX_SNAPSHOTS):
        s.add(float(i), {"ttft": ("x", Histogram((1.0,), (float(i), float(i)), 0.0))})
    assert len(s.times) <= MAX_SNAPSHOTS and s.times[-1] == 3 * MAX_SNAPSHOTS - 1
    assert s.times == sorted(s.times) and s.times[0] == 0.0
    s.add(5.5, {"ttft": ("x", h)})  # a scrape that finished out of order lands in its place
    assert s.times == sorted(s.times)


def series_of(*increases: tuple[int, ...], bounds=(0.1, 0.5)) -> HistogramSeries:
    s = HistogramSeries()
    s.add(0.0, {"ttft": ("vllm:time_to_first_token_seconds", Histogram(bounds, (0,) * (len(bounds) + 1), 0.0))})
    for inc in increases:
        s.add(1.0, {"ttft": ("vllm:time_to_first_token_seconds", Histogram(bounds, inc, 0.0))})
    return s


def test_the_fleets_figure_sums_backends_and_states_its_coverage():
    fleet = {"a": series_of((5, 10, 10)), "b": series_of((5, 10, 10)), "c": HistogramSeries()}
    got = server_latency(fleet, 0.0, 1.0)["ttft_s"]
    assert got["n"] == 20 and got["source"] == "server" and got["coverage"] == "2 of 3"
    assert got["covered_backends"] == ["a", "b"] and got["p50"] == pytest.approx(0.1)
    assert got["p50"] <= got["p95"] <= got["p99"]
    assert "itl_ms" not in server_latency(fleet, 0.0, 1.0)  # no backend has it: the caller falls back
    odd = {"a": series_of((5, 10, 10)), "b": series_of((1, 1), bounds=(0.2,))}
    assert server_latency(odd, 0.0, 1.0)["ttft_s"]["coverage"] == "1 of 2"  # other buckets cannot be summed


def test_percentiles_interpolate_between_closest_ranks():
    assert percentiles([1, 2, 3, 4], [50, 10]) == {"p50": 2.5, "p10": pytest.approx(1.3)}
    assert percentiles([], [50]) == {"p50": None}
    assert percentiles([7.0], [99]) == {"p99": 7.0}
