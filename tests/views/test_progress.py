"""Terminal progress: plain periodic lines off a terminal, a rich live display on one; server-counted rates only."""

from __future__ import annotations

import re
import time
from io import StringIO

import anyio
import pytest
from feed_synth import synthetic_job
from rich.console import Console

from orchestrator.core.events import (
    BackendState,
    Delta,
    ForecastReady,
    JobFinished,
    JobStarted,
    LevelPlanned,
    MetricsSample,
    NodeFailed,
    NodeFinished,
    NodeStarted,
    OutlineReady,
)
from orchestrator.core.outline import Chapter, Outline, Part
from orchestrator.core.reply import Reply
from orchestrator.views.jobstate import JobState, short_url
from orchestrator.views.progress import TerminalProgress

A = "http://gpu1:8000/v1"
B = "http://gpu2:8001/v1"


def reply(backend: str, tokens: int) -> Reply:
    return Reply("text", "stop", 10, tokens, backend, 0.0, 0.1, 0.2)


def script() -> list:
    outline = Outline("Handbook", (Part("P", (Chapter("C", ("s1", "s2", "s3", "s4")),)),))
    return [
        JobStarted("Write me a handbook", (A, B), {"cap": 8}, 100.0),
        NodeStarted("", "book", "Handbook", A, 1, 100.1),
        NodeFinished("", "book", "Handbook", reply(A, 30), 100.5),
        LevelPlanned(1, 1, 100.5),
        LevelPlanned(2, 1, 101.0),
        LevelPlanned(3, 4, 101.5),
        OutlineReady(outline, 101.5),
        MetricsSample(101.5, 1000.0, 0.0, {A: {"tokens": 600.0, "running": 0.0, "waiting": 0.0}}),
        NodeStarted("1.1.1", "section", "s1", A, 1, 101.6),
        NodeStarted("1.1.2", "section", "s2", B, 1, 101.6),
        NodeStarted("1.1.3", "section", "s3", A, 1, 101.6),
        NodeStarted("1.1.4", "section", "s4", B, 1, 101.6),
        Delta("1.1.1", "hello ", 101.7),
        MetricsSample(103.5, 4000.0, 1500.0, {A: {"tokens": 2600.0, "running": 2.0, "waiting": 0.0}}),
        NodeFinished("1.1.1", "section", "s1", reply(A, 300), 103.6),
        NodeFailed("1.1.2", "section", "s2", B, 1, "HTTP 500", False, 103.7),
        NodeStarted("1.1.2", "section", "s2", A, 2, 103.8),
        NodeFailed("1.1.4", "section", "s4", B, 8, "connection refused", True, 103.9),
        BackendState(B, False, "connection refused", 103.9),
    ]


def test_job_state_counts_what_the_events_say():
    s = JobState()
    for e in script():
        s.update(e)
    assert s.sections_total == 4
    assert len(s.sections_done) == 1 and s.sections_failed == {"1.1.4"}
    assert s.retries == 1
    # in flight: 1.1.2 (now on A, attempt 2) and 1.1.3 on A; B has nothing left
    assert s.inflight == {A: 2, B: 0}
    assert s.tokens_written == 330
    assert s.rate == 1500.0
    assert s.rate_so_far == pytest.approx(3000.0 / 2.0)  # server counter: 3000 tokens over 2 s of samples
    assert s.server_tokens == 3000.0
    assert s.per_reader == 750.0  # the counted rate over the 2 streams A reports running
    snap = s.snapshot()
    assert snap["per_reader"] == 750.0
    assert snap["sections_done"] == 1 and snap["failed"] == 1
    assert [b["label"] for b in snap["backends"]] == ["gpu1:8000", "gpu2:8001"]
    assert snap["backends"][1]["healthy"] is False


def test_a_restart_without_a_failure_event_does_not_leak_in_flight():
    s = JobState()
    s.update(NodeStarted("1.1.1", "section", "s", A, 1, 1.0))
    s.update(NodeStarted("1.1.1", "section", "s", B, 2, 2.0))  # the first attempt ended silently
    assert s.inflight == {A: 0, B: 1}
    s.update(NodeFinished("1.1.1", "section", "s", reply(B, 5), 3.0))
    assert s.inflight == {A: 0, B: 0}


