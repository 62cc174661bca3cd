"""The server-counted figures: the interpolation and sum math over sampled counters (sustained and best-second
rates, gaps, resets, coverage of the backends), and how the report labels them and warns about missing usage."""

from __future__ import annotations

import time

import pytest

from orchestrator.core.reply import Reply
from orchestrator.metrics import counter_increase, server_counted

# ------------------------------------------------------------------------------------------ series math


def linear(rate: float, t_start: float, t_end: float, step: float = 0.5, phase: float = 0.0, v0: float = 0.0):
    pts = []
    t = t_start + phase
    while t <= t_end + 1e-9:
        pts.append((t, v0 + rate * (t - t_start), 1.0, 0.0))
        t += step
    return pts


def test_constant_rate_one_backend():
    s = {"a": linear(100.0, 0.0, 10.0)}
    r = server_counted(s, 1.0, 9.0)
    assert r is not None
    assert r["sustained_tok_s"] == pytest.approx(100.0)
    assert r["best_second_tok_s"] == pytest.approx(100.0)
    assert r["metric"] == "vllm:generation_tokens_total"
    assert counter_increase(s, 1.0, 9.0) == pytest.approx(800.0)


def test_two_backends_offset_sample_times_sum():
    # same absolute schedule in principle, but each server answers a little later: sample times differ
    s = {"a": linear(100.0, 0.0, 10.0, phase=0.013), "b": linear(250.0, 0.0, 10.0, phase=0.071)}
    r = server_counted(s, 2.0, 8.0)
    assert r["sustained_tok_s"] == pytest.approx(350.0)
    assert r["best_second_tok_s"] == pytest.approx(350.0)


def bursty(burst_at: float, base: float, burst: float, t_end: float = 10.0):
    """A counter rising at ``base`` tok/s with an extra ``burst`` tokens spread over [burst_at, burst_at + 1]."""
    pts = []
    for i in range(int(t_end / 0.5) + 1):
        t = i * 0.5
        v = base * t + burst * min(1.0, max(0.0, t - burst_at))
        pts.append((t, v, None, None))
    return pts


def test_best_second_is_a_simultaneous_peak_not_a_sum_of_peaks():
    # a peaks in [2, 3], b peaks in [6, 7]: each has a best second of 100 + 50, but never at the same time
    s = {"a": bursty(2.0, 100.0, 50.0), "b": bursty(6.0, 100.0, 50.0)}
    r = server_counted(s, 0.0, 10.0)
    assert r["sustained_tok_s"] == pytest.approx((2000 + 100) / 10)
    assert r["best_second_tok_s"] == pytest.approx(250.0)  # 150 + 100, not 150 + 150
    # aligned peaks do add up
    s = {"a": bursty(4.0, 100.0, 50.0), "b": bursty(4.0, 100.0, 50.0)}
    assert server_counted(s, 0.0, 10.0)["best_second_tok_s"] == pytest.approx(300.0)


def test_best_second_found_between_sample_times():
    # samples at 0.5 s on a; b samples at a different phase: the best 1 s span starts at neither's sample time
    a = [(t * 0.5, 0.0 if t * 0.5 < 3.0 else 100.0 * min(1.0, (t * 0.5 - 3.0) / 0.5), None, None) for t in range(21)]
    b = [(0.25 + t * 0.5, 0.0, None, None) for t in range(20)]
    r = server_counted({"a": a, "b": b}, 0.0, 9.75)
    assert r["best_second_tok_s"] == pytest.approx(100.0)
    assert r["sustained_tok_s"] == pytest.approx(100.0 / 9.75)


