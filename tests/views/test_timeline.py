"""--timeline: the run as a picture (orchestrator.timeline). A job on simulated cards writes timeline.png and
timeline.json whose figures agree with the job's own stats and limits; the consumer itself, fed made-up events."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from orchestrator import cli
from orchestrator.cli.job import resolve
from orchestrator.core.events import Delta, JobStarted, MetricsSample, NodeFailed, NodeFinished, NodeStarted
from orchestrator.core.reply import Reply
from orchestrator.views.timeline import RunTimeline

PROMPT = "Write me a complete software engineering handbook"
SHAPE = ["--parts", "2", "--chapters", "3", "--sections", "4", "--words", "40", "--max-tokens", "80"]
CAP = 3  # below what 24 sections on 2 cards would take at once: the cap is reached, so exceeding it would show


@pytest.fixture(scope="module")
def cards(sim_fleet):
    return sim_fleet(2, time_scale=0.5)


def backend_flags(cards) -> list[str]:
    return [x for u in cards.urls for x in ("--backend", u)]


def check_png(path: Path) -> None:
    with Image.open(path) as im:
        assert im.format == "PNG"
        assert im.size[0] > 400 and im.size[1] > 300
        im.verify()


def check_in_flight(data: dict) -> None:
    """Every card's count stays within its cap, never goes negative, and ends at zero; the series agrees with the
    requests it was made from."""
    for url, steps in data["in_flight"].items():
        counts = [n for _, n in steps]
        assert max(counts) <= data["caps"][url] == CAP
        assert min(counts) >= 0 and counts[-1] == 0
        times = [t for t, _ in steps]
        assert times == sorted(times)
        assert sum(r["backend"] == url for r in data["requests"]) > 0
    assert {r["backend"] for r in data["requests"]} <= set(data["backends"])


def test_a_job_with_timeline_writes_a_chart_and_data_that_agree_with_its_stats(cards, tmp_path):
    out = tmp_path / "out"
    code = cli.main([PROMPT, *SHAPE, *backend_flags(cards), "--cap", str(CAP), "--format", "md", "--out", str(out),
                     "--timeline", "-q"])
    assert code == 0
    check_png(out / "timeline.png")
    data = json.loads((out / "timeline.json").read_text())
    stats = json.loads((out / "stats.json").read_text())

    assert len(data["requests"]) == stats["requests"]
    kinds = [r["kind"] for r in data["requests"]]
    assert kinds.count("section") >= stats["sections"] == 24
    assert sum(k != "section" for k in kinds) == stats["planning_requests"]
    assert all(0 <= r["start"] <= r["end"] <= data["end"] and r["ok"] is not None for r in data["requests"])
    check_in_flight(data)
    assert max(max(n for _, n in steps) for steps in data["in_flight"].values()) == CAP  # the cap was reached

    # the critical path is one chain book -> part -> chapter, ending at the chapter whose titles arrived last, then
    # the book's brief when it came later still (a section request carries both: --context outline, the default)
    path = data["critical_path"]
    nodes = path["nodes"]
    assert [n["kind"] for n in nodes] in (["book", "part", "chapter"], ["book", "part", "chapter", "brief"])
    brief_end = next(r["end"] for r in data["requests"] if r["kind"] == "brief" and r["ok"])
    assert (len(nodes) == 4) == (brief_end > nodes[2]["end"])
    nodes = nodes[:3]
    book, part, chapter = (n["path"] for n in nodes)
    assert book == "" and chapter.split(".")[0] == part
    chapter_ends = [r["end"] for r in data["requests"] if r["kind"] == "chapter" and r["ok"]]
    assert nodes[2]["end"] == max(chapter_ends)
    section_starts = [r["start"] for r in data["requests"] if r["kind"] == "section"]
    assert path["last_section_start"] == max(section_starts) >= nodes[2]["start"]

    # tokens/s from the job's own counter samples: something was counted, and the sum is the cards' sum
    rates = data["tokens_per_s"]
    assert rates["t"] and max(v or 0 for v in rates["total"]) > 0
    for i, total in enumerate(rates["total"]):
        per = [rates["per_backend"][u][i] for u in data["backends"]]
        if total is not None and None not in per:
            assert total == pytest.approx(sum(per), abs=0.05)


def test_plan_then_write_each_draw_their_own_requests(cards, tmp_path):
    out = tmp_path / "book"
    assert cli.main(["plan", PROMPT, *SHAPE, *backend_flags(cards), "--out", str(out), "--timeline", "-q"]) == 0
    planned = json.loads((out / "timeline.json").read_text())
    assert {r["kind"] for r in planned["requests"]} == {"book", "brief", "part", "chapter"}
    assert [n["kind"] for n in planned["critical_path"]["nodes"]][:3] == ["book", "part", "chapter"]
    assert planned["critical_path"]["last_section_start"] is None

    assert cli.main(["write", str(out), *backend_flags(cards), "--cap", str(CAP), "--format", "md", "--timeline",
                     "-q"]) == 0
    check_png(out / "timeline.png")
    written = json.loads((out / "timeline.json").read_text())
    stats = json.loads((out / "stats.json").read_text())
    assert {r["kind"] for r in written["requests"]} == {"section"}  # the outline came from outline.md
    assert len(written["requests"]) == stats["requests"]
    assert written["critical_path"]["nodes"] == []
    check_in_flight(written)


@pytest.mark.parametrize("extra, wanted", [(["--timeline"], True), ([], False)])
def test_the_timeline_flag_reaches_the_settings(extra, wanted):
    settings = resolve([PROMPT, "--backend", "http://127.0.0.1:9/v1", *extra])[2]
    assert settings.timeline is wanted


def reply(backend: str, t_start: float, t_end: float) -> Reply:
    return Reply("text", "stop", 1, 1, backend, t_start, t_start, t_end)


def test_the_consumer_counts_requests_not_journal_answers_and_scales_time(tmp_path):
    a, b = "http://a/v1", "http://b/v1"
    tl = RunTimeline(time_scale=2.0, caps={a: 1, b: 1})
    events = [
        JobStarted(PROMPT, (a, b), {"cap": 1}, 100.0),
        NodeStarted("", "book", "B", a, 1, 100.0),
        Delta("", "text", 100.5),  # never needed: ignored
        NodeFailed("", "book", "B", a, 1, "HTTP 500", False, 101.0),
        NodeStarted("", "book", "B", b, 2, 102.0),
        NodeFinished("", "book", "B", reply(b, 102.0, 104.0), 104.5),  # the reply's own end counts
        NodeStarted("1", "part", "P", a, 1, 104.0),  # starts as the book's slot on b is freed, on another card
        NodeFinished("1", "part", "P", reply(a, 104.0, 106.0), 106.0),
        NodeStarted("1.1", "chapter", "C", a, 1, 106.0),  # a slot freed and taken at one instant: one stream
        NodeFinished("1.1", "chapter", "C", reply(a, 106.0, 108.0), 108.0),
        NodeFinished("1.1.1", "section", "S", reply(a, 90.0, 91.0), 108.0),  # from the journal: no request
        NodeStarted("1.1.2", "section", "T", b, 1, 107.0),
        MetricsSample(104.0, 10.0, None, {a: {"tokens": 0.0}, b: {"tokens": 10.0}}),
        MetricsSample(105.0, 60.0, None, {a: {"tokens": 20.0}, b: {"tokens": 40.0}}),
    ]
    for ev in events:
        tl(ev)
    tl.write(tmp_path / "t.png", t_end=110.0)
    check_png(tmp_path / "t.png")
    data = json.loads((tmp_path / "t.json").read_text())
    reqs = data["requests"]
    assert [(r["kind"], r["ok"]) for r in reqs] == [("book", False), ("book", True), ("part", True),
                                                     ("chapter", True), ("section", None)]
    assert reqs[0]["error"] == "HTTP 500"
    assert (reqs[1]["start"], reqs[1]["end"]) == (1.0, 2.0)  # (102 - 100) / 2, (104 - 100) / 2
    assert reqs[4]["end"] == data["end"] == 5.0  # still open: it ends where the data ends
    assert data["max_in_flight"] == {a: 1, b: 1}
    assert [n["path"] for n in data["critical_path"]["nodes"]] == ["", "1", "1.1"]
    assert data["critical_path"]["nodes"][0]["start"] == 0.0  # a node's span runs from its first attempt
    assert data["critical_path"]["last_section_start"] == 3.5
    # counters: 20 and 30 tokens in one wall second are 40 and 60 tokens per model second
    assert data["tokens_per_s"]["per_backend"] == {a: [None, 40.0], b: [None, 60.0]}
    assert data["tokens_per_s"]["total"] == [None, 100.0]


def test_a_continued_section_is_not_counted_in_flight_while_its_continuation_waits(tmp_path):
    """--finish-truncated: the first reply ends, its slot goes to another section, then the continuation gets a
    lease. The first reply's request ends where it ended (the finished section's reply keeps its t_end), so the
    card never shows more streams than its cap."""
    a = "http://a/v1"
    tl = RunTimeline(caps={a: 1})
    for ev in [
        JobStarted(PROMPT, (a,), {"cap": 1}, 0.0),
        NodeStarted("1.1.1", "section", "S", a, 1, 0.0),  # the first reply: 0 -> 2 (cut at the cap)
        NodeStarted("1.1.2", "section", "T", a, 1, 2.0),  # takes the freed slot
        NodeFinished("1.1.2", "section", "T", reply(a, 2.0, 4.0), 4.0),
        NodeStarted("1.1.1", "section", "S", a, 1, 4.0),  # the continuation: 4 -> 5
        NodeFinished("1.1.1", "section", "S", reply(a, 0.0, 2.0), 5.0),  # the finished text keeps t_end 2
    ]:
        tl(ev)
    data = tl.data(t_end=5.0)
    spans = sorted((r["path"], r["start"], r["end"]) for r in data["requests"])
    assert spans == [("1.1.1", 0.0, 2.0), ("1.1.1", 4.0, 5.0), ("1.1.2", 2.0, 4.0)]
    assert data["max_in_flight"] == {a: 1}