def test_plain_lines_off_a_terminal():
    out = StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    progress = TerminalProgress(console, plain_interval=0.05)
    assert progress.live_mode is False
    with progress:
        for e in script():
            progress(e)
        deadline = time.monotonic() + 5
        while out.getvalue().count("sections 1/4") < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        progress(JobFinished({"sections": 4}, False, 104.0))
    text = out.getvalue()
    assert "\x1b" not in text, "plain lines carry no terminal escapes"
    lines = text.splitlines()
    assert "job started on 2 backends: gpu1:8000, gpu2:8001" in lines
    assert "planned level 3: 4 sections" in lines
    assert "outline ready: 1 parts, 1 chapters, 4 sections" in lines
    assert "backend gpu2:8001 out of rotation: connection refused" in lines
    assert any("section 1.1.4 's4' failed after 8 attempts: connection refused" in x for x in lines)
    periodic = [x for x in lines if "sections 1/4 (25.0%)" in x]
    assert len(periodic) >= 2, text  # the timer printed at least once, stop() printed the last one
    last = periodic[0]  # printed while the job ran (the closing one, after JobFinished, has nothing in flight)
    assert "tokens 330" in last
    assert "rate 1,500 tok/s (so far 1,500, each reader 750 tok/s)" in last
    assert re.search(r"in flight 2 \[gpu1:8000=2 gpu2:8001=0\(down\)\]", last), last
    assert "retries 1" in last and "failed 1" in last
    assert "in flight 0 " in periodic[-1]
    assert lines[-1] == "job finished with problems (1 failed sections)"
    # No forecast was made: nothing about one (no empty figure, no "ETA ?").
    assert "forecast" not in text and "ETA" not in text
    assert progress.state.eta() is None and progress.state.snapshot()["forecast"] is None


def test_plain_line_before_the_outline_and_without_server_counters():
    progress = TerminalProgress(Console(file=StringIO(), force_terminal=False), plain_interval=60)
    progress(JobStarted("p", (A,), {}, 0.0))
    progress(LevelPlanned(1, 8, 1.0))
    line = progress.plain_line()
    assert "planning L1=8" in line and "rate -" in line
    # Chunk arrivals never make a rate: only MetricsSample does.
    for i in range(50):
        progress(Delta("1.1.1", "x" * 10, 1.0 + i / 100))
    assert "rate -" in progress.plain_line()
    progress(MetricsSample(2.0, None, None, {A: {"tokens": None, "running": None, "waiting": None}}))
    assert "rate n/a (no server counter)" in progress.plain_line()


def test_rich_live_display_on_a_terminal():
    out = StringIO()
    console = Console(file=out, force_terminal=True, width=120, height=40, color_system="truecolor")
    progress = TerminalProgress(console)
    assert progress.live_mode is True
    with progress:
        anyio.run(lambda: synthetic_job(progress, parts=1, chapters=2, sections=3, chunk_delay=0.002,
                                        fail_path="1.2.3", words=40))
    text = out.getvalue()
    assert "\x1b[" in text
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    for word in ("handbook", "Software Engineering Handbook", "sections", "5/6", "tok/s", "127.0.0.1:8101",
                 "retries", "1 failed"):
        assert word in plain, word
    assert "finished with problems (1 failed sections)" in plain
    assert "forecast" not in plain and "ETA" not in plain  # this job made no forecast
    # Rendering straight away (no events at all) works too.
    Console(file=StringIO(), force_terminal=True, width=60).print(TerminalProgress(console)._render())


def test_short_url():
    assert short_url("http://gpu1:8000/v1") == "gpu1:8000"
    assert short_url("https://api.example.com/v1") == "api.example.com"
    assert short_url("not a url") == "not a url"


def test_planning_nodes_leave_flight_when_their_children_start():
    # Planning nodes may get no NodeFinished: a child's start (or the outline) shows that the parent is done.
    s = JobState()
    s.update(JobStarted("p", (A, B), {"parts": 2, "chapters": 3, "sections": 4, "cap": 8}, 0.0))
    assert s.total == 24 and s.snapshot()["outline_known"] is False
    s.update(NodeStarted("", "book", "Book", A, 1, 0.1))
    assert s.inflight[A] == 1
    assert s.update(NodeStarted("1", "part", "P1", B, 1, 0.2)) == [""]
    s.update(NodeStarted("2", "part", "P2", A, 1, 0.2))
    assert s.inflight == {A: 1, B: 1} and s.plan_done == 1
    assert s.update(NodeStarted("1.1", "chapter", "C", A, 1, 0.3)) == ["1"]
    s.update(NodeStarted("1.1.1", "section", "S", B, 1, 0.4))
    assert s.inflight == {A: 1, B: 1} and s.plan_done == 3  # book, part 1, chapter 1.1; part 2 still running
    outline = Outline("Book", (Part("P1", (Chapter("C", ("S",)),)), Part("P2", ())))
    s.update(OutlineReady(outline, 0.5))
    assert s.inflight == {A: 0, B: 1} and s.plan_done == 4 and s.total == 1
    # A NodeFinished for a planning node (if the runner sends one) is not counted twice.
    s.update(NodeFinished("2", "part", "P2", reply(A, 10), 0.6))
    assert s.plan_done == 4


