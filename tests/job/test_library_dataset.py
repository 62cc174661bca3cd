"""A library's dataset: rows round-trip through parquet (and the jsonl mirror) in row groups, files are published
by rename only, a resume carries finished books over, and merge joins shards or refuses in one line."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator.book.assemble import Book, SectionText
from orchestrator.core.errors import ConfigError
from orchestrator.core.outline import Chapter, Outline, Part
from orchestrator.core.states import Missing
from orchestrator.job.library_dataset import (
    BOOK_SCHEMA,
    SECTION_SCHEMA,
    BookRow,
    DatasetWriter,
    SectionRow,
    book_row,
    rebuild,
    section_rows,
)
from orchestrator.job.library_merge import merge, merge_stats


def rows_of(book_id: str, sections: int = 3, key: str = "k1") -> tuple[BookRow, list[SectionRow]]:
    secs = [SectionRow(book_id, f"prompt of {book_id}", f"Title {book_id}", "Part 1", "Chapter 1", f"Section {i}",
                       f"1.1.{i}", f"Text {i} of {book_id}. " * i, 5 * i, 7 * i,
                       "length" if i == 2 else "stop", "http://gpu1:8000/v1", "m", 1 + i % 2, 100.0 + i, 101.5 + i,
                       "HTTP 500" if i == 5 else None, "" if i == 5 else f"Text {i} of {book_id}.")
            for i in range(1, sections + 1)]
    book = BookRow(book_id, key, f"prompt of {book_id}", f"Title {book_id}", (1, 1, sections), sections,
                   sum(s.words for s in secs), sum(s.tokens for s in secs), "complete", f"books/{book_id}",
                   ("book.md", "book.pdf"))
    return book, secs


def as_dicts(rows) -> list[dict]:
    return [{k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(r).items()} for r in rows]


def write_dataset(out: Path, books: list[tuple[BookRow, list[SectionRow]]], **kw) -> dict[str, Path]:
    with DatasetWriter(out, **kw) as w:
        for book, secs in books:
            w.add_book(book, secs)
    return w.close()


def test_the_schemas_name_the_row_fields_in_order():
    assert SECTION_SCHEMA.names == [f.name for f in dataclasses.fields(SectionRow)]
    assert BOOK_SCHEMA.names == [f.name for f in dataclasses.fields(BookRow)]


def test_rows_round_trip_with_their_types(tmp_path):
    books = [rows_of("a", 3), rows_of("b", 5)]
    paths = write_dataset(tmp_path, books)
    assert set(paths) == {"sections.parquet", "books.parquet"}
    sections = pq.read_table(tmp_path / "sections.parquet")
    assert sections.schema.equals(SECTION_SCHEMA)
    assert sections.to_pylist() == as_dicts(s for _, secs in books for s in secs)
    table = pq.read_table(tmp_path / "books.parquet")
    assert table.schema.equals(BOOK_SCHEMA)
    assert table.to_pylist() == as_dicts(b for b, _ in books)
    assert not list(tmp_path.glob("*.part")) and not list(tmp_path.glob("*.jsonl"))


def test_pandas_reads_the_dataset(tmp_path):
    import pandas as pd  # a dev dependency: the dataset must read in pandas (a failure, never a skip)
    write_dataset(tmp_path, [rows_of("a", 4)])
    frame = pd.read_parquet(tmp_path / "sections.parquet")
    assert len(frame) == 4 and list(frame.columns) == SECTION_SCHEMA.names
    assert frame["tokens"].dtype.kind == "i" and frame["t_start"].dtype.kind == "f"
    assert frame["error"].isna().all()
    books = pd.read_parquet(tmp_path / "books.parquet")
    assert list(books.loc[0, "shape"]) == [1, 1, 4] and list(books.loc[0, "files"]) == ["book.md", "book.pdf"]


def test_many_rows_make_many_row_groups_of_the_set_size(tmp_path):
    books = [rows_of(f"b{i}", 7) for i in range(20)]  # 140 sections
    write_dataset(tmp_path, books, rows_per_group=32)
    f = pq.ParquetFile(tmp_path / "sections.parquet")
    sizes = [f.metadata.row_group(i).num_rows for i in range(f.num_row_groups)]
    assert sizes == [32, 32, 32, 32, 12]
    assert pq.ParquetFile(tmp_path / "books.parquet").metadata.num_rows == 20
    assert f.read().column("book_id").to_pylist() == [b.id for b, secs in books for _ in secs]


def test_rows_are_written_as_groups_fill_not_held(tmp_path):
    w = DatasetWriter(tmp_path, rows_per_group=10)
    for i in range(9):
        w.add_book(*rows_of(f"b{i}", 4))
    assert w.sinks["sections"].buffered < 10  # 36 rows in: 3 groups written, 6 rows waiting
    assert w.sinks["sections"].writer is not None and (tmp_path / "sections.parquet.part").stat().st_size > 0
    w.close()
    assert pq.ParquetFile(tmp_path / "sections.parquet").num_row_groups == 4


def test_files_are_published_by_rename_on_close_only(tmp_path):
    write_dataset(tmp_path, [rows_of("old", 2)])
    before = {n: (tmp_path / n).read_bytes() for n in ("sections.parquet", "books.parquet")}
    w = DatasetWriter(tmp_path)
    w.add_book(*rows_of("new", 3))
    assert (tmp_path / "sections.parquet.part").exists() and (tmp_path / "books.parquet.part").exists()
    # a crash here (the process killed): the previous complete dataset is untouched
    assert {n: (tmp_path / n).read_bytes() for n in before} == before
    w.close()
    assert not list(tmp_path.glob("*.part"))
    assert pq.read_table(tmp_path / "books.parquet").column("id").to_pylist() == ["new"]


def test_an_error_inside_with_leaves_the_previous_dataset(tmp_path):
    write_dataset(tmp_path, [rows_of("old", 2)])
    before = (tmp_path / "books.parquet").read_bytes()
    with pytest.raises(RuntimeError), DatasetWriter(tmp_path) as w:
        w.add_book(*rows_of("new", 2))
        raise RuntimeError("the runner failed")
    assert (tmp_path / "books.parquet").read_bytes() == before
    assert not list(tmp_path.glob("*.part"))


def test_the_jsonl_mirror_holds_the_same_rows(tmp_path):
    books = [rows_of("a", 2), rows_of("b", 3)]
    paths = write_dataset(tmp_path, books, formats=("parquet", "jsonl"), rows_per_group=2)
    assert set(paths) == {"sections.parquet", "books.parquet", "sections.jsonl", "books.jsonl"}
    lines = (tmp_path / "sections.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(x) for x in lines] == pq.read_table(tmp_path / "sections.parquet").to_pylist()
    books_read = [json.loads(x) for x in (tmp_path / "books.jsonl").read_text(encoding="utf-8").splitlines()]
    assert books_read == as_dicts(b for b, _ in books)
    write_dataset(tmp_path, books)  # parquet only now: the old mirror would go stale
    assert not (tmp_path / "sections.jsonl").exists()


@pytest.mark.parametrize("formats", [(), ("csv",), ("parquet", "json")])
def test_unknown_dataset_formats_are_one_line(tmp_path, formats):
    with pytest.raises(ConfigError, match=r"--dataset: expected any of parquet,jsonl"):
        DatasetWriter(tmp_path, formats)


def test_add_book_refuses_a_book_twice_or_rows_of_another(tmp_path):
    w = DatasetWriter(tmp_path)
    w.add_book(*rows_of("a"))
    with pytest.raises(ValueError, match="already"):
        w.add_book(*rows_of("a"))
    book, _ = rows_of("b")
    with pytest.raises(ValueError, match="another book"):
        w.add_book(book, rows_of("c")[1])
    w.abort()
    assert not list(tmp_path.iterdir())


def test_carry_over_keeps_finished_books_with_their_key(tmp_path):
    books = {i: rows_of(i, n, key=f"key-{i}") for i, n in (("a", 3), ("b", 4), ("c", 2))}
    write_dataset(tmp_path, list(books.values()), formats=("parquet", "jsonl"), rows_per_group=2)
    w = DatasetWriter(tmp_path, ("parquet", "jsonl"), rows_per_group=2)
    kept = w.carry_over({"a": "key-a", "b": "changed", "z": "key-z"})  # b's line changed; z never written
    assert kept == {"a"}
    w.add_book(*books["c"])
    w.add_book(*rows_of("b", 1, key="changed"))
    w.close()
    table = pq.read_table(tmp_path / "sections.parquet")
    assert [r for r in table.to_pylist() if r["book_id"] == "a"] == as_dicts(books["a"][1])
    assert sorted(pq.read_table(tmp_path / "books.parquet").column("id").to_pylist()) == ["a", "b", "c"]
    assert len((tmp_path / "sections.jsonl").read_text().splitlines()) == table.num_rows == 3 + 2 + 1
    w = DatasetWriter(tmp_path)
    assert w.carry_over({"a": "key-a"}) == {"a"}
    with pytest.raises(ValueError, match="already"):  # a carried book is in: adding it again is a runner bug
        w.add_book(*books["a"])
    w.abort()


def test_carry_over_from_nothing_or_a_damaged_file_is_empty(tmp_path):
    w = DatasetWriter(tmp_path)
    assert w.carry_over({"a": "k1"}) == set()
    w.close()
    (tmp_path / "books.parquet").write_bytes(b"not parquet")
    w = DatasetWriter(tmp_path)
    assert w.carry_over({"a": "k1"}) == set()
    w.add_book(*rows_of("a"))  # the runner adds it from the journal instead
    w.close()
    assert pq.read_table(tmp_path / "books.parquet").column("id").to_pylist() == ["a"]


def test_rebuild_streams_books_into_a_fresh_dataset(tmp_path):
    books = [rows_of(f"b{i}", 3) for i in range(5)]
    rebuild(tmp_path, iter(books), rows_per_group=4)
    assert pq.read_table(tmp_path / "sections.parquet").to_pylist() == as_dicts(s for _, x in books for s in x)


def test_rows_from_a_finished_book():
    outline = Outline("Owls", (Part("Kinds", (Chapter("Barn owls", ("Range", "Diet", "Calls")),)),))
    texts = (SectionText("1.1.1", "Kinds", "Barn owls", "Range", "They live far and wide.", "stop", 9, "http://a/v1"),
             SectionText("1.1.2", "Kinds", "Barn owls", "Diet", "Mice, mostly, and", "length", 12, "http://b/v1"),
             SectionText("1.1.3", "Kinds", "Barn owls", "Calls", "", None, 0, None, error="HTTP 500 x8"))
    book = Book(outline, texts, "# Owls\n")
    rows = section_rows("owls", "Write about owls", book, model="m", attempts={"1.1.3": 8},
                        times={"1.1.1": (10.0, 12.5)})
    assert [(r.section, r.words, r.tokens, r.finish_reason, r.attempts, r.error) for r in rows] == [
        ("Range", 5, 9, "stop", 1, None), ("Diet", 3, 12, "length", 1, None), ("Calls", 0, 0, None, 8, "HTTP 500 x8")]
    assert (rows[0].t_start, rows[0].t_end, rows[1].t_start) == (10.0, 12.5, None)
    assert [r.printed for r in rows] == [s.body for s in texts[:2]] + [""]  # a failed section prints nothing
    assert {(r.book_id, r.prompt, r.book_title, r.model) for r in rows} == {("owls", "Write about owls", "Owls", "m")}
    # each row names the model of the backend that wrote it; a failed section (no backend) the library's
    served = section_rows("owls", "p", book, model="a,b", models={"http://a/v1": "qwen", "http://b/v1": "llama"})
    assert [r.model for r in served] == ["qwen", "llama", "a,b"]
    row = book_row("owls", "key", "Write about owls", book, folder="books/owls", files=["book.md"])
    assert (row.shape, row.sections, row.words, row.tokens, row.status) == ((1, 1, 3), 3, 8, 21, "failed")
    whole = Book(outline, texts[:2], "")
    assert book_row("owls", "key", "p", whole, folder="books/owls").status == "complete"
    stopped = Book(outline, (*texts[:2], dataclasses.replace(texts[2], error=Missing.INTERRUPTED)), "")
    assert book_row("owls", "key", "p", stopped, folder="books/owls").status == "incomplete"


def test_printed_is_the_section_as_book_md_prints_it():
    outline = Outline("Owls", (Part("Kinds", (Chapter("Barn owls", ("Range", "Diet")),)),))
    texts = (SectionText("1.1.1", "Kinds", "Barn owls", "Range", "They live far and wide.\n\nI hope this helps! Let me "
                         "know if you have any other questions.", "stop", 30, "http://a/v1"),
             SectionText("1.1.2", "Kinds", "Barn owls", "Diet", "They eat mice. They also eat vo", "length", 12,
                         "http://a/v1"))
    rows = section_rows("owls", "p", Book(outline, texts, ""), model="m")
    assert [(r.text, r.printed) for r in rows] == [(texts[0].text, "They live far and wide."),
                                                   (texts[1].text, "They eat mice.")]
    assert rows[0].words == 18  # the answer as generated, as before the column


def _older(path: Path) -> None:
    """Rewrite a dataset file as a library wrote it before the columns added since (library_dataset._ADDED)."""
    table = pq.read_table(path)
    pq.write_table(table.drop_columns([c for c in ("printed",) if c in table.column_names]), path)


def test_a_dataset_from_before_the_printed_column(tmp_path):
    books = [rows_of("a", 2, key="key-a"), rows_of("b", 3, key="key-b")]
    old = tmp_path / "old"
    write_dataset(old, books, formats=("parquet", "jsonl"))
    _older(old / "sections.parquet")
    w = DatasetWriter(old)  # a resumed library does not carry it over: its books come again from their journals
    assert w.carry_over({"a": "key-a", "b": "key-b"}) == set()
    w.abort()
    (old / "stats.json").write_text("{}", encoding="utf-8")
    merge([old], tmp_path / "merged")  # a shard written before it: read with nulls there, everything else kept
    rows = pq.read_table(tmp_path / "merged" / "sections.parquet").to_pylist()
    assert rows == [{**d, "printed": None} for d in as_dicts(s for _, secs in books for s in secs)]
    w = DatasetWriter(tmp_path / "merged")  # nor is a merge of it, which has the column but nulls in it
    assert w.carry_over({"a": "key-a", "b": "key-b"}) == set()
    w.abort()
    w = DatasetWriter(tmp_path / "new")  # one written with the column is carried over
    w.add_book(*books[0])
    w.close()
    w = DatasetWriter(tmp_path / "new")
    assert w.carry_over({"a": "key-a"}) == {"a"}
    w.abort()
    table = pq.read_table(old / "sections.parquet")
    typed = table.append_column("printed", pa.array([["x"]] * table.num_rows, pa.list_(pa.string())))
    pq.write_table(typed, old / "sections.parquet")  # the column, of another type: one line, no traceback
    with pytest.raises(ConfigError, match=r"cannot read the dataset of .*old: ") as info:
        merge([old], tmp_path / "typed")
    assert "\n" not in str(info.value)
    pq.write_table(table.drop_columns(["words"]), old / "sections.parquet")  # any other column missing: refused
    with pytest.raises(ConfigError, match=r"cannot read the dataset of .*old: sections\.parquet has no column 'words'$"):
        merge([old], tmp_path / "again")


def make_shard(root: Path, name: str, ids: list[str], stats: dict, jsonl: bool = True) -> Path:
    d = root / name
    write_dataset(d, [rows_of(i, 2) for i in ids], formats=("parquet", "jsonl") if jsonl else ("parquet",))
    for i in ids:
        (d / "books" / i / "assets").mkdir(parents=True)
        (d / "books" / i / "book.md").write_text(f"# {i}\n", encoding="utf-8")
        (d / "books" / i / "assets" / "x.txt").write_text("x", encoding="utf-8")
    (d / "stats.json").write_text(json.dumps(stats), encoding="utf-8")
    return d


STATS_0 = {"books": 2, "failed_books": 0, "sections": 4, "tokens_written": 100, "requests": 10, "planning_requests": 2,
           "request_errors": 1, "words": 70, "whole_job_s": 30.5, "cards": 4, "server_counted": {"available": False},
           "stopped_answers": 3, "planning_stopped": 4, "resumed_sections": 1, "unusable_replies": 1,
           "signed_off_answers": 2}
STATS_1 = {"books": 1, "failed_books": 1, "sections": 2, "tokens_written": 40, "requests": 5, "planning_requests": 1,
           "request_errors": 0, "words": 30, "whole_job_s": 41.0, "stopped_answers": 2}


def test_merge_joins_two_shards(tmp_path):
    a = make_shard(tmp_path, "s0", ["a", "b"], STATS_0)
    b = make_shard(tmp_path, "s1", ["c"], STATS_1)
    out = tmp_path / "all"
    merged = merge([a, b], out)
    sections = pq.read_table(out / "sections.parquet")
    assert sections.schema.equals(SECTION_SCHEMA)
    want = pq.read_table(a / "sections.parquet").to_pylist() + pq.read_table(b / "sections.parquet").to_pylist()
    assert sections.to_pylist() == want
    assert pq.read_table(out / "books.parquet").column("id").to_pylist() == ["a", "b", "c"]
    assert len((out / "sections.jsonl").read_text().splitlines()) == 6
    assert json.loads((out / "stats.json").read_text()) == merged
    assert (merged["books"], merged["failed_books"], merged["sections"], merged["tokens_written"]) == (3, 1, 6, 140)
    assert (merged["requests"], merged["planning_requests"], merged["request_errors"], merged["words"]) == (15, 3, 1, 100)
    assert merged["whole_job_s"] == 41.0 and [s["dir"] for s in merged["shards"]] == [str(a), str(b)]
    for i, shard in (("a", a), ("c", b)):
        linked = out / "books" / i / "assets" / "x.txt"
        assert linked.read_text() == "x"
        assert os.path.samefile(linked, shard / "books" / i / "assets" / "x.txt")  # a hard link: one copy on disk
    merge([a, b], out)  # again: the same result, the links replaced
    assert pq.read_table(out / "books.parquet").num_rows == 3
    assert not list(out.glob("*.part"))


def test_merge_writes_jsonl_only_when_every_shard_has_it(tmp_path):
    a = make_shard(tmp_path, "s0", ["a"], STATS_0)
    b = make_shard(tmp_path, "s1", ["b"], STATS_1, jsonl=False)
    merge([a, b], tmp_path / "out")
    assert not (tmp_path / "out" / "sections.jsonl").exists()
    merge([a, b], tmp_path / "out2", formats=("parquet", "jsonl"))
    assert len((tmp_path / "out2" / "books.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize(("second", "pattern"), [
    (["b", "a"], r"book 'a' of .*s1 is also in .*s0: each book belongs to one shard"),
    (["A"], r"book 'A' of .*s1 is also in .*s0"),
])
def test_merge_refuses_a_book_in_two_shards(tmp_path, second, pattern):
    a = make_shard(tmp_path, "s0", ["a"], STATS_0)
    b = make_shard(tmp_path, "s1", second, STATS_1)
    with pytest.raises(ConfigError, match=pattern) as info:
        merge([a, b], tmp_path / "out")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "out" / "books.parquet").exists()


def test_merge_refuses_a_book_twice_in_one_shard(tmp_path):
    a = make_shard(tmp_path, "s0", ["a"], STATS_0)
    write_dataset(tmp_path / "s1", [rows_of("b"), rows_of("x")])
    (tmp_path / "s1" / "stats.json").write_text("{}", encoding="utf-8")
    table = pq.read_table(tmp_path / "s1" / "books.parquet")
    pq.write_table(table.set_column(0, "id", pa.array(["b", "b"])), tmp_path / "s1" / "books.parquet")
    with pytest.raises(ConfigError, match=r"book 'b' of .*s1 is twice in it"):
        merge([a, tmp_path / "s1"], tmp_path / "out")


def test_merge_refuses_missing_or_wrong_inputs(tmp_path):
    a = make_shard(tmp_path, "s0", ["a"], STATS_0)
    cases = [([tmp_path / "nowhere"], r"nowhere has no sections\.parquet or books\.parquet or stats\.json"),
             ([], r"no shard folders given"), ([a, a], r"given twice"), ([a], r"--out .* is one of the shards")]
    for dirs, pattern in cases:
        with pytest.raises(ConfigError, match=pattern):
            merge(dirs, a if pattern.startswith("--out") else tmp_path / "out")
    (a / "stats.json").write_text("{broken", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"cannot read .*stats\.json"):
        merge([a], tmp_path / "out")
    (a / "stats.json").write_text("[]", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"is not a JSON object"):
        merge([a], tmp_path / "out")
    (a / "stats.json").write_text("{}", encoding="utf-8")
    pq.write_table(pa.table({"book_id": ["a"], "other": [1]}), a / "sections.parquet")  # another schema
    with pytest.raises(ConfigError, match=r"cannot read the dataset of .*s0"):
        merge([a], tmp_path / "out")
    assert not list((tmp_path / "out").glob("*.part"))
    (a / "books.parquet").write_bytes(b"junk")
    with pytest.raises(ConfigError, match=r"cannot read .*books\.parquet") as info:
        merge([a], tmp_path / "out")
    assert "\n" not in str(info.value)


def test_a_librarys_run_counts_sum_its_books_stats():
    """stats.json of a library: this run's requests, errors, stopped answers and resumed sections summed over the
    books it wrote (RUN_COUNTS), a bool or a missing key counting nothing."""
    from orchestrator.job.library_stats import RUN_COUNTS, Totals

    t = Totals()
    t.add({**STATS_0, "resumed_sections": 2}, {})
    t.add({**STATS_1, "request_errors": True}, {})
    assert {k: t.run_sums[k] for k in RUN_COUNTS} == {
        "tokens_written": 140, "requests": 15, "planning_requests": 3, "request_errors": 1, "unusable_replies": 1,
        "resumed_sections": 2, "stopped_answers": 5, "signed_off_answers": 2, "planning_stopped": 4}
    assert t.written == 2


def test_merge_stats_sums_counts_and_takes_the_longest_time():
    merged = merge_stats([("s0", STATS_0), ("s1", STATS_1), ("s2", {"books": True, "whole_job_s": 2})])
    assert merged["books"] == 3  # a bool is not a count
    assert merged["whole_job_s"] == 41.0
    assert merged["stopped_answers"] == 5 and merged["resumed_sections"] == 1 and merged["planning_stopped"] == 4
    assert merged["signed_off_answers"] == 2
    assert merged["unusable_replies"] == 1  # summed where a shard has it (stats.json before it had none)
    assert "cards" not in merged and "server_counted" not in merged and "failed_sections" not in merged
    assert merged["shards"][2] == {"dir": "s2", "books": True, "whole_job_s": 2}
    assert merge_stats([]) == {"shards": [], "failed_book_ids": []}


def test_the_dataset_reads_as_one_table_across_row_groups(tmp_path):
    write_dataset(tmp_path, [rows_of(f"b{i}", 3) for i in range(10)], rows_per_group=7)
    dataset = pq.ParquetDataset([str(tmp_path / "sections.parquet")])  # as datasets.load_dataset("parquet") reads it
    table = dataset.read()
    assert table.num_rows == 30 and isinstance(table.column("text"), pa.ChunkedArray)