def test_best_second_matches_a_brute_force_scan():
    import bisect
    import random

    rng = random.Random(7)
    series = {}
    for name in ("a", "b", "c"):
        t, v, pts = rng.uniform(0, 0.5), 0.0, []
        while t < 12.0:
            pts.append((t, v, None, None))
            t += rng.uniform(0.3, 0.7)  # jittered, different per server
            v += rng.choice([0.0, 10.0, 80.0, 300.0])
        series[name] = pts

    def at(pts, t):
        ts = [p[0] for p in pts]
        if t <= ts[0]:
            return pts[0][1]
        if t >= ts[-1]:
            return pts[-1][1]
        i = bisect.bisect_right(ts, t)
        (ta, va), (tb, vb) = pts[i - 1][:2], pts[i][:2]
        return va + (vb - va) * (t - ta) / (tb - ta)

    t0, t1 = 1.0, 11.0
    total = lambda t: sum(at(p, t) for p in series.values())
    brute = max(total(t0 + k * 0.001 + 1.0) - total(t0 + k * 0.001) for k in range(int((t1 - t0 - 1.0) / 0.001) + 1))
    r = server_counted(series, t0, t1)
    assert r["best_second_tok_s"] == pytest.approx(brute, rel=1e-3)
    assert r["best_second_tok_s"] >= brute - 1e-9
    assert r["sustained_tok_s"] == pytest.approx((total(t1) - total(t0)) / (t1 - t0))


def test_gap_is_bridged_and_reset_is_stitched():
    pts = linear(100.0, 0.0, 10.0)
    pts = [p for p in pts if not 3.0 < p[0] < 5.0]  # failed scrapes: a gap
    assert server_counted({"a": pts}, 1.0, 9.0)["sustained_tok_s"] == pytest.approx(100.0)
    # restart at t=5: the counter starts again from zero and climbs at the same rate
    times = [i * 0.5 for i in range(21)]
    restarted = [(t, (100.0 * t) if t < 5 else 100.0 * (t - 5), None, None) for t in times]
    r = server_counted({"a": restarted}, 0.0, 10.0)
    # the step 4.5 -> 5.0 drops to 0: counted as "0 new tokens" (Prometheus increase semantics)
    assert r["sustained_tok_s"] == pytest.approx((450.0 + 500.0) / 10.0)
    assert r["best_second_tok_s"] == pytest.approx(100.0)


def test_window_shorter_than_one_second():
    s = {"a": linear(100.0, 0.0, 10.0)}
    r = server_counted(s, 2.0, 2.6)
    assert r["sustained_tok_s"] == pytest.approx(100.0)
    assert r["best_second_tok_s"] == r["sustained_tok_s"]


def test_best_second_never_below_sustained():
    # contrived: work only at both ends of a 1.5 s window; no 1 s span holds the average
    pts = [(0.0, 0.0, None, None), (0.25, 50.0, None, None), (1.25, 50.0, None, None),
           (1.5, 100.0, None, None)]
    r = server_counted({"a": pts}, 0.0, 1.5)
    assert r["best_second_tok_s"] >= r["sustained_tok_s"]


def test_no_counter_gives_none():
    assert server_counted({}, 0.0, 10.0) is None
    assert server_counted({"a": []}, 0.0, 10.0) is None
    assert server_counted({"a": [(0.0, None, 1.0, 0.0), (1.0, None, 1.0, 0.0)]}, 0.0, 1.0) is None
    assert server_counted({"a": linear(1.0, 0.0, 5.0)}, 3.0, 3.0) is None
    assert counter_increase({}, 0.0, 1.0) == 0.0


def test_window_clipped_to_observed_span():
    s = {"a": linear(100.0, 2.0, 6.0)}  # the sampler only ran from 2 to 6
    r = server_counted(s, 0.0, 10.0)
    assert r["sustained_tok_s"] == pytest.approx(100.0)


def test_a_backend_without_counter_is_named_not_hidden():
    # b answers /metrics but has no token counter: the figures are a's alone, and say so
    s = {"a": linear(100.0, 0.0, 10.0), "b": [(t, None, 3.0, 0.0) for t in range(11)]}
    r = server_counted(s, 1.0, 9.0, metric="x", reasons={"b": "no counter here"})
    assert r["sustained_tok_s"] == pytest.approx(100.0)  # the covered part only ...
    assert r["covered_backends"] == ["a"]  # ... and which part that is
    assert r["uncovered_backends"] == [{"url": "b", "reason": "no counter here"}]
    assert r["covered_share"] == 0.5
    assert r["metric"] == "x" and r["metric_by_backend"] == {"a": "x"}
    # without a reason given, the uncovered backend is still listed
    r = server_counted(s, 1.0, 9.0)
    assert [b["url"] for b in r["uncovered_backends"]] == ["b"] and r["uncovered_backends"][0]["reason"]
    # every backend counted: nothing uncovered, share 1
    full = server_counted({"a": linear(100.0, 0.0, 10.0), "c": linear(50.0, 0.0, 10.0)}, 1.0, 9.0)
    assert full["covered_backends"] == ["a", "c"] and full["uncovered_backends"] == []
    assert full["covered_share"] == 1.0