def test_plain_line_while_planning_and_writing_overlap():
    progress = TerminalProgress(Console(file=StringIO(), force_terminal=False), plain_interval=60)
    progress(JobStarted("p", (A,), {"parts": 2, "chapters": 2, "sections": 2}, 0.0))
    progress(LevelPlanned(1, 2, 1.0))
    progress(NodeStarted("1.1.1", "section", "S", A, 1, 2.0))
    progress(NodeFinished("1.1.1", "section", "S", reply(A, 50), 3.0))
    line = progress.plain_line()
    assert "sections 1/~8 (12.5%)" in line and "planning L1=2" in line and "tokens 50" in line


def test_a_rate_over_some_backends_is_labelled_as_such():
    # B answers /metrics without a token counter: the rate is A's alone, and every view says so
    progress = TerminalProgress(Console(file=StringIO(), force_terminal=False), plain_interval=60)
    progress(JobStarted("p", (A, B), {}, 0.0))
    partial = {A: {"tokens": 600.0, "running": 1.0, "waiting": 0.0}, B: {"tokens": None, "running": 2.0,
                                                                          "waiting": 0.0}}
    progress(MetricsSample(1.0, 600.0, None, partial))
    progress(MetricsSample(2.0, 1600.0, 1000.0, partial))
    line = progress.plain_line()
    # each reader: the counted rate over the counted backend's streams only (B's 2 are not in its rate)
    assert "rate 1,000 tok/s (so far 1,000, each reader 1,000 tok/s) server-counted (1 of 2 backends)" in line, line
    snap = progress.state.snapshot()
    assert snap["rate_label"] == "server-counted (1 of 2 backends)"
    assert (snap["counted_backends"], snap["metered_backends"]) == (1, 2)
    out = StringIO()
    Console(file=out, force_terminal=True, width=160).print(progress._render())
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert "server-counted (1 of 2 backends)" in plain
    # once every backend is counted, the rate is the fleet's and carries no qualifier
    whole = {A: {"tokens": 2600.0, "running": 1.0, "waiting": 0.0}, B: {"tokens": 10.0, "running": 2.0,
                                                                         "waiting": 0.0}}
    progress(MetricsSample(3.0, 2610.0, 1000.0, whole))
    assert "backends)" not in progress.plain_line()
    assert progress.state.snapshot()["rate_label"] == "server-counted"


# -- the forecast beside the live figures ---------------------------------------------------------------------------

FORECAST = {"sections": 4, "tokens": 4000, "pages": 20, "whole_job_s": 40.0, "plan_s": 5.0, "write_s": 30.0,
            "words": 3000, "per_backend": [], "inputs": {"fit": "test"}}


def counted(t: float, tokens: float, rate: float = 100.0, partial: bool = False) -> MetricsSample:
    per = {A: {"tokens": tokens, "running": 1.0, "waiting": 0.0}}
    if partial:
        per[B] = {"tokens": None, "running": 1.0, "waiting": 0.0}
    return MetricsSample(t, tokens, rate, per)


def forecast_job(partial: bool = False) -> list:
    """A job forecast at 40 s (5 s planning, 30 s writing, 5 s after), 4,000 tokens, 20 A5 pages."""
    return [
        JobStarted("p", (A,), {"cap": 8}, 100.0),
        ForecastReady(40.0, 20, 4, 4000, FORECAST, 100.0),
        counted(101.0, 0.0, partial=partial),
    ]


