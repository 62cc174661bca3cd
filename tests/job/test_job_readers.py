"""What each reader gets, in a job (issue 26, part 1): stats.json ``readers`` from the servers' counters and
histograms where they have them, from the client's timing where they do not, and the printed "each reader" line."""

from __future__ import annotations

import json

import pytest
from cli_run import handbook
from fake_openai import FakeServer

from orchestrator.sim.engine import EngineConfig

SMALL = ["--parts", "2", "--chapters", "2", "--sections", "4", "--words", "80", "--max-tokens", "120",
         "--format", "md"]


@pytest.fixture(scope="module")
def cards(sim_fleet):
    return sim_fleet(2)


def ordered(entry: dict, keys: tuple[str, ...]) -> bool:
    values = [entry[k] for k in keys]
    return all(v is not None for v in values) and values == sorted(values)


def test_a_job_on_vllm_like_servers_reads_each_figure_from_them(cards, tmp_path):
    out = tmp_path / "book"
    argv = ["A handbook of kites", *SMALL, "--out", str(out), "--stream-sections", "always"]
    for url in cards.urls:
        argv += ["--backend", url]
    proc = handbook(*argv)
    assert proc.returncode == 0, proc.stderr
    st = json.loads((out / "stats.json").read_text())
    rd = st["readers"]
    assert rd["rate_source"] == "server" and rd["streams_source"] == "server"
    assert rd["rate_tok_s"] == pytest.approx(st["server_counted"]["sustained_tok_s"], rel=1e-3)
    # the reference's definition: the counted rate shared by the streams in flight
    assert rd["per_stream_tok_s"] == pytest.approx(rd["rate_tok_s"] / rd["streams_in_flight"], rel=0.01)
    assert 0 < rd["streams_in_flight"] <= st["sections"] + 2  # never more streams than requests could be open
    for key, pcts in (("ttft_s", ("p50", "p95", "p99")), ("itl_ms", ("p50", "p99")),
                      ("e2e_s", ("p50", "p95", "p99"))):
        entry = rd[key]
        assert entry["source"] == "server" and entry["coverage"] == "2 of 2", key
        assert set(entry["covered_backends"]) == set(cards.urls) and ordered(entry, pcts), entry
    assert rd["itl_ms"]["metric"] == "vllm:inter_token_latency_seconds"
    # a request's time end to end is at least its own tokens' worth of steps, and at most the writing
    assert rd["e2e_s"]["p99"] <= st["whole_job_s"] + 1
    # each section's own rate: one token per engine step, between the step at one stream and at every stream
    engine = EngineConfig()
    dec = rd["section_decode_tok_s"]
    assert dec["source"] == "client" and dec["n"] == st["sections"] and ordered(dec, ("p10", "p50", "p90"))
    assert 0.5 * engine.model_tok_s(st["sections"]) / st["sections"] <= dec["p50"] <= 1.1 * 1000 / engine.step_ms
    assert "each reader: " in proc.stdout and "(server, 2 of 2)" in proc.stdout


def test_unstreamed_sections_are_timed_by_the_servers_alone(cards, tmp_path):
    out = tmp_path / "book"
    before = [cards.stats(i) for i in range(2)]
    proc = handbook("A handbook of kites", *SMALL, "--out", str(out), "--backend", cards.urls[0],
                    "--backend", cards.urls[1], "--stream-sections", "auto")  # nothing reads the text: unstreamed
    assert proc.returncode == 0, proc.stderr
    after = [cards.stats(i) for i in range(2)]
    st = json.loads((out / "stats.json").read_text())
    streamed = sum(a["streamed"] - b["streamed"] for a, b in zip(after, before, strict=True))
    asked = sum(a["requests"] - b["requests"] for a, b in zip(after, before, strict=True))
    assert asked == st["requests"] and streamed == st["planning_requests"]  # planning streams, sections do not
    rd = st["readers"]
    assert rd["section_decode_tok_s"] is None  # no first token to time: only the servers saw the tokens come
    assert rd["ttft_s"]["source"] == "server" and rd["ttft_s"]["n"] >= st["sections"]


def test_servers_without_counters_give_the_clients_figures_labelled_so(tmp_path):
    out = tmp_path / "book"
    with FakeServer("ok") as srv:
        proc = handbook("A handbook of kites", *SMALL, "--backend", srv.url, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    rd = json.loads((out / "stats.json").read_text())["readers"]
    assert rd["rate_source"] == "client" and rd["streams_source"] == "client"
    assert rd["per_stream_tok_s"] > 0 and rd["streams_in_flight"] > 0
    for key in ("ttft_s", "itl_ms", "e2e_s"):
        assert rd[key]["source"] == "client" and rd[key]["n"] > 0 and "coverage" not in rd[key], key
    assert "client-timed" in proc.stdout and "(client)" in proc.stdout


def test_a_fleet_half_without_histograms_never_shows_half_as_the_whole(cards, tmp_path):
    out = tmp_path / "book"
    with FakeServer("ok") as srv:
        proc = handbook("A handbook of kites", *SMALL, "--backend", cards.urls[0], "--backend", srv.url,
                        "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    st = json.loads((out / "stats.json").read_text())
    rd = st["readers"]
    assert st["server_counted"]["covered_backends"] == [cards.urls[0]]
    for key in ("ttft_s", "itl_ms", "e2e_s"):  # one card's histograms are not the fleet's: the client's figures
        assert rd[key]["source"] == "client", key
    assert rd["streams_source"] == "server"  # the counted card's own streams share the counted card's rate

