"""What each reader gets (issue 26, part 1): per-stream rate by the reference's definition, each section's decode
rate, and latency percentiles labelled server or client."""

from __future__ import annotations

import pytest

from orchestrator.core.reply import Reply
from orchestrator.metrics.latency import Histogram, HistogramSeries
from orchestrator.metrics.readers import client_in_flight, mean_running, readers


def reply(t_start: float, t_first: float, t_end: float, tokens: int, *, ok: bool = True, streamed: bool = True,
          backend: str = "a") -> Reply:
    return Reply(text="x", finish_reason="stop" if ok else None, prompt_tokens=10, completion_tokens=tokens,
                 backend=backend, t_start=t_start, t_first=t_first, t_end=t_end,
                 error=None if ok else "boom", streamed=streamed)


def test_streams_in_flight_by_littles_law_and_by_the_servers_gauges():
    rs = [reply(0, 1, 10, 100), reply(0, 1, 5, 50), reply(5, 6, 10, 50)]
    assert client_in_flight(rs, 0, 10) == pytest.approx(2.0)
    assert client_in_flight(rs, 0, 0) == 0.0
    series = {"a": [(0.0, 0.0, 4.0, 0.0), (1.0, 0.0, 2.0, 0.0), (3.0, 0.0, 2.0, 0.0)],
              "b": [(0.0, 0.0, 1.0, 0.0), (3.0, 0.0, 1.0, 0.0)], "c": [(0.0, 0.0, None, 0.0)]}
    # a: 4 for 1 s then 2 for 2 s (time-weighted 8/3); b: 1; c: no gauge
    assert mean_running(series, 0, 3) == pytest.approx(8 / 3 + 1)
    assert mean_running({"c": series["c"]}, 0, 3) is None


def test_streams_open_a_few_percent_of_the_window_are_not_rounded_to_none():
    # CI at stop 42: a fake server answering at once left requests open 4% of the writing window; stats.json said
    # 0.0 streams in flight beside 44,884 tok/s for each reader
    rs = [reply(0.0, 0.01, 0.1, 100), reply(0.2, 0.21, 0.3, 100)]
    got = readers(rs, 0.0, 5.0, sustained_tok_s=None)
    assert got["streams_in_flight"] == pytest.approx(0.04)
    assert got["per_stream_tok_s"] == pytest.approx(200 / 5.0 / 0.04)
    from orchestrator.job.report import readers_line

    assert "over 0.04 streams in flight" in (readers_line({"readers": got}) or "")
    assert readers([reply(0.0, 0.5, 10.0, 100)], 0.0, 10.0, sustained_tok_s=None)["streams_in_flight"] == 1.0


def test_client_figures_when_no_server_counts():
    rs = [reply(0.0, 0.5, 10.5, 101), reply(0.0, 1.0, 6.0, 51), reply(1.0, 1.5, 2.5, 11),
          reply(2.0, 2.0, 3.0, 0, ok=False)]
    got = readers(rs, 0.0, 10.5, sustained_tok_s=None)
    assert got["rate_source"] == "client" and got["streams_source"] == "client"
    tokens = 101 + 51 + 11
    assert got["streams_in_flight"] == pytest.approx(round(client_in_flight(rs, 0.0, 10.5), 1))
    assert got["per_stream_tok_s"] == pytest.approx(tokens / 10.5 / client_in_flight(rs, 0.0, 10.5), rel=1e-3)
    # each section's decode rate: (tokens - 1) / (last - first): 100/10, 50/5, 10/1
    assert got["section_decode_tok_s"]["p50"] == pytest.approx(10.0) and got["section_decode_tok_s"]["n"] == 3
    assert got["ttft_s"]["source"] == "client" and got["ttft_s"]["p50"] == pytest.approx(0.5)
    assert got["itl_ms"]["p50"] == pytest.approx(100.0)  # each request's mean gap: 10 s / 100 tokens ...
    assert got["e2e_s"]["p99"] <= 10.5 and got["e2e_s"]["n"] == 3  # ... and the failed attempt counts nowhere


def test_an_unstreamed_reply_has_no_first_token_to_time():
    rs = [reply(0.0, 4.0, 4.0, 100, streamed=False), reply(0.0, 1.0, 3.0, 21)]
    got = readers(rs, 0.0, 4.0, sustained_tok_s=None)
    assert got["ttft_s"]["n"] == 1 and got["ttft_s"]["p50"] == pytest.approx(1.0)
    assert got["section_decode_tok_s"]["n"] == 1 and got["e2e_s"]["n"] == 2


def test_server_figures_win_only_when_every_backend_has_them():
    rs = [reply(0.0, 0.5, 4.0, 100, backend="a"), reply(0.0, 0.5, 4.0, 100, backend="b")]
    series = {"a": [(0.0, 0.0, 1.0, 0.0), (4.0, 100.0, 1.0, 0.0)], "b": [(0.0, 0.0, 1.0, 0.0), (4.0, 100.0, 1.0, 0.0)]}

    def hs(count: float) -> HistogramSeries:
        s = HistogramSeries()
        s.add(0.0, {"ttft": ("vllm:time_to_first_token_seconds", Histogram((0.25, 1.0), (0, 0, 0), 0.0))})
        s.add(4.0, {"ttft": ("vllm:time_to_first_token_seconds", Histogram((0.25, 1.0), (0, count, count), 0.0))})
        return s

    full = readers(rs, 0.0, 4.0, sustained_tok_s=50.0, series=series, histograms={"a": hs(1), "b": hs(1)})
    assert full["rate_source"] == "server" and full["streams_source"] == "server"
    assert full["streams_in_flight"] == 2.0 and full["per_stream_tok_s"] == 25.0
    assert full["ttft_s"]["source"] == "server" and full["ttft_s"]["coverage"] == "2 of 2"
    assert full["e2e_s"]["source"] == "client"  # no backend has that histogram
    partial = readers(rs, 0.0, 4.0, sustained_tok_s=50.0, series=series,
                      histograms={"a": hs(1), "b": HistogramSeries()})
    assert partial["ttft_s"]["source"] == "client"  # half the fleet's histogram is never presented as the fleet's