def test_the_eta_goes_by_the_forecast_then_leans_on_the_servers_rate():
    s = JobState()
    for e in forecast_job():
        s.update(e)
    eta = s.eta()
    assert eta is not None and (eta.forecast_s, eta.pages, eta.tokens) == (40.0, 20, 4000)
    assert (eta.left_s, eta.basis, eta.over_s) == (39.0, "forecast", 0.0)
    s.update(LevelPlanned(3, 1, 104.0))
    s.update(NodeStarted("1.1.1", "section", "s1", A, 1, 105.0))  # writing begins: the rate counts from here
    s.update(counted(102.5, 0.0))
    s.update(counted(106.0, 500.0))
    # 500 tokens in 5 s: 3,500 left take 35 s, plus the forecast's 5 s after writing -> 46 s by the live rate;
    # an eighth of the forecast tokens is written, so an eighth of the weight goes to it.
    eta = s.eta()
    assert eta.basis == "forecast + live rate"
    assert eta.left_s == pytest.approx(0.875 * 40 + 0.125 * 46 - 6)
    assert eta.forecast_s == 40.0  # the forecast itself is never revised
    s.update(counted(145.0, 3000.0))  # past the forecast: the live rate alone says what is left
    eta = s.eta()
    assert eta.basis == "live rate" and eta.over_s == pytest.approx(5.0)
    assert eta.left_s == pytest.approx(1000 / (3000 / 44) + 5)
    s.update(NodeFinished("1.1.1", "section", "s1", reply(A, 3900), 150.0))
    s.update(counted(152.0, 3900.0))
    eta = s.eta()  # every section is in: the forecast's 5 s after writing, less the 2 s they have had
    assert (eta.basis, eta.left_s) == ("after writing", pytest.approx(3.0))
    s.update(JobFinished({"whole_job_s": 56.0, "pdf_pages": 21}, True, 156.0))
    eta = s.eta()
    assert (eta.took_s, eta.left_s, eta.basis) == (56.0, 0.0, "took")
    assert eta.error_pct == pytest.approx(40.0) and eta.pages_error_pct == pytest.approx(5.0)
    snap = s.snapshot()["forecast"]
    assert snap["forecast_s"] == 40.0 and snap["took_s"] == 56.0 and snap["error_pct"] == 40.0
    assert snap["pdf_pages"] == 21 and snap["basis_text"] == "finished"


def test_a_rate_over_part_of_the_fleet_is_not_used_for_the_eta():
    s = JobState()
    for e in forecast_job(partial=True):
        s.update(e)
    s.update(NodeStarted("1.1.1", "section", "s1", A, 1, 105.0))
    s.update(counted(110.0, 900.0, partial=True))
    eta = s.eta()
    assert (eta.basis, eta.left_s) == ("forecast", 30.0)
    s.update(counted(141.0, 1000.0, partial=True))
    eta = s.eta()  # past the forecast with nothing trustworthy to go by: how far over, and no guess
    assert eta.left_s is None and eta.over_s == pytest.approx(1.0)


def test_plain_lines_show_the_forecast_beside_the_live_figures():
    out = StringIO()
    progress = TerminalProgress(Console(file=out, force_terminal=False, width=300), plain_interval=60)
    with progress:
        for e in forecast_job():
            progress(e)
        assert progress.plain_line().endswith("forecast 40s · ETA 39s (by the forecast)")
        progress(NodeStarted("1.1.1", "section", "s1", A, 1, 105.0))
        progress(counted(106.0, 500.0))
        assert "forecast 40s · ETA 34s (forecast + the servers' writing rate)" in progress.plain_line()
        progress(counted(145.0, 3000.0))
        assert "forecast 40s · 5.0s over · ETA 19s (at the servers' writing rate)" in progress.plain_line()
        progress(JobFinished({"whole_job_s": 46.0, "pdf_pages": 21}, True, 146.0))
    lines = out.getvalue().splitlines()
    assert "forecast: 40s for the whole job, 20 A5 pages, 4 sections, 4,000 tokens" in lines
    assert "forecast 40s, took 46s (+15%)" in lines[-3]  # the closing plain line
    assert lines[-2] == "forecast 40s, took 46s (+15%); 20 A5 pages forecast, 21 typeset (+5%)"
    assert lines[-1] == "job complete"


def test_the_live_display_shows_the_forecast_and_the_eta():
    progress = TerminalProgress(Console(file=StringIO(), force_terminal=True), plain_interval=60)
    for e in forecast_job():
        progress(e)
    progress(NodeStarted("1.1.1", "section", "s1", A, 1, 105.0))
    progress(counted(106.0, 500.0))

    def text() -> str:
        console = Console(record=True, width=140, file=StringIO())
        console.print(progress._render())
        return console.export_text()

    view = text()
    assert "tokens    0 written · 4,000 forecast" in view, view
    assert "forecast  40s whole job · 20 A5 pages · 4 sections   ETA 34s (forecast + the servers' writing rate)" in view
    progress(counted(145.0, 3000.0))
    assert "5.0s over   ETA 19s (at the servers' writing rate)" in text()
    progress(JobFinished({"whole_job_s": 38.0}, True, 138.0))
    assert "40s whole job · 20 A5 pages · 4 sections   took 38s (-5%)" in text()


