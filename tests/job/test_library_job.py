"""`handbook library` (issue 27): many books over one fleet and its caps, the dataset out, resume and change, bad
lines before any request, failed books by id, shards and their merge."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cli_run import handbook as cli_handbook
from fake_openai import FakeServer

CAP = 4


def handbook(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return cli_handbook(*args, timeout=timeout)


@pytest.fixture(scope="module")
def cards(sim_fleet):
    return sim_fleet(2)


def library_file(path: Path, n: int, **extra) -> Path:
    lines = [json.dumps({"id": f"book-{i}", "prompt": f"A handbook of topic {i}", "parts": 1, "chapters": 2,
                         "sections": 2 + i % 2, **extra}) for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


def library_argv(cards, file: Path, out: Path, *more: str, cap: int = CAP) -> list[str]:
    """`handbook library FILE` on ``cards``, short sections, no progress."""
    argv = ["library", str(file), "--out", str(out), "--cap", str(cap), "--words", "60", "--max-tokens", "90", "-q"]
    for url in cards.urls:
        argv += ["--backend", url]
    return [*argv, *more]


def run_library(cards, file: Path, out: Path, *more: str) -> subprocess.CompletedProcess:
    return handbook(*library_argv(cards, file, out, *more))


def start_library(cards, file: Path, out: Path, *, in_flight: int, wait_for: int, **popen) -> subprocess.Popen:
    """The library in the background at cap 2, once it has finished ``wait_for`` books (or after 120 s)."""
    more = ("--books-in-flight", str(in_flight))
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", *library_argv(cards, file, out, *more, cap=2)],
                            **popen)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(finished_books(out)) < wait_for and proc.poll() is None:
        time.sleep(0.1)
    return proc


def finished_books(out: Path) -> list[Path]:
    return [p for p in (out / "books").glob("*/book.json") if '"complete"' in p.read_text()]


def requests_of(cards) -> int:
    return sum(cards.stats(i)["requests"] for i in range(len(cards.urls)))


def test_a_library_shares_one_fleet_and_writes_its_dataset(cards, tmp_path):
    file = library_file(tmp_path / "lib.jsonl", 5)
    out = tmp_path / "out"
    for i in range(len(cards.urls)):
        cards.reset_max(i)
    before = requests_of(cards)
    proc = run_library(cards, file, out, "--dataset", "parquet,jsonl")
    assert proc.returncode == 0, proc.stderr
    st = json.loads((out / "stats.json").read_text())
    # one fleet for every book: its caps held across books, and every request the servers saw is one of the books'
    assert all(cards.stats(i)["max_in_flight"] <= CAP for i in range(len(cards.urls)))
    assert requests_of(cards) - before == st["requests"] == st["requests_this_run"]
    assert (st["books"], st["books_done"], st["books_written"], st["failed_books"]) == (5, 5, 5, 0)
    assert st["stopped_answers"] == 0  # summed over the books' stats.json: the simulator's prose never loops
    want = {f"book-{i}": 2 * (2 + i % 2) for i in range(5)}
    sections = pq.read_table(out / "sections.parquet").to_pylist()
    books = pq.read_table(out / "books.parquet").to_pylist()
    assert {b["id"]: b["sections"] for b in books} == want
    assert len(sections) == sum(want.values()) == st["sections"]
    assert all(s["text"] and s["backend"] in cards.urls and s["t_end"] >= s["t_start"] > 1e9 for s in sections)
    assert sum(s["tokens"] for s in sections) == st["section_tokens"]
    printed = {b["id"]: (out / b["folder"] / "book.md").read_text(encoding="utf-8") for b in books}
    assert all(s["printed"] and s["printed"] in printed[s["book_id"]] for s in sections)  # as book.md prints it
    for b in books:  # each book is a book: its own folder with book.md, stats and defects, no PDF unasked
        folder = out / b["folder"]
        assert (folder / "book.md").is_file() and (folder / "defects.json").is_file()
        assert not (folder / "book.pdf").exists()
        assert json.loads((folder / "book.json").read_text())["status"] == "complete"
        own = json.loads((folder / "stats.json").read_text())
        assert own["server_counted"]["available"] is False  # the fleet's counters count every book at once
    assert len((out / "sections.jsonl").read_text().splitlines()) == len(sections)
    assert st["server_counted"]["sustained_tok_s"] > 0 and st["readers"]["ttft_s"]["source"] == "server"
    d = json.loads((out / "defects.json").read_text())
    assert d["near_duplicate_sections"]["sections_checked"] == len(sections)


def test_rerun_appended_and_changed_lines_ask_only_for_what_changed(cards, tmp_path):
    file = library_file(tmp_path / "lib.jsonl", 3)
    out = tmp_path / "out"
    assert run_library(cards, file, out).returncode == 0
    before = requests_of(cards)
    again = run_library(cards, file, out)  # the same command: nothing is asked
    assert again.returncode == 0, again.stderr
    assert requests_of(cards) == before
    st = json.loads((out / "stats.json").read_text())
    assert (st["carried_over"], st["books_written"], st["requests_this_run"]) == (3, 0, 0)
    assert len(pq.read_table(out / "sections.parquet")) == st["sections"] == 4 + 6 + 4
    table = pq.read_table(out / "sections.parquet")  # as a library wrote it before the printed column
    pq.write_table(table.drop_columns(["printed"]), out / "sections.parquet")
    older = run_library(cards, file, out)
    assert older.returncode == 0, older.stderr
    assert requests_of(cards) == before  # not carried over: its books come again from their journals, asking nothing

    def rows(table: pa.Table) -> list[dict]:
        return sorted(table.to_pylist(), key=lambda r: (r["book_id"], r["path"]))
    again_rows, first_rows = rows(pq.read_table(out / "sections.parquet")), rows(table)
    times = ("t_start", "t_end")  # read back from the journal: its finished_at, and its latency before that
    assert [{k: v for k, v in r.items() if k not in times} for r in again_rows] == [
        {k: v for k, v in r.items() if k not in times} for r in first_rows]
    assert all(abs(a[k] - b[k]) < 1.0 for a, b in zip(again_rows, first_rows, strict=True) for k in times)
    lines = file.read_text().splitlines()
    lines[1] = lines[1].replace('"sections": 3', '"sections": 2')  # a changed line: that book only, afresh
    lines.append(json.dumps({"id": "new-book", "prompt": "A handbook of kites", "parts": 1, "chapters": 1,
                             "sections": 2}))
    file.write_text("\n".join(lines) + "\n")
    proc = run_library(cards, file, out)
    assert proc.returncode == 0, proc.stderr
    st = json.loads((out / "stats.json").read_text())
    assert (st["books"], st["carried_over"], st["books_written"]) == (4, 2, 2)
    books = {b["id"]: b for b in pq.read_table(out / "books.parquet").to_pylist()}
    assert books["book-1"]["sections"] == 4 and books["new-book"]["sections"] == 2
    assert len(pq.read_table(out / "sections.parquet")) == 4 + 4 + 4 + 2


def test_bad_lines_exit_2_before_any_request(cards, tmp_path):
    file = tmp_path / "lib.jsonl"
    file.write_text('{"prompt": "A handbook of kites"}\n{"prompt": "Another", "partz": 2}\n')
    before = requests_of(cards)
    proc = run_library(cards, file, tmp_path / "out")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"handbook: error: {file}:2: ") and "partz" in lines[0], lines
    assert requests_of(cards) == before
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    proc = run_library(cards, empty, tmp_path / "out2")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


def test_failed_books_are_named_and_the_others_finish(tmp_path):
    file = library_file(tmp_path / "lib.jsonl", 3)
    out = tmp_path / "out"
    with FakeServer("ok", fail_sections=("Section topic 2",)) as srv:
        lines = file.read_text().splitlines()
        lines[0] = lines[0].replace('"sections": 2', '"sections": 1')  # book-0 has no "Section topic 2"
        file.write_text("\n".join(lines) + "\n")
        proc = handbook("library", str(file), "--out", str(out), "--backend", srv.url, "--attempts", "2", "-q",
                        "--words", "60")
    assert proc.returncode == 1
    assert "book(s) failed: book-1, book-2" in proc.stderr
    st = json.loads((out / "stats.json").read_text())
    assert st["failed_book_ids"] == ["book-1", "book-2"] and st["books_done"] == 1
    assert {b["id"]: b["status"] for b in pq.read_table(out / "books.parquet").to_pylist()} == {
        "book-0": "complete", "book-1": "failed", "book-2": "failed"}


def test_planning_that_fails_every_attempt_is_reported_by_id(tmp_path):
    file = library_file(tmp_path / "lib.jsonl", 2)
    with FakeServer("garbage") as srv:
        proc = handbook("library", str(file), "--out", str(tmp_path / "out"), "--backend", srv.url,
                        "--attempts", "2", "-q")
    assert proc.returncode == 1, proc.stderr
    assert "book-0: planning failed" in proc.stderr and "book-1: planning failed" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_shards_on_two_fleets_merge_into_the_unsharded_library(cards, sim_fleet, tmp_path):
    file = library_file(tmp_path / "lib.jsonl", 6)
    other = sim_fleet(1)  # the second host's own servers
    shards = [tmp_path / f"shard{i}" for i in range(2)]
    for i, (fleet, out) in enumerate(zip((cards, other), shards, strict=True)):
        proc = run_library(fleet, file, out, "--shard", f"{i}/2")
        assert proc.returncode == 0, proc.stderr
    ids = [{b["id"] for b in pq.read_table(d / "books.parquet").to_pylist()} for d in shards]
    assert not ids[0] & ids[1] and ids[0] | ids[1] == {f"book-{i}" for i in range(6)}
    merged = tmp_path / "merged"
    proc = handbook("library", "merge", *map(str, shards), "--out", str(merged))
    assert proc.returncode == 0, proc.stderr
    whole = tmp_path / "whole"
    assert run_library(cards, file, whole).returncode == 0

    def sections_of(d: Path) -> set[tuple[str, str]]:
        return {(r["book_id"], r["path"]) for r in pq.read_table(d / "sections.parquet").to_pylist()}

    assert sections_of(merged) == sections_of(whole)  # the same books and section paths as one unsharded run
    books = pq.read_table(merged / "books.parquet").to_pylist()
    st = json.loads((merged / "stats.json").read_text())
    assert st["books"] == 6 and st["sections"] == len(sections_of(whole))
    assert all((merged / b["folder"] / "book.md").is_file() for b in books)
    again = handbook("library", "merge", str(shards[0]), str(shards[0]), "--out", str(tmp_path / "twice"))
    assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1  # a book in two shards


def test_kill_9_and_the_same_command_resumes(cards, tmp_path):
    file = library_file(tmp_path / "lib.jsonl", 6)
    out = tmp_path / "out"
    proc = start_library(cards, file, out, in_flight=2, wait_for=2, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        done = finished_books(out)
        proc.kill()  # SIGKILL: nothing is closed, nothing is flushed
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert len(done) >= 2, "no book finished before the kill"
    before = requests_of(cards)
    again = run_library(cards, file, out)
    assert again.returncode == 0, again.stderr
    st = json.loads((out / "stats.json").read_text())
    assert st["books_done"] == 6
    assert requests_of(cards) - before == st["requests_this_run"]
    for index in done:  # a book that was complete before the kill: assembled again from its journal, no request
        own = json.loads((index.parent / "stats.json").read_text())
        assert own["requests"] == 0 and own["resumed_sections"] == own["sections"], index.parent.name
    assert len(pq.read_table(out / "sections.parquet")) == st["sections"] == sum(2 * (2 + i % 2) for i in range(6))


def test_a_forecast_of_the_whole_library(cards, tmp_path):
    file = library_file(tmp_path / "lib.jsonl", 4)
    out = tmp_path / "out"
    proc = run_library(cards, file, out, "--forecast")
    assert proc.returncode == 0, proc.stderr
    fc = json.loads((out / "forecast.json").read_text())
    st = json.loads((out / "stats.json").read_text())
    assert (fc["books"], fc["to_write"], fc["sections"]) == (4, 4, st["sections"])  # the shapes, counted exactly
    assert fc["tokens"] > 0 and fc["whole_job_s"] > 0 and fc["inputs"]["rate_at_caps_tok_s"] > 0
    assert st["forecast"]["error"]["whole_job_s"] is not None and st["forecast"]["error"]["tokens"] is not None
    again = run_library(cards, file, out, "--forecast")  # nothing left to write: a forecast of nothing
    assert again.returncode == 0, again.stderr
    fc = json.loads((out / "forecast.json").read_text())
    assert (fc["to_write"], fc["tokens"]) == (0, 0)


def test_ctrl_c_keeps_what_is_finished_and_the_rerun_completes(cards, tmp_path):
    import signal

    file = library_file(tmp_path / "lib.jsonl", 6)
    out = tmp_path / "out"
    proc = start_library(cards, file, out, in_flight=1, wait_for=1, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    st = json.loads((out / "stats.json").read_text())
    assert st["interrupted"] is True and 1 <= st["books_done"] < 6
    assert len(pq.read_table(out / "books.parquet")) == st["books_done"]  # what was finished is in the dataset
    again = run_library(cards, file, out)
    assert again.returncode == 0, again.stderr
    st = json.loads((out / "stats.json").read_text())
    assert st["books_done"] == 6 and st["carried_over"] >= 1


def test_every_backend_gone_stops_the_library_with_what_is_finished_kept(tmp_path):
    import anyio

    from orchestrator import BackendError, Settings, agenerate_library
    from orchestrator.sim.launch import SimFleet

    file = library_file(tmp_path / "lib.jsonl", 6)
    out = tmp_path / "out"
    settings = Settings(cap=2, words=60, max_tokens=90, formats=("md",), stream_sections="auto",
                        all_down_timeout_s=1.0, attempts=2)
    with SimFleet(cards=1) as fleet:
        seen: list[str] = []

        def on_event(event) -> None:
            if type(event).__name__ == "BookFinished" and event.status == "complete":
                seen.append(event.id)
                if len(seen) == 1:
                    fleet.stop()  # the only server goes away after the first book

        async def main() -> None:
            await agenerate_library(file, fleet.urls, settings, out, on_event, books_in_flight=1)

        with pytest.raises(BackendError):
            anyio.run(main)
    st = json.loads((out / "stats.json").read_text())
    assert st["books_done"] >= 1 and st["failed_books"] >= 1
    assert {b["id"] for b in pq.read_table(out / "books.parquet").to_pylist() if b["status"] == "complete"} >= set(seen)


def test_journal_times_are_a_written_sections_own():
    from orchestrator.book.assemble import Book, SectionText
    from orchestrator.core.outline import Chapter, Outline, Part
    from orchestrator.job.library_dataset import journal_times

    outline = Outline("Owls", (Part("Kinds", (Chapter("Barn owls", ("Range", "Diet", "Calls")),)),))
    texts = (SectionText("1.1.1", "Kinds", "Barn owls", "Range", "Far and wide.", "stop", 9, "http://a/v1"),
             SectionText("1.1.2", "Kinds", "Barn owls", "Diet", "Mice.", "stop", 3, "http://a/v1"),
             SectionText("1.1.3", "Kinds", "Barn owls", "Calls", "", None, 0, None, error="HTTP 500 x8"))
    stored = {"1.1.1": ("Range", 10.0, 12.5), "1.1.2": ("Prey", 20.0, 21.0), "1.1.3": ("Calls", 30.0, 31.0)}
    # 1.1.2's row is another title's (re-asked under this one); 1.1.3 failed this run: neither has the journal's times
    assert journal_times(Book(outline, texts, ""), stored) == {"1.1.1": (10.0, 12.5)}