def test_a_mixed_fleet_names_each_backends_metric():
    s = {"v": linear(100.0, 0.0, 10.0), "l": linear(20.0, 0.0, 10.0)}
    names = {"v": "vllm:generation_tokens_total", "l": "llamacpp:tokens_predicted_total"}
    r = server_counted(s, 1.0, 9.0, names)
    assert r["sustained_tok_s"] == pytest.approx(120.0)
    assert r["metric_by_backend"] == names
    assert r["metric"] == "vllm:generation_tokens_total + llamacpp:tokens_predicted_total"


def test_many_samples_are_cheap():
    # an hour of 0.5 s samples on six servers
    s = {f"s{i}": linear(3000.0, 0.0, 3600.0, phase=0.01 * i) for i in range(6)}
    t = time.perf_counter()
    r = server_counted(s, 10.0, 3590.0)
    assert time.perf_counter() - t < 5.0
    assert r["sustained_tok_s"] == pytest.approx(18000.0)


# ------------------------------------------------------------------------ the report: labels and warnings


def _record(replies, backends=("http://a/v1", "http://b/v1"), server_counted=None):
    from orchestrator.book.assemble import Book
    from orchestrator.core.outline import Outline
    from orchestrator.job.report import JobRecord

    return JobRecord(
        backends=tuple(backends), plan_levels=(1,), book=Book(Outline("T"), (), "# T\n"),
        replies=tuple(replies), t_start=0.0, t_titles_known=1.0, t_write_start=1.0, t_write_end=11.0, t_end=12.0,
        server_counted=server_counted,
    )


def _reply(backend: str, tokens: int, text: str = "Some prose.", error: str | None = None) -> Reply:
    return Reply(text, "stop", 10, tokens, backend, 0.0, 0.1, 0.2, error=error)


def test_build_stats_warns_when_a_backend_sends_no_usage():
    from orchestrator.job.report import build_stats

    a, b = "http://a/v1", "http://b/v1"
    replies = [("section", _reply(a, 100)), ("section", _reply(a, 120)),
               ("section", _reply(b, 0)), ("section", _reply(b, 90)), ("section", _reply(b, 0)),
               ("section", _reply(b, 0, text="")),  # empty text and no tokens: nothing was written, no warning
               ("section", _reply(b, 0, error="HTTP 500"))]  # a failed attempt is no reply without usage
    stats = build_stats(_record(replies))
    assert stats["warnings"] == [f"backend {b} returned no usage in 2 of 4 replies: tokens_written undercounts"]
    assert build_stats(_record([("section", _reply(a, 5))]))["warnings"] == []


def test_printed_figures_say_what_they_are():
    from orchestrator.job.report import ROW_COLUMNS, server_counted_line

    header = next(name for name, key in ROW_COLUMNS if key == "avg_tok_s_writing")
    assert "usage" in header and "write" in header  # the reference run's definition, not a server count
    a, b, c = "http://a/v1", "http://b/v1", "http://c/v1"
    partial = {"sustained_tok_s": 1000.0, "best_second_tok_s": 1200.0, "metric": "vllm:generation_tokens_total",
               "covered_backends": [a, b], "uncovered_backends": [{"url": c, "reason": "HTTP 404"}],
               "covered_share": 0.6667}
    line = server_counted_line({"server_counted": partial})
    assert line.startswith("server-counted (2 of 3 backends)") and c in line and "HTTP 404" in line
    whole = dict(partial, covered_backends=[a, b, c], uncovered_backends=[], covered_share=1.0)
    line = server_counted_line({"server_counted": whole})
    assert line.startswith("server-counted while writing") and "of 3" not in line
    line = server_counted_line({"server_counted": {"available": False, "reason": "no backend exposes a counter"}})
    assert "not available" in line and "no backend exposes a counter" in line
    assert server_counted_line({"server_counted": None}) is None