def test_a_resumed_job_measures_its_forecast_against_what_it_writes():
    # The forecast of a resumed job counts only the sections left to write; the journal's answers (NodeFinished
    # with no attempt in this run) are not progress against it.
    s = JobState()
    s.update(JobStarted("p", (A,), {}, 100.0))
    s.update(LevelPlanned(3, 4, 100.0))
    s.update(ForecastReady(40.0, 10, 2, 2000, FORECAST, 100.0))
    s.update(NodeFinished("1.1.1", "section", "s1", reply(A, 900), 100.1))
    s.update(NodeFinished("1.1.2", "section", "s2", reply(A, 900), 100.1))
    assert (s.tokens_written, s.tokens_asked) == (1800, 0)
    s.update(counted(101.0, 0.0))
    s.update(NodeStarted("1.1.3", "section", "s3", A, 1, 102.0))
    s.update(counted(106.0, 500.0))
    eta = s.eta()  # a quarter of the 2,000 tokens left is written: 1,500 more at 100 tok/s, then 5 s after writing
    assert eta.basis == "forecast + live rate"
    assert eta.left_s == pytest.approx(0.75 * 40 + 0.25 * (6 + 15 + 5) - 6)
    s.update(JobFinished({"whole_job_s": 30.0, "pdf_pages": 21}, True, 130.0))
    eta = s.eta()
    assert eta.took_s == 30.0 and eta.error_pct == pytest.approx(-25.0)
    assert eta.pdf_pages is None  # the PDF is the whole book's, the forecast was of half of it


def test_a_live_display_of_a_forecast_job_closes_with_how_good_the_forecast_was():
    out = StringIO()
    progress = TerminalProgress(Console(file=out, force_terminal=True, width=160, height=40, color_system="truecolor"))
    with progress:
        anyio.run(lambda: synthetic_job(progress, parts=1, chapters=2, sections=3, chunk_delay=0.002, words=40,
                                        forecast_s=30.0, pdf_pages=3))
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert "forecast  30s whole job · 1 A5 pages · 6 sections" in plain
    lines = plain.splitlines()
    assert re.fullmatch(r"forecast 30s, took [0-9.]+s \(-[0-9]+%\); 1 A5 pages forecast, 3 typeset \(\+200%\)",
                        lines[-2]), lines[-2]
    assert lines[-1] == "job complete"


PDF_STATS = {"whole_job_s": 156.0, "pdf_ready_s": 154.2, "typeset_after_write_s": 6.07, "pdf_pages": 1348,
             "typeset_cpu_s": {"during_write": 80.5, "after_write": 5.9, "chunks_from_background": 11}}
PDF_LINE = "PDF ready 154.2 s after start, 6.1 s after the last section (1,348 A5 pages)"


@pytest.mark.parametrize("pdf", [True, False])
def test_a_job_with_a_pdf_closes_with_when_it_was_ready(pdf: bool):
    stats = PDF_STATS if pdf else {**PDF_STATS, "pdf_ready_s": None, "typeset_after_write_s": None}
    out = StringIO()
    with TerminalProgress(Console(file=out, force_terminal=False, width=300), plain_interval=60) as progress:
        for e in script():
            progress(e)
        progress(JobFinished(stats, False, 104.0))
    lines = out.getvalue().splitlines()
    assert lines[-1].startswith("job finished with problems")
    assert (lines[-2] == PDF_LINE) if pdf else ("PDF ready" not in out.getvalue())  # no PDF: nothing said of one
    live = TerminalProgress(Console(file=StringIO(), force_terminal=True), plain_interval=60)
    for e in forecast_job():
        live(e)
    console = Console(record=True, width=160, file=StringIO())
    console.print(live._render())
    assert "PDF ready" not in console.export_text()  # only a finished job has a PDF to speak of
    live(JobFinished(stats, True, 146.0))
    console.print(live._render())
    view = console.export_text()
    assert "took 2m36s" in view and "1,348 A5 pages typeset" in view  # the forecast's own closing figures stay
    assert (f"pdf       {PDF_LINE}" in view) if pdf else ("PDF ready" not in view), view

