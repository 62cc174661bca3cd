"""End to end against simulated cards on 127.0.0.1: the spine of issue 2."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from orchestrator import Backend, Settings, generate
from orchestrator.job.report import ROW_COLUMNS
from orchestrator.metrics import parse_metrics
from orchestrator.sim.launch import SimFleet

STATS_KEYS = {
    "cards", "plan", "sections", "plan_time_s", "tokens_written", "write_time_s", "avg_tok_s_writing",
    "whole_job_s", "words", "pages_at_300_words", "typeset_s", "pdf_pages", "requests", "planning_requests",
    "request_errors", "failed_sections", "empty_sections", "truncated_sections", "server_counted", "per_backend",
}


def counter(url: str) -> float:
    base = url.removesuffix("/v1")
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as r:
        return parse_metrics(r.read().decode()).generation_tokens or 0.0


def section_headings(md: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^#### (.+)$", md, re.M)]


@pytest.fixture(scope="module")
def two_cards(sim_fleet):
    return sim_fleet(2)


def test_cli_small_book(two_cards, tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "orchestrator", "Write me a complete software engineering handbook",
           "--parts", "3", "--chapters", "3", "--sections", "4", "--out", str(out), "--format", "md", "-q"]
    for u in two_cards.urls:
        cmd += ["--backend", u]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    md = (out / "book.md").read_text()
    assert len(section_headings(md)) == 36
    stats = json.loads((out / "stats.json").read_text())
    assert STATS_KEYS <= set(stats)
    assert stats["sections"] == 36 and stats["plan"] == [1, 3, 9]
    assert stats["empty_sections"] == 0 and stats["failed_sections"] == 0
    assert stats["cards"] == 2
    outline = json.loads((out / "outline.json").read_text())
    assert len(outline["parts"]) == 3
    assert all(len(p["chapters"]) == 3 for p in outline["parts"])
    assert all(len(c["sections"]) == 4 for p in outline["parts"] for c in p["chapters"])
    # Every section in outline order, non-empty, under its own heading.
    expected = [s for p in outline["parts"] for c in p["chapters"] for s in c["sections"]]
    assert section_headings(md) == expected
    bodies = re.split(r"^#### .+$", md, flags=re.M)[1:]
    for body in bodies:
        prose = re.split(r"^#{1,3} .+$", body, flags=re.M)[0]
        assert len(prose.split()) > 20
    # The table row is printed (stdout is no terminal: 160 columns, one line per row), with the job's own figures.
    header, row = table_rows(proc.stdout)
    assert header == [name for name, _ in ROW_COLUMNS]
    cells = {key: cell for (_, key), cell in zip(ROW_COLUMNS, row, strict=True)}
    assert cells["cards"] == "2" and cells["plan"] == "1 -> 3 -> 9" and cells["sections"] == "36"
    assert cells["tokens_written"] == f"{stats['tokens_written']:,}" and stats["tokens_written"] > 0
    assert cells["words"] == f"{stats['words']:,}" and stats["words"] > 36 * 20
    assert cells["pages_at_300_words"] == f"{stats['pages_at_300_words']:,}"


def table_rows(stdout: str) -> tuple[list[str], list[str]]:
    """The header and the one data row of the table the CLI prints (rich box characters)."""
    lines = [ln.strip() for ln in stdout.splitlines()]
    heads = [ln for ln in lines if ln.startswith("┃")]
    rows = [ln for ln in lines if ln.startswith("│")]
    assert len(heads) == 1 and len(rows) == 1, stdout
    split = lambda ln, bar: [c.strip() for c in ln.strip(bar).split(bar)]
    return split(heads[0], "┃"), split(rows[0], "│")


def test_tokens_caps_and_shares(two_cards, tmp_path):
    before = [counter(u) for u in two_cards.urls]
    two_cards.reset_max()  # the module's cards served the previous test with no cap: forget its peak
    cap = 6
    events = []
    result = generate(
        "A field guide to distributed systems",
        backends=[Backend(u, cap=cap) for u in two_cards.urls],
        settings=Settings(parts=2, chapters=4, sections=12, words=80, max_tokens=160, formats=("md",)),
        out=tmp_path / "o",
        on_event=events.append,
    )
    assert not any(type(e).__name__ == "Delta" for e in events)  # no streamed text unless deltas=True
    after = [counter(u) for u in two_cards.urls]
    stats = result.stats
    assert result.complete and stats["sections"] == 96
    usage_sum = sum(b["tokens"] for b in stats["per_backend"])
    assert stats["tokens_written"] == usage_sum
    assert stats["tokens_written"] == pytest.approx(sum(after) - sum(before), abs=0.5)
    for i, b in enumerate(stats["per_backend"]):
        assert two_cards.stats(i)["max_in_flight"] <= cap
        assert b["max_in_flight"] <= cap
    shares = [b["sections"] for b in stats["per_backend"]]
    assert abs(shares[0] - shares[1]) <= 0.1 * max(shares), shares
    sc = stats["server_counted"]
    assert sc is not None and sc["metric"] == "vllm:generation_tokens_total"
    assert sc["sustained_tok_s"] > 0 and sc["best_second_tok_s"] is not None
    assert sc["best_second_tok_s"] >= sc["sustained_tok_s"] * 0.99


def test_planning_falls_back_to_text_when_json_schema_is_rejected(tmp_path):
    with SimFleet(cards=1, no_json_schema=True) as fleet:
        result = generate(
            "A short book on testing",
            backends=fleet.urls,
            settings=Settings(parts=2, chapters=2, sections=3, words=60, max_tokens=120, formats=("md",)),
            out=tmp_path / "o",
        )
    assert result.complete
    assert result.outline.shape == (2, 4, 12)
    assert result.stats["plan"] == [1, 2, 4]


def test_library_call_and_strict_order(two_cards, tmp_path):
    events = []
    result = generate(
        "A handbook of code review",
        backends=two_cards.urls,
        settings=Settings(parts=2, chapters=2, sections=2, words=60, max_tokens=120, pipeline=False,
                          formats=("md",)),
        out=tmp_path / "lib",
        on_event=events.append,
        deltas=True,
    )
    assert result.complete and result.stats["sections"] == 8
    assert Path(result.paths["md"]).read_text() == result.markdown
    kinds = [type(e).__name__ for e in events]
    assert kinds[0] == "JobStarted" and kinds[-1] == "JobFinished"
    # Strict order: no section starts before the last section title is known.
    first_section = next(i for i, e in enumerate(events) if type(e).__name__ == "NodeStarted" and e.kind == "section")
    outline_ready = kinds.index("OutlineReady")
    assert outline_ready < first_section
    assert "Delta" in kinds  # deltas=True: the streamed text too
